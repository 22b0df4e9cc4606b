"""Tiered storage with real processes, against a local directory (`file://`) and a real
S3-compatible server (moto_server, with conditional writes):

- a topic with small segments and short local retention receives 1M records; local disk
  keeps only recent segments; a new consumer group from the earliest offset gets every
  record, in order and complete (checked by content), most of them from the cold tier;
  confluent-kafka (assign) and kcat do the same;
- on a 3-broker cluster the partition leader is SIGKILLed while it uploads; after failover
  the manifest holds every sealed range exactly once and names no missing object;
- the object store is stopped (SIGSTOP) under load: no acknowledged record is lost, local
  disk holds the backlog, a cold replay started meanwhile finishes once it returns, and
  uploads resume.
"""

import json
import signal
import subprocess
import threading
import sys
import time
import urllib.request
import uuid

import pytest

from conftest import (Broker, consume_partitions, free_port, kcat_bin, port_accepts, rdkafka_conf,
                      record_key, record_value, scrape_metrics, strata_bin)

N = 1_000_000
PARTITIONS = 2
SEGMENT = 64 << 10
LOCAL = 128 << 10


def start_moto(log_dir):
    """A moto_server process on a free port: (process, endpoint URL)."""
    port = free_port()
    log = open(log_dir / "moto.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)], stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while not port_accepts(port):
        assert proc.poll() is None, "moto_server exited"
        assert time.monotonic() < deadline, "moto_server did not start"
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    proc, endpoint = start_moto(tmp_path_factory.mktemp("moto"))
    yield endpoint
    proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait()


S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}


def new_bucket(endpoint):
    bucket = f"cold-{uuid.uuid4().hex[:8]}"
    s3_client(endpoint).create_bucket(Bucket=bucket)
    return bucket


def newest_manifest_keys(s3, bucket, prefix="strata/"):
    """({partition prefix: key of its newest manifest}, every key in the bucket)."""
    keys = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys |= {o["Key"] for o in page.get("Contents", [])}
    newest = {}
    for k in keys:
        if "/manifest/" in k and k.endswith(".json"):
            part, _, name = k.partition("/manifest/")
            version = int(name[:-len(".json")])
            if version > newest.get(part, (0, None))[0]:
                newest[part] = (version, k)
    return {part: k for part, (_, k) in newest.items()}, keys


def bucket_manifests(endpoint, bucket, prefix="strata/"):
    """({partition prefix: newest manifest}, every key in the bucket)."""
    s3 = s3_client(endpoint)
    newest, keys = newest_manifest_keys(s3, bucket, prefix)
    manifests = {part: json.loads(s3.get_object(Bucket=bucket, Key=k)["Body"].read()) for part, k in newest.items()}
    return manifests, keys


def check_manifest(m, keys, prefix="strata/"):
    """The manifest's segments are contiguous from its log start (each range exactly once)
    and every object it names exists. Returns the unreferenced segment objects (orphans)."""
    segs = m["segments"]
    assert segs, f"empty manifest {m}"
    assert segs[0]["base_offset"] == m["log_start"], m
    for a, b in zip(segs, segs[1:]):
        assert b["base_offset"] == a["end_offset"], f"gap or overlap between {a} and {b}"
    for seg in segs:
        assert seg["end_offset"] > seg["base_offset"], seg
        for suffix in ("", ".index", ".timeindex", ".epochs"):
            assert prefix + seg["key"] + suffix in keys, f"the manifest names a missing object {seg['key']}{suffix}"
    named = {prefix + seg["key"] for seg in segs}
    return {k for k in keys if k.endswith(".log") and k not in named}


def s3_client(endpoint):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test",
                        aws_secret_access_key="test", region_name="us-east-1")


@pytest.fixture(params=["file", "s3"])
def tiered(request, tmp_path, s3_endpoint):
    b = Broker(strata_bin(), tmp_path)
    b.extra_env = {
        "STRATA__COLD__URL": f"file://{tmp_path / 'cold'}",
        "STRATA__COLD__INTERVAL": "200ms",
        "STRATA__TOPICS__RETENTION_CHECK_INTERVAL": "200ms",
    }
    b.bucket = None
    if request.param == "s3":
        b.bucket = new_bucket(s3_endpoint)
        b.extra_env.update({
            "STRATA__COLD__URL": f"s3://{b.bucket}/strata",
            "STRATA__COLD__ENDPOINT": s3_endpoint,
            "STRATA__COLD__PATH_STYLE": "true",
            **S3_ENV,
        })
    b.start()
    yield b
    b.stop()


def metrics(b):
    return scrape_metrics(b.metrics_port)


