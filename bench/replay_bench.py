#!/usr/bin/env python3
"""strata-replay and strata-compactor figures. Prints; asserts nothing about speed.

A broker tiers a compacted topic (400k updates over 5,000 keys) to a local directory (its
embedded file:// store) and stops; then, with the cluster down:

- `strata-replay export --format parquet` (zstd, 131,072-row groups): records/s and MB/s,
  as a ratio to pyarrow writing the same records (the table read back from the export)
  with the same settings: pyarrow's figure is the write alone, strata's includes reading
  the bucket, CRC checks and decoding;
- `strata-replay cat` to /dev/null: records/s and MB/s of JSON lines;
- `strata-compactor once`: records/s and MB/s of segments compacted (two passes over the
  range, rewriting and upload included), as a ratio to `cat`'s records/s.

Usage: STRATA_BIN=target/release/strata python3 bench/replay_bench.py [--records 400000]
(strata-replay and strata-compactor are looked for beside STRATA_BIN.)
"""
import argparse
import os
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


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=400_000)
    ap.add_argument("--value-bytes", type=int, default=200)
    args = ap.parse_args()
    strata = os.environ.get("STRATA_BIN", "target/release/strata")
    replay = str(Path(strata).parent / "strata-replay")
    compactor = str(Path(strata).parent / "strata-compactor")
    from confluent_kafka import Producer
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as work:
        work = Path(work)
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
                                   "--config", "remote.storage.enable=true", "--config", "cleanup.policy=compact"], capture_output=True).returncode == 0:
                    break
                time.sleep(0.1)
            p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "compression.type": "lz4"})
            pad = "x" * max(0, args.value_bytes - 40)
            for i in range(args.records):
                while True:
                    try:
                        p.produce("ledger", key=f"account-{i % 5000}".encode(),
                                  value=f'{{"seq": {i}, "amount": {i % 9973}, "memo": "{pad}"}}'.encode(),
                                  headers=[("source", b"bench")])
                        break
                    except BufferError:
                        p.poll(0.05)
            p.flush(120)
            time.sleep(2.5)  # segment.ms passes; one more record per partition rolls the rest
            for part in (0, 1):
                p.produce("ledger", value=b"roll", partition=part)
            p.flush(30)
            cold = work / "data" / "cold"
            deadline = time.monotonic() + 120
            while True:
                text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read().decode()
                under = [line for line in text.splitlines() if line.startswith("strata_under_tiered_bytes ")]
                if under and float(under[0].split()[1]) == 0 and time.monotonic() > deadline - 115:
                    break
                if time.monotonic() > deadline:
                    sys.exit("not tiered in time")
                time.sleep(0.5)
        finally:
            broker.terminate()
            broker.wait(timeout=30)
        url = f"file://{cold}"
        print("== strata-replay, the cluster down, bucket on local disk", flush=True)
        out = work / "export"
        start = time.perf_counter()
        r = subprocess.run([replay, "--url", url, "export", "ledger", "--format", "parquet", "--out", str(out)],
                           capture_output=True, text=True)
        took = time.perf_counter() - start
        if r.returncode != 0:
            sys.exit(r.stderr)
        print(r.stderr.strip())
        import pyarrow.dataset as ds

        table = ds.dataset(out, format="parquet", partitioning="hive").to_table()
        rows = table.num_rows
        raw = sum(table.column(c).nbytes for c in ("key", "value", "headers"))
        export_rps = rows / took
        print(f"export: {rows} records in {took:.2f} s = {export_rps:,.0f} records/s, {raw / took / 1e6:.1f} MB/s of keys, values and headers")
        start = time.perf_counter()
        pq.write_table(table, work / "pyarrow.parquet", compression="zstd", row_group_size=131_072)
        pa_took = time.perf_counter() - start
        print(f"pyarrow write_table of the same {rows} rows (zstd, 131,072-row groups): {pa_took:.2f} s = {rows / pa_took:,.0f} records/s")
        print(f"export / pyarrow write: {export_rps / (rows / pa_took):.2f}x (the export also reads, checks and decodes)")
        start = time.perf_counter()
        with open(os.devnull, "wb") as null:
            r = subprocess.run([replay, "--url", url, "cat", "ledger"], stdout=null, stderr=subprocess.PIPE, text=True)
        took = time.perf_counter() - start
        if r.returncode != 0:
            sys.exit(r.stderr)
        print(f"cat to /dev/null: {rows / took:,.0f} records/s, {raw / took / 1e6:.1f} MB/s ({r.stderr.strip()})")
        cat_rps = rows / took
        segment_bytes = sum(f.stat().st_size for f in cold.glob("*/*/*/segments/*.log"))
        start = time.perf_counter()
        r = subprocess.run([compactor, "--url", url, "once", "--work-dir", str(work / "compact")],
                           capture_output=True, text=True)
        took = time.perf_counter() - start
        if r.returncode != 0:
            sys.exit(r.stderr)
        after = sum(f.stat().st_size for f in cold.glob("*/*/*/segments/*.log")) - segment_bytes
        print(r.stdout.strip())
        print(f"compaction: {rows} records, {segment_bytes / 1e6:.1f} MB of segments in {took:.2f} s = "
              f"{rows / took:,.0f} records/s, {segment_bytes / took / 1e6:.1f} MB/s "
              f"({rows / took / cat_rps:.2f}x cat's records/s; {after / 1e6:.2f} MB written)")


if __name__ == "__main__":
    main()
