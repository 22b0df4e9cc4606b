"""The runbooks in docs/runbooks/, followed step by step against real processes (issue 18,
item 8): each test does what its runbook tells an operator to do, with the commands it
names (`strata quorum describe|metadata`, `strata topic describe|create|delete`,
`strata-replay ls|replay`, /readyz, /metrics), and checks the outcome the runbook promises.

- dead-broker.md: a broker of a 3 + 3 cluster is SIGKILLed; the symptoms show (fenced,
  under-replicated partitions, ISR without it); a replacement with an empty disk and a new
  address takes its node id; the ISR is full again, and the replacement alone serves every
  acknowledged record.
- controller-majority-lost.md: 2 of 3 controllers SIGKILLed; metadata changes are refused at
  once, writes after a lease, the survivor is alive but not ready; restarting the two heals
  the quorum and writes resume with nothing acknowledged lost.
- restore-topic-from-bucket.md: a tiered topic in a real S3 server (moto) is deleted; the
  bucket still holds it; `strata-replay replay` into the recreated topic brings back every
  acknowledged record at its offset, with its key, value, headers and timestamp.
"""

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import Broker, free_port, port_accepts, rdkafka_conf, scrape_metrics, strata_bin
from test_cluster import LEASE_S, Cluster, attach_logs_on_failure

def readyz(port: int) -> tuple[int, str]:
    """(status, body) of GET /readyz; (0, why) when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=3) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def describe(cluster: Cluster, topic: str, controller=None) -> dict:
    """`strata topic --controller ADDR describe TOPIC` (JSON from a controller), as
    {partition: {leader, replicas, isr}}."""
    out = json.loads(cluster.cli("topic", "describe", topic, controller=controller).stdout)
    return {i: {"leader": p["leader"], "replicas": sorted(p["replicas"]), "isr": sorted(p["isr"])}
            for i, p in enumerate(out["partitions"])}


def produce(bootstrap: str, topic: str, start: int, n: int, partitions: int, timeout=60) -> dict:
    """n idempotent acks=all records, values start..start+n: {value: (partition, offset)} of
    those acknowledged (all of them, or the test fails)."""
    from confluent_kafka import Producer

    acked, errors = {}, []

    def report(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked[int(msg.value().decode().split("-")[1])] = (msg.partition(), msg.offset())

    p = Producer(rdkafka_conf({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                               "linger.ms": 5, "message.timeout.ms": timeout * 1000}))
    for i in range(start, start + n):
        p.produce(topic, value=f"value-{i}".encode(), key=f"key-{i % 97}".encode(), partition=i % partitions,
                  on_delivery=report)
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(timeout + 5) == 0 and not errors, f"{len(errors)} failed: {errors[:3]}"
    assert len(acked) == n
    return acked


def leaders_seen(bootstrap: str, topic: str, leader=None, timeout=20) -> dict:
    """Wait until the broker at `bootstrap` names a leader for every partition of `topic` in
    its own Kafka Metadata (a broker applies the controllers' metadata a moment after they
    commit it, and librdkafka takes a partition without a leader as unknown); {partition:
    leader}, every leader `leader` when it is given."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(rdkafka_conf({"bootstrap.servers": bootstrap}))
    deadline = time.monotonic() + timeout
    while True:
        t = admin.list_topics(topic, timeout=10).topics[topic]
        leaders = {p: m.leader for p, m in t.partitions.items()}
        if t.error is None and leaders and all(l >= 0 and leader in (None, l) for l in leaders.values()):
            return leaders
        assert time.monotonic() < deadline, f"{bootstrap} names no leader for some of {topic}: {leaders} {t.error}"
        time.sleep(0.2)


def read_back(bootstrap: str, topic: str, partitions: int, leader=None, deadline_s=30) -> dict:
    """Every record from offset 0 to the high watermark: {value: (partition, offset)}."""
    from confluent_kafka import Consumer, TopicPartition

    assert len(leaders_seen(bootstrap, topic, leader)) == partitions
    c = Consumer(rdkafka_conf({"bootstrap.servers": bootstrap, "group.id": "runbook-check",
                               "enable.auto.commit": False}))
    try:
        hwm = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out, seen = {}, 0
        deadline = time.monotonic() + deadline_s
        while seen < sum(hwm.values()):
            assert time.monotonic() < deadline, f"read {seen} of {hwm}"
            for m in c.consume(num_messages=5000, timeout=0.5):
                assert m.error() is None, m.error()
                seen += 1
                v = int(m.value().decode().split("-")[1])
                assert v not in out, f"value {v} twice: {out[v]} and {(m.partition(), m.offset())}"
                out[v] = (m.partition(), m.offset())
        return out
    finally:
        c.close()