def consume_group(bootstrap, topic, hwm, deadline):
    """Reads `topic` as a new consumer group (subscribe, auto.offset.reset=earliest) up to
    the high watermarks `hwm`: {partition: [(offset, key, value)]}, keys and values as
    ints."""
    from confluent_kafka import Consumer, KafkaException

    c = Consumer(rdkafka_conf({
        "bootstrap.servers": bootstrap, "group.id": f"replay-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest", "enable.auto.commit": True,
    }))
    out = {p: [] for p in hwm}
    try:
        c.subscribe([topic])
        while any(len(out[p]) < hwm[p] for p in hwm):
            assert time.monotonic() < deadline, f"group read ran out of time: {[len(v) for v in out.values()]} of {hwm}"
            for msg in c.consume(num_messages=10000, timeout=0.5):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                out[msg.partition()].append((msg.offset(), int(msg.key()), int(msg.value().decode().split("-", 1)[1])))
    finally:
        c.close()
    return out


def local_log_bytes(b, topic, p):
    d = b.data_dir / "logs" / f"{topic}-{p}"
    total = 0
    for f in d.glob("*.log"):
        try:
            total += f.stat().st_size
        except FileNotFoundError:  # deleted by retention since the listing
            pass
    return total


def test_history_replays_from_the_cold_tier(tiered, s3_endpoint):
    from confluent_kafka import Producer

    b = tiered
    b.create_topic("history", PARTITIONS, {
        "segment.bytes": SEGMENT, "remote.storage.enable": "true",
        "local.retention.bytes": LOCAL, "retention.ms": -1,
    })
    p = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 20, "batch.size": 16384,
                               "enable.idempotence": True}))
    for i in range(N):
        while True:
            try:
                p.produce("history", key=str(i).encode(), value=record_value(i).encode(), partition=i % PARTITIONS)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                p.poll(0.1)
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(60) == 0

    # Everything sealed goes up; local disk keeps only the recent segments.
    deadline = time.monotonic() + 120
    while True:
        m = metrics(b)
        starts = [m.get(f'strata_partition_log_start_offset{{topic="history",partition="{i}"}}', 0) for i in range(PARTITIONS)]
        local = [local_log_bytes(b, "history", i) for i in range(PARTITIONS)]
        if m.get("strata_under_tiered_bytes", 1) == 0 and all(s > 0 for s in starts) and all(x <= LOCAL + 2 * SEGMENT for x in local):
            break
        assert time.monotonic() < deadline, f"not tiered: starts {starts}, local bytes {local}, metrics under_tiered {m.get('strata_under_tiered_bytes')}\n{b.stderr_tail()}"
        time.sleep(0.5)
    assert m["strata_tiered_segments_total"] >= 10
    assert m.get("strata_tier_upload_errors_total", 0) == 0
    hw_total = sum(m[f'strata_partition_high_watermark{{topic="history",partition="{i}"}}'] for i in range(PARTITIONS))
    assert hw_total == N
    from_cold = sum(starts)
    assert from_cold > N * 0.8, f"most records live only in the cold tier ({from_cold} of {N})"

    # A new consumer group from the earliest offset reads every record, in order, by content.
    hwm = {i: int(m[f'strata_partition_high_watermark{{topic="history",partition="{i}"}}']) for i in range(PARTITIONS)}
    out = consume_group(b.bootstrap, "history", hwm, time.monotonic() + 240)
    for part, recs in out.items():
        assert [o for o, _, _ in recs] == list(range(hwm[part])), f"partition {part}: offsets not contiguous from 0"
        keys = [int(k) for _, k, _ in recs]
        assert keys == list(range(part, N, PARTITIONS)), f"partition {part}: records missing or out of order"
        assert [v for _, _, v in recs] == keys, f"partition {part}: a value does not match its key"

    # kcat from the beginning sees the same count.
    r = subprocess.run([kcat_bin(), "-b", b.bootstrap, "-C", "-t", "history", "-o", "beginning", "-e", "-q", "-f", "%k\n"],
                       capture_output=True, text=True, timeout=180)
    assert len(r.stdout.split()) == N, r.stderr[-2000:]

    if b.bucket:
        # The objects are in the S3-compatible bucket: both partitions' manifests, each
        # naming only objects that exist, contiguous from offset 0.
        manifests, keys = bucket_manifests(s3_endpoint, b.bucket)
        assert len(manifests) == PARTITIONS, sorted(manifests)
        for m in manifests.values():
            check_manifest(m, keys)
            assert m["log_start"] == 0


