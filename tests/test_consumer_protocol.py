"""KIP-848's consumer protocol (ConsumerGroupHeartbeat) with librdkafka's
`group.protocol=consumer` against a real strata process: the coordinator assigns the
partitions itself, members that join take partitions only once others gave them up, a
SIGKILLed member's partitions move after its session timeout (8 s here, from the broker's
`[groups] consumer_session_timeout`; Kafka's default is 45 s), a member that leaves hands
them over at once, commits are checked against the member epoch, and a new member resumes
from the group's committed offsets. Members are separate processes
(tests/group_member.py)."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupType, KafkaError, Producer
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   NewTopic, ResourceType)

from conftest import Broker, rdkafka_conf, strata_bin

MEMBER = Path(__file__).with_name("group_member.py")
TOPIC = "kip848"
PARTITIONS = 6
GROUP = "kip848-group"


class Member:
    """A member process; by default librdkafka on the consumer protocol."""

    def __init__(self, broker, workdir: Path, name: str, lib="confluent", protocol="consumer",
                 assignor="uniform"):
        self.out = workdir / f"member-{name}.out"
        self.err = workdir / f"member-{name}.err"
        self.proc = subprocess.Popen(
            [sys.executable, str(MEMBER), lib, broker.bootstrap, GROUP, TOPIC,
             str(self.out), "--protocol", protocol, "--assignor", assignor],
            stdout=subprocess.DEVNULL, stderr=open(self.err, "ab"))

    def lines(self):
        return self.out.read_text().splitlines() if self.out.exists() else []

    def values(self):
        return {l.split(" ")[3] for l in self.lines() if l.startswith("R ") and len(l.split(" ")) == 4}

    def assignment(self):
        latest = None
        for line in self.lines():
            parts = line.split(" ")
            if parts[0] == "A":
                latest = {int(p) for p in parts[2].split(",") if p} if len(parts) == 3 else set()
        return latest

    def end(self, sig_kill=False):
        if self.proc.poll() is None:
            (self.proc.kill if sig_kill else self.proc.terminate)()
            self.proc.wait(timeout=30)

    def tail(self):
        err = self.err.read_text(errors="replace") if self.err.exists() else ""
        return "\n".join(self.lines()[-15:] + ["--- stderr ---"] + err.splitlines()[-15:])


# the broker's consumer-protocol session and heartbeat (Kafka's group.consumer.*), shorter
# than Kafka's defaults so a SIGKILLed member's session ends within the test
GROUP_ENV = {
    "STRATA__GROUPS__CONSUMER_SESSION_TIMEOUT": "8s",
    "STRATA__GROUPS__CONSUMER_MIN_SESSION_TIMEOUT": "6s",
    "STRATA__GROUPS__CONSUMER_HEARTBEAT_INTERVAL": "1s",
    "STRATA__GROUPS__CONSUMER_MIN_HEARTBEAT_INTERVAL": "1s",
    # classic members (tests/group_member.py) ask for a 4 s session
    "STRATA__GROUPS__MIN_SESSION_TIMEOUT": "1s",
}


@pytest.fixture
def broker(tmp_path):
    b = Broker(strata_bin(), tmp_path)
    b.extra_env.update(GROUP_ENV)
    b.start()
    try:
        yield b
    finally:
        b.close()


def wait_until(predicate, what, timeout, members=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n"
                         + "\n".join(m.tail() for m in members))


def produce(broker, start, count):
    p = Producer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "acks": "all"}))
    for i in range(start, start + count):
        p.produce(TOPIC, key=str(i).encode(), value=f"r{i}".encode())
    assert p.flush(30) == 0
    return {f"r{i}" for i in range(start, start + count)}


def test_consumer_protocol_members_share_hand_over_and_resume(broker, tmp_path):
    a = AdminClient(rdkafka_conf({"bootstrap.servers": broker.bootstrap}))
    a.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(20)
    sent = produce(broker, 0, 600)
    m1, m2 = Member(broker, tmp_path, "1"), Member(broker, tmp_path, "2")
    members = [m1, m2]
    try:
        def split():
            a1, a2 = m1.assignment(), m2.assignment()
            return (a1 is not None and a2 is not None and not (a1 & a2)
                    and a1 | a2 == set(range(PARTITIONS)) and len(a1) == len(a2))
        wait_until(split, "two members with 3 partitions each", 60, members)
        wait_until(lambda: m1.values() | m2.values() >= sent, "600 records consumed", 60, members)

        # the group is listed and described as a consumer-protocol group (ConsumerGroupDescribe)
        groups = a.list_consumer_groups(request_timeout=10).result(20).valid
        listed = [g for g in groups if g.group_id == GROUP]
        assert listed and listed[0].type == ConsumerGroupType.CONSUMER, groups
        d = a.describe_consumer_groups([GROUP], request_timeout=10)[GROUP].result(20)
        assert d.type == ConsumerGroupType.CONSUMER and len(d.members) == 2, d
        described = sorted(len(m.assignment.topic_partitions) for m in d.members)
        assert described == [3, 3], d
        assert {tp.topic for m in d.members for tp in m.assignment.topic_partitions} == {TOPIC}

        # SIGKILL: m2's partitions move to m1 once its session (8 s) is over, not before
        m2.end(sig_kill=True)
        killed = time.monotonic()
        sent |= produce(broker, 600, 300)
        wait_until(lambda: m1.assignment() == set(range(PARTITIONS)),
                   "m1 to take every partition after m2's session timed out", 40, members)
        assert time.monotonic() - killed > 5, "m2's partitions moved before its session ended"
        wait_until(lambda: m1.values() | m2.values() >= sent, "900 records consumed", 60, members)

        # a third member joins: m1 gives half up, m3 takes it
        m3 = Member(broker, tmp_path, "3")
        members.append(m3)
        wait_until(lambda: (m3.assignment() or set()) and not (m1.assignment() & m3.assignment())
                   and m1.assignment() | m3.assignment() == set(range(PARTITIONS)),
                   "m1 and m3 to split the partitions", 60, members)

        # m1 leaves (SIGTERM: commits, then leaves): m3 gets everything at once, and reads
        # on from the group's committed offsets, not from the start
        m1.end()
        seen_before = m3.values()
        fresh = produce(broker, 900, 60)
        wait_until(lambda: m3.assignment() == set(range(PARTITIONS)),
                   "m3 to take every partition after m1 left", 20, members)
        wait_until(lambda: m3.values() >= fresh, "the 60 new records", 30, members)
        again = (m3.values() - seen_before) - fresh
        # at-least-once allows a few records m1 read but had not committed; never the topic
        assert len(again) < 100, f"m3 re-read {len(again)} records: committed offsets ignored"
    finally:
        for m in members:
            m.end(sig_kill=True)


def test_group_session_configs_keep_within_the_brokers_bounds(broker):
    """Kafka's group.consumer.{min,max}.session.timeout.ms bound a group's own
    consumer.session.timeout.ms; the broker describes its defaults."""
    a = AdminClient(rdkafka_conf({"bootstrap.servers": broker.bootstrap}))
    b = a.describe_configs([ConfigResource(ResourceType.BROKER, "1")])
    configs = list(b.values())[0].result(20)
    assert configs["group.consumer.session.timeout.ms"].value == "8000", configs
    assert configs["group.consumer.min.session.timeout.ms"].value == "6000"
    assert configs["group.consumer.max.session.timeout.ms"].value == "60000"
    assert configs["group.consumer.heartbeat.interval.ms"].value == "1000"

    group = ConfigResource(ResourceType.GROUP, "bounded-group")
    d = a.describe_configs([group])[group].result(20)
    assert d["consumer.session.timeout.ms"].value == "8000", d

    def alter(key, value):
        r = ConfigResource(ResourceType.GROUP, "bounded-group",
                           incremental_configs=[ConfigEntry(key, value,
                                                            incremental_operation=AlterConfigOpType.SET)])
        return a.incremental_alter_configs([r])[r]

    alter("consumer.session.timeout.ms", "7000").result(20)
    d = a.describe_configs([group])[group].result(20)
    assert d["consumer.session.timeout.ms"].value == "7000", d
    for value, bound in (("5000", "group.consumer.min.session.timeout.ms"),
                         ("61000", "group.consumer.max.session.timeout.ms")):
        try:
            alter("consumer.session.timeout.ms", value).result(20)
            raise AssertionError(f"a session timeout of {value} ms was taken")
        except Exception as e:  # noqa: BLE001 - the KafkaException carries the code
            err = e.args[0]
            assert err.code() == KafkaError.INVALID_CONFIG, err
            assert bound in err.str(), err


def test_a_consumer_group_whose_members_left_stays_listed_until_deleted(broker, tmp_path):
    """As in Kafka 4.0: a consumer-protocol group with committed offsets stays a consumer
    group (state Empty) after its last member leaves, is described as such, and goes when
    it is deleted. Before, it vanished from the consumer-type listing at once (librdkafka's
    0081 ListConsumerGroups with a type filter found none of its four groups)."""
    from confluent_kafka import ConsumerGroupState

    a = AdminClient(rdkafka_conf({"bootstrap.servers": broker.bootstrap}))
    a.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(20)
    sent = produce(broker, 0, 60)
    m = Member(broker, tmp_path, "solo")
    try:
        wait_until(lambda: m.values() >= sent, "60 records consumed", 60, [m])
    finally:
        m.end()  # SIGTERM: commits, then leaves

    def listed():
        groups = a.list_consumer_groups(request_timeout=10).result(20).valid
        return [g for g in groups if g.group_id == GROUP]

    wait_until(lambda: listed() and listed()[0].state == ConsumerGroupState.EMPTY,
               "the group listed Empty", 20)
    assert listed()[0].type == ConsumerGroupType.CONSUMER, listed()
    d = a.describe_consumer_groups([GROUP], request_timeout=10)[GROUP].result(20)
    assert (d.type, d.state, len(d.members)) == (ConsumerGroupType.CONSUMER, ConsumerGroupState.EMPTY, 0), d
    a.delete_consumer_groups([GROUP], request_timeout=10)[GROUP].result(20)
    assert not listed(), "a deleted group is still listed"


@pytest.mark.parametrize("classic", ["eager", "cooperative"])
def test_a_group_with_members_moves_between_the_classic_and_the_consumer_protocol(
        broker, tmp_path, classic):
    """Kafka 4.0's online migration (group.consumer.migration.policy=bidirectional): a
    consumer-protocol member joining a classic group with members upgrades it, the classic
    members (librdkafka and kafka-python with eager range, or two librdkafka members with
    cooperative-sticky, which report what they own) stay in it and share the partitions
    with the new member, and when that member leaves the group goes back to classic and
    rebalances. Nothing is lost and no partition is assigned twice at the end of each step.
    Before, the new member was refused (GROUP_ID_NOT_FOUND) while the classic group had
    members."""
    a = AdminClient(rdkafka_conf({"bootstrap.servers": broker.bootstrap}))
    a.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(20)
    everything = set(range(PARTITIONS))
    sent = produce(broker, 0, 300)
    if classic == "eager":
        c1 = Member(broker, tmp_path, "classic-1", protocol="classic", assignor="range")
        c2 = Member(broker, tmp_path, "classic-2", lib="kafka-python", protocol="classic",
                    assignor="range")
    else:
        c1, c2 = (Member(broker, tmp_path, f"classic-{i}", protocol="classic",
                         assignor="cooperative-sticky") for i in (1, 2))
    members = [c1, c2]

    def shared(ms):
        owned = [m.assignment() for m in ms]
        if any(not o for o in owned):
            return False
        return (sum(len(o) for o in owned) == PARTITIONS
                and set().union(*owned) == everything)

    def values():
        return set().union(*(m.values() for m in members))

    def group_type():
        groups = a.list_consumer_groups(request_timeout=10).result(20).valid
        return [g.type for g in groups if g.group_id == GROUP]

    try:
        wait_until(lambda: shared([c1, c2]), "the classic members to split the partitions", 60,
                   members)
        wait_until(lambda: values() >= sent, "300 records consumed", 60, members)
        assert group_type() == [ConsumerGroupType.CLASSIC], group_type()

        # upgrade: a consumer-protocol member joins the classic group with members
        n = Member(broker, tmp_path, "consumer-protocol")
        members.append(n)
        wait_until(lambda: shared([c1, c2, n]), "three members to split the partitions", 90,
                   members)
        assert group_type() == [ConsumerGroupType.CONSUMER], group_type()
        d = a.describe_consumer_groups([GROUP], request_timeout=10)[GROUP].result(20)
        assert len(d.members) == 3, d
        sent |= produce(broker, 300, 300)
        wait_until(lambda: values() >= sent, "600 records consumed", 60, members)

        # downgrade: the consumer-protocol member leaves; the classic members take it all
        n.end()
        wait_until(lambda: shared([c1, c2]) and group_type() == [ConsumerGroupType.CLASSIC],
                   "the classic members to split the partitions in a classic group again", 90,
                   members)
        sent |= produce(broker, 600, 300)
        wait_until(lambda: values() >= sent, "900 records consumed", 60, members)
    finally:
        for m in members:
            m.end(sig_kill=True)