@pytest.fixture
def cluster(request, tmp_path):
    c = Cluster(strata_bin(), tmp_path)
    try:
        c.start_all()
        yield c
    finally:
        c.stop_all()
        attach_logs_on_failure(request, c)


# --- docs/runbooks/dead-broker.md -----------------------------------------------------------


def test_dead_broker_replaced_by_a_new_machine_with_an_empty_disk(cluster):
    t0 = time.monotonic()
    topic, parts = "settlements", 6
    cluster.cli("topic", "create", topic, "-p", str(parts), "--replication-factor", "3",
                "--config", "min.insync.replicas=2")
    cluster.wait_for(lambda m: topic in m["topics"], "topic created")
    bootstrap = ",".join(f"127.0.0.1:{cluster.broker_ports[i]}" for i in (1, 2))
    acked = produce(bootstrap, topic, 0, 3000, parts)

    # The failure: broker 3's machine dies.
    dead = 3
    cluster.kill(f"broker-{dead}")

    # Symptoms and diagnosis, as the runbook lists them.
    status, why = readyz(cluster.metrics_ports[dead])
    assert status == 0, (status, why)  # nothing answers on the dead node
    m = cluster.wait_for(lambda m: m["brokers"][str(dead)]["fenced"], f"broker {dead} fenced", timeout=LEASE_S * 3)
    layout = describe(cluster, topic)
    for p, d in layout.items():
        assert dead in d["replicas"] and dead not in d["isr"] and d["leader"] != dead, (p, d)
    leader_metrics = [cluster.broker_metrics(i) for i in (1, 2)]
    under = sum(mm.get("strata_under_replicated_partitions", 0) for mm in leader_metrics)
    assert under == parts, f"strata_under_replicated_partitions {under}, expected {parts}"
    active = max(scrape_metrics(cluster.controller_metrics_ports[i]).get("strata_cluster_fenced_brokers", 0)
                 for i in (1, 2, 3))
    assert active == 1, active
    # Producers carry on meanwhile (min.insync.replicas=2 holds with two brokers).
    acked.update(produce(bootstrap, topic, 3000, 2000, parts))

    # The fix: a new machine (empty data directory, another address) with the dead broker's
    # node id and the same config otherwise.
    shutil.rmtree(cluster.workdir / f"broker-{dead}")
    cluster.broker_ports[dead] = free_port()
    cluster.grpc_ports[dead] = free_port()
    cluster.metrics_ports[dead] = free_port()
    replaced_at = time.monotonic()
    cluster.start(f"broker-{dead}")

    # Verification: registered and unfenced, ready, every ISR full again, nothing under-replicated.
    cluster.wait_for(lambda m: not m["brokers"][str(dead)]["fenced"], "replacement registered")
    deadline = time.monotonic() + 30
    while True:
        layout = describe(cluster, topic)
        if all(d["isr"] == d["replicas"] == [1, 2, 3] for d in layout.values()):
            break
        assert time.monotonic() < deadline, f"ISR not full 30 s after the replacement started: {layout}"
        time.sleep(0.3)
    caught_up = time.monotonic() - replaced_at
    assert readyz(cluster.metrics_ports[dead])[0] == 200
    deadline = time.monotonic() + 10
    while sum(cluster.broker_metrics(i).get("strata_under_replicated_partitions", 0) for i in (1, 2, 3)) != 0:
        assert time.monotonic() < deadline, "partitions still under-replicated"
        time.sleep(0.3)
    print(f"replacement in every ISR {caught_up:.1f} s after it started")

    # The replacement alone holds everything: with brokers 1 and 2 gone it leads every
    # partition and serves every acknowledged record at its offset.
    cluster.kill("broker-1")
    cluster.kill("broker-2")
    cluster.wait_for(lambda m: all(p["leader"] == dead for p in m["topics"][topic]["partitions"]),
                     f"broker {dead} leads every partition", timeout=LEASE_S * 3)
    got = read_back(f"127.0.0.1:{cluster.broker_ports[dead]}", topic, parts, leader=dead)
    assert got == acked, f"{len(got)} records read, {len(acked)} acknowledged"
    print(f"dead-broker run-through: {time.monotonic() - t0:.1f} s")
    # (done: SIGKILL the rest rather than wait out controlled shutdowns with no broker to hand over to)
    for name in list(cluster.procs):
        cluster.kill(name)


# --- docs/runbooks/controller-majority-lost.md ----------------------------------------------