def test_leader_sigkill_mid_upload_leaves_each_segment_once(tmp_path, s3_endpoint, monkeypatch, request):
    """3 controllers + 3 brokers tiering to S3; the partition leader is SIGKILLed under
    load as soon as the bucket holds a segment object its manifest does not name yet (an
    upload between its data PUT and its manifest commit). After failover (and its return),
    the manifest holds every sealed range exactly once, names no missing object, and every
    acknowledged record reads back from offset 0 through both tiers."""
    from test_cluster import Cluster, attach_logs_on_failure
    from test_replication import Load, create_topic, partition_leaders, verify, wait_full_isr

    bucket = new_bucket(s3_endpoint)
    for k, v in S3_ENV.items():
        monkeypatch.setenv(k, v)
    extra = (
        'replica_lag_time_max = "4s"\n'
        f'[cold]\nurl = "s3://{bucket}/strata"\nendpoint = "{s3_endpoint}"\npath_style = true\n'
        'interval = "200ms"\nrequest_timeout = "5s"\norphan_grace = "3s"\n'
        '[topics]\nretention_check_interval = "200ms"\n'
    )
    c = Cluster(strata_bin(), tmp_path, broker_extra=extra)
    try:
        c.start_all()
        topic = "ledger"
        create_topic(c, topic, 1, {"segment.bytes": SEGMENT, "remote.storage.enable": "true",
                                   "local.retention.bytes": 2 * SEGMENT, "retention.ms": -1})
        load = Load(c, rate=2000, topic=topic).start()
        # Once a few segments are up, watch the bucket for an upload in progress: a segment
        # object the manifest does not name yet. (If none is caught in 30 s, the kill still
        # lands under load, between uploads.)
        victim = partition_leaders(c, topic)[0]
        deadline = time.monotonic() + 60
        while c.broker_metrics(victim).get("strata_tiered_segments_total", 0) < 3:
            assert time.monotonic() < deadline, f"nothing tiered by broker {victim}"
            time.sleep(0.1)
        mid_upload = False
        deadline = time.monotonic() + 30
        while not mid_upload and time.monotonic() < deadline:
            manifests, keys = bucket_manifests(s3_endpoint, bucket)
            named = {"strata/" + seg["key"] for m in manifests.values() for seg in m["segments"]}
            mid_upload = any(k.endswith(".log") and k not in named for k in keys)
        c.kill(f"broker-{victim}")
        killed_at = load.acked_count()
        load.wait_acked(killed_at + 6000, timeout=90)
        new_leader = partition_leaders(c, topic)[0]
        assert new_leader != victim
        c.start(f"broker-{victim}")
        wait_full_isr(c, topic)
        load.wait_acked(load.acked_count() + 2000)
        load.finish()
        assert not load.failed, f"{len(load.failed)} produce failures, e.g. {list(load.failed.items())[:3]}"

        # Everything sealed reaches the cold tier through the new leader.
        deadline = time.monotonic() + 90
        while True:
            leader = partition_leaders(c, topic)[0]
            m = c.broker_metrics(leader)
            start = m.get(f'strata_partition_log_start_offset{{topic="{topic}",partition="0"}}', 0)
            if m.get("strata_under_tiered_bytes", 1) == 0 and start > 0:
                break
            assert time.monotonic() < deadline, f"backlog on broker {leader}: {m.get('strata_under_tiered_bytes')}"
            time.sleep(0.2)
        manifests, keys = bucket_manifests(s3_endpoint, bucket)
        assert len(manifests) == 1
        (manifest,) = manifests.values()
        orphans = check_manifest(manifest, keys)
        assert manifest["log_start"] == 0
        assert manifest["segments"][-1]["end_offset"] >= start, "the cold tier reaches the local log start"
        epochs = {s["leader_epoch"] for s in manifest["segments"]}
        assert len(epochs) >= 2, f"segments uploaded by both leaders: epochs {epochs}"
        print(f"\nkilled mid-upload: {mid_upload}; {len(manifest['segments'])} segments in the manifest, "
              f"leader epochs {sorted(epochs)}, {len(orphans)} orphaned segment objects")
        # The leader deletes what the killed upload left once past the grace period (3 s).
        deadline = time.monotonic() + 30
        while orphans:
            assert time.monotonic() < deadline, f"orphans not deleted: {sorted(orphans)}"
            time.sleep(0.5)
            manifests, keys = bucket_manifests(s3_endpoint, bucket)
            orphans = check_manifest(next(iter(manifests.values())), keys)
        # Every acknowledged record, from offset 0: the cold tier, then the local log.
        verify(c, load, partitions=1, topic=topic)
    finally:
        c.stop_all()
        attach_logs_on_failure(request, c, 80)


