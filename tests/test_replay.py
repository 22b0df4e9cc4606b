"""strata-replay against a real bucket with the cluster down: records produced by
confluent-kafka with every compression codec (none, gzip, snappy, lz4, zstd), keys, binary
values and headers are tiered; the broker is stopped; `ls` lists the topic, `cat` prints
every tiered record as JSON lines, and `export --format parquet` writes files that pyarrow
and DuckDB read back with the exact record count, offsets, keys and values. A bit flip in
a segment object is caught by CRC and named; --skip-corrupt skips it and says so.
"""

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import Broker, free_port, rdkafka_conf, scrape_metrics, strata_bin
from kafka_wire import raw_batch

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
PER_CODEC = 4000
PARTITIONS = 2
TOPIC = "trades"


def replay_bin():
    return str(Path(strata_bin()).parent / "strata-replay")


def run_replay(cold_url, *args, check=True, timeout=120):
    r = subprocess.run([replay_bin(), "--url", cold_url, *args], capture_output=True, timeout=timeout,
                       env=dict(os.environ, NO_COLOR="1"))
    if check:
        assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
    return r


def metrics(b):
    return scrape_metrics(b.metrics_port)


def value_of(codec, i):
    # Every tenth value is binary (not UTF-8), the rest text.
    if i % 10 == 0:
        return bytes([0xff, 0xfe, i % 256, (i // 256) % 256]) + codec.encode()
    return f"{codec}-value-{i}".encode()


@pytest.fixture(scope="module")
def archived(tmp_path_factory):
    """A stopped broker whose tiered topic holds every produced record in the cold tier:
    (cold URL, {(partition, offset): (key, value, headers)})."""
    from confluent_kafka import Producer

    tmp = tmp_path_factory.mktemp("replay")
    b = Broker(strata_bin(), tmp)
    b.extra_env = {"STRATA__COLD__INTERVAL": "200ms", "STRATA__TOPICS__RETENTION_CHECK_INTERVAL": "200ms"}
    b.start()
    try:
        b.create_topic(TOPIC, PARTITIONS, {"segment.bytes": 32 << 10, "segment.ms": 1000, "remote.storage.enable": "true",
                                           "local.retention.bytes": 64 << 10, "retention.ms": -1})
        produced = {}

        def delivered(headers):
            def report(err, msg):
                assert err is None, err
                produced[(msg.partition(), msg.offset())] = (msg.key(), msg.value(), headers)
            return report

        for codec in CODECS:
            p = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 10,
                                       "compression.type": codec, "enable.idempotence": True}))
            for i in range(PER_CODEC):
                # A repeated header key: both values, in order, must survive.
                headers = [("codec", codec.encode()), ("seq", str(i).encode()), ("codec", b"again")]
                p.produce(TOPIC, key=f"{codec}-{i % 50}".encode(), value=value_of(codec, i),
                          headers=headers, on_delivery=delivered(headers))
                if i % 1000 == 0:
                    p.poll(0)
            assert p.flush(30) == 0
        assert len(produced) == len(CODECS) * PER_CODEC
        # Let segment.ms pass, then one more record per partition rolls the last data
        # segment, so every produced record gets sealed and tiered.
        time.sleep(1.5)
        p = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "acks": "all"}))
        for part in range(PARTITIONS):
            p.produce(TOPIC, value=b"filler", partition=part)
        assert p.flush(30) == 0
        ends = {part: max(o for (pp, o) in produced if pp == part) + 1 for part in range(PARTITIONS)}
        cold = b.data_dir / "cold"

        def tiered_end(part):
            manifests = sorted(cold.glob(f"*/*/{part}/manifest/*.json"))
            segs = json.loads(manifests[-1].read_text())["segments"] if manifests else []
            return segs[-1]["end_offset"] if segs else 0

        # Every produced record reaches the cold tier.
        deadline = time.monotonic() + 60
        while any(tiered_end(part) < ends[part] for part in range(PARTITIONS)):
            assert time.monotonic() < deadline, \
                f"not tiered: {[tiered_end(p) for p in range(PARTITIONS)]} of {ends}\n{b.stderr_tail()}"
            time.sleep(0.3)
    finally:
        b.stop()  # the cluster is down from here on
    return f"file://{cold}", produced


def test_ls_lists_topics_partitions_and_ranges(archived):
    url, produced = archived
    out = run_replay(url, "ls").stdout.decode()
    assert f"{TOPIC} (cluster " in out, out
    for part in range(PARTITIONS):
        line = next(line for line in out.splitlines() if line.strip().startswith(f"{part}: offsets 0.."))
        assert "segments" in line and "MB" in line, line