def test_controller_majority_lost_and_restored(cluster):
    from confluent_kafka import Producer

    from kafka_wire import KafkaWire

    t0 = time.monotonic()
    topic, parts = "payments", 3
    cluster.cli("topic", "create", topic, "-p", str(parts), "--replication-factor", "3",
                "--config", "min.insync.replicas=2")
    cluster.wait_for(lambda m: topic in m["topics"], "topic created")
    bootstrap = ",".join(f"127.0.0.1:{cluster.broker_ports[i]}" for i in (1, 2, 3))
    acked = produce(bootstrap, topic, 0, 2000, parts)

    layout = describe(cluster, topic)

    # The failure: two of three controllers die, the Raft leader among them.
    leader = cluster.leader()
    survivor = next(i for i in (1, 2, 3) if i != leader)
    lost = [i for i in (1, 2, 3) if i != survivor]
    for i in lost:
        cluster.kill(f"controller-{i}")
    lost_at = time.monotonic()
    survivor_addr = cluster.controller_addr(survivor)

    # Symptoms: the survivor is alive but not ready and knows no leader; nobody is the
    # active controller (StrataNoActiveController); metadata changes are refused at once.
    deadline = time.monotonic() + 10
    while True:
        status, why = readyz(cluster.controller_metrics_ports[survivor])
        if status == 503:
            break
        assert time.monotonic() < deadline, f"survivor still ready: {status} {why}"
        time.sleep(0.2)
    assert "not ready" in why, why
    for i in lost:
        assert readyz(cluster.controller_metrics_ports[i])[0] == 0
    assert scrape_metrics(cluster.controller_metrics_ports[survivor])["strata_controller_active"] == 0
    deadline = time.monotonic() + 10
    while True:
        q = json.loads(cluster.cli("quorum", "describe", controller=survivor_addr).stdout)
        if q["leader_id"] is None:
            break
        assert time.monotonic() < deadline, f"the survivor still names leader {q}"
        time.sleep(0.2)
    refused = cluster.cli("topic", "create", "blocked", "-p", "1", controller=survivor_addr, check=False)
    assert refused.returncode != 0, refused.stdout

    # One lease later no broker leads (produce is refused) — what the runbook tells
    # producers to expect: retries until the quorum is back.
    time.sleep(max(0.0, lost_at + LEASE_S + 0.5 - time.monotonic()))
    for b in (1, 2, 3):
        wire = KafkaWire(cluster.broker_ports[b])
        named = wire.partition_leaders(topic)
        wire.close()
        own = [i for i, d in layout.items() if d["leader"] == b]
        assert all(named[i] == -1 for i in own), f"broker {b} still leads some of {own}: {named}"
    refused_acks = []
    p = Producer(rdkafka_conf({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 2000}))
    for i in range(parts):
        p.produce(topic, b"refused", partition=i, on_delivery=lambda e, m: refused_acks.append(e))
    p.flush(10)
    assert len(refused_acks) == parts and all(e is not None for e in refused_acks), refused_acks

    # The fix: start the lost controllers again, on their own data directories.
    restored_at = time.monotonic()
    for i in lost:
        cluster.start(f"controller-{i}")

    # Verification: a leader and three voters seen alike from every controller, all
    # ready; metadata changes and writes work; nothing acknowledged before is lost.
    deadline = time.monotonic() + 30
    while True:
        views = [cluster.quorum(cluster.controller_addr(i)) for i in (1, 2, 3)]
        ready = [readyz(cluster.controller_metrics_ports[i])[0] for i in (1, 2, 3)]
        if all(v and v["leader_id"] is not None for v in views) and len({v["leader_id"] for v in views}) == 1 \
                and ready == [200, 200, 200]:
            break
        assert time.monotonic() < deadline, f"quorum not healed: {views} {ready}"
        time.sleep(0.3)
    healed = time.monotonic() - restored_at
    assert sum(scrape_metrics(cluster.controller_metrics_ports[i])["strata_controller_active"] for i in (1, 2, 3)) == 1
    cluster.cli("topic", "create", "unblocked", "-p", "1", controller=survivor_addr)
    acked.update(produce(bootstrap, topic, 2000, 1000, parts))
    got = read_back(bootstrap, topic, parts)
    assert got == acked, f"{len(got)} records read, {len(acked)} acknowledged"
    assert all(d["isr"] == [1, 2, 3] for d in describe(cluster, topic).values())
    print(f"quorum healed {healed:.1f} s after the restart; run-through {time.monotonic() - t0:.1f} s")
    for name in list(cluster.procs):
        cluster.kill(name)


# --- docs/runbooks/restore-topic-from-bucket.md ---------------------------------------------