def s3_broker(tmp_path, endpoint) -> Broker:
    """A started broker tiering to a new bucket of the S3 server at `endpoint`, with 1 s
    object-store requests and quick tiering and retention rounds."""
    bucket = new_bucket(endpoint)
    b = Broker(strata_bin(), tmp_path)
    b.extra_env = {
        "STRATA__COLD__URL": f"s3://{bucket}/strata", "STRATA__COLD__ENDPOINT": endpoint,
        "STRATA__COLD__PATH_STYLE": "true", "STRATA__COLD__INTERVAL": "200ms",
        "STRATA__COLD__REQUEST_TIMEOUT": "1s",
        "STRATA__TOPICS__RETENTION_CHECK_INTERVAL": "200ms", **S3_ENV,
    }
    b.bucket = bucket
    b.start()
    return b


def test_store_stopped_under_load_loses_nothing_and_uploads_resume(tmp_path):
    """moto_server is SIGSTOPped for a while under acks=all load: requests to it hang and
    time out, uploads fail and are retried, local disk keeps the backlog (nothing not
    uploaded is deleted), and a cold replay started meanwhile waits it out. On SIGCONT the
    backlog drains, local retention catches up, and every acknowledged record reads back."""
    from confluent_kafka import Producer

    moto, endpoint = start_moto(tmp_path)
    b = None
    try:
        b = s3_broker(tmp_path, endpoint)
        b.create_topic("ledger", 1, {"segment.bytes": SEGMENT, "remote.storage.enable": "true",
                                     "local.retention.bytes": LOCAL, "retention.ms": -1})
        acked, failed = [], []
        producer = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5,
                                          "enable.idempotence": True}))

        def on_delivery(err, msg):
            (failed if err is not None else acked).append(msg.offset() if err is None else err)

        stop = threading.Event()
        sent = [0]

        def produce():
            while not stop.is_set():
                for _ in range(100):
                    i = sent[0]
                    try:
                        producer.produce("ledger", key=record_key(i).encode(), value=record_value(i).encode(),
                                         on_delivery=on_delivery)
                    except BufferError:
                        break
                    sent[0] += 1
                producer.poll(0.02)

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        start_key = 'strata_partition_log_start_offset{topic="ledger",partition="0"}'
        # Before the outage: some segments tiered, and local retention has deleted the
        # first (so a replay from 0 needs the cold tier).
        deadline = time.monotonic() + 60
        while True:
            m = metrics(b)
            if m.get("strata_tiered_segments_total", 0) >= 3 and m.get(start_key, 0) > 0:
                break
            assert time.monotonic() < deadline, f"nothing tiered and deleted locally before the outage: {m.get(start_key)}"
            time.sleep(0.1)

        moto.send_signal(signal.SIGSTOP)
        try:
            paused = metrics(b)
            # A cold replay from offset 0 starts while the store is down.
            replay = {}
            reader = threading.Thread(target=lambda: replay.update(
                zip(("out", "hwm"), consume_partitions(b.bootstrap, "ledger", 1, time.monotonic() + 120))), daemon=True)
            reader.start()
            # at least 10 s down, and until an upload has failed (each try takes up to
            # about 5 s: a 1 s request timeout, retried within 4 s)
            down = time.monotonic()
            while True:
                time.sleep(0.5)
                during = metrics(b)
                failed_uploads = during.get("strata_tier_upload_errors_total", 0) > paused.get(
                    "strata_tier_upload_errors_total", 0)
                if (failed_uploads and time.monotonic() - down >= 10) or time.monotonic() - down > 40:
                    break
            local_during = local_log_bytes(b, "ledger", 0)
        finally:
            moto.send_signal(signal.SIGCONT)
        # Uploads failed and were retried; the backlog stayed on local disk.
        assert during.get("strata_tier_upload_errors_total", 0) > paused.get("strata_tier_upload_errors_total", 0)
        assert during["strata_under_tiered_bytes"] > 2 * SEGMENT, during["strata_under_tiered_bytes"]
        assert local_during > LOCAL + 2 * SEGMENT, local_during
        # (That nothing not uploaded was deleted shows below: every record reads back.)

        # The store is back: the backlog drains and local retention catches up.
        deadline = time.monotonic() + 90
        while True:
            m = metrics(b)
            if m.get("strata_under_tiered_bytes", 1) == 0 and local_log_bytes(b, "ledger", 0) <= LOCAL + 2 * SEGMENT:
                break
            assert time.monotonic() < deadline, f"backlog not drained: {m.get('strata_under_tiered_bytes')}\n{b.stderr_tail()}"
            time.sleep(0.2)
        stop.set()
        t.join()
        assert producer.flush(60) == 0
        assert not failed, f"{len(failed)} produce failures, e.g. {failed[:3]}"
        reader.join(timeout=120)
        assert "out" in replay, "the replay started during the outage did not finish"
        # It read up to the high watermark it saw, the first paused[start_key] records from
        # the cold tier (they were no longer on local disk).
        got = [o for o, _, _ in replay["out"][0]]
        assert got == list(range(len(got))) and len(got) >= replay["hwm"][0]
        assert paused[start_key] > 0

        # Every acknowledged record, from offset 0.
        out, hwm = consume_partitions(b.bootstrap, "ledger", 1, time.monotonic() + 120)
        assert [o for o, _, _ in out[0]] == list(range(hwm[0]))
        assert [v for _, _, v in out[0]] == list(range(len(out[0])))
        assert sorted(acked) == list(range(len(acked))) and len(acked) <= hwm[0]
        manifests, keys = bucket_manifests(endpoint, b.bucket)
        (manifest,) = manifests.values()
        check_manifest(manifest, keys)
    finally:
        moto.send_signal(signal.SIGCONT)
        if b is not None:
            b.stop()
        moto.kill()
        moto.wait()