def test_cat_prints_every_record_as_json_lines(archived):
    url, produced = archived
    r = run_replay(url, "cat", TOPIC)
    seen = {}
    for line in r.stdout.decode().splitlines():
        rec = json.loads(line)
        if rec["value"] == "filler":
            continue
        v = rec["value"]
        value = base64.b64decode(v["base64"]) if isinstance(v, dict) else v.encode()
        headers = [(h["key"], h["value"].encode()) for h in rec["headers"]]
        assert rec["topic"] == TOPIC and rec["timestamp"] > 0
        seen[(rec["partition"], rec["offset"])] = (rec["key"].encode(), value, headers)
    assert seen == produced, f"{len(seen)} records printed, {len(produced)} produced"
    assert "records" in r.stderr.decode()
    # An offset range of one partition.
    r = run_replay(url, "cat", TOPIC, "--partitions", "1", "--from-offset", "100", "--to-offset", "150")
    offsets = [json.loads(line)["offset"] for line in r.stdout.decode().splitlines()]
    assert offsets == list(range(100, 150))


def test_export_to_parquet_reads_back_in_pyarrow_and_duckdb(archived, tmp_path):
    import duckdb
    import pyarrow.dataset as ds

    url, produced = archived
    out = tmp_path / "export"
    r = run_replay(url, "export", TOPIC, "--format", "parquet", "--out", str(out), "--row-group-rows", "5000")
    assert "exported" in r.stderr.decode(), r.stderr.decode()
    files = sorted(out.rglob("*.parquet"))
    assert files and all(f"topic={TOPIC}" in str(f) and "/date=" in str(f) for f in files), files

    table = ds.dataset(out, format="parquet", partitioning="hive").to_table()
    got = {}
    for row in table.to_pylist():
        if row["value"] == b"filler":
            continue
        got[(row["partition"], row["offset"])] = (row["key"], row["value"],
                                                  [(h["key"], h["value"]) for h in row["headers"]])
    assert got == produced, f"pyarrow read {len(got)} records, {len(produced)} produced"
    assert str(table.schema.field("timestamp").type) == "timestamp[ms, tz=UTC]"

    con = duckdb.connect()
    glob = str(out / "**" / "*.parquet")
    n, distinct, partitions = con.execute(
        f"select count(*), count(distinct (partition, \"offset\")), count(distinct partition) "
        f"from read_parquet('{glob}', hive_partitioning=false) where value <> 'filler'::blob").fetchone()
    assert (n, distinct, partitions) == (len(produced), len(produced), PARTITIONS)
    rows = con.execute(f"select partition, \"offset\", key, value from read_parquet('{glob}', hive_partitioning=false) "
                       f"where value <> 'filler'::blob").fetchall()
    assert {(p, o): (bytes(k), bytes(v)) for p, o, k, v in rows} == {k: (v[0], v[1]) for k, v in produced.items()}


