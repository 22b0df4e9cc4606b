"""The Prometheus endpoint reports what the broker did."""

import urllib.request

from confluent_kafka import Producer

from conftest import consume_partitions, rdkafka_conf, record_value

import time


def scrape(broker) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_metrics_count_produce_fetch_and_partitions(broker):
    broker.create_topic("observed", 3)
    before = scrape(broker)
    p = Producer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "acks": "all"}))
    for i in range(1000):
        p.produce("observed", record_value(i).encode(), partition=i % 3)
    assert p.flush(30) == 0
    consume_partitions(broker.bootstrap, "observed", 3, time.monotonic() + 30)
    m = scrape(broker)
    assert m["strata_produced_records_total"] - before.get("strata_produced_records_total", 0) == 1000
    assert m["strata_produce_requests_total"] > before.get("strata_produce_requests_total", 0)
    assert m["strata_produce_errors_total"] == 0
    assert m["strata_produce_latency_seconds_count"] > 0
    assert m['strata_produce_latency_seconds_bucket{le="+Inf"}'] == m["strata_produce_latency_seconds_count"]
    assert m["strata_fetched_bytes_total"] > 0 and m["strata_fetch_requests_total"] > 0
    # The consumer's group.id made the broker create __consumer_offsets too (as Kafka does).
    observed = [k for k in m if k.startswith('strata_partition_high_watermark{topic="observed"')]
    assert len(observed) == 3
    assert m["strata_leader_partitions"] == m["strata_local_partitions"] >= 3
    assert m["strata_offline_partitions"] == 0 and m["strata_under_replicated_partitions"] == 0
    hw = sum(m[f'strata_partition_high_watermark{{topic="observed",partition="{i}"}}'] for i in range(3))
    assert hw == 1000
