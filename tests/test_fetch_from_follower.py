"""Fetch from follower (KIP-392) on a real 3 + 3 cluster: brokers in racks RACK1..RACK3 with
`replica_selector = "rack-aware"`. A consumer whose `client.rack` is a follower's rack is told
by the leader to read from that follower and does (the brokers' own fetched-bytes counters say
where the bytes came from); one in the leader's rack stays on the leader; a SIGKILL of the
follower it reads from sends it back to the leader without losing or repeating a record.
Every record read is checked against what the producer had acknowledged, in order.
"""

import signal
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from conftest import rdkafka_conf, strata_bin
from test_cluster import Cluster, attach_logs_on_failure

TOPIC = "fff"
VALUE = "x" * 200


class RackCluster(Cluster):
    def cluster_extra(self, i):
        return f'rack = "RACK{i}"\nreplica_selector = "rack-aware"\n'


@pytest.fixture
def cluster(request, tmp_path):
    c = RackCluster(strata_bin(), tmp_path)
    try:
        c.start_all()
        yield c
    finally:
        c.stop_all()
        attach_logs_on_failure(request, c, 60)


def bootstrap(c, ids=(1, 2, 3)):
    return ",".join(f"127.0.0.1:{c.broker_ports[i]}" for i in ids)


def fetched_bytes(c, i):
    return c.broker_metrics(i).get("strata_fetched_bytes_total", 0)


def produce(c, start, count):
    p = Producer(rdkafka_conf({"bootstrap.servers": bootstrap(c), "acks": "all",
                               "enable.idempotence": True, "linger.ms": 5}))
    acked = []

    def on_delivery(err, msg):
        assert err is None, err
        acked.append((msg.offset(), int(msg.value().decode().split(":")[0])))

    for n in range(start, start + count):
        p.produce(TOPIC, f"{n}:{VALUE}".encode(), partition=0, on_delivery=on_delivery)
        p.poll(0)
    assert p.flush(60) == 0
    return sorted(acked)


def consumer(c, rack, ids=(1, 2, 3)):
    k = Consumer(rdkafka_conf({"bootstrap.servers": bootstrap(c, ids), "group.id": f"g-{rack}",
                               "client.rack": rack, "enable.auto.commit": False,
                               "auto.offset.reset": "earliest", "fetch.wait.max.ms": 200,
                               "topic.metadata.refresh.interval.ms": 1000}))
    k.assign([TopicPartition(TOPIC, 0, 0)])
    return k


def read(k, want, deadline_s, on_each=None):
    got = []
    deadline = time.monotonic() + deadline_s
    while len(got) < want and time.monotonic() < deadline:
        m = k.poll(0.5)
        if m is None or m.error():
            continue
        got.append((m.offset(), int(m.value().decode().split(":")[0])))
        if on_each:
            on_each(len(got))
    return got


def test_a_consumer_reads_from_the_follower_in_its_rack_and_back_from_the_leader_when_it_dies(cluster):
    cluster.cli("topic", "create", TOPIC, "-p", "1", "--replication-factor", "3",
                "--config", "min.insync.replicas=2")
    m = cluster.wait_for(lambda m: TOPIC in m["topics"] and sorted(m["topics"][TOPIC]["partitions"][0]["isr"])
                         == [1, 2, 3], "the topic with its full ISR", timeout=30)
    leader = m["topics"][TOPIC]["partitions"][0]["leader"]
    follower = min(i for i in (1, 2, 3) if i != leader)
    other = ({1, 2, 3} - {leader, follower}).pop()
    n = 3000
    acked = produce(cluster, 0, n)
    assert [v for _, v in acked] == list(range(n)), "one producer, one partition: acknowledged in order"
    payload = n * len(VALUE)

    # A consumer in the follower's rack reads everything from the follower.
    before = {i: fetched_bytes(cluster, i) for i in (1, 2, 3)}
    k = consumer(cluster, f"RACK{follower}")
    got = read(k, n, 60)
    k.close()
    after = {i: fetched_bytes(cluster, i) for i in (1, 2, 3)}
    assert got == acked, f"read {len(got)} of {n}, or not as acknowledged"
    moved = {i: after[i] - before[i] for i in (1, 2, 3)}
    assert moved[follower] >= payload, f"the follower in the consumer's rack served too little: {moved}"
    assert moved[leader] < payload // 4, f"the leader served the records itself: {moved}"
    assert moved[other] == 0, f"the broker in no one's rack served records: {moved}"

    # One in the leader's rack stays on the leader.
    before = after
    k = consumer(cluster, f"RACK{leader}")
    got = read(k, n, 60)
    k.close()
    after = {i: fetched_bytes(cluster, i) for i in (1, 2, 3)}
    assert got == acked
    moved = {i: after[i] - before[i] for i in (1, 2, 3)}
    assert moved[leader] >= payload and moved[follower] == 0 and moved[other] == 0, moved

    # Reading from the follower while records arrive, the follower SIGKILLed part way: the
    # consumer carries on from the leader, every acknowledged record exactly once, in order.
    k = consumer(cluster, f"RACK{follower}", ids=(leader, other))
    more = {}
    writer = threading.Thread(target=lambda: more.setdefault("acked", produce(cluster, n, n)))
    writer.start()
    killed = threading.Event()

    def kill_half_way(count):
        if count == n + n // 2 and not killed.is_set():
            killed.set()
            cluster.kill(f"broker-{follower}")

    got = read(k, 2 * n, 90, on_each=kill_half_way)
    writer.join(60)
    k.close()
    assert killed.is_set(), f"read only {len(got)} records before the deadline"
    everything = acked + more["acked"]
    assert [v for _, v in everything] == list(range(2 * n))
    assert got == everything, (f"read {len(got)} of {2 * n}; first difference at "
                               f"{next((i for i, (a, b) in enumerate(zip(got, everything)) if a != b), len(got))}")
    assert cluster.procs.get(f"broker-{follower}") is None
