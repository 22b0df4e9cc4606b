"""Partition reassignment (Kafka's AlterPartitionReassignments / ListPartitionReassignments,
and `strata topic reassign`) on a 3 + 3 cluster of real processes.

Two partitions on brokers 1 and 2 move to 2 and 3 while an acks=all producer keeps writing:
one through kafka-python's admin client, unthrottled; the other through the CLI with a
throttle, so the move can be watched in progress (ListPartitionReassignments) and its
leader, broker 1, is SIGKILLed mid-copy. Afterwards each partition's replicas and ISR are
exactly the target, broker 1's copies are deleted (the killed one when it comes back),
broker 3's log is byte-identical to the leader's, and every acknowledged record reads back
once at its offset.
"""

import threading
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition as CkTopicPartition
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from conftest import rdkafka_conf
from test_cluster import LEASE_S, cluster  # noqa: F401 (the 3 + 3 cluster fixture)

TOPIC = "moves"
VALUE = b"x" * 800
THROTTLE = 256 * 1024  # bytes per second


class Writer:
    """An acks=all idempotent producer writing to both partitions until stopped."""

    def __init__(self, bootstrap):
        self.acked, self.errors = {}, []
        self.stop = threading.Event()
        self.p = Producer(rdkafka_conf({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                        "linger.ms": 5, "message.timeout.ms": 60000,
                                        # batches well under the throttle's second of bytes (a
                                        # fetch always returns its first batch whole)
                                        "batch.size": 64 * 1024}))
        self.n = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def report(self, err, msg):
        if err is not None:
            self.errors.append(err)
        else:
            self.acked[msg.key().decode()] = (msg.partition(), msg.offset())

    def write(self, count):
        for _ in range(count):
            key = str(self.n)
            self.p.produce(TOPIC, key=key.encode(), value=VALUE, partition=self.n % 2, on_delivery=self.report)
            self.n += 1
            self.p.poll(0)

    def run(self):
        while not self.stop.is_set():
            self.write(20)  # 200 records a second: 80 KB/s a partition, under the throttle
            time.sleep(0.1)

    def finish(self):
        self.stop.set()
        self.thread.join(timeout=10)
        assert self.p.flush(60) == 0, "records still unacknowledged"
        assert not self.errors, self.errors[:3]


