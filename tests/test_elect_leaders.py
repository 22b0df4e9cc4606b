"""ElectLeaders (Kafka API 43) on a 3 + 3 cluster of real processes, through
confluent-kafka's `AdminClient.elect_leaders` and `strata topic elect-leaders`.

A partition's preferred leader is SIGKILLed (its leadership moves), restarted, and rejoins
the ISR; a preferred election gives it its leadership back at a new leader epoch, a second
one is ELECTION_NOT_NEEDED, and acks=all writes before, across and after the elections all
read back once, at their offsets. While the preferred replica is out of the ISR the
election is refused (PREFERRED_LEADER_NOT_AVAILABLE) and nothing changes.
"""

import time

from confluent_kafka import (OFFSET_BEGINNING, Consumer, ElectionType, KafkaError, KafkaException, Producer,
                             TopicPartition)
from confluent_kafka.admin import AdminClient

from conftest import rdkafka_conf
from test_cluster import LEASE_S, cluster  # noqa: F401 (the 3 + 3 cluster fixture)

TIMEOUT = 20


def produce(bootstrap, topic, start, n) -> dict:
    acked, errors = {}, []

    def report(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked[int(msg.value())] = (msg.partition(), msg.offset())

    p = Producer(rdkafka_conf({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                               "linger.ms": 5}))
    for i in range(start, start + n):
        p.produce(topic, value=str(i).encode(), partition=i % 3, on_delivery=report)
    assert p.flush(TIMEOUT) == 0 and not errors, errors[:3]
    return acked


def read_all(bootstrap, topic, expected: int) -> dict:
    c = Consumer(rdkafka_conf({"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False}))
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)])
    out = {}
    deadline = time.monotonic() + TIMEOUT
    try:
        while len(out) < expected:
            assert time.monotonic() < deadline, f"read {len(out)} of {expected}"
            for m in c.consume(num_messages=1000, timeout=0.5):
                assert m.error() is None, m.error()
                v = int(m.value())
                assert v not in out, f"{v} twice"
                out[v] = (m.partition(), m.offset())
    finally:
        c.close()
    return out


def elect(admin, partitions):
    """{partition: None or the KafkaError} of one preferred election."""
    f = admin.elect_leaders(ElectionType.PREFERRED, partitions)
    return {tp.partition: (e.args[0] if isinstance(e, KafkaException) else e) for tp, e in f.result().items()}


def test_a_preferred_election_gives_the_first_replica_its_leadership_back(cluster):
    topic = "orders"
    cluster.cli("topic", "create", topic, "-p", "3", "--replication-factor", "3",
                "--config", "min.insync.replicas=2")
    m = cluster.wait_for(lambda m: topic in m["topics"], "topic created")
    bootstrap = ",".join(f"127.0.0.1:{cluster.broker_ports[i]}" for i in (1, 2, 3))
    acked = produce(bootstrap, topic, 0, 300)
    part0 = m["topics"][topic]["partitions"][0]
    preferred = part0["replicas"][0]
    assert part0["leader"] == preferred

    cluster.kill(f"broker-{preferred}")
    m = cluster.wait_for(lambda m: m["topics"][topic]["partitions"][0]["leader"] not in (preferred, -1, None),
                         "leadership moved", timeout=LEASE_S * 3)
    acked.update(produce(bootstrap, topic, 300, 300))
    moved = m["topics"][topic]["partitions"][0]
    survivors = ",".join(f"127.0.0.1:{cluster.broker_ports[i]}" for i in (1, 2, 3) if i != preferred)
    admin = AdminClient(rdkafka_conf({"bootstrap.servers": survivors}))
    got = elect(admin, [TopicPartition(topic, 0)])
    assert got[0].code() == KafkaError.PREFERRED_LEADER_NOT_AVAILABLE, got
    after = cluster.metadata()["topics"][topic]["partitions"][0]
    assert (after["leader"], after["leader_epoch"]) == (moved["leader"], moved["leader_epoch"]), after

    cluster.start(f"broker-{preferred}")
    cluster.wait_for(lambda m: preferred in m["topics"][topic]["partitions"][0]["isr"], "back in the ISR",
                     timeout=30)
    admin = AdminClient(rdkafka_conf({"bootstrap.servers": bootstrap}))
    assert elect(admin, [TopicPartition(topic, 0)]) == {0: None}
    m = cluster.wait_for(lambda m: m["topics"][topic]["partitions"][0]["leader"] == preferred, "preferred leads")
    assert m["topics"][topic]["partitions"][0]["leader_epoch"] > moved["leader_epoch"]
    again = elect(admin, [TopicPartition(topic, 0)])
    assert again[0].code() == KafkaError.ELECTION_NOT_NEEDED, again

    # The CLI, over every partition of the topic: nothing left to do.
    out = cluster.cli("topic", "elect-leaders", topic).stdout
    assert out.count("unchanged") == 3, out

    acked.update(produce(bootstrap, topic, 600, 300))
    assert read_all(bootstrap, topic, len(acked)) == acked
