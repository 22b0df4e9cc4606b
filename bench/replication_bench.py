#!/usr/bin/env python3
"""Replication figures (printed, not asserted) on a local 3-controller + 3-broker cluster,
800-byte records, RF=3, min.insync.replicas=2, acks=all, idempotent producer, fsync on every
replica (flush.messages=1, the default):

- the disk's limit for this setup: sequential 1 MiB writes + fdatasync, divided by 3 (every
  byte is written and fsynced three times on the same disk);
- sustained produce throughput and its ratio to that limit;
- produce-to-ack latency p50/p99/p999 at a fixed rate (10.5k msgs/s by default);
- end-to-end produce-to-consume latency p50/p99 at the same rate (a consumer in another
  process reads the send time out of each record);
- unavailability of a partition after its leader is SIGKILLed: from the kill to the first
  acknowledgement of a write to that partition (p50/p99 over repeated kills);
- with `strata-loadgen` built next to the binary: the same fixed rate from a Rust client,
  and the brokers' own commit latency.
"""
import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from produce_bench import run as produce_run  # noqa: E402
from test_cluster import LEASE_S, Cluster  # noqa: E402

RECORD = 800


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round((len(s) - 1) * p)))] if s else float("nan")


def disk_limit_mb_s(directory, seconds=3.0):
    """Sequential 1 MiB writes, fdatasync after each: what one replica's disk can take."""
    chunk = os.urandom(1 << 20)
    path = os.path.join(directory, "disk-probe.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = 0
    start = time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            os.write(fd, chunk)
            os.fdatasync(fd)
            written += len(chunk)
    finally:
        os.close(fd)
        os.unlink(path)
    return written / (time.perf_counter() - start) / 1e6


def produce_histogram(c):
    """Summed produce-latency histogram buckets of the three brokers: {le: count}."""
    total = {}
    for i in (1, 2, 3):
        for k, v in c.broker_metrics(i).items():
            if k.startswith("strata_produce_latency_seconds_bucket"):
                le = k.split('le="')[1].rstrip('"}')
                total[le] = total.get(le, 0) + v
    return total


def bucket_quantile(before, after, q):
    """The upper bound of the histogram bucket holding quantile q of the requests between
    two snapshots."""
    delta = {k: after[k] - before.get(k, 0) for k in after}
    count = delta.get("+Inf", 0)
    for le in sorted((k for k in delta if k != "+Inf"), key=float):
        if count and delta[le] >= q * count:
            return f"<= {float(le) * 1e3:g} ms"
    return "> 5 s"


def bootstrap(c):
    return ",".join(f"127.0.0.1:{c.broker_ports[i]}" for i in (1, 2, 3))


def consume_latencies(bootstrap_servers, topic, partitions, seconds, out):
    """Child process: reads from the end and records now - send time (in the value)."""
    consumer = Consumer({
        **({"debug": os.environ["E2E_DEBUG"]} if os.environ.get("E2E_DEBUG") else {}),
        "bootstrap.servers": bootstrap_servers,
        "group.id": "e2e-unused",
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 100,
        "fetch.min.bytes": 1,
    })
    tps = []
    for p in range(partitions):
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        tps.append(TopicPartition(topic, p, high))
    consumer.assign(tps)
    lat = []
    end = time.time() + seconds
    while time.time() < end:
        # poll() returns as soon as a record is there (consume() waits to fill its batch)
        msg = consumer.poll(0.1)
        if msg is not None and msg.error() is not None and os.environ.get("E2E_DEBUG"):
            print("consumer error", msg.error(), flush=True)
        if msg is not None and msg.error() is None and msg.value().startswith(b"t="):
            lat.append(time.time() - float(msg.value()[2:22]))
    consumer.close()
    out.put(lat)


def e2e(c, topic, partitions, rate, seconds):
    q = multiprocessing.Queue()
    child = multiprocessing.Process(target=consume_latencies, args=(bootstrap(c), topic, partitions, seconds + 3, q))
    child.start()
    time.sleep(2)  # the consumer is assigned and polling
    producer = Producer({"bootstrap.servers": bootstrap(c), "acks": "all", "enable.idempotence": True,
                         "linger.ms": 0})
    pad = b"x" * (RECORD - 24)
    # Warm up (connections, metadata, producer id) before timing; the consumer skips these.
    for i in range(300):
        producer.produce(topic, b"warm-up", b"k%d" % i)
    producer.flush(30)
    start = time.perf_counter()
    sent = 0
    while time.perf_counter() - start < seconds:
        if sent >= rate * (time.perf_counter() - start):
            producer.poll(0)
            time.sleep(0.0002)
            continue
        producer.produce(topic, b"t=%20.6f|" % time.time() + pad, b"k%d" % (sent % 1000))
        sent += 1
        if sent % 1000 == 0:
            producer.poll(0)
    producer.flush(30)
    lat = q.get(timeout=60)
    child.join()
    return lat, sent


def unavailability(c, topic, kills):
    """Kill partition 0's leader while a probe writes to it every 2 ms; the window is from the
    kill to the first acknowledgement of a write sent after it."""
    windows = []
    for k in range(kills):
        m = c.metadata()
        leader = m["topics"][topic]["partitions"][0]["leader"]
        acks = []
        probe = Producer({"bootstrap.servers": bootstrap(c), "acks": "all", "enable.idempotence": True,
                          "linger.ms": 0, "message.timeout.ms": 60000, "request.timeout.ms": 2000,
                          "retry.backoff.ms": 20, "retry.backoff.max.ms": 100,
                          "topic.metadata.refresh.interval.ms": 200})

        def done(err, msg, sent):
            if err is None:
                acks.append((sent, time.monotonic()))

        def send():
            t = time.monotonic()
            probe.produce(topic, b"probe", partition=0, on_delivery=lambda e, m, t=t: done(e, m, t))
            probe.poll(0)

        for _ in range(200):
            send()
            time.sleep(0.002)
        probe.flush(10)
        killed = time.monotonic()
        c.kill(f"broker-{leader}")
        while not any(sent >= killed for sent, _ in acks):
            send()
            time.sleep(0.002)
            assert time.monotonic() - killed < 60, "partition 0 never became writable again"
        first = min(at for sent, at in acks if sent >= killed)
        windows.append(first - killed)
        probe.flush(30)
        c.start(f"broker-{leader}")
        c.wait_for(lambda m: all(sorted(p["isr"]) == [1, 2, 3] for p in m["topics"][topic]["partitions"]),
                   "full ISR again", timeout=60)
        print(f"  kill {k + 1}: broker {leader} killed, partition 0 writable again after {windows[-1] * 1e3:.0f} ms",
              flush=True)
    return windows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--binary", default=os.environ.get("STRATA_BIN", "target/release/strata"))
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rate", type=int, default=10_500)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--kills", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        disk = disk_limit_mb_s(tmp)
        limit = disk / 3
        print(f"disk: sequential 1 MiB writes + fdatasync {disk:.1f} MB/s; limit for RF=3 on one disk {limit:.1f} MB/s")
        c = Cluster(args.binary, Path(tmp))
        try:
            c.start_all()
            topic = "bench-rf3"
            c.cli("topic", "create", topic, "-p", str(args.partitions), "--replication-factor", "3",
                  "--config", "min.insync.replicas=2")
            c.wait_for(lambda m: topic in m["topics"], "topic")
            time.sleep(1)
            for name, rate, linger in (("max", 0, 5), ("rate", args.rate, 0)):
                before = produce_histogram(c)
                r = produce_run(bootstrap(c), topic, args.seconds, rate, RECORD, linger)
                after = produce_histogram(c)
                if r["errors"]:
                    sys.exit(f"{r['errors']} messages failed; figures invalid")
                if rate:
                    print(f"produce at {rate} msgs/s (RF=3, acks=all, fsync x3): ack latency "
                          f"p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms p999 {r['p999_ms']:.2f} ms "
                          f"(acked {r['acked']}/{r['sent']})")
                    print(f"  of which inside the brokers (produce request in -> response out, histogram "
                          f"buckets): p50 {bucket_quantile(before, after, .5)}, p99 {bucket_quantile(before, after, .99)}")
                else:
                    print(f"produce max (RF=3, acks=all, fsync x3, linger 5 ms): {r['msgs_per_s']:.0f} msgs/s "
                          f"{r['mb_per_s']:.1f} MB/s, ratio to the limit {r['mb_per_s'] / limit:.2f}")
            loadgen = Path(args.binary).with_name("strata-loadgen")
            if loadgen.exists():
                # The same rate from a Rust client that costs little CPU: the brokers' latency
                # without the Python callbacks competing for the two cores.
                before = c.broker_metrics(1)
                grpc = ",".join(f"127.0.0.1:{c.grpc_ports[i]}" for i in (1, 2, 3))
                r = subprocess.run([str(loadgen), "--bootstrap", grpc, "--topic", topic, "--rate", str(args.rate),
                                    "--seconds", str(args.seconds)], capture_output=True, text=True)
                print(r.stdout.strip() or r.stderr.strip())
                after = c.broker_metrics(1)
                commit = {k.split('le="')[1].rstrip('"}'): v for k, v in after.items()
                          if k.startswith("strata_commit_latency_seconds_bucket")}
                commit_before = {k.split('le="')[1].rstrip('"}'): v for k, v in before.items()
                                 if k.startswith("strata_commit_latency_seconds_bucket")}
                print(f"  commit latency inside broker 1 (append -> fsynced on the ISR, histogram buckets): "
                      f"p50 {bucket_quantile(commit_before, commit, .5)}, p99 {bucket_quantile(commit_before, commit, .99)}")
            else:
                print(f"(no {loadgen}: build it with cargo build --release --bin strata-loadgen for the Rust-client figure)")
            lat, sent = e2e(c, topic, args.partitions, args.rate, args.seconds)
            print(f"end-to-end produce -> consume at {args.rate} msgs/s: p50 {pct(lat, .5) * 1e3:.2f} ms "
                  f"p99 {pct(lat, .99) * 1e3:.2f} ms p999 {pct(lat, .999) * 1e3:.2f} ms "
                  f"({len(lat)} of {sent} records timed)")
            w = unavailability(c, topic, args.kills)
            if w:
                print(f"unavailability after a leader SIGKILL, {len(w)} kills: p50 {pct(w, .5) * 1e3:.0f} ms "
                      f"p99 {pct(w, .99) * 1e3:.0f} ms (a killed broker's controller session closes and it is "
                      f"fenced at once; the rest is the client finding the new leader; mean {statistics.mean(w) * 1e3:.0f} ms)")
        finally:
            c.stop_all()


if __name__ == "__main__":
    main()
