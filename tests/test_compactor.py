"""strata-compactor against a real bucket beside a running broker:

- a compacted topic receives 1M updates over 10k keys (the last update of every hundredth
  key is a tombstone) through confluent-kafka with lz4 and idempotence; everything is
  tiered; the compactor is SIGKILLed in the middle of a run (the manifests stay valid and
  every record stays readable), then run again to the end. Afterwards every key's latest
  value is in the cold tier at the offset it was produced at, no older value is, the
  killed run's partial objects are deleted as orphans, and a consumer reading through the
  broker from the earliest offset sees exactly the same;
- as a service against a real S3-compatible server (moto_server): a dry run changes
  nothing; rounds compact the topic and merge its segments, and its metrics say so;
- bad input: an unreachable bucket or missing credentials is one clear line.
"""

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from conftest import Broker, free_port, rdkafka_conf, scrape_metrics, strata_bin
from test_tiered import S3_ENV, new_bucket, s3_endpoint  # noqa: F401 (fixture)

KEYS = 10_000
ROUNDS = 100
PARTITIONS = 2
TOPIC = "accounts"


def compactor_bin():
    return str(Path(strata_bin()).parent / "strata-compactor")


def compactor(url, *args, env=None, **kw):
    return subprocess.Popen([compactor_bin(), "--url", url, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, NO_COLOR="1", **(env or {})), **kw)


def run_compactor(url, *args, env=None, timeout=600, check=True):
    p = compactor(url, *args, env=env)
    out, err = p.communicate(timeout=timeout)
    if check:
        assert p.returncode == 0, err.decode(errors="replace")[-3000:]
    return p.returncode, out.decode(), err.decode()


def manifests(cold: Path):
    """{partition: newest manifest} of the topic in a file:// bucket."""
    out = {}
    for part in range(PARTITIONS):
        files = sorted(cold.glob(f"*/*/{part}/manifest/*.json"))
        out[part] = json.loads(files[-1].read_text()) if files else {"segments": []}
    return out


def check_valid(cold: Path, m):
    """Contiguous from the log start, every named object present."""
    segs = m["segments"]
    assert segs and segs[0]["base_offset"] == m["log_start"], m
    for a, b in zip(segs, segs[1:]):
        assert b["base_offset"] == a["end_offset"], f"gap or overlap between {a} and {b}"
    for s in segs:
        for suffix in ("", ".index", ".timeindex"):
            assert (cold / (s["key"] + suffix)).exists(), f"missing {s['key']}{suffix}"


def segment_objects(cold: Path):
    return {str(p.relative_to(cold)) for p in cold.glob("*/*/*/segments/*.log")}


def value(r, k):
    return f"r{r}-k{k}".encode()


