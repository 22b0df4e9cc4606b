"""Consumer groups on a real 3-controller + 3-broker cluster, with the members as real
processes (confluent-kafka and kafka-python, tests/group_member.py) and kcat's balanced
consumer: partitions are shared and move when a member is SIGKILLed, consumers restart from
their committed offsets with no record skipped (at-least-once), two groups read the same
topic independently, and the group recovers when its coordinator's broker is SIGKILLed
during a rebalance.
"""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import kcat_bin, rdkafka_conf, strata_bin
from test_cluster import Cluster, attach_logs_on_failure

TOPIC = "payments"
PARTITIONS = 12
OFFSETS_PARTITIONS = 10
SESSION_S = 4  # group_member.py's session.timeout.ms
MEMBER = Path(__file__).resolve().parent / "group_member.py"


@pytest.fixture
def cluster(request, tmp_path):
    # Small offsets segments and frequent snapshots, so the tests also run the coordinators
    # (and their failover) on trimmed __consumer_offsets partitions.
    extra = (f'\n[groups]\noffsets_topic_partitions = {OFFSETS_PARTITIONS}\nmin_session_timeout = "1s"\n'
             'offsets_snapshot_records = 100\noffsets_topic_segment_bytes = 4096\n')
    c = Cluster(strata_bin(), tmp_path, broker_extra=extra)
    members = []
    c.members = members
    try:
        c.start_all()
        yield c
    finally:
        for m in members:
            m.kill()
        c.stop_all()
        attach_logs_on_failure(request, c, 80)
        call = getattr(request.node, "rep_call", None)
        if call is not None and call.failed:
            for m in members:
                request.node.add_report_section("teardown", f"member {m.name}", m.tail())


def bootstrap(cluster):
    return ",".join(f"127.0.0.1:{cluster.broker_ports[i]}" for i in (1, 2, 3))


class Member:
    """A group member process and what it wrote."""

    def __init__(self, cluster, lib, group, name, assignor="roundrobin", delay=0.0,
                 protocol="classic"):
        self.name = name
        self.out = cluster.workdir / f"member-{name}.out"
        self.err = cluster.workdir / f"member-{name}.err"
        args = [sys.executable, str(MEMBER), lib, bootstrap(cluster), group, TOPIC, str(self.out),
                "--assignor", assignor, "--delay", str(delay), "--protocol", protocol]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(self.err, "ab"))
        cluster.members.append(self)

    def lines(self):
        return self.out.read_text().splitlines() if self.out.exists() else []

    def records(self):
        """[(partition, offset, value)], skipping a line cut by SIGKILL."""
        out = []
        for line in self.lines():
            parts = line.split(" ")
            if parts[0] == "R" and len(parts) == 4:
                out.append((int(parts[1]), int(parts[2]), parts[3]))
        return out

    def assignment(self, since=0.0):
        """The latest assignment written at or after `since` (None: none yet)."""
        latest = None
        for line in self.lines():
            parts = line.split(" ")
            if parts[0] == "A" and len(parts) >= 2 and float(parts[1]) >= since:
                latest = {int(p) for p in parts[2].split(",") if p} if len(parts) == 3 else set()
        return latest

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        if self.alive():
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        """SIGTERM: the member commits what it wrote and leaves the group."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, n=30):
        text = self.err.read_text(errors="replace") if self.err.exists() else ""
        return "\n".join((self.lines()[-n:] + ["--- stderr ---"] + text.splitlines()[-n:]))


def create_topic(cluster):
    cluster.cli("topic", "create", TOPIC, "-p", str(PARTITIONS), "--replication-factor", "3",
                "--config", "min.insync.replicas=2")
    cluster.wait_for(lambda m: TOPIC in m["topics"], f"topic {TOPIC}")
    time.sleep(1)


def produce(cluster, start, count):
    """Produces values r<start>..r<start+count-1> with acks=all; returns the acked values."""
    from confluent_kafka import Producer

    acked = set()

    def on_delivery(err, msg):
        if err is None:
            acked.add(msg.value().decode())

    p = Producer(rdkafka_conf({"bootstrap.servers": bootstrap(cluster), "acks": "all",
                               "enable.idempotence": True, "linger.ms": 5}))
    for i in range(start, start + count):
        p.produce(TOPIC, key=str(i).encode(), value=f"r{i}".encode(), on_delivery=on_delivery)
        p.poll(0)
    assert p.flush(30) == 0, "produce did not finish"
    assert len(acked) == count, f"only {len(acked)}/{count} acknowledged"
    return acked


def wait_until(predicate, what, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def covers_all(members, since=0.0):
    """The live members' latest assignments partition the topic exactly."""
    seen = []
    for m in members:
        a = m.assignment(since)
        if a is None:
            return False
        seen.extend(a)
    return sorted(seen) == list(range(PARTITIONS))


