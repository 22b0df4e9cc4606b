"""The IAM policies of terraform/modules/iam, tested for real: the policy documents are
rendered from their templates exactly as terraform's templatefile would (test_terraform.py
`render_template`), attached to roles in moto's server, and moto is then switched to IAM
enforcement (every request signed with SigV4 by a known key and allowed by its identity's
policies). Under the roles' temporary credentials:

- a `strata` broker tiers two topics to s3://BUCKET/PREFIX: segments, companions, topic
  descriptions and manifests are written (create-only), old manifest versions deleted;
- `strata-replay` (the read-only audit role) lists, prints and exports the archived records;
- `strata-compactor` (its own role) compacts a compacted topic: new segments written, the
  manifest swapped, the replaced objects deleted;

each without a single refused request, while a write outside the prefix (broker), a delete
or a write by the replay role, and any access by the controller role are refused with
AccessDenied. moto does not evaluate `s3:prefix` conditions, so the listing prefixes each
process sent are read from moto's request log and matched against the policy's patterns
as S3 would.
"""

import fnmatch
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import Broker, free_port, port_accepts, rdkafka_conf, scrape_metrics, strata_bin
from test_terraform import MODULES, VARS, render_template, statements

BUCKET = "strata-cold-iam"
PREFIX = "prod-1"
REGION = "us-east-1"
ROLES = ("broker", "replay", "compactor", "controller")


# moto_server, with one fix to its SigV4 check (not to its authorization): in server mode it
# sees the query string decoded (`prefix=prod-1/`), and botocore, which it recomputes the
# signature with, takes a URL's query as already encoded, so every listing with a `/` in its
# prefix fails with SignatureDoesNotMatch whoever signs it (boto3 included). The fix encodes
# the query again, as the client signed it, before the signature is recomputed.
MOTO = r"""
import sys
import urllib.parse

from moto.iam import access_control

_original = access_control.IAMRequestBase._create_aws_request


def _create_aws_request(self):
    path, sep, query = self._path.partition("?")
    if sep:
        pairs = [pair.partition("=") for pair in query.split("&")]
        self._path = path + "?" + "&".join(
            urllib.parse.quote(urllib.parse.unquote(k), safe="-_.~") + eq + urllib.parse.quote(urllib.parse.unquote(v), safe="-_.~")
            for k, eq, v in pairs)
    return _original(self)


access_control.IAMRequestBase._create_aws_request = _create_aws_request

from moto.server import main

main(sys.argv[1:])
"""


def start_moto(log_dir: Path):
    port = free_port()
    log = open(log_dir / "moto.log", "ab")
    proc = subprocess.Popen([sys.executable, "-c", MOTO, "-p", str(port)], stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while not port_accepts(port):
        assert proc.poll() is None, "moto_server exited"
        assert time.monotonic() < deadline, "moto_server did not start"
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}"


def policy_text(role: str) -> str:
    """The exact text terraform's templatefile() makes of the role's policy template."""
    text = (MODULES / "iam" / "policies" / f"{role}.json.tftpl").read_text()
    return render_template(text, {**VARS, "bucket": BUCKET, "prefix": PREFIX, "region": REGION})


def list_patterns(role: str):
    """The s3:prefix patterns the role's ListBucket statement allows."""
    for s in statements(json.loads(policy_text(role))):
        if s["Action"] == "s3:ListBucket":
            p = s["Condition"]["StringLike"]["s3:prefix"]
            return p if isinstance(p, list) else [p]
    raise AssertionError(f"{role}: no ListBucket statement")


def client(endpoint, creds, service="s3"):
    import boto3
    from botocore.config import Config

    return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id=creds["AccessKeyId"], aws_secret_access_key=creds["SecretAccessKey"],
                        aws_session_token=creds.get("SessionToken"),
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


def refused(call, code="AccessDenied"):
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as e:
        call()
    assert e.value.response["Error"]["Code"] == code, e.value.response["Error"]