def consume_all(bootstrap, topic, ends, deadline):
    """Every record of `topic` from the earliest offset up to `ends`, through the broker:
    {partition: [(offset, key, value)]}."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer(rdkafka_conf({"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}",
                               "enable.auto.commit": False}))
    out = {p: [] for p in ends}
    try:
        c.assign([TopicPartition(topic, p, -2) for p in ends])  # OFFSET_BEGINNING
        done = set()
        while len(done) < len(ends):
            assert time.monotonic() < deadline, f"read ran out of time: {[len(v) for v in out.values()]}"
            for msg in c.consume(num_messages=5000, timeout=0.5):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                out[msg.partition()].append((msg.offset(), msg.key(), msg.value()))
                if msg.offset() + 1 >= ends[msg.partition()]:
                    done.add(msg.partition())
    finally:
        c.close()
    return out


@pytest.fixture
def compacted_topic(tmp_path):
    """A running broker whose compacted topic holds 1M updates over 10k keys, all tiered:
    (broker, cold dir, {partition: {key: (offset, value)}}, {partition: end offset})."""
    from confluent_kafka import Producer

    b = Broker(strata_bin(), tmp_path)
    b.extra_env = {"STRATA__COLD__INTERVAL": "200ms", "STRATA__TOPICS__RETENTION_CHECK_INTERVAL": "200ms"}
    b.start()
    b.create_topic(TOPIC, PARTITIONS, {
        "cleanup.policy": "compact", "segment.bytes": 256 << 10, "segment.ms": 3000,
        "remote.storage.enable": "true", "local.retention.bytes": 0,
    })
    latest = {p: {} for p in range(PARTITIONS)}

    def delivered(err, msg):
        assert err is None, err
        latest[msg.partition()][msg.key()] = (msg.offset(), msg.value())

    p = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 20,
                               "batch.size": 65536, "compression.type": "lz4", "enable.idempotence": True}))
    for r in range(ROUNDS):
        for k in range(KEYS):
            # The last update of every hundredth key deletes it.
            v = None if (r == ROUNDS - 1 and k % 100 == 0) else value(r, k)
            while True:
                try:
                    p.produce(TOPIC, key=f"k{k}".encode(), value=v, partition=k % PARTITIONS, on_delivery=delivered)
                    break
                except BufferError:
                    p.poll(0.1)
        p.poll(0)
    assert p.flush(120) == 0
    # Let segment.ms pass; one more record per partition rolls the last data segment.
    time.sleep(3.5)
    for part in range(PARTITIONS):
        p.produce(TOPIC, key=b"filler", value=b"filler", partition=part, on_delivery=delivered)
    assert p.flush(30) == 0
    ends = {part: latest[part][b"filler"][0] for part in range(PARTITIONS)}
    assert sum(ends.values()) == KEYS * ROUNDS
    cold = b.data_dir / "cold"
    deadline = time.monotonic() + 120
    while True:
        ms = manifests(cold)
        tiered = {part: (ms[part]["segments"] or [{"end_offset": 0}])[-1]["end_offset"] for part in ms}
        if all(tiered[part] >= ends[part] for part in ends):
            break
        assert time.monotonic() < deadline, f"not tiered: {tiered} of {ends}\n{b.stderr_tail()}"
        time.sleep(0.5)
    yield b, cold, latest, ends
    b.stop()


def test_1m_updates_compact_to_each_keys_latest_and_survive_a_kill(compacted_topic, tmp_path):
    b, cold, latest, ends = compacted_topic
    url = f"file://{cold}"
    before = manifests(cold)
    objects_before = segment_objects(cold)
    work = tmp_path / "work"
    work.mkdir()

    # A run SIGKILLed while it writes new segments.
    proc = compactor(url, "once", "--concurrency", "1", "--orphan-grace", "2s", "--work-dir", str(work))
    deadline = time.monotonic() + 300
    while not any(work.iterdir()):
        assert proc.poll() is None, f"the compactor ended before it was killed: {proc.communicate()[1].decode()[-2000:]}"
        assert time.monotonic() < deadline, "the compactor never started writing"
        time.sleep(0.02)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    after_kill = manifests(cold)
    for part, m in after_kill.items():
        check_valid(cold, m)
        assert m["segments"][-1]["end_offset"] == before[part]["segments"][-1]["end_offset"]
    partial = segment_objects(cold) - objects_before
    print(f"\nkilled mid-run: {sum(m['version'] != before[p]['version'] for p, m in after_kill.items())} of "
          f"{PARTITIONS} partitions swapped, {len(partial)} new segment objects in the bucket")

    # Run again, to the end.
    time.sleep(2.5)  # the killed run's objects are past the grace period now
    started = time.monotonic()
    _, out, err = run_compactor(url, "once", "--concurrency", "2", "--orphan-grace", "2s", "--work-dir", str(work))
    took = time.monotonic() - started
    print(out + err.splitlines()[-1])
    assert "FAILED" not in out
    assert not list(work.iterdir()), "work files are removed"

    expected = {part: sorted((o, k, v) for k, (o, v) in latest[part].items() if k != b"filler")
                for part in range(PARTITIONS)}
    for part, m in manifests(cold).items():
        check_valid(cold, m)
        assert all(s.get("compacted") for s in m["segments"]), "every segment is compacted"
        assert m["segments"][-1]["end_offset"] == ends[part], "offsets are preserved to the end"
    # The killed run's partial objects were orphans, deleted by the rerun's sweep; nothing
    # unnamed remains but what was just retired.
    named = {s["key"] for m in manifests(cold).values() for s in m["segments"]}
    retired = {r["key"] for m in manifests(cold).values() for r in m.get("retired", [])}
    leftover = segment_objects(cold) - named - retired
    assert not (leftover & partial), f"partial objects left: {sorted(leftover & partial)[:3]}"

    # The cold tier, read straight from the bucket: each key's latest, at its offset.
    replay = str(Path(strata_bin()).parent / "strata-replay")
    r = subprocess.run([replay, "--url", url, "cat", TOPIC], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    cold_recs = {part: [] for part in range(PARTITIONS)}
    for line in r.stdout.decode().splitlines():
        rec = json.loads(line)
        v = rec["value"]
        cold_recs[rec["partition"]].append((rec["offset"], rec["key"].encode(), None if v is None else v.encode()))
    for part in range(PARTITIONS):
        assert cold_recs[part] == expected[part], f"partition {part}: the cold tier is not the latest per key"

    # Through the broker (its leader picks up the new manifests within seconds): the same,
    # then the filler from the local log.
    deadline = time.monotonic() + 120
    while True:
        seen = consume_all(b.bootstrap, TOPIC, {part: ends[part] + 1 for part in range(PARTITIONS)}, deadline)
        if all(len(seen[part]) == len(expected[part]) + 1 for part in seen):
            break
        time.sleep(2)  # still the pre-compaction manifest
    for part in range(PARTITIONS):
        assert seen[part][:-1] == expected[part], f"partition {part}: consumers see something else"
        assert seen[part][-1][1] == b"filler"
    tombstones = sum(v is None for part in expected for _, _, v in expected[part])
    assert tombstones == KEYS // 100
    total = sum(len(v) for v in expected.values())
    print(f"1M updates over {KEYS} keys -> {total} records ({tombstones} tombstones); "
          f"rerun took {took:.1f} s (debug build)")


def test_service_against_s3_dry_run_then_rounds_with_metrics(tmp_path, s3_endpoint):  # noqa: F811
    from confluent_kafka import Producer

    bucket = new_bucket(s3_endpoint)
    b = Broker(strata_bin(), tmp_path)
    b.extra_env = {
        "STRATA__COLD__URL": f"s3://{bucket}/strata", "STRATA__COLD__ENDPOINT": s3_endpoint,
        "STRATA__COLD__PATH_STYLE": "true", "STRATA__COLD__INTERVAL": "200ms",
        "STRATA__TOPICS__RETENTION_CHECK_INTERVAL": "200ms", **S3_ENV,
    }
    b.start()
    svc = None
    try:
        b.create_topic("prices", 1, {"cleanup.policy": "compact,delete", "retention.ms": -1,
                                     "segment.bytes": 32 << 10, "remote.storage.enable": "true",
                                     "local.retention.bytes": 0})
        p = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 16384}))
        offsets = {}

        def delivered(err, msg):
            assert err is None, err
            offsets[msg.key()] = (msg.offset(), msg.value())

        for r in range(100):
            for k in range(200):
                p.produce("prices", key=f"isin-{k}".encode(), value=f"{r}:{k}:".encode() + b"x" * 100,
                          on_delivery=delivered)
            p.poll(0)
        assert p.flush(30) == 0
        deadline = time.monotonic() + 60
        while scrape_metrics(b.metrics_port).get("strata_tiered_segments_total", 0) < 5:
            assert time.monotonic() < deadline, b.stderr_tail()
            time.sleep(0.3)
        s3 = __import__("test_tiered").s3_client(s3_endpoint)

        def bucket_state():
            keys = sorted(o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
                          for o in page.get("Contents", []))
            return keys

        while not any(k.endswith("/topic.json") for k in bucket_state()):
            assert time.monotonic() < deadline, "the topic is not described in the bucket"
            time.sleep(0.2)
        url = f"s3://{bucket}/strata"
        args = ["--endpoint", s3_endpoint, "--path-style"]
        def newest_manifest():
            return json.loads(s3.get_object(Bucket=bucket, Key=max(
                k for k in bucket_state() if "/manifest/" in k))["Body"].read())

        # Once the broker has tiered all it will: a dry run deletes and writes no segment object.
        while scrape_metrics(b.metrics_port).get("strata_under_tiered_bytes", 1) != 0:
            assert time.monotonic() < deadline, "the broker does not finish tiering"
            time.sleep(0.2)
        before = {k for k in bucket_state() if "/segments/" in k}
        _, out, _ = run_compactor(url, *args, "once", "--dry-run", "--orphan-grace", "0s", env=S3_ENV)
        assert "(dry run)" in out and "records removed" in out, out
        after = {k for k in bucket_state() if "/segments/" in k}
        assert before == after, "a dry run writes and deletes nothing"
        assert not any(s.get("compacted") for s in newest_manifest()["segments"])

        port = free_port()
        svc = compactor(url, *args, "run", "--interval", "1s", "--metrics-addr", f"127.0.0.1:{port}",
                        "--orphan-grace", "1s", env=S3_ENV)
        deadline = time.monotonic() + 90
        while True:
            assert svc.poll() is None, svc.communicate()[1].decode()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    kind, text = r.headers["Content-Type"], r.read().decode()
                # prometheus_client's OpenMetrics parser refuses a split family, a sample
                # outside its family or a missing # EOF; every family has HELP
                assert kind.startswith("application/openmetrics-text"), kind
                families = list(text_string_to_metric_families(text))
                assert all(f.documentation for f in families), [f.name for f in families if not f.documentation]
                vals = {s.name: s.value for f in families for s in f.samples}
                if vals.get("strata_compactor_partitions_compacted_total", 0) >= 1:
                    break
            except OSError:
                vals = {}
            assert time.monotonic() < deadline, f"no compaction: {vals}"
            time.sleep(0.5)
        assert vals["strata_compactor_records_removed_total"] > 0
        assert vals["strata_compactor_segments_read_total"] > vals["strata_compactor_segments_written_total"]
        assert vals.get("strata_compactor_partitions_failed_total", 0) == 0
        svc.send_signal(signal.SIGTERM)
        assert svc.wait(timeout=30) == 0, "SIGTERM stops the service, in a round or between"

        # Through the broker, the compacted range holds only each key's latest.
        m = newest_manifest()
        last_tiered = m["segments"][-1]["end_offset"]
        assert all(s.get("compacted") for s in m["segments"])
        end = max(o for o, _ in offsets.values()) + 1
        deadline = time.monotonic() + 60
        while True:
            seen = consume_all(b.bootstrap, "prices", {0: end}, deadline)[0]
            in_cold = [(o, k, v) for o, k, v in seen if o < last_tiered]
            keys = [k for _, k, _ in in_cold]
            if len(keys) == len(set(keys)):
                break
            time.sleep(2)  # the broker still holds the pre-compaction manifest
        for o, k, v in in_cold:
            assert offsets[k][0] >= o
            if offsets[k][0] < last_tiered:
                assert (o, v) == offsets[k], f"{k}: not its latest"
    finally:
        if svc is not None and svc.poll() is None:
            svc.kill()
        b.stop()


def test_bad_input_is_one_clear_line(tmp_path, s3_endpoint):  # noqa: F811
    no_aws = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    no_aws.update(AWS_EC2_METADATA_DISABLED="true", AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
                  AWS_CONFIG_FILE="/nonexistent")
    cases = [
        (["--url", "ftp://nowhere", "once"], os.environ, "unsupported scheme"),
        (["--url", f"file://{tmp_path}/empty", "once"], os.environ, "no topic"),
        (["--url", "s3://no-such-bucket-here/x", "--endpoint", s3_endpoint, "--path-style", "once"],
         dict(os.environ, **S3_ENV), "nosuchbucket"),
        (["--url", "s3://b/x", "--endpoint", s3_endpoint, "once"], no_aws, "no aws credentials"),
    ]
    (tmp_path / "empty").mkdir()
    for args, env, needle in cases:
        r = subprocess.run([compactor_bin(), *args], capture_output=True, timeout=60, env=dict(env, NO_COLOR="1"))
        err = r.stderr.decode()
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert r.returncode != 0, args
        assert len(err.strip().splitlines()) == 1 and needle in lines[0].lower(), f"{args}: {err}"
        assert "panicked" not in err and "backtrace" not in err.lower(), err


def test_a_decompression_bomb_in_the_bucket_fails_its_partition_in_bounded_memory(tmp_path):
    """Issue 17: strata-compactor shares the batch decoder that a 917 KB gzip batch drove to
    936 MB in strata-replay. With a bomb planted in a compacted topic's cold tier (the
    broker now refuses one at produce, but a bucket may hold one from before), the
    compactor fails that partition with one line naming the batch, leaves its manifest
    as it was, and its memory stays bounded by the decoder's limit (64 MiB per batch)."""
    import gzip
    import shutil

    from confluent_kafka import Producer
    from kafka_wire import raw_batch, record
    from test_replay import peak_rss_mb, plant

    b = Broker(strata_bin(), tmp_path / "broker")
    b.extra_env = {"STRATA__COLD__INTERVAL": "200ms", "STRATA__TOPICS__RETENTION_CHECK_INTERVAL": "200ms"}
    b.start()
    try:
        b.create_topic("positions", 1, {"cleanup.policy": "compact", "segment.bytes": 32 << 10, "segment.ms": 1000,
                                        "remote.storage.enable": "true", "local.retention.bytes": 0})
        p = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "acks": "all", "compression.type": "lz4"}))
        for i in range(3000):
            p.produce("positions", key=b"fund-%d" % (i % 100), value=b"units %d" % i)
        assert p.flush(30) == 0
        time.sleep(1.5)
        p.produce("positions", key=b"filler", value=b"filler")
        assert p.flush(30) == 0
        del p
        cold = b.data_dir / "cold"
        deadline = time.monotonic() + 60
        while (manifests(cold)[0]["segments"] or [{"end_offset": 0}])[-1]["end_offset"] < 3000:
            assert time.monotonic() < deadline, b.stderr_tail()
            time.sleep(0.3)
    finally:
        b.stop()
    clean, bombed = tmp_path / "clean", tmp_path / "bombed"
    shutil.copytree(cold, clean)
    shutil.copytree(cold, bombed)
    body = gzip.compress(record(bytes(900 << 20), key=b"fund-1"), compresslevel=9)
    assert len(body) < 1 << 20
    offset = plant(bombed, 0, lambda base: raw_batch(base, 1, body, int(time.time() * 1000)))
    before = sorted(bombed.glob("*/*/0/manifest/*.json"))[-1]

    def run(bucket):
        return peak_rss_mb([compactor_bin(), "--url", f"file://{bucket}", "once", "--work-dir",
                            str(tmp_path / f"work-{bucket.name}")])
    r, baseline = run(clean)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    r, peak = run(bombed)
    out = (r.stdout + r.stderr).decode(errors="replace")
    failed = [line for line in out.splitlines() if "FAILED" in line]
    print(f"compactor on a bucket holding a {len(body):,}-byte gzip bomb: exit {r.returncode}, peak RSS "
          f"{peak:.0f} MB (a clean run: {baseline:.0f} MB): {failed}")
    assert len(failed) == 1 and "decompress" in failed[0] and f"offset {offset}" in failed[0], out[-2000:]
    assert "more than 67108864 bytes" in failed[0], failed
    assert r.returncode != 0, "a failed partition must fail the run"
    assert sorted(bombed.glob("*/*/0/manifest/*.json"))[-1] == before, "the bombed partition's manifest was swapped"
    assert peak < baseline + 200, f"peak RSS {peak:.0f} MB against {baseline:.0f} MB for a clean run"