def consumed_values(members):
    return {v for m in members for (_, _, v) in m.records()}


def java_hash_partition(group, partitions):
    """Kafka's abs(group.hashCode()) % partitions, with Java's String.hashCode."""
    data = group.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (h * 31 + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    h = 0 if h == -(1 << 31) else abs(h)
    return h % partitions


def coordinator_of(cluster, group):
    p = java_hash_partition(group, OFFSETS_PARTITIONS)
    return cluster.metadata()["topics"]["__consumer_offsets"]["partitions"][p]["leader"]


def test_members_share_partitions_move_on_sigkill_and_resume_from_commits(cluster):
    create_topic(cluster)
    produced = produce(cluster, 0, 3000)
    libs = ["confluent", "kafka-python", "confluent", "kafka-python"]
    members = [Member(cluster, lib, "settlement", f"a{i}") for i, lib in enumerate(libs)]
    wait_until(lambda: covers_all(members), "4 members to share the 12 partitions", 60)
    for m in members:
        assert len(m.assignment()) == 3, f"{m.name} has {m.assignment()}"
    wait_until(lambda: consumed_values(members) >= produced, "the first 3000 records", 60)

    # SIGKILL one member: its partitions move to the others within the session timeout.
    victim, survivors = members[1], [members[0], members[2], members[3]]
    lost = victim.assignment()
    killed_at = time.time()
    victim.kill()
    produced |= produce(cluster, 3000, 600)
    wait_until(lambda: covers_all(survivors, since=killed_at), "the survivors to take over", SESSION_S + 15)
    moved_after = max(float(l.split(" ")[1]) for m in survivors for l in m.lines() if l.startswith("A ")) - killed_at
    print(f"partitions {sorted(lost)} moved {moved_after:.2f}s after the SIGKILL")
    assert moved_after <= SESSION_S + 6, f"took {moved_after:.1f}s"
    wait_until(lambda: consumed_values(members) >= produced, "records after the takeover", 60)

    # All stop (cleanly, committing) and restart: they resume at the committed offsets.
    for m in survivors:
        m.stop()
    last = {}
    for m in members:
        for p, o, _ in m.records():
            last[p] = max(last.get(p, -1), o)
    produced |= produce(cluster, 3600, 1200)
    restarted = [Member(cluster, lib, "settlement", f"b{i}") for i, lib in enumerate(libs)]
    wait_until(lambda: consumed_values(restarted) >= {f"r{i}" for i in range(3600, 4800)},
               "the records produced while the group was down", 90)
    everything = members + restarted
    assert consumed_values(everything) >= produced, "a produced record was never consumed"
    first_after = {}
    for m in restarted:
        for p, o, _ in m.records():
            first_after[p] = min(first_after.get(p, 1 << 62), o)
    for p in range(PARTITIONS):
        # Resumed exactly after what the previous members processed and committed: no skip
        # (not above), and not from the beginning (the commits were kept).
        assert first_after[p] == last[p] + 1, f"partition {p}: resumed at {first_after[p]}, last seen {last[p]}"


def test_two_groups_read_the_same_topic_independently(cluster):
    create_topic(cluster)
    produced = produce(cluster, 0, 2000)
    fast = [Member(cluster, "confluent", "reporting", "fast0", assignor="cooperative-sticky"),
            Member(cluster, "confluent", "reporting", "fast1", assignor="cooperative-sticky")]
    slow = [Member(cluster, "kafka-python", "audit", "slow0", assignor="range", delay=0.004)]
    wait_until(lambda: consumed_values(fast) >= produced, "the fast group to read everything", 60)
    slow_progress = len(consumed_values(slow))
    assert slow_progress < len(produced), "the slow group should still be behind"
    # The slow group's position is its own: it goes on to read everything too.
    wait_until(lambda: consumed_values(slow) >= produced, "the slow group to catch up", 90)
    sets = [m.assignment() for m in fast]
    assert sorted(sets[0] | sets[1]) == list(range(PARTITIONS)) and not (sets[0] & sets[1])
    assert sorted(slow[0].assignment()) == list(range(PARTITIONS))


def test_group_recovers_when_its_coordinator_is_killed_mid_rebalance(cluster):
    create_topic(cluster)
    produced = produce(cluster, 0, 2000)
    group = "custody"
    members = [Member(cluster, "confluent", group, "c0"), Member(cluster, "kafka-python", group, "c1")]
    wait_until(lambda: covers_all(members), "2 members to share the partitions", 60)
    wait_until(lambda: consumed_values(members) >= produced, "the first records", 60)
    before = {}
    for m in members:
        for p, o, _ in m.records():
            before[p] = max(before.get(p, -1), o)
    coordinator = coordinator_of(cluster, group)
    # A third member starts a rebalance; the coordinator's broker dies during it.
    started = time.time()
    members.append(Member(cluster, "confluent", group, "c2"))
    time.sleep(0.5)
    cluster.kill(f"broker-{coordinator}")
    produced |= produce(cluster, 2000, 600)
    wait_until(lambda: covers_all(members, since=started), "the group to settle on the new coordinator", 60)
    settled = time.time() - started
    print(f"coordinator broker-{coordinator} killed; group settled {settled:.1f}s after the rebalance began")
    new = coordinator_of(cluster, group)
    assert new != coordinator
    wait_until(lambda: consumed_values(members) >= produced, "every record after the failover", 60)
    # No committed offset was lost: nothing before the failover is read again from the start.
    redelivered_from_start = [p for p in range(PARTITIONS)
                              if sum(1 for m in members for (q, o, _) in m.records() if q == p and o == 0) > 1]
    assert not redelivered_from_start, f"partitions read again from offset 0: {redelivered_from_start}"
    for p, o in before.items():
        firsts = [oo for m in members for (q, oo, _) in m.records() if q == p]
        assert max(firsts) >= o


def test_consumer_protocol_group_keeps_its_partitions_when_its_coordinator_is_killed(cluster):
    """KIP-848: the group's state is in __consumer_offsets, so the new coordinator knows the
    members at their epochs and nobody's partitions move."""
    create_topic(cluster)
    produced = produce(cluster, 0, 2000)
    group = "custody-kip848"
    members = [Member(cluster, "confluent", group, f"k{i}", assignor="uniform",
                      protocol="consumer") for i in range(2)]
    wait_until(lambda: covers_all(members), "2 consumer-protocol members to share the partitions", 60)
    wait_until(lambda: consumed_values(members) >= produced, "the first records", 60)
    held = {m.name: m.assignment() for m in members}
    coordinator = coordinator_of(cluster, group)
    killed_at = time.time()
    cluster.kill(f"broker-{coordinator}")
    produced |= produce(cluster, 2000, 600)
    wait_until(lambda: consumed_values(members) >= produced, "every record after the failover", 90)
    assert coordinator_of(cluster, group) != coordinator
    for m in members:
        moved = [l for l in m.lines() if l.startswith("A ") and float(l.split(" ")[1]) >= killed_at]
        assert not moved and m.assignment() == held[m.name], (
            f"{m.name}'s partitions moved after the coordinator's SIGKILL: {moved}")


def test_kcat_balanced_consumer(cluster):
    create_topic(cluster)
    produced = produce(cluster, 0, 1500)
    out = subprocess.run(
        [kcat_bin(), "-b", bootstrap(cluster), "-G", "kcat-group", TOPIC, "-o", "beginning",
         "-X", "auto.offset.reset=earliest", "-e", "-q", "-f", "%s\n"],
        capture_output=True, text=True, timeout=60)
    got = set(out.stdout.split())
    assert got == produced, f"kcat -G read {len(got)} of {len(produced)}: {out.stderr[-2000:]}"
    # Its commits were kept: a second run reads nothing new.
    again = subprocess.run(
        [kcat_bin(), "-b", bootstrap(cluster), "-G", "kcat-group", TOPIC, "-e", "-q", "-f", "%s\n"],
        capture_output=True, text=True, timeout=60)
    assert again.stdout.split() == [], again.stderr[-2000:]


def strata_group(cluster, *args):
    import os
    env = dict(os.environ)
    env.pop("RUST_BACKTRACE", None)
    r = subprocess.run([strata_bin(), "group", "--bootstrap", bootstrap(cluster), *args],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, f"strata group {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def total_lag(describe_output):
    return int(describe_output.strip().splitlines()[-1].split()[-1])


def test_operator_view_lists_describes_and_resets_offsets(cluster):
    create_topic(cluster)
    produced = produce(cluster, 0, 1200)
    subprocess.run([kcat_bin(), "-b", bootstrap(cluster), "-G", "ops", TOPIC, "-o", "beginning",
                    "-X", "auto.offset.reset=earliest", "-e", "-q"], capture_output=True, timeout=60, check=True)
    listed = strata_group(cluster, "list")
    assert any(line.split("\t")[:2] == ["ops", "Empty"] for line in listed.splitlines()), listed
    described = strata_group(cluster, "describe", "ops")
    assert "state Empty" in described and total_lag(described) == 0, described

    plan = strata_group(cluster, "reset-offsets", "ops", "-t", TOPIC, "--to-earliest")
    assert "dry run" in plan
    assert total_lag(strata_group(cluster, "describe", "ops")) == 0, "a dry run changed nothing"
    strata_group(cluster, "reset-offsets", "ops", "-t", TOPIC, "--to-earliest", "--execute")
    assert total_lag(strata_group(cluster, "describe", "ops")) == len(produced)

    # The coordinator's metrics show the same lag, partition by partition.
    coordinator = coordinator_of(cluster, "ops")
    m = cluster.broker_metrics(coordinator)
    lags = {k: v for k, v in m.items() if k.startswith('strata_group_lag_records{group="ops"')}
    assert len(lags) == PARTITIONS and sum(lags.values()) == len(produced), lags

    # A consumer of the group reads everything again from the reset offsets.
    out = subprocess.run([kcat_bin(), "-b", bootstrap(cluster), "-G", "ops", TOPIC, "-e", "-q", "-f", "%s\n"],
                         capture_output=True, text=True, timeout=60)
    assert set(out.stdout.split()) == produced
    strata_group(cluster, "reset-offsets", "ops", "-t", TOPIC, "--to-offset", "50", "--execute")
    assert total_lag(strata_group(cluster, "describe", "ops")) == len(produced) - 50 * PARTITIONS

    # Many commits: the coordinator snapshots its offsets partition and every replica
    # deletes the superseded segments; the offsets are intact.
    for n in range(12):
        strata_group(cluster, "reset-offsets", "ops", "-t", TOPIC, "--to-offset", str(60 + n), "--execute")
    index = java_hash_partition("ops", OFFSETS_PARTITIONS)

    def first_segment(i):
        d = cluster.workdir / f"broker-{i}" / "logs" / f"__consumer_offsets-{index}"
        return min(int(f.name.split(".")[0]) for f in d.glob("*.log"))
    wait_until(lambda: all(first_segment(i) > 0 for i in (1, 2, 3)), "every replica to drop superseded segments", 30)
    expected = len(produced) - 71 * PARTITIONS
    assert total_lag(strata_group(cluster, "describe", "ops")) == expected

    # The coordinator's broker dies: a follower replays the trimmed partition to the same
    # offsets.
    cluster.kill(f"broker-{coordinator_of(cluster, 'ops')}")

    def recovered():
        try:
            return total_lag(strata_group(cluster, "describe", "ops")) == expected
        except AssertionError:
            return False
    wait_until(recovered, "the new coordinator to serve the same offsets", 30)


def test_native_and_kafka_members_share_group_offsets(cluster):
    """A native (gRPC) member, assigned by the coordinator, commits; a kafka-python member of
    the same group then starts where it stopped: one coordinator, one set of offsets."""
    import os
    create_topic(cluster)
    produced = produce(cluster, 0, 900)
    env = dict(os.environ)
    env.pop("RUST_BACKTRACE", None)
    grpc = f"127.0.0.1:{cluster.grpc_ports[1]}"
    native = subprocess.run([strata_bin(), "consume", "--grpc", grpc, "-t", TOPIC, "--group", "mixed",
                             "--assignor", "roundrobin", "--idle", "3s"],
                            capture_output=True, text=True, timeout=90, env=env)
    assert native.returncode == 0, native.stderr
    got = {line.split(" ")[3] for line in native.stdout.splitlines() if line.count(" ") >= 3}
    assert got == produced, f"native member read {len(got)} of {len(produced)}: {native.stderr[-1500:]}"
    described = strata_group(cluster, "describe", "mixed")
    assert total_lag(described) == 0, described
    produced_later = produce(cluster, 900, 120)
    member = Member(cluster, "kafka-python", "mixed", "k0")
    try:
        wait_until(lambda: consumed_values([member]) >= produced_later, "the kafka-python member", 60)
    except AssertionError as e:
        # seen once in CI (2026-12-01), not reproduced: say what the member and the group saw
        err = member.err.read_text()[-3000:] if member.err.exists() else ""
        raise AssertionError(f"{e}; member output: {member.lines()[-10:]}; member stderr: {err}; "
                             f"group: {strata_group(cluster, 'describe', 'mixed')}") from e
    time.sleep(1)
    assert consumed_values([member]) == produced_later, "it resumed at the native member's commits"
