#!/usr/bin/env python3
"""Transactions' cost (printed, not asserted) on a local 3-controller + 3-broker cluster,
RF=3, min.insync.replicas=2, acks=all, with librdkafka (confluent-kafka) on both sides, in
one run:

- an idempotent producer: records/s and p50/p99 acknowledgement latency;
- a transactional producer, same client settings, transactions of --txn-records records:
  records/s and p50/p99 commit latency (commit_transaction's duration: flush + EndTxn +
  markers on every partition's leader);
- a read_committed consumer reading each topic back: records/s (the plain topic pays
  nothing for the last stable offset; the transactional one filters its markers).
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_cluster import Cluster  # noqa: E402

VALUE = b"x" * 800


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def idempotent(boot, topic, seconds):
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": boot, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5, "queue.buffering.max.messages": 200000})
    lat, sent = [], 0

    def done(err, msg, t0):
        assert err is None, err
        lat.append(time.monotonic() - t0)

    p.produce(topic, VALUE)
    p.flush(30)  # warm: metadata, producer id
    lat.clear()
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(1000):
            t0 = time.monotonic()
            p.produce(topic, VALUE, on_delivery=lambda e, m, t0=t0: done(e, m, t0))
        sent += 1000
        p.poll(0)
    p.flush(60)
    took = time.monotonic() - start
    return sent / took, pct(lat, 0.5) * 1000, pct(lat, 0.99) * 1000


def transactional(boot, topic, seconds, per_txn):
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": boot, "transactional.id": "bench-txn", "acks": "all",
                  "linger.ms": 5, "queue.buffering.max.messages": 200000})
    p.init_transactions(30)
    commits, sent = [], 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        p.begin_transaction()
        for i in range(per_txn):
            p.produce(topic, VALUE)
            if i % 1000 == 0:
                p.poll(0)
        t0 = time.monotonic()
        p.commit_transaction(60)
        commits.append(time.monotonic() - t0)
        sent += per_txn
    took = time.monotonic() - start
    return sent / took, pct(commits, 0.5) * 1000, pct(commits, 0.99) * 1000, len(commits)


def read_back(boot, topic, partitions):
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": boot, "group.id": f"bench-{topic}", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "fetch.max.bytes": 8 << 20})
    c.assign([TopicPartition(topic, i, 0) for i in range(partitions)])
    n, start, idle = 0, time.monotonic(), time.monotonic()
    last = start
    while time.monotonic() - idle < 3:
        msgs = c.consume(10000, timeout=0.5)
        got = sum(1 for m in msgs if not m.error())
        if got:
            n += got
            idle = last = time.monotonic()
    c.close()
    return n / max(last - start, 1e-9), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--txn-records", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=6)
    args = ap.parse_args()
    binary = os.environ.get("STRATA_BIN", "target/release/strata")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        c = Cluster(binary, Path(d))
        try:
            c.start_all()
            for t in ("plain", "txn"):
                c.cli("topic", "create", t, "-p", str(args.partitions), "--replication-factor", "3",
                      "--config", "min.insync.replicas=2")
                c.wait_for(lambda m, t=t: t in m["topics"], t)
            time.sleep(1)
            boot = ",".join(f"127.0.0.1:{c.broker_ports[i]}" for i in (1, 2, 3))
            rate, p50, p99 = idempotent(boot, "plain", args.seconds)
            trate, c50, c99, n = transactional(boot, "txn", args.seconds, args.txn_records)
            prate, pn = read_back(boot, "plain", args.partitions)
            xrate, xn = read_back(boot, "txn", args.partitions)
            print(f"3 + 3 cluster, RF=3, acks=all, {args.partitions} partitions, 800 B records, librdkafka")
            print(f"idempotent producer:    {rate:>9.0f} records/s   ack p50 {p50:6.1f} ms  p99 {p99:6.1f} ms")
            print(f"transactional producer: {trate:>9.0f} records/s   commit p50 {c50:6.1f} ms  p99 {c99:6.1f} ms"
                  f"  ({n} transactions of {args.txn_records})")
            print(f"transactional / idempotent throughput: {trate / rate:.2f}")
            print(f"read_committed consumer: plain topic {prate:>9.0f} records/s ({pn}),"
                  f" transactional topic {xrate:>9.0f} records/s ({xn})")
        finally:
            c.stop_all()


if __name__ == "__main__":
    main()
