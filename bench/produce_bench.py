#!/usr/bin/env python3
"""Produce throughput and ack latency through the Kafka listener, driven by librdkafka
(confluent-kafka). Prints figures; asserts nothing about speed.

Two runs against an existing topic:
  - max: as fast as librdkafka will send (acks=all, linger 5 ms), for msgs/s and MB/s;
  - rate: a fixed offered rate (default 10,500 msgs/s), for p50/p99/p999 produce-to-ack latency.
"""
import argparse
import os
import sys
import time

from confluent_kafka import Producer


def percentile(sorted_values, p):
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(round((len(sorted_values) - 1) * p)))]


def run(bootstrap, topic, seconds, rate, record_bytes, linger_ms, extra=None):
    """`extra`: more librdkafka settings (security.protocol, sasl.*, ssl.*)."""
    value = os.urandom(record_bytes // 2).hex().encode()[:record_bytes]
    latencies = []
    errors = []
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": linger_ms,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        **(extra or {}),
    })

    def on_delivery(err, msg, sent=None):
        if err is not None:
            errors.append(err)
        else:
            latencies.append(time.perf_counter() - sent)

    # Warm up: connect, fetch metadata and a producer id before the clock starts, so the
    # figures are the steady state, not librdkafka's start-up.
    for _ in range(100):
        producer.produce(topic, value, b"warm-up")
    if producer.flush(30) != 0:
        sys.exit("warm-up messages were not acknowledged within 30 s")

    start = time.perf_counter()
    sent = 0
    while True:
        now = time.perf_counter()
        elapsed = now - start
        if elapsed >= seconds:
            break
        if rate and sent >= rate * elapsed:
            producer.poll(0)
            time.sleep(0.0002)
            continue
        key = b"key-%d" % (sent % 1000)
        try:
            producer.produce(topic, value, key, on_delivery=lambda e, m, t=now: on_delivery(e, m, t))
            sent += 1
        except BufferError:
            producer.poll(0.001)
        if sent % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(60)
    total = time.perf_counter() - start
    latencies.sort()
    return {
        "sent": sent,
        "acked": len(latencies),
        "errors": len(errors) + remaining,
        "msgs_per_s": len(latencies) / total,
        "mb_per_s": len(latencies) * record_bytes / total / 1e6,
        "p50_ms": percentile(latencies, 0.50) * 1e3,
        "p99_ms": percentile(latencies, 0.99) * 1e3,
        "p999_ms": percentile(latencies, 0.999) * 1e3,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--topic", default="bench")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rate", type=int, default=10_500)
    ap.add_argument("--record-bytes", type=int, default=800)
    args = ap.parse_args()
    for name, rate, linger in (("max", 0, 5), ("rate", args.rate, 0)):
        r = run(args.bootstrap, args.topic, args.seconds, rate, args.record_bytes, linger)
        if rate:
            # Latency is only meaningful below saturation: report it for the fixed rate.
            figures = (f"ack latency p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms "
                       f"p999 {r['p999_ms']:.2f} ms")
            offered = f"offered {rate} msgs/s"
        else:
            figures = "(latency at saturation is queueing; see the fixed-rate run)"
            offered = "offered max, linger 5 ms"
        print(
            f"produce {name:>4} ({offered}, {args.record_bytes} B records, acks=all, idempotent): "
            f"{r['msgs_per_s']:>9.0f} msgs/s {r['mb_per_s']:>7.1f} MB/s  {figures}  "
            f"(acked {r['acked']}/{r['sent']}, errors {r['errors']})"
        )
        if r["errors"]:
            sys.exit(f"{r['errors']} messages failed; the figures above are not valid")


if __name__ == "__main__":
    main()