def test_a_damaged_object_is_named_and_skipped_only_when_asked(archived, tmp_path):
    import shutil

    url, produced = archived
    cold = Path(url[len("file://"):])
    copy = tmp_path / "cold"
    shutil.copytree(cold, copy)
    victim = sorted(copy.glob("*/*/0/segments/*.log"))[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    r = run_replay(f"file://{copy}", "cat", TOPIC, check=False)
    err = r.stderr.decode()
    assert r.returncode != 0
    assert victim.name in err and "crc" in err.lower() and "--skip-corrupt" in err, err
    assert len(err.strip().splitlines()) == 1, err
    r = run_replay(f"file://{copy}", "cat", TOPIC, "--skip-corrupt")
    err = r.stderr.decode()
    assert "skipped 1 damaged segment" in err, err
    printed = len(r.stdout.decode().splitlines())
    assert 0 < printed < len(produced) + PARTITIONS


def plant(cold, part, make_batch):
    """Appends a segment holding `make_batch(base offset)` to partition `part` of the cold
    tier at `cold`, as its leader would have uploaded it (object, empty indexes, a new
    manifest version); returns its offset."""
    newest = sorted(cold.glob(f"*/*/{part}/manifest/*.json"))[-1]
    m = json.loads(newest.read_text())
    last = m["segments"][-1]
    batch = make_batch(last["end_offset"])
    key = f"{newest.parent.parent.relative_to(cold)}/segments/{last['end_offset']:020}-1-{'b' * 32}.log"
    (cold / key).write_bytes(batch)
    for suffix in (".index", ".timeindex"):
        (cold / f"{key}{suffix}").write_bytes(b"")
    seg = {k: v for k, v in last.items() if k != "compacted"}
    seg.update(base_offset=last["end_offset"], end_offset=last["end_offset"] + 1, size_bytes=len(batch), key=key)
    m["segments"].append(seg)
    m["version"] += 1
    (newest.parent / f"{m['version']:020}.json").write_text(json.dumps(m))
    return last["end_offset"]


def peak_rss_mb(argv, timeout=120):
    """Runs argv; (completed process, its peak RSS in MB), measured by a wrapper whose only
    child it is."""
    wrapper = ("import resource, subprocess, sys\n"
               "r = subprocess.run(sys.argv[1:], capture_output=True)\n"
               "sys.stdout.buffer.write(r.stdout); sys.stderr.buffer.write(r.stderr)\n"
               "sys.stderr.write('\\nPEAK_RSS_KB=%d' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
               "sys.exit(r.returncode)\n")
    r = subprocess.run([sys.executable, "-c", wrapper, *argv], capture_output=True, timeout=timeout,
                       env=dict(os.environ, NO_COLOR="1"))
    err = r.stderr.decode(errors="replace")
    body, _, peak = err.rpartition("\nPEAK_RSS_KB=")
    r.stderr = body.encode()
    return r, int(peak) / 1024


def test_decompression_bombs_in_the_bucket_stop_replay_with_one_line_in_bounded_memory(archived, tmp_path):
    """Issue 17: strata-replay reading a 33-byte snappy batch whose header claims a huge
    length peaked at 1.06 GB RSS, and a 917 KB gzip batch drove it to 936 MB. Any producer
    can plant such a batch. Replay must stop on it with one line naming it, its memory
    bounded by the decoder's limit (64 MiB of output per batch)."""
    import gzip
    import shutil

    url, _ = archived
    cold = Path(url[len("file://"):])
    snappy_claim = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F]) + bytes(28)  # 4 GiB - 1, in 33 bytes
    gzip_bomb = gzip.compress(bytes(900 << 20), compresslevel=9)
    assert len(gzip_bomb) < 1 << 20
    r, baseline = peak_rss_mb([replay_bin(), "--url", url, "cat", TOPIC, "--partitions", "0"])
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    for name, attributes, body in (("snappy", 2, snappy_claim), ("gzip", 1, gzip_bomb)):
        copy = tmp_path / name
        shutil.copytree(cold, copy)
        now = int(time.time() * 1000)
        offset = plant(copy, 0, lambda base: raw_batch(base, attributes, body, now))
        r, peak = peak_rss_mb([replay_bin(), "--url", f"file://{copy}", "cat", TOPIC, "--partitions", "0"])
        err = r.stderr.decode(errors="replace").strip()
        print(f"{name} bomb ({len(body)} bytes): exit {r.returncode}, peak RSS {peak:.0f} MB "
              f"(a clean replay of the partition: {baseline:.0f} MB): {err}")
        assert r.returncode != 0, f"{name}: the bomb was replayed"
        assert len(err.splitlines()) == 1, err
        assert "decompress" in err and "more than" in err and f"offset {offset}" in err, err
        assert peak < baseline + 200, f"{name}: peak RSS {peak:.0f} MB against {baseline:.0f} MB for a clean replay"


def test_bad_input_gets_one_clear_line(archived):
    url, _ = archived
    for args, says in [(["cat", "nosuch"], "no topic 'nosuch'"),
                       (["cat", TOPIC, "--partitions", "9"], "no partition 9"),
                       (["cat", TOPIC, "--from-time", "yesterday"], "RFC 3339"),
                       (["export", TOPIC, "--out", "/tmp/x", "--compression", "brotli"], "unknown compression")]:
        r = run_replay(url, *args, check=False)
        err = r.stderr.decode()
        assert r.returncode != 0 and says in err and len(err.strip().splitlines()) == 1, (args, err)
    r = run_replay("ftp://bucket", "ls", check=False)
    assert r.returncode != 0 and "unsupported scheme" in r.stderr.decode()
    # No credentials anywhere: one line saying what to set.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
               AWS_CONFIG_FILE="/nonexistent")
    r = subprocess.run([replay_bin(), "--url", "s3://archive", "--endpoint", "http://127.0.0.1:9", "ls"],
                       capture_output=True, timeout=60, env=env)
    err = r.stderr.decode()
    assert r.returncode != 0 and "no AWS credentials" in err and len(err.strip().splitlines()) == 1, err