def process_env(creds, tmp_path):
    """The environment of a process running as the role: its temporary keys only (no
    profile, no instance metadata)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and not k.startswith("STRATA__")}
    env.update(AWS_ACCESS_KEY_ID=creds["AccessKeyId"], AWS_SECRET_ACCESS_KEY=creds["SecretAccessKey"],
               AWS_SESSION_TOKEN=creds["SessionToken"], AWS_REGION=REGION, AWS_EC2_METADATA_DISABLED="true",
               AWS_CONFIG_FILE=str(tmp_path / "no-aws-config"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-aws-creds"),
               NO_COLOR="1")
    return env


class MotoLog:
    """The requests moto served, from its log: (method, path, query, status) since mark()."""

    LINE = re.compile(r'"(GET|PUT|POST|DELETE|HEAD) (\S+) HTTP/1\.[01]" (\d{3})')

    def __init__(self, path: Path):
        self.path = path
        self.at = 0

    def mark(self):
        self.at = self.path.stat().st_size

    def since_mark(self):
        with open(self.path, "rb") as f:
            f.seek(self.at)
            text = re.sub(r"\x1b\[[0-9;]*m", "", f.read().decode(errors="replace"))  # werkzeug's colours
        out = []
        for m in self.LINE.finditer(text):
            url = urllib.parse.urlsplit(m.group(2))
            out.append((m.group(1), urllib.parse.unquote(url.path), urllib.parse.parse_qs(url.query), int(m.group(3))))
        return out

    def check_phase(self, role: str):
        """Every request of the phase succeeded (no 403) and each listing's prefix is one the
        role's s3:prefix condition admits. Returns the requests."""
        reqs = [r for r in self.since_mark() if r[1].startswith(f"/{BUCKET}")]
        assert reqs, f"{role}: no request reached the bucket"
        denied = [r for r in reqs if r[3] == 403]
        assert not denied, f"{role}: refused requests {denied[:5]}"
        lists = [r for r in reqs if r[0] == "GET" and r[1].rstrip("/") == f"/{BUCKET}"]
        assert lists, f"{role}: never listed"
        patterns = list_patterns(role)
        for _, _, query, _ in lists:
            prefix = query.get("prefix", [""])[0]
            assert any(fnmatch.fnmatchcase(prefix, p) for p in patterns), \
                f"{role} listed prefix {prefix!r}, which s3:prefix {patterns} would refuse on S3"
        return reqs


@pytest.fixture
def moto_iam(tmp_path):
    """moto_server with the four roles and their rendered policies, then IAM enforcement on:
    (endpoint, {role: temporary credentials}, MotoLog)."""
    proc, endpoint = start_moto(tmp_path)
    try:
        root = {"AccessKeyId": "test", "SecretAccessKey": "test"}
        s3 = client(endpoint, root)
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key="other-cluster/strata/topic/0/manifest/00000000000000000001.json", Body=b"{}")
        iam, sts = client(endpoint, root, "iam"), client(endpoint, root, "sts")
        trust = json.dumps({"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"}, "Action": "sts:AssumeRole"}]})
        creds = {}
        for role in ROLES:
            arn = iam.create_role(RoleName=f"strata-{role}", AssumeRolePolicyDocument=trust)["Role"]["Arn"]
            if role != "controller":  # the controller role has no policy at all (modules/iam)
                iam.put_role_policy(RoleName=f"strata-{role}", PolicyName="cold-tier", PolicyDocument=policy_text(role))
            creds[role] = sts.assume_role(RoleArn=arn, RoleSessionName=role, DurationSeconds=3600)["Credentials"]
        # From here on every request is authenticated and authorized.
        req = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})
        assert json.loads(urllib.request.urlopen(req, timeout=10).read())["status"] == "ok"
        yield endpoint, creds, MotoLog(tmp_path / "moto.log")
    finally:
        proc.kill()
        proc.wait()


