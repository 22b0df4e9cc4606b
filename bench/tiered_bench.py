#!/usr/bin/env python3
"""Tiered storage figures. Prints; asserts nothing about speed.

1. `strata-tierbench` against a real S3-compatible server (moto_server, started here) and a
   local directory: upload throughput; a plain object_store ranged GET of the same bytes
   (the baseline); cold replay through the reader with an empty and a warm cache, as ratios
   to that baseline; the chunk cache's hit ratio during the sequential replay.
2. A broker process tiering to moto: produce p99 latency on a real-time topic (acks=all,
   fixed rate) alone, then while a consumer group replays a tiered topic's history from
   the cold tier in another process, with that replay's throughput.

Usage: STRATA_BIN=target/release/strata python3 bench/tiered_bench.py [--seconds 10]
       [--tierbench-args "--record-bytes 100 --segments 36"] [--tierbench-only]
(strata-tierbench is looked for beside STRATA_BIN.)
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from produce_bench import run as produce_run  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, proc, what, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"{what} exited")
            if time.monotonic() > deadline:
                sys.exit(f"{what} did not start")
            time.sleep(0.1)


def metrics(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


S3_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}


def replay(bootstrap, topic, records, seconds):
    """Child process: new consumer groups (kcat -G, librdkafka), one after another, read
    the `records` records of `topic` from the earliest offset, for at least `seconds`;
    prints records, value bytes and the time taken."""
    kcat = os.environ.get("KCAT", shutil.which("kcat") or "kcat")
    n = size = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        r = subprocess.run([kcat, "-b", bootstrap, "-G", f"replay-{uuid.uuid4().hex[:8]}", "-X",
                            "auto.offset.reset=earliest", "-e", "-q", "-f", "%S\n", topic],
                           capture_output=True, text=True, timeout=600)
        sizes = r.stdout.split()
        if len(sizes) < records:
            sys.exit(f"replay read {len(sizes)} of {records} records: {r.stderr[-500:]}")
        n += len(sizes)
        size += sum(int(x) for x in sizes)
    print(f"{n} {size} {time.perf_counter() - start}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rate", type=int, default=2000, help="real-time topic: offered msgs/s")
    ap.add_argument("--history-records", type=int, default=150_000)
    ap.add_argument("--read-cap-mb", type=float, default=40,
                    help="the capped run's [cold] read_bytes_per_sec, in MB/s")
    ap.add_argument("--tierbench-args", default="--record-bytes 100 --segments 36",
                    help="strata-tierbench's own flags (the default: 4 partitions x 36 segments "
                         "x 8 MiB of 100-byte records, about 10.5M records)")
    ap.add_argument("--tierbench-only", action="store_true",
                    help="run the library-level figures only, not the broker")
    ap.add_argument("--replay-child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.replay_child:
        bootstrap, topic, records, seconds = args.replay_child
        return replay(bootstrap, topic, int(records), float(seconds))

    strata = os.environ.get("STRATA_BIN", "target/release/strata")
    tierbench = str(Path(strata).parent / "strata-tierbench")
    env = dict(os.environ, **S3_ENV)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as work:
        work = Path(work)
        port = free_port()
        moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(port, moto, "moto_server")
            endpoint = f"http://127.0.0.1:{port}"
            import boto3

            s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="bench", aws_secret_access_key="bench")
            for bucket in ("tierbench", "broker"):
                s3.create_bucket(Bucket=bucket)

            print("== cold tier, library level (strata-tierbench)", flush=True)
            for name, store in (("S3-compatible (moto_server)", ["--url", "s3://tierbench/run", "--endpoint", endpoint,
                                                                 "--path-style"]),
                                ("local directory", ["--url", f"file://{work / 'file-store'}"])):
                print(f"-- {name}", flush=True)
                # Peak memory as the kernel counts it for the child (/usr/bin/time), beside
                # the VmHWM the binary prints itself.
                subprocess.run(["/usr/bin/time", "-f", "peak RSS (/usr/bin/time): %M KiB",
                                tierbench, *store, "--dir", str(work / "scratch"),
                                *args.tierbench_args.split()], env=env, check=True)
                shutil.rmtree(work / "file-store", ignore_errors=True)
            if args.tierbench_only:
                return

            print("== produce latency on a real-time topic while a group replays cold history", flush=True)
            kafka, ctl, mport = free_port(), free_port(), free_port()
            bootstrap = f"127.0.0.1:{kafka}"
            # A small chunk cache (16 MiB, no disk tier): months of history do not fit in
            # any cache, so the replay keeps reading from the store.
            broker_env = dict(env, STRATA__COLD__URL="s3://broker/strata", STRATA__COLD__ENDPOINT=endpoint,
                              STRATA__COLD__PATH_STYLE="true", STRATA__COLD__INTERVAL="200ms",
                              STRATA__COLD__CACHE_BYTES=str(16 << 20), STRATA__COLD__DISK_CACHE_BYTES="0",
                              STRATA__TOPICS__RETENTION_CHECK_INTERVAL="200ms")
            log = open(work / "broker.log", "ab")

            def start_broker(extra):
                b = subprocess.Popen([strata, "dev", "--data-dir", str(work / "data"), "--listen", bootstrap,
                                      "--controller-listen", f"127.0.0.1:{ctl}", "--metrics", f"127.0.0.1:{mport}"],
                                     stdout=log, stderr=log, env=dict(broker_env, **extra))
                wait_port(kafka, b, "strata")
                return b

            broker = start_broker({})
            try:
                def topic(*a):
                    for _ in range(100):
                        if subprocess.run([strata, "topic", "--bootstrap", bootstrap, "create", *a],
                                          capture_output=True).returncode == 0:
                            return
                        time.sleep(0.1)
                    sys.exit(f"could not create topic {a[0]}")

                topic("history", "-p", "1", "--config", "segment.bytes=4194304", "--config", "remote.storage.enable=true",
                      "--config", "local.retention.bytes=8388608", "--config", "retention.ms=-1")
                topic("hothistory", "-p", "1", "--config", "segment.bytes=4194304")
                topic("realtime", "-p", "1")
                from confluent_kafka import Producer

                p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "batch.size": 1 << 20})
                value = os.urandom(500).hex().encode()
                for i in range(args.history_records):
                    for t in ("history", "hothistory"):
                        while True:
                            try:
                                p.produce(t, value, b"%d" % i)
                                break
                            except BufferError:
                                p.poll(0.05)
                p.flush(120)
                deadline = time.monotonic() + 300
                while True:
                    m = metrics(mport)
                    start = m.get('strata_partition_log_start_offset{topic="history",partition="0"}', 0)
                    if m.get("strata_under_tiered_bytes", 1) == 0 and start > args.history_records * 0.8:
                        break
                    if time.monotonic() > deadline:
                        sys.exit(f"history not tiered: log start {start}")
                    time.sleep(0.5)
                print(f"history: {args.history_records} records of 1000 B, {start:.0f} of them only in the cold tier",
                      flush=True)

                alone = produce_run(bootstrap, "realtime", args.seconds, args.rate, 800, 0)
                print(f"produce at {args.rate} msgs/s (800 B, acks=all), no replay: p50 {alone['p50_ms']:.2f} ms "
                      f"p99 {alone['p99_ms']:.2f} ms p999 {alone['p999_ms']:.2f} ms (errors {alone['errors']})",
                      flush=True)
                cap = int(args.read_cap_mb * 1e6)
                for label, replayed, extra in (
                        ("from the hot tier (local log), for comparison", "hothistory", {}),
                        ("from the cold tier, uncapped", "history", {}),
                        (f"from the cold tier, capped at {args.read_cap_mb:g} MB/s", "history",
                         {"STRATA__COLD__READ_BYTES_PER_SEC": str(cap)})):
                    broker.terminate()
                    broker.wait(timeout=30)
                    broker = start_broker(extra)
                    produce_run(bootstrap, "realtime", 1, 100, 800, 0)  # reconnect and warm up
                    before = metrics(mport)
                    child = subprocess.Popen([sys.executable, __file__, "--replay-child", bootstrap, replayed,
                                              str(args.history_records), str(args.seconds + 2)],
                                             stdout=subprocess.PIPE, text=True)
                    result = {}
                    t = threading.Thread(target=lambda: result.update(r=child.communicate()[0]))
                    t.start()
                    time.sleep(1)
                    during = produce_run(bootstrap, "realtime", args.seconds, args.rate, 800, 0)
                    t.join(timeout=600)
                    n, size, took = result["r"].split()
                    m = metrics(mport)
                    hits = m.get("strata_cold_cache_hits_total", 0) - before.get("strata_cold_cache_hits_total", 0)
                    misses = m.get("strata_cold_cache_misses_total", 0) - before.get("strata_cold_cache_misses_total", 0)
                    cold_mb = (m.get("strata_cold_read_bytes_total", 0) - before.get("strata_cold_read_bytes_total", 0)) / 1e6
                    print(f"produce during a replay {label}: p50 {during['p50_ms']:.2f} ms p99 {during['p99_ms']:.2f} ms "
                          f"p999 {during['p999_ms']:.2f} ms (errors {during['errors']}); p99 {during['p99_ms'] / alone['p99_ms']:.2f}x "
                          f"the no-replay figure")
                    print(f"  the replay: {int(n)} records in {float(took):.1f} s = {int(n) / float(took):.0f} records/s, "
                          f"{int(size) / float(took) / 1e6:.1f} MB/s of values; {cold_mb:.0f} MB read from the store; "
                          f"chunk cache hit ratio {100 * hits / max(1, hits + misses):.1f}%", flush=True)
            finally:
                broker.terminate()
                broker.wait(timeout=30)
        finally:
            moto.kill()
            moto.wait()


if __name__ == "__main__":
    main()
