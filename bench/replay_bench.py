#!/usr/bin/env python3
"""strata-replay and strata-compactor figures. Prints; asserts nothing about speed.

A broker tiers a compacted topic (updates over 5,000 keys, by default 400k of them) to a
local directory (its embedded file:// store) and stops; then, with the cluster down:

- `strata-replay export --format parquet` (zstd, 131,072-row groups): records/s and MB/s,
  as a ratio to pyarrow writing the same records (the table read back from the export)
  with the same settings (zstd level 1, 131,072-row groups, 1 MiB pages and dictionary
  pages, statistics, no dictionary for the offset column), measured in the same run, in wall
  and in CPU time (on a busy machine the export's wall time is its CPU time): pyarrow's
  figure is the write alone, strata's includes reading the bucket, CRC checks and
  decoding; the peak memory (max RSS) of each;
- the same export with the bucket and the output on an S3-compatible server (moto_server,
  as the tests use) with `--s3`;
- `strata-replay cat` to /dev/null: records/s and MB/s of JSON lines;
- `strata-compactor once`: records/s and MB/s of segments compacted (two passes over the
  range, rewriting and upload included), as a ratio to `cat`'s records/s.

The history is produced by `--producers` librdkafka (confluent-kafka) processes at once with
large lz4 batches, so 10M records take about a minute; `--keep DIR` keeps the history and
reuses it on the next run with the same DIR (A/B runs of the export without producing again).

Usage: STRATA_BIN=target/release/strata python3 bench/replay_bench.py [--records 400000]
       [--producers 2] [--keep DIR] [--s3] [--runs 1] [--no-cat] [--no-compactor]
(strata-replay and strata-compactor are looked for beside STRATA_BIN.)
"""
import argparse
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, proc):
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit("strata did not start")
            time.sleep(0.1)