def replay_bin() -> str:
    return str(Path(strata_bin()).parent / "strata-replay")


def test_a_deleted_topic_restored_from_the_bucket_with_strata_replay(tmp_path):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    from test_tiered import S3_ENV, new_bucket, start_moto

    t0 = time.monotonic()
    moto, endpoint = start_moto(tmp_path)
    b = Broker(strata_bin(), tmp_path / "node")
    try:
        bucket = new_bucket(endpoint)
        url = f"s3://{bucket}/prod"
        b.extra_env = {"STRATA__COLD__URL": url, "STRATA__COLD__ENDPOINT": endpoint,
                       "STRATA__COLD__PATH_STYLE": "true", "STRATA__COLD__INTERVAL": "200ms",
                       "STRATA__TOPICS__RETENTION_CHECK_INTERVAL": "200ms", **S3_ENV}
        b.start()
        topic, parts = "ledger", 2
        configs = {"remote.storage.enable": "true", "segment.bytes": 16 << 10, "segment.ms": 1000,
                   "local.retention.bytes": 32 << 10, "retention.ms": -1}
        b.create_topic(topic, parts, configs)

        acked = {}

        def report(err, msg):
            assert err is None, err
            # (a delivery report carries no headers: they are the ones sent with the value)
            i = int(msg.value()[len(b"entry-"):].split(b"entry-")[0])
            acked[(msg.partition(), msg.offset())] = (msg.key(), msg.value(), headers_of(i), msg.timestamp()[1])

        def headers_of(i):
            return [("seq", str(i).encode()), ("source", b"ledger-service")]

        p = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "acks": "all", "enable.idempotence": True,
                                   "linger.ms": 5}))
        for i in range(6000):
            p.produce(topic, key=f"account-{i % 61}".encode(), value=f"entry-{i}".encode() * 3,
                      headers=headers_of(i), partition=i % parts,
                      on_delivery=report)
            if i % 500 == 0:
                p.poll(0)
        assert p.flush(30) == 0 and len(acked) == 6000
        # segment.ms passes, one more record rolls each partition's last segment: every
        # acknowledged record is sealed and uploaded (the fillers stay local and are lost).
        time.sleep(1.2)
        for part in range(parts):
            p.produce(topic, value=b"filler", partition=part)
        assert p.flush(30) == 0
        ends = {part: max(o for (pp, o) in acked if pp == part) + 1 for part in range(parts)}

        replay = [replay_bin(), "--url", url, "--endpoint", endpoint, "--path-style"]
        env = dict(os.environ, NO_COLOR="1", **S3_ENV)

        def bucket_ranges():
            """{partition: end offset} of `topic` from `strata-replay ls`."""
            r = subprocess.run(replay + ["ls"], capture_output=True, text=True, timeout=60, env=env)
            assert r.returncode == 0, r.stderr
            out, inside = {}, False
            for line in r.stdout.splitlines():
                if not line.startswith(" "):
                    inside = line.startswith(f"{topic} ")
                elif inside and (m := re.match(r"\s+(\d+): offsets (\d+)\.\.(\d+)", line)):
                    out[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
            return out, r.stdout

        deadline = time.monotonic() + 40
        while True:
            ranges, listing = bucket_ranges()
            if all(ranges.get(part, (0, 0))[1] >= ends[part] for part in range(parts)):
                break
            assert time.monotonic() < deadline, f"not all in the bucket: {listing} (want {ends})"
            time.sleep(0.3)

        # The incident: the topic is deleted.
        b.cli("delete", topic)
        assert topic not in b.cli("list").stdout

        # Diagnosis: the bucket still holds it (the runbook's `strata-replay ls`).
        ranges, listing = bucket_ranges()
        assert {part: r[0] for part, r in ranges.items()} == {0: 0, 1: 0}, listing
        assert all(ranges[part][1] >= ends[part] for part in range(parts)), listing

        # The fix: recreate the topic with the same partitions and configs but tiering off
        # (so the bucket keeps one topic of that name while replaying), replay into it with a
        # checkpoint, then switch tiering back on.
        restore_configs = dict(configs, **{"remote.storage.enable": "false"})
        b.create_topic(topic, parts, restore_configs)
        checkpoint = tmp_path / "restore.checkpoint"
        r = subprocess.run(replay + ["replay", topic, "--to-bootstrap", b.bootstrap, "--acks", "all",
                                     "--checkpoint", str(checkpoint)],
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        print(r.stderr.strip().splitlines()[-1])
        state = json.loads(checkpoint.read_text())
        assert {int(k): v["next_source_offset"] for k, v in state["partitions"].items()} == \
            {part: ranges[part][1] for part in range(parts)}, state
        # A rerun (say, after a cut-short first run) adds nothing.
        again = subprocess.run(replay + ["replay", topic, "--to-bootstrap", b.bootstrap, "--acks", "all",
                                         "--checkpoint", str(checkpoint)],
                               capture_output=True, text=True, timeout=120, env=env)
        assert again.returncode == 0, again.stderr[-3000:]

        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
            ConfigEntry("remote.storage.enable", "true", incremental_operation=AlterConfigOpType.SET)])
        list(admin.incremental_alter_configs([res]).values())[0].result(timeout=30)
        described = b.cli("describe", topic).stdout
        assert re.search(r"remote.storage.enable = true", described), described

        # Verification: every acknowledged record is back, at its offset, with its key,
        # value, headers and timestamp; nothing else is there.
        c = Consumer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "group.id": "restore-check",
                                   "enable.auto.commit": False}))
        try:
            hwm = {part: c.get_watermark_offsets(TopicPartition(topic, part), timeout=10) for part in range(parts)}
            assert hwm == {part: (0, ends[part]) for part in range(parts)}, hwm
            c.assign([TopicPartition(topic, part, 0) for part in range(parts)])
            restored = {}
            deadline = time.monotonic() + 30
            while len(restored) < len(acked):
                assert time.monotonic() < deadline, f"restored {len(restored)} of {len(acked)}"
                for m in c.consume(num_messages=5000, timeout=0.5):
                    assert m.error() is None, m.error()
                    restored[(m.partition(), m.offset())] = (m.key(), m.value(), m.headers(), m.timestamp()[1])
        finally:
            c.close()
        assert restored == acked, "the restored topic differs from what was acknowledged"

        # With tiering back on, the restored topic is archived again, under its new topic
        # id: the bucket then describes two topics of that name (the runbook's last step).
        deadline = time.monotonic() + 30
        while True:
            r = subprocess.run(replay + ["ls"], capture_output=True, text=True, timeout=60, env=env)
            if len([l for l in r.stdout.splitlines() if l.startswith(f"{topic} ")]) == 2:
                break
            assert time.monotonic() < deadline, f"the restored topic is not tiered again:\n{r.stdout}{r.stderr}"
            time.sleep(0.3)
        print(f"restore run-through: {time.monotonic() - t0:.1f} s")
    finally:
        b.close()
        moto.kill()
        moto.wait()