def read_all(bootstrap, topic, partitions):
    """Every record of `topic` from offset 0 to the high watermark, with confluent-kafka:
    {(partition, offset): (key, value, headers, timestamp)}."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(rdkafka_conf({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}))
    try:
        hwm = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out = {}
        deadline = time.monotonic() + 60
        while sum(1 for k in out) < sum(hwm.values()):
            assert time.monotonic() < deadline, f"read {len(out)} of {hwm}"
            for msg in c.consume(num_messages=5000, timeout=0.5):
                assert msg.error() is None, msg.error()
                out[(msg.partition(), msg.offset())] = (msg.key(), msg.value(), msg.headers() or [], msg.timestamp()[1])
        return out
    finally:
        c.close()


def source_records(url):
    out = {}
    for line in run_replay(url, "cat", TOPIC).stdout.decode().splitlines():
        r = json.loads(line)
        enc = lambda v: None if v is None else (base64.b64decode(v["base64"]) if isinstance(v, dict) else v.encode())  # noqa: E731
        out[(r["partition"], r["offset"])] = (enc(r["key"]), enc(r["value"]),
                                              [(h["key"], enc(h["value"])) for h in r["headers"]], r["timestamp"])
    return out


@pytest.mark.parametrize("transport", ["kafka", "grpc"])
def test_replay_to_another_cluster_reproduces_the_topic_and_resumes_after_sigkill(archived, tmp_path, transport):
    url, produced = archived
    target = Broker(strata_bin(), tmp_path)
    grpc = f"127.0.0.1:{free_port()}"
    target.extra_env = {"STRATA__GRPC__LISTEN": grpc}
    target.start()
    try:
        target.create_topic("trades-copy", PARTITIONS)
        checkpoint = tmp_path / "replay.checkpoint"
        to = ["--to-bootstrap", target.bootstrap] if transport == "kafka" else ["--to-grpc", grpc]
        args = [replay_bin(), "--url", url, "replay", TOPIC, *to, "--to-topic", "trades-copy", "--acks", "all", "--checkpoint", str(checkpoint), "--batch-bytes", "8192"]
        # Cut short by SIGKILL partway (rate-capped so it is still running), then rerun.
        first = subprocess.Popen(args + ["--records-per-sec", "5000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not checkpoint.exists():
            assert first.poll() is None, first.stderr.read().decode()
            assert time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.05)
        time.sleep(1)
        assert first.poll() is None, "the first run finished before it could be cut short"
        first.kill()
        first.wait()
        cut = json.loads(checkpoint.read_text())
        done = sum(p["next_source_offset"] for p in cut["partitions"].values())
        assert 0 < done < len(produced), cut
        second = subprocess.run(args, capture_output=True, timeout=120)
        assert second.returncode == 0, second.stderr.decode()[-2000:]
        assert "replayed" in second.stderr.decode()
        assert ("(gRPC)" in second.stderr.decode()) == (transport == "grpc")

        src = source_records(url)
        copy = read_all(target.bootstrap, "trades-copy", PARTITIONS)
        assert len(copy) == len(src), f"{len(copy)} records in the copy, {len(src)} in the source (duplicates or gaps)"
        assert copy == src, "the copy differs from the source"
        # A rerun after completion writes nothing more.
        again = subprocess.run(args, capture_output=True, timeout=120)
        assert again.returncode == 0, again.stderr.decode()[-2000:]
        assert len(read_all(target.bootstrap, "trades-copy", PARTITIONS)) == len(src)
    finally:
        target.stop()


def test_include_hot_adds_the_not_yet_tiered_tail(tmp_path):
    from confluent_kafka import Producer

    b = Broker(strata_bin(), tmp_path)
    b.extra_env = {"STRATA__COLD__INTERVAL": "200ms"}
    b.start()
    try:
        b.create_topic("live", 1, {"segment.bytes": 16 << 10, "remote.storage.enable": "true"})
        p = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5}))
        n = 3000
        for i in range(n):
            p.produce("live", key=str(i).encode(), value=f"v{i}".encode())
            if i % 100 == 99:
                assert p.flush(30) == 0  # many small batches: segments roll
        url = f"file://{b.data_dir / 'cold'}"
        deadline = time.monotonic() + 30
        while True:
            r = run_replay(url, "cat", "live", check=False)
            if r.returncode == 0 and r.stdout:
                break
            assert time.monotonic() < deadline, r.stderr.decode()
            time.sleep(0.3)
        cold_only = [json.loads(line)["offset"] for line in r.stdout.decode().splitlines()]
        assert cold_only == list(range(len(cold_only))) and 0 < len(cold_only) < n
        r = run_replay(url, "cat", "live", "--include-hot", b.bootstrap)
        both = [json.loads(line) for line in r.stdout.decode().splitlines()]
        assert [x["offset"] for x in both] == list(range(n)), "every record once, cold then hot"
        assert [x["value"] for x in both] == [f"v{i}" for i in range(n)]
    finally:
        b.stop()
