"""Tiered storage with a real broker process, against a local directory (`file://`) and a
real S3-compatible server (moto_server, with conditional writes): a topic with small
segments and short local retention receives many records; local disk keeps only recent
segments; a consumer from the earliest offset gets every record, in order and complete
(checked by content), most of them from the cold tier; kcat does the same.
"""

import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

from conftest import Broker, consume_partitions, free_port, kcat_bin, port_accepts, rdkafka_conf, record_value, strata_bin

N = 200_000
PARTITIONS = 2
SEGMENT = 64 << 10
LOCAL = 128 << 10


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)], stdout=log, stderr=log)
    deadline = time.monotonic() + 30
    while not port_accepts(port):
        assert proc.poll() is None, "moto_server exited"
        assert time.monotonic() < deadline, "moto_server did not start"
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


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
        b.bucket = f"cold-{uuid.uuid4().hex[:8]}"
        s3_client(s3_endpoint).create_bucket(Bucket=b.bucket)
        b.extra_env.update({
            "STRATA__COLD__URL": f"s3://{b.bucket}/strata",
            "STRATA__COLD__ENDPOINT": s3_endpoint,
            "STRATA__COLD__PATH_STYLE": "true",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
        })
    b.start()
    yield b
    b.stop()


def metrics(b):
    text = urllib.request.urlopen(f"http://127.0.0.1:{b.metrics_port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def local_log_bytes(b, topic, p):
    d = b.data_dir / "logs" / f"{topic}-{p}"
    return sum(f.stat().st_size for f in d.glob("*.log"))


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

    # A new consumer from the earliest offset reads every record, in order, by content.
    out, hwm = consume_partitions(b.bootstrap, "history", PARTITIONS, time.monotonic() + 180)
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
        # The objects are in the S3-compatible bucket: manifests and segments of both
        # partitions.
        s3 = s3_client(s3_endpoint)
        keys = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=b.bucket, Prefix="strata/"):
            keys += [o["Key"] for o in page.get("Contents", [])]
        assert any("/manifest/" in k for k in keys)
        assert sum(k.endswith(".log") for k in keys) >= from_cold / 5000