def produce(bootstrap, first, end, value_bytes):
    """Child process: records first..end of the history, keys over 5,000 accounts."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 50, "batch.size": 1 << 20,
                  "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000,
                  "queue.buffering.max.kbytes": 1 << 20})
    pad = "x" * max(0, value_bytes - 40)
    headers = [("source", b"bench")]
    produce_one = p.produce
    for i in range(first, end):
        while True:
            try:
                produce_one("ledger", key=f"account-{i % 5000}".encode(),
                            value=f'{{"seq": {i}, "amount": {i % 9973}, "memo": "{pad}"}}'.encode(),
                            headers=headers)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(600)


def history(strata, work, records, value_bytes, producers):
    """A broker tiers `records` records of topic `ledger` into work/data/cold and stops."""
    kafka, ctl, mport = free_port(), free_port(), free_port()
    bootstrap = f"127.0.0.1:{kafka}"
    log = open(work / "broker.log", "ab")
    env = dict(os.environ, STRATA__COLD__INTERVAL="200ms")
    broker = subprocess.Popen([strata, "dev", "--data-dir", str(work / "data"), "--listen", bootstrap,
                               "--controller-listen", f"127.0.0.1:{ctl}", "--metrics", f"127.0.0.1:{mport}"],
                              stdout=log, stderr=log, env=env)
    try:
        wait_port(kafka, broker)
        for _ in range(100):
            if subprocess.run([strata, "topic", "--bootstrap", bootstrap, "create", "ledger", "-p", "2",
                               "--config", "segment.bytes=4194304", "--config", "segment.ms=2000",
                               "--config", "remote.storage.enable=true", "--config", "cleanup.policy=compact"],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        start = time.perf_counter()
        share = -(-records // producers)
        children = [subprocess.Popen([sys.executable, __file__, "--produce-child", bootstrap, str(first),
                                      str(min(records, first + share)), str(value_bytes)])
                    for first in range(0, records, share)]
        for c in children:
            if c.wait() != 0:
                sys.exit("a producer failed")
        took = time.perf_counter() - start
        print(f"history: {records} records produced in {took:.1f} s ({records / took:,.0f} records/s, "
              f"{len(children)} producer processes)", flush=True)
        time.sleep(2.5)  # segment.ms passes; one more record per partition rolls the rest
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for part in (0, 1):  # a compacted topic takes keyed records only
            p.produce("ledger", key=b"roll", value=b"roll", partition=part)
        if p.flush(30) != 0:
            sys.exit("the records rolling the last segments were not acknowledged")
        deadline = time.monotonic() + 120 + records / 50_000
        settle = time.monotonic() + 5
        while True:
            text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read().decode()
            under = [line for line in text.splitlines() if line.startswith("strata_under_tiered_bytes ")]
            if under and float(under[0].split()[1]) == 0 and time.monotonic() > settle:
                break
            if time.monotonic() > deadline:
                sys.exit("not tiered in time")
            time.sleep(0.5)
    finally:
        broker.terminate()
        broker.wait(timeout=30)


def run(cmd, stdout=subprocess.DEVNULL, env=None):
    """Runs `cmd` under GNU time: (seconds, peak RSS in MB, stderr); exits on failure. The
    CPU seconds it used (user + system) are in `run.cpu` after."""
    with tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile("r") as rss:
        start = time.perf_counter()
        status = subprocess.run(["/usr/bin/time", "-f", "%U %S\n%M", "-o", rss.name, *cmd], stdout=stdout, stderr=err,
                                env=env).returncode
        took = time.perf_counter() - start
        err.seek(0)
        text = err.read().decode(errors="replace").strip()
        peak = rss.read().strip().splitlines()
    if status != 0:
        sys.exit(f"{cmd[0]} failed: {text}")
    run.cpu = sum(float(x) for x in peak[-2].split())
    return took, int(peak[-1]) / 1024, text


# Columns strata-replay writes without a dictionary (replay-cli's PLAIN_COLUMNS): pyarrow is
# given the same, every other column with one (both libraries' default).
PLAIN_COLUMNS = ("offset",)


def leaf_paths(schema):
    """The Parquet column paths pyarrow writes for `schema` (lists as `name.list.element`)."""
    import pyarrow as pa

    def walk(prefix, t):
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            yield from walk(f"{prefix}.list.element", t.value_type)
        elif pa.types.is_struct(t):
            for f in t:
                yield from walk(f"{prefix}.{f.name}", f.type)
        else:
            yield prefix

    return [p for f in schema for p in walk(f.name, f.type)]


def plain_read(cold):
    """Seconds to read every segment object of the local bucket once (1 MiB reads into one
    buffer: the page-cache copy a plain GET of a local directory is), and their bytes."""
    files = sorted(cold.glob("*/*/*/segments/*.log"))
    buf = bytearray(1 << 20)
    total = 0
    start = time.perf_counter()
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                total += n
    return time.perf_counter() - start, total


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=400_000)
    ap.add_argument("--value-bytes", type=int, default=200)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--keep", help="keep the history in this directory and reuse it when it is there")
    ap.add_argument("--runs", type=int, default=1, help="exports (and pyarrow writes) to run, alternating")
    ap.add_argument("--s3", action="store_true", help="also export from and to moto_server")
    ap.add_argument("--no-cat", action="store_true")
    ap.add_argument("--no-compactor", action="store_true")
    ap.add_argument("--produce-child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.produce_child:
        bootstrap, first, end, value_bytes = args.produce_child
        return produce(bootstrap, int(first), int(end), int(value_bytes))
    strata = os.environ.get("STRATA_BIN", "target/release/strata")
    replay = str(Path(strata).parent / "strata-replay")
    compactor = str(Path(strata).parent / "strata-compactor")
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as scratch:
        work = Path(args.keep) if args.keep else Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        cold = work / "data" / "cold"
        if not (work / "history.done").exists():
            shutil.rmtree(work / "data", ignore_errors=True)
            history(strata, work, args.records, args.value_bytes, args.producers)
            if args.keep:
                (work / "history.done").write_text(str(args.records))
        else:
            print(f"history: reused from {work} ({(work / 'history.done').read_text()} records)")
        url = f"file://{cold}"
        segment_bytes = sum(f.stat().st_size for f in cold.glob("*/*/*/segments/*.log"))
        print(f"== strata-replay, the cluster down, bucket on local disk ({segment_bytes / 1e6:.1f} MB of segments)",
              flush=True)
        out = work / "export"
        table = None
        for n in range(args.runs):
            shutil.rmtree(out, ignore_errors=True)
            # the ratio below follows the machine's load more than anything (docs/benchmarks.md)
            load = os.getloadavg()[0]
            took, rss, text = run([replay, "--url", url, "export", "ledger", "--format", "parquet", "--out", str(out)])
            print(text)
            if table is None:
                table = ds.dataset(out, format="parquet", partitioning="hive").to_table()
                rows = table.num_rows
                raw = sum(table.column(c).nbytes for c in ("key", "value", "headers"))
            export_rps = rows / took
            print(f"export: {rows} records in {took:.2f} s = {export_rps:,.0f} records/s, "
                  f"{raw / took / 1e6:.1f} MB/s of keys, values and headers; CPU {run.cpu:.2f} s; "
                  f"peak RSS {rss:.0f} MB")
            start, cpu = time.perf_counter(), time.process_time()
            pq.write_table(table, work / "pyarrow.parquet", compression="zstd", row_group_size=131_072,
                           use_dictionary=[c for c in leaf_paths(table.schema) if c not in PLAIN_COLUMNS])
            pa_took, pa_cpu = time.perf_counter() - start, time.process_time() - cpu
            print(f"pyarrow write_table of the same {rows} rows (zstd, 131,072-row groups, no dictionary for "
                  f"{', '.join(PLAIN_COLUMNS)}): {pa_took:.2f} s (CPU {pa_cpu:.2f} s) = "
                  f"{rows / pa_took:,.0f} records/s; this process's peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB "
                  f"(the table in memory included)")
            print(f"export / pyarrow write: {export_rps / (rows / pa_took):.2f}x, in CPU time {pa_cpu / run.cpu:.2f}x "
                  f"(the export also reads, checks and decodes); load average {load:.1f} before the export",
                  flush=True)
        get_took, got = plain_read(cold)
        print(f"plain read of the {got / 1e6:.1f} MB of segment objects: {get_took:.2f} s = {got / get_took / 1e6:.0f} MB/s; "
              f"export / plain read: {get_took / took:.2f}x", flush=True)
        if args.s3:
            s3_export(replay, work, cold, rows, raw)
        if not args.no_cat:
            with open(os.devnull, "wb") as null:
                took, rss, text = run([replay, "--url", url, "cat", "ledger"], stdout=null)
            print(f"cat to /dev/null: {rows / took:,.0f} records/s, {raw / took / 1e6:.1f} MB/s ({text}); "
                  f"peak RSS {rss:.0f} MB")
            cat_rps = rows / took
        if not args.no_compactor and not args.keep:
            start = time.perf_counter()
            r = subprocess.run([compactor, "--url", url, "once", "--work-dir", str(work / "compact")],
                               capture_output=True, text=True)
            took = time.perf_counter() - start
            if r.returncode != 0:
                sys.exit(r.stderr)
            after = sum(f.stat().st_size for f in cold.glob("*/*/*/segments/*.log")) - segment_bytes
            print(r.stdout.strip())
            versus = f"{rows / took / cat_rps:.2f}x cat's records/s; " if not args.no_cat else ""
            print(f"compaction: {rows} records, {segment_bytes / 1e6:.1f} MB of segments in {took:.2f} s = "
                  f"{rows / took:,.0f} records/s, {segment_bytes / took / 1e6:.1f} MB/s "
                  f"({versus}{after / 1e6:.2f} MB written)")


S3_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}


def s3_export(replay, work, cold, rows, raw):
    """The bucket copied to moto_server; the export from it to it, and a plain GET of the
    same segment objects (one at a time, boto3) for comparison."""
    import boto3

    port = free_port()
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, moto)
        endpoint = f"http://127.0.0.1:{port}"
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="bench", aws_secret_access_key="bench")
        s3.create_bucket(Bucket="bench")
        for f in cold.rglob("*"):
            if f.is_file():
                s3.upload_file(str(f), "bench", f"cold/{f.relative_to(cold)}")
        env = dict(os.environ, **S3_ENV)
        s3_args = ["--endpoint", endpoint, "--path-style"]
        print("== strata-replay export, bucket and output on moto_server", flush=True)
        took, rss, text = run([replay, "--url", "s3://bench/cold", *s3_args, "export", "ledger", "--out",
                               "s3://bench/export"], env=env)
        print(text)
        print(f"export from and to S3: {rows / took:,.0f} records/s, {raw / took / 1e6:.1f} MB/s; peak RSS {rss:.0f} MB")
        import pyarrow.parquet as pq

        back = work / "export-s3"
        shutil.rmtree(back, ignore_errors=True)
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix="export/"):
            for o in page.get("Contents", []):
                (back / o["Key"]).parent.mkdir(parents=True, exist_ok=True)
                s3.download_file("bench", o["Key"], str(back / o["Key"]))
        got_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in back.rglob("*.parquet"))
        if got_rows != rows:
            sys.exit(f"the S3 export holds {got_rows} rows, the local one {rows}")
        shutil.rmtree(back)
        keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix="cold/")
                for o in page.get("Contents", []) if o["Key"].endswith(".log")]
        start = time.perf_counter()
        got = sum(len(s3.get_object(Bucket="bench", Key=k)["Body"].read()) for k in keys)
        get_took = time.perf_counter() - start
        print(f"plain GET of the {got / 1e6:.1f} MB of segment objects (boto3, one at a time): {get_took:.2f} s = "
              f"{got / get_took / 1e6:.0f} MB/s; export / plain GET: {get_took / took:.2f}x", flush=True)
    finally:
        moto.kill()
        moto.wait()


if __name__ == "__main__":
    main()