def read_all(bootstrap, expected):
    c = Consumer(rdkafka_conf({"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False}))
    c.assign([CkTopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(2)])
    out = {}
    deadline = time.monotonic() + 60
    try:
        while len(out) < expected:
            assert time.monotonic() < deadline, f"read {len(out)} of {expected}"
            for m in c.consume(num_messages=1000, timeout=0.5):
                assert m.error() is None, m.error()
                k = m.key().decode()
                assert k not in out, f"{k} read twice"
                out[k] = (m.partition(), m.offset())
    finally:
        c.close()
    return out


def segments(cluster, broker, partition):
    d = cluster.workdir / f"broker-{broker}" / "logs" / f"{TOPIC}-{partition}"
    return b"".join(f.read_bytes() for f in sorted(d.glob("*.log")))


def test_partitions_move_to_other_brokers_under_load_and_through_a_leader_kill(cluster):
    bootstrap = ",".join(f"127.0.0.1:{cluster.broker_ports[i]}" for i in (1, 2, 3))
    kp = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        kp.create_topics([NewTopic(TOPIC, -1, -1, replica_assignments={0: [1, 2], 1: [1, 2]},
                                   topic_configs={"min.insync.replicas": "2"})])
    finally:
        kp.close()
    cluster.wait_for(lambda m: TOPIC in m["topics"], "topic created")
    writer = Writer(bootstrap)
    writer.write(4000)  # 1.6 MB a partition, for the throttled copy to take seconds
    assert writer.p.flush(60) == 0
    writer.thread.start()

    # Partition 0, through kafka-python (Kafka's API: unthrottled).
    kp = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        assert kp.alter_partition_reassignments({TopicPartition(TOPIC, 0): [2, 3]}) == {
            TopicPartition(TOPIC, 0): None}
        # Partition 1, through the CLI with a throttle.
        out = cluster.cli("topic", "reassign", TOPIC, "--partition", "1", "--replicas", "2,3",
                          "--throttle", str(THROTTLE)).stdout
        assert "moves-1\tmoving" in out, out
        started = time.monotonic()
        # (the answering broker may apply the controllers' change a moment later)
        deadline = time.monotonic() + 10
        while TopicPartition(TOPIC, 1) not in (ongoing := kp.list_partition_reassignments()):
            assert time.monotonic() < deadline, ongoing
            time.sleep(0.1)
        assert ongoing.get(TopicPartition(TOPIC, 1)) == {
            "replicas": [2, 3, 1], "adding_replicas": [3], "removing_replicas": [1]}, ongoing
        # A partition that does not exist is refused.
        refused = kp.alter_partition_reassignments({TopicPartition(TOPIC, 5): None})
        assert TopicPartition(TOPIC, 5) in refused and refused[TopicPartition(TOPIC, 5)] is not None, refused
    finally:
        kp.close()

    m = cluster.wait_for(lambda m: m["topics"][TOPIC]["partitions"][0].get("reassignment") is None,
                         "partition 0 moved", timeout=60)
    p0 = m["topics"][TOPIC]["partitions"][0]
    assert (p0["replicas"], sorted(p0["isr"])) == ([2, 3], [2, 3]), p0
    assert p0["leader"] in (2, 3)
    assert m["topics"][TOPIC]["partitions"][1].get("reassignment") is not None, "the throttled move is done already"

    # The leader of the throttled move dies mid-copy: broker 2 (in the ISR) takes over,
    # and broker 3 goes on copying from it.
    cluster.kill("broker-1")
    m = cluster.wait_for(lambda m: m["topics"][TOPIC]["partitions"][1]["leader"] == 2, "broker 2 leads",
                         timeout=LEASE_S * 3)
    r = cluster.cli("topic", "reassign", TOPIC, "--partition", "1", "--replicas", "2,3", "--throttle",
                    str(THROTTLE), "--wait")
    assert "all 1 partitions are on their new replicas" in r.stdout, r.stdout + r.stderr
    took = time.monotonic() - started
    bytes_copied = len(segments(cluster, 3, 1))
    # One second's burst, then the rate: well under the unthrottled time it would take
    assert took >= 0.5 * (bytes_copied - THROTTLE) / THROTTLE, (took, bytes_copied)

    writer.finish()
    m = cluster.metadata()
    for p in m["topics"][TOPIC]["partitions"]:
        assert (p["replicas"], sorted(p["isr"]), p.get("reassignment")) == ([2, 3], [2, 3], None), p

    # broker 1's copies: deleted; the one it held while dead goes once it is back
    assert not (cluster.workdir / "broker-1" / "logs" / f"{TOPIC}-0").exists()
    cluster.start("broker-1")
    deadline = time.monotonic() + 30
    while (cluster.workdir / "broker-1" / "logs" / f"{TOPIC}-1").exists():
        assert time.monotonic() < deadline, "broker 1 kept the copy of a partition moved away while it was down"
        time.sleep(0.2)

    assert read_all(bootstrap, len(writer.acked)) == writer.acked
    # the new replica holds exactly the leader's log
    for part in (0, 1):
        leader = m["topics"][TOPIC]["partitions"][part]["leader"]
        follower = 5 - leader  # the other of 2 and 3
        deadline = time.monotonic() + 20
        while segments(cluster, follower, part) != segments(cluster, leader, part):
            assert time.monotonic() < deadline, f"partition {part}: broker {follower}'s copy differs from the leader's"
            time.sleep(0.5)


def test_a_throttled_move_stays_throttled_while_its_leader_is_between_role_and_layout(cluster):
    """A broker takes on a partition's new role (the replicas a move adds) a moment before it
    installs the topic's new layout (which carries the move's throttle). A fetch from the
    added replica in between used to be served unthrottled: one fetch of up to 32 MiB copied
    the whole partition at once (seen in CI as a throttled move done in 70 ms). The failpoint
    holds broker 1 in that moment for two seconds; the added replica must copy nothing more
    than the throttle allows meanwhile."""
    topic = "held"
    bootstrap = ",".join(f"127.0.0.1:{cluster.broker_ports[i]}" for i in (1, 2, 3))
    kp = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        kp.create_topics([NewTopic(topic, -1, -1, replica_assignments={0: [1, 2]})])
    finally:
        kp.close()
    cluster.wait_for(lambda m: topic in m["topics"] and m["topics"][topic]["partitions"][0]["leader"] == 1,
                     "topic created, led by broker 1")
    p = Producer(rdkafka_conf({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                               "batch.size": 64 * 1024}))
    for i in range(2000):  # 1.6 MB
        p.produce(topic, key=str(i).encode(), value=VALUE, partition=0)
        p.poll(0)
    assert p.flush(60) == 0

    def copied():
        d = cluster.workdir / "broker-3" / "logs" / f"{topic}-0"
        return sum(f.stat().st_size for f in d.glob("*.log"))

    cluster.arm("broker-1-hold-layout")
    try:
        out = cluster.cli("topic", "reassign", topic, "--partition", "0", "--replicas", "2,3",
                          "--throttle", str(THROTTLE)).stdout
        assert f"{topic}-0\tmoving" in out, out
        started = time.monotonic()
        time.sleep(2)
        # held: broker 3 follows at the new epoch, broker 1 leads at it, its layout is behind
        assert copied() <= THROTTLE + 64 * 1024, f"{copied()} bytes copied unthrottled"
    finally:
        cluster.disarm("broker-1-hold-layout")
    r = cluster.cli("topic", "reassign", topic, "--partition", "0", "--replicas", "2,3", "--throttle",
                    str(THROTTLE), "--wait")
    assert "all 1 partitions are on their new replicas" in r.stdout, r.stdout + r.stderr
    took = time.monotonic() - started
    assert copied() >= 1_600_000, copied()
    assert took >= 0.5 * (copied() - THROTTLE) / THROTTLE, (took, copied())
