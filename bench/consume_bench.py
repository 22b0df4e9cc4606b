#!/usr/bin/env python3
"""The consume path (issue 20): fetch throughput from the page cache against a plain read of
the same segment files in the same run, and a consumer of many partitions with and without
a fetch session (KIP-227). Prints figures; asserts nothing about speed.

One `strata dev` node (PLAINTEXT, local-directory store). The consumer is
`hot/examples/fetch_load.rs`: raw Fetch v12 requests, one in flight, counting batches without
decoding records, so the broker is what is measured.

1. Topic `one` (1 partition) is filled by `produce_load` (prebuilt 800-byte-record batches,
   acks=1) for --produce-seconds. Then, alternately, --rounds times: `fetch_load plain-read`
   of the partition's segment files (1 MiB reads; the page cache holds them, read once
   before) and `fetch_load catch-up` from offset 0 to the end (50 MiB per response, 8 MiB per
   partition). Ratio of MB/s, and the broker's CPU seconds per GB served.
2. Topic `many` (--partitions partitions): confluent-kafka writes --many-records keyed
   records; then `catch-up` with 64 KiB per partition and `follow` (the topic's end, for
   --follow-seconds while the producer writes 2,000 records/s) run with and without
   `--sessions`: requests, bytes sent and received per request, broker CPU per request.

Usage:
    cargo build --release --bin strata
    cargo build --release -p strata-hot --example produce_load --example fetch_load
    STRATA_BIN=target/release/strata python3 bench/consume_bench.py [--rounds 3] [--partitions 600]
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def loopback_mb_per_s(total=2 << 30):
    """What one TCP connection over loopback carries here (8 MiB sends, 8 MiB receives):
    the ceiling of any fetch, whatever the broker does."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def send():
        c, _ = srv.accept()
        data = bytes(8 << 20)
        for _ in range(total // len(data)):
            c.sendall(data)
        c.close()

    t = threading.Thread(target=send)
    t.start()
    s = socket.create_connection(srv.getsockname())
    buf = memoryview(bytearray(8 << 20))
    got, started = 0, time.monotonic()
    while (n := s.recv_into(buf)) > 0:
        got += n
    seconds = time.monotonic() - started
    t.join()
    s.close()
    srv.close()
    return got / seconds / 1e6


def scraped(port):
    """{metric: value} from the broker's /metrics (unlabelled lines)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def run_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--produce-seconds", type=float, default=6.0)
    ap.add_argument("--partitions", type=int, default=600)
    ap.add_argument("--many-records", type=int, default=120_000)
    ap.add_argument("--follow-seconds", type=float, default=8.0)
    args = ap.parse_args()
    binary = os.environ.get("STRATA_BIN", "target/release/strata")
    examples = Path(binary).parent / "examples"
    produce_load, fetch_load = examples / "produce_load", examples / "fetch_load"
    for tool in (produce_load, fetch_load):
        if not tool.exists():
            sys.exit(f"{tool} is missing: cargo build --release -p strata-hot --example produce_load --example fetch_load")

    work = Path(tempfile.mkdtemp(prefix="strata-consume-bench-", dir=os.environ.get("BENCH_DIR")))
    port, controller, metrics = free_port(), free_port(), free_port()
    bootstrap = f"127.0.0.1:{port}"
    log = open(work / "strata.log", "wb")
    proc = subprocess.Popen([binary, "dev", "--data-dir", str(work / "data"), "--listen", bootstrap,
                             "--controller-listen", f"127.0.0.1:{controller}", "--metrics", f"127.0.0.1:{metrics}"],
                            stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"strata did not start; see {work / 'strata.log'}")
                time.sleep(0.2)
        admin = ["--controller", f"127.0.0.1:{controller}"]
        for cmd in (["topic", "create", "one", "-p", "1", "--config", "segment.bytes=268435456", *admin],
                    ["topic", "create", "many", "-p", str(args.partitions), *admin]):
            for _ in range(100):
                r = subprocess.run([binary, *cmd], capture_output=True, text=True)
                if r.returncode == 0:
                    break
                time.sleep(0.2)
            else:
                sys.exit(f"strata {' '.join(cmd)} failed: {r.stderr}")

        # 1. one partition, page cache
        produced = run_json([str(produce_load), "--bootstrap", bootstrap, "--topic", "one", "--acks", "1",
                             "--seconds", str(args.produce_seconds)])
        segments = work / "data" / "logs" / "one-0"
        size = sum(f.stat().st_size for f in segments.glob("*.log"))
        print(f"topic one: {produced['acked']:,} records of 800 B, {size / 1e6:,.0f} MB in "
              f"{len(list(segments.glob('*.log')))} segment files")
        plain = [str(fetch_load), "plain-read", "--dir", str(segments)]
        catch_up = [str(fetch_load), "catch-up", "--bootstrap", bootstrap, "--topic", "one"]
        run_json(plain)  # into the page cache
        rows = []
        for i in range(args.rounds):
            loopback = loopback_mb_per_s()
            p = run_json(plain)
            before = cpu_seconds(proc.pid)
            c = run_json(catch_up)
            broker_cpu = cpu_seconds(proc.pid) - before
            rows.append((p["mb_per_s"], c["mb_per_s"], loopback))
            print(f"round {i + 1}: plain read {p['mb_per_s']:,.0f} MB/s, loopback TCP {loopback:,.0f} MB/s, "
                  f"fetch {c['mb_per_s']:,.0f} MB/s ({c['bytes'] / 1e6:,.0f} MB in {c['requests']} requests): "
                  f"{c['mb_per_s'] / p['mb_per_s']:.2f} of the plain read, {c['mb_per_s'] / loopback:.2f} of loopback; "
                  f"broker {broker_cpu / (c['bytes'] / 1e9):.2f} CPU s/GB")
        sent = scraped(metrics)
        print(f"sent from the segment files (sendfile; STRATA__KAFKA__SENDFILE=false turns it off): "
              f"{sent.get('strata_fetched_from_file_bytes_total', 0) / 1e6:,.0f} MB of "
              f"{sent.get('strata_fetched_bytes_total', 0) / 1e6:,.0f} MB fetched")
        for name, at in (("plain read", 0), ("loopback TCP", 2)):
            ratios = sorted(r[1] / r[at] for r in rows)
            print(f"fetch / {name}: median {ratios[len(ratios) // 2]:.2f} (min {ratios[0]:.2f}, max {ratios[-1]:.2f})")

        # 2. many partitions, with and without a fetch session
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1, "log_level": 0,
                             "queue.buffering.max.messages": 1_000_000})
        value = b"x" * 200
        for i in range(args.many_records):
            while True:
                try:
                    producer.produce("many", value, key=str(i).encode())
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.flush(60)
        print(f"topic many: {args.partitions} partitions, {args.many_records:,} records of 200 B")
        base = ["--bootstrap", bootstrap, "--topic", "many", "--partitions", str(args.partitions)]
        for sessions in (False, True, False, True):
            flag = ["--sessions"] if sessions else []
            before = cpu_seconds(proc.pid)
            c = run_json([str(fetch_load), "catch-up", *base, "--partition-max-bytes", "4096", *flag])
            cpu = cpu_seconds(proc.pid) - before
            print(f"catch-up {'with' if sessions else 'without'} a session: {c['records']:,} records in "
                  f"{c['seconds']:.2f} s, {c['requests']} requests, {c['request_bytes'] / c['requests']:,.0f} B "
                  f"sent and {c['response_bytes'] / c['requests']:,.0f} B received per request, "
                  f"broker {cpu / c['requests'] * 1e3:.2f} CPU ms per request")

        stop = threading.Event()

        def trickle():
            i = 0
            started = time.monotonic()
            while not stop.is_set():
                due = int((time.monotonic() - started) * 2000)
                while i < due:
                    producer.produce("many", value, key=str(i).encode())
                    i += 1
                producer.poll(0.01)

        writer = threading.Thread(target=trickle, daemon=True)
        writer.start()
        try:
            for sessions in (False, True, False, True):
                flag = ["--sessions"] if sessions else []
                before = cpu_seconds(proc.pid)
                c = run_json([str(fetch_load), "follow", *base, "--seconds", str(args.follow_seconds),
                              "--max-wait-ms", "100", *flag])
                cpu = cpu_seconds(proc.pid) - before
                print(f"follow {'with' if sessions else 'without'} a session: {c['records']:,} records, "
                      f"{c['requests']} requests, {c['request_bytes'] / c['requests']:,.0f} B sent and "
                      f"{c['response_bytes'] / c['requests']:,.0f} B received per request, broker "
                      f"{cpu / c['requests'] * 1e3:.2f} CPU ms per request, {cpu / c['seconds']:.2f} CPU s/s "
                      f"(its produce load included)")
        finally:
            stop.set()
            writer.join()
            producer.flush(30)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