# --- the pages themselves -------------------------------------------------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_runbooks_are_indexed_linked_from_alerts_and_name_only_files_that_exist():
    import yaml

    root = DOCS.parent
    pages = sorted(p.name for p in (DOCS / "runbooks").glob("*.md") if p.name != "README.md")
    index = (DOCS / "runbooks" / "README.md").read_text()
    for name in ("dead-broker.md", "controller-majority-lost.md", "full-disk.md", "rolling-upgrade.md",
                 "replace-broker-disk.md", "restore-topic-from-bucket.md"):
        assert name in pages, f"docs/runbooks/{name} is missing"
    for name in pages:
        assert f"]({name})" in index, f"docs/runbooks/README.md does not link {name}"

    rules = yaml.safe_load((DOCS / "monitoring" / "alerts.yml").read_text())
    urls = {r["alert"]: r["annotations"].get("runbook_url") for g in rules["groups"] for r in g["rules"]}
    linked = {u for u in urls.values() if u}
    for alert, url in urls.items():
        if url:
            assert (root / url).is_file(), f"{alert}: runbook_url {url} does not exist"
    assert {"docs/runbooks/dead-broker.md", "docs/runbooks/controller-majority-lost.md",
            "docs/runbooks/full-disk.md"} <= linked, linked

    # Links and repository paths the pages name exist (no file outside the repository).
    tests = {n for n in re.findall(r"tests/test_\w+\.py::(\w+)", "".join(
        p.read_text() for p in (DOCS / "runbooks").glob("*.md")))}
    defined = set(re.findall(r"^def (test_\w+)", Path(__file__).read_text(), re.M))
    assert tests <= defined, f"runbooks cite tests that do not exist: {tests - defined}"
    for page in [*(DOCS / "runbooks").glob("*.md"), DOCS / "quickstart-s3.md", DOCS / "deploy.md"]:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links {target}, which does not exist"
        for path in re.findall(r"`((?:docs|deploy|tests|hot|cold|compactor|replay-cli|controller|terraform)/[\w./-]*[\w/])`", text):
            if "<" in path or "*" in path:
                continue
            assert (root / path).exists(), f"{page.name} names {path}, which is not in the repository"