def check_refusals(endpoint, creds, segment_key):
    """What the policies must refuse, and what the same identities may do (so a refusal is
    the policy's, not a broken client's)."""
    broker, replay = client(endpoint, creds["broker"]), client(endpoint, creds["replay"])
    compactor, controller = client(endpoint, creds["compactor"]), client(endpoint, creds["controller"])
    inside = f"{PREFIX}/iam-probe"
    broker.put_object(Bucket=BUCKET, Key=inside, Body=b"x")
    assert replay.get_object(Bucket=BUCKET, Key=inside)["Body"].read() == b"x"
    for who in (broker, compactor):
        refused(lambda: who.put_object(Bucket=BUCKET, Key="other-cluster/iam-probe", Body=b"x"))
        refused(lambda: who.get_object(Bucket=BUCKET, Key="other-cluster/strata/topic/0/manifest/00000000000000000001.json"))
        refused(lambda: who.delete_object(Bucket=BUCKET, Key="other-cluster/strata/topic/0/manifest/00000000000000000001.json"))
    refused(lambda: replay.delete_object(Bucket=BUCKET, Key=segment_key))
    refused(lambda: replay.delete_object(Bucket=BUCKET, Key=inside))
    refused(lambda: replay.put_object(Bucket=BUCKET, Key=f"{PREFIX}/replay-write", Body=b"x"))
    refused(lambda: replay.create_multipart_upload(Bucket=BUCKET, Key=f"{PREFIX}/replay-write"))
    refused(lambda: replay.get_object(Bucket=BUCKET, Key="other-cluster/strata/topic/0/manifest/00000000000000000001.json"))
    refused(lambda: controller.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/"))
    refused(lambda: controller.get_object(Bucket=BUCKET, Key=segment_key))
    # Keys nobody issued are refused outright.
    refused(lambda: client(endpoint, {"AccessKeyId": "test", "SecretAccessKey": "test"}).list_objects_v2(Bucket=BUCKET),
            "InvalidAccessKeyId")
    assert compactor.head_object(Bucket=BUCKET, Key=segment_key)["ContentLength"] > 0, "the replay role deleted it"
    broker.delete_object(Bucket=BUCKET, Key=inside)


def bucket_keys(s3):
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{PREFIX}/"):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def newest_manifests(s3, keys):
    """{partition dir: newest manifest} and {partition dir: versions present}."""
    versions = {}
    for k in keys:
        if "/manifest/" in k:
            part, _, name = k.partition("/manifest/")
            versions.setdefault(part, []).append(int(name[:-len(".json")]))
    newest = {part: json.loads(s3.get_object(Bucket=BUCKET, Key=f"{part}/manifest/{max(v):020}.json")["Body"].read())
              for part, v in versions.items()}
    return newest, versions


def run(cmd, env, timeout=120):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\n{r.stderr[-3000:]}"
    assert "AccessDenied" not in r.stderr, r.stderr[-3000:]
    return r


def test_broker_replay_and_compactor_under_their_policies(moto_iam, tmp_path):
    from confluent_kafka import Producer

    endpoint, creds, log = moto_iam
    url = f"s3://{BUCKET}/{PREFIX}"
    bin_dir = Path(strata_bin()).parent
    s3_args = ["--url", url, "--endpoint", endpoint, "--path-style"]
    inspect = client(endpoint, creds["compactor"])  # lists and reads the prefix

    # --- the broker: tiering under the broker role ------------------------------------------
    log.mark()
    b = Broker(strata_bin(), tmp_path / "broker")
    b.extra_env = {
        **process_env(creds["broker"], tmp_path),
        "STRATA__COLD__URL": url, "STRATA__COLD__ENDPOINT": endpoint, "STRATA__COLD__PATH_STYLE": "true",
        "STRATA__COLD__INTERVAL": "200ms", "STRATA__TOPICS__RETENTION_CHECK_INTERVAL": "200ms",
    }
    b.start()
    produced = {}
    try:
        b.create_topic("ledger", 2, {"segment.bytes": 16 << 10, "remote.storage.enable": "true",
                                     "local.retention.bytes": 16 << 10, "retention.ms": -1})
        b.create_topic("prices", 1, {"cleanup.policy": "compact,delete", "retention.ms": -1, "segment.bytes": 32 << 10,
                                     "remote.storage.enable": "true", "local.retention.bytes": 0})
        # Segments past 32 MiB go up as multipart uploads (cold/src/upload.rs).
        b.create_topic("bulk", 1, {"segment.bytes": 33 << 20, "remote.storage.enable": "true",
                                   "local.retention.bytes": 0, "retention.ms": -1})

        def delivered(err, msg):
            assert err is None, err
            produced[(msg.topic(), msg.partition(), msg.offset())] = (msg.key().decode(), msg.value().decode())

        p = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 4096,
                                   "enable.idempotence": True}))
        for i in range(3000):
            p.produce("ledger", key=f"trade-{i}", value=f"ledger-{i}-" + "x" * 40, partition=i % 2, on_delivery=delivered)
        for r in range(40):
            for k in range(100):
                p.produce("prices", key=f"isin-{k}", value=f"{r}:{k}:" + "p" * 80, on_delivery=delivered)
            p.poll(0)
        blob = "b" * (64 << 10)
        for i in range(560):  # 35 MiB: one sealed segment of about 33 MiB
            while True:
                try:
                    p.produce("bulk", key=f"blob-{i}", value=blob)
                    break
                except BufferError:
                    p.poll(0.1)
        assert p.flush(60) == 0

        # Every sealed segment tiered: each manifest reaches the base of the local active segment.
        deadline = time.monotonic() + 60
        while not all_sealed_tiered(b, inspect):
            m = scrape_metrics(b.metrics_port)
            assert m.get("strata_tier_upload_errors_total", 0) == 0, b.stderr_tail()
            assert time.monotonic() < deadline, f"tiering did not finish\n{b.stderr_tail()}"
            time.sleep(0.3)
        m = scrape_metrics(b.metrics_port)
        assert m.get("strata_tiered_segments_total", 0) >= 10, m
        assert m.get("strata_tier_upload_errors_total", 0) == 0
    finally:
        assert b.stop() == 0
        b.close()
    broker_reqs = log.check_phase("broker")
    assert "AccessDenied" not in (tmp_path / "broker" / "broker.stderr").read_text()
    assert any(r[0] == "PUT" and "/manifest/" in r[1] for r in broker_reqs), "no manifest written"
    assert any(r[0] == "DELETE" for r in broker_reqs), "the broker deleted no old manifest version"
    multipart = [r for r in broker_reqs if "uploads" in r[2] or "uploadId" in r[2]]
    assert {r[0] for r in multipart} == {"POST", "PUT"} and len(multipart) >= 6, f"no multipart upload: {multipart}"

    keys = bucket_keys(inspect)
    manifests, versions = newest_manifests(inspect, keys)
    assert len(manifests) == 4, sorted(manifests)  # ledger 0, 1, prices 0 and bulk 0
    for part, m in manifests.items():
        assert m["segments"], part
        for s in m["segments"]:
            for suffix in ("", ".index", ".timeindex", ".epochs"):
                assert f"{PREFIX}/{s['key']}{suffix}" in keys, f"{part}: missing {s['key']}{suffix}"
        if max(versions[part]) > 4:  # the newest and three before it are kept
            assert len(versions[part]) <= 4, f"{part}: old manifest versions were not deleted: {versions[part]}"
    assert max(max(v) for v in versions.values()) > 4, versions
    dirs = topic_dirs(inspect, keys)
    segment_key = f"{PREFIX}/{manifests[dirs['bulk'] + '/0']['segments'][0]['key']}"  # never compacted

    # --- strata-replay under the read-only role ---------------------------------------------
    replay = [str(bin_dir / "strata-replay"), *s3_args]
    env = process_env(creds["replay"], tmp_path)
    log.mark()
    ls = run([*replay, "ls"], env).stdout
    assert "ledger" in ls and "prices" in ls, ls
    out = run([*replay, "cat", "ledger"], env).stdout
    got = {}
    for line in out.splitlines():
        rec = json.loads(line)
        got[("ledger", rec["partition"], rec["offset"])] = (rec["key"], rec["value"])
    cold_end = {p: manifests[f"{dirs['ledger']}/{p}"]["segments"][-1]["end_offset"] for p in (0, 1)}
    expected = {k: v for k, v in produced.items() if k[0] == "ledger" and k[2] < cold_end[k[1]]}
    assert got == expected, f"replay read {len(got)} records, {len(expected)} tiered"
    assert len(got) > 1000
    export = tmp_path / "export"
    run([*replay, "export", "ledger", "--out", str(export), "--format", "parquet"], env)
    import pyarrow.parquet as pq

    rows = sum(pq.read_table(f).num_rows for f in export.rglob("*.parquet"))
    assert rows == len(got), (rows, len(got))
    log.check_phase("replay")
    assert not [r for r in log.since_mark() if r[0] in ("PUT", "POST", "DELETE")], "replay wrote to the bucket"

    # --- strata-compactor under its role ----------------------------------------------------
    compactor = [str(bin_dir / "strata-compactor"), *s3_args]
    env = process_env(creds["compactor"], tmp_path)
    before = set(bucket_keys(inspect))
    log.mark()
    once = [*compactor, "once", "--orphan-grace", "2s", "--work-dir", str(tmp_path / "work")]
    r = run(once, env, timeout=180)
    assert "FAILED" not in r.stdout and " 0 failed" in r.stderr, r.stdout + r.stderr
    removed = [int(x) for x in re.findall(r"prices\[0\]: .* (\d+) records removed", r.stdout)]
    assert removed and removed[0] > 0 and "not swapped" not in r.stdout, r.stdout
    # Past the grace period a second round deletes the objects the first one replaced.
    time.sleep(2.5)
    r = run(once, env, timeout=180)
    assert "FAILED" not in r.stdout and " 0 failed" in r.stderr, r.stdout + r.stderr
    deleted = int(re.search(r"(\d+) orphans deleted", r.stderr).group(1))
    assert deleted > 0, r.stderr
    compactor_reqs = log.check_phase("compactor")
    assert any(q[0] == "DELETE" for q in compactor_reqs), "the compactor deleted nothing"
    after = set(bucket_keys(inspect))
    manifests_after, _ = newest_manifests(inspect, list(after))
    prices = f"{dirs['prices']}/0"
    assert all(s.get("compacted") for s in manifests_after[prices]["segments"]), manifests_after[prices]
    assert {k for k in before - after if "/segments/" in k}, "the replaced segment objects were not deleted"

    # The audit role reads the compacted topic: each key once, at its latest tiered value.
    env = process_env(creds["replay"], tmp_path)
    recs = [json.loads(line) for line in run([*replay, "cat", "prices"], env).stdout.splitlines()]
    keys_seen = [rec["key"] for rec in recs]
    assert len(keys_seen) == len(set(keys_seen)) == 100, len(keys_seen)
    end = manifests_after[prices]["segments"][-1]["end_offset"]
    latest = {}
    for (topic, _, offset), (k, v) in sorted(produced.items()):
        if topic == "prices" and offset < end:
            latest[k] = (offset, v)
    assert {rec["key"]: (rec["offset"], rec["value"]) for rec in recs} == latest

    # --- what the policies refuse ------------------------------------------------------------
    check_refusals(endpoint, creds, segment_key)


def all_sealed_tiered(b, s3):
    keys = bucket_keys(s3)
    dirs = topic_dirs(s3, keys)
    if set(dirs) != {"ledger", "prices", "bulk"}:
        return False
    manifests, _ = newest_manifests(s3, keys)
    for topic, partitions in (("ledger", 2), ("prices", 1), ("bulk", 1)):
        for p in range(partitions):
            active = max(int(f.stem) for f in (b.data_dir / "logs" / f"{topic}-{p}").glob("*.log"))
            m = manifests.get(f"{dirs[topic]}/{p}")
            if active == 0 or not m or not m["segments"] or m["segments"][-1]["end_offset"] < active:
                return False
    return True


def topic_dirs(s3, keys):
    """{topic name: its directory in the bucket}, from the topic descriptions."""
    out = {}
    for k in keys:
        if k.endswith("/topic.json"):
            info = json.loads(s3.get_object(Bucket=BUCKET, Key=k)["Body"].read())
            out[info["name"]] = k[:-len("/topic.json")]
    return out