def test_a_restart_while_the_store_is_down_hides_no_cold_history(tmp_path):
    """The broker restarts while moto_server is SIGSTOPped, so it cannot read the
    partition's manifest: until it can, ListOffsets earliest and fetches below the local
    log answer retriable errors, not the local log start (a consumer resetting to earliest
    would otherwise start after the history only the cold tier holds). Once the store is
    back, a new group from the earliest offset reads every record from offset 0."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    moto, endpoint = start_moto(tmp_path)
    b = None
    try:
        b = s3_broker(tmp_path, endpoint)
        n = 20_000
        b.create_topic("ledger", 1, {"segment.bytes": SEGMENT, "remote.storage.enable": "true",
                                     "local.retention.bytes": LOCAL, "retention.ms": -1})
        p = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 20,
                                   "batch.size": 16384}))
        for i in range(n):
            p.produce("ledger", key=record_key(i).encode(), value=record_value(i).encode())
            if i % 1000 == 0:
                p.poll(0)
        assert p.flush(60) == 0
        start_key = 'strata_partition_log_start_offset{topic="ledger",partition="0"}'
        deadline = time.monotonic() + 60
        while True:
            m = metrics(b)
            if m.get("strata_under_tiered_bytes", 1) == 0 and m.get(start_key, 0) > n // 4:
                break
            assert time.monotonic() < deadline, f"not tiered: local start {m.get(start_key)}"
            time.sleep(0.2)
        local_start = int(m[start_key])

        b.kill()
        moto.send_signal(signal.SIGSTOP)
        try:
            b.start()
            # Ready (registered, metadata applied, the replica open and leading); the
            # manifest cannot be read, the store being stopped.
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{b.metrics_port}/readyz", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "the restarted broker never became ready"
                time.sleep(0.1)
            # The broker cannot tell where the cold tier starts: no answer, rather than a
            # wrong one.
            # (librdkafka folds a low watermark it did not get into the high one: `low == n`
            # means no earliest offset was given, which is right; an offset inside the
            # history, such as the local log start, is the defect.)
            c = Consumer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "group.id": "wm"}))
            try:
                low, _ = c.get_watermark_offsets(TopicPartition("ledger", 0), timeout=3)
                assert not 0 < low < n, f"earliest answered {low} while the manifest is unknown (local start {local_start})"
            except KafkaException:
                pass
            finally:
                c.close()
            group = Consumer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "group.id": "late-auditor",
                                           "auto.offset.reset": "earliest", "enable.auto.commit": False}))
            group.subscribe(["ledger"])
            early = [m for m in group.consume(num_messages=1000, timeout=4) if m.error() is None]
            assert not early, f"read from {early[0].offset()} while the cold tier was unknown (local start {local_start})"
        finally:
            moto.send_signal(signal.SIGCONT)
        seen = []
        deadline = time.monotonic() + 90
        while len(seen) < n:
            assert time.monotonic() < deadline, f"read {len(seen)} of {n} after the store came back"
            for m in group.consume(num_messages=5000, timeout=0.5):
                if m.error() is None:
                    seen.append(m.offset())
        group.close()
        assert seen == list(range(n)), f"first offsets {seen[:3]}"
    finally:
        if b is not None:
            b.stop()
        moto.send_signal(signal.SIGCONT)
        moto.kill()
        moto.wait()
