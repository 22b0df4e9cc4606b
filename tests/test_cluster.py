"""A 3-controller + 3-broker cluster of real `strata` processes on 127.0.0.1: placement,
controller failover (SIGKILL of the leader), broker fencing and rejoin.

The brokers register, heartbeat and stream metadata; replication itself is tested in
test_replication.py.
"""

import collections
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import free_port, port_accepts, port_accepts_at, scrape_metrics, strata_bin

LEASE_S = 3


class Cluster:
    def __init__(self, binary, workdir: Path, broker_extra: str = "", tls: bool = False, lease_s: int = LEASE_S,
                 raft_heartbeat_ms: int = 100):
        self.binary = binary
        self.workdir = workdir
        self.lease_s = lease_s
        self.raft_heartbeat_ms = raft_heartbeat_ms
        # Extra lines for each broker's [cluster] section.
        self.broker_extra = broker_extra
        # mTLS on every gRPC port ([tls]): `strata certs` makes a CA, a certificate per node
        # and client certificates for an admin (a super user) and for mallory (signed by the
        # same CA, but nobody in particular).
        self.certs = workdir / "certs" if tls else None
        if tls:
            nodes = [a for i in (1, 2, 3) for a in ("--node", f"controller-{i}", "--node", f"broker-{i}")]
            subprocess.run([binary, "certs", "--out", str(self.certs), *nodes,
                            "--client", "admin", "--client", "mallory", "--client", "writer"],
                           check=True, capture_output=True)
        self.controller_ports = {i: free_port() for i in (1, 2, 3)}
        self.broker_ports = {i: free_port() for i in (1, 2, 3)}
        self.grpc_ports = {i: free_port() for i in (1, 2, 3)}
        self.metrics_ports = {i: free_port() for i in (1, 2, 3)}
        self.controller_metrics_ports = {i: free_port() for i in (1, 2, 3)}
        self.procs = {}
        # Failpoints (controller/src/failpoint.rs): a test arms one by creating its file here.
        self.failpoints = workdir / "failpoints"
        self.failpoints.mkdir(exist_ok=True)
        # Benchmarks turn them off: each check is a file lookup (one per fsync, say).
        self.failpoints_on = True

    def arm(self, failpoint):
        (self.failpoints / failpoint).touch()

    def disarm(self, failpoint):
        (self.failpoints / failpoint).unlink(missing_ok=True)

    def fired(self, failpoint):
        return (self.failpoints / f"{failpoint}.fired").exists()

    def controller_addr(self, i):
        return f"127.0.0.1:{self.controller_ports[i]}"

    def tls_section(self, name):
        if not self.certs:
            return ""
        # Brokers keep their Kafka listener open (PLAINTEXT, no ACL needed): these clusters
        # test the internal planes; test_security.py tests authenticated Kafka listeners.
        auth = ('[auth]\nsuper_users = ["User:CN=admin"]\nallow_everyone_if_no_acl_found = true\n'
                if name.startswith("broker") else "")
        return auth + (f'[tls]\nca = "{self.certs / "ca.pem"}"\ncert = "{self.certs / f"node-{name}.pem"}"\n'
                f'key = "{self.certs / f"node-{name}.key"}"\n')

    def client_tls(self, user="admin"):
        """The `strata` flags of a client holding `user`'s certificate (none without TLS)."""
        if not self.certs:
            return []
        return ["--tls-ca", str(self.certs / "ca.pem"), "--tls-cert", str(self.certs / f"client-{user}.pem"),
                "--tls-key", str(self.certs / f"client-{user}.key")]

    def host(self, name):
        """The address node `name` listens on."""
        return "127.0.0.1"

    def launcher(self, name):
        """What runs before the binary in node `name`'s command line."""
        return []

    def cluster_extra(self, i):
        """More lines for broker i's [cluster] section (a subclass gives each its rack)."""
        return ""

    def _config(self, name):
        path = self.workdir / f"{name}.toml"
        voters = "\n".join(f'{i} = "{self.controller_addr(i)}"' for i in (1, 2, 3))
        controllers = ", ".join(f'"{self.controller_addr(i)}"' for i in (1, 2, 3))
        kind, i = name.split("-")
        i = int(i)
        host = self.host(name)
        if kind == "controller":
            text = (
                f'roles = ["controller"]\ndata_dir = "{self.workdir / name}"\n'
                f"[controller]\nnode_id = {i}\nlisten = \"{self.controller_addr(i)}\"\n"
                f'broker_lease = "{int(self.lease_s * 1000)}ms"\nraft_heartbeat = "{self.raft_heartbeat_ms}ms"\n[controller.voters]\n{voters}\n'
                f'[metrics]\nlisten = "{host}:{self.controller_metrics_ports[i]}"\n'
                + ('[auth]\nsuper_users = ["User:CN=admin"]\n' if self.certs else "")
            )
        else:
            text = (
                f'roles = ["broker"]\nnode_id = {i}\ndata_dir = "{self.workdir / name}"\n'
                f'[kafka]\nlisten = "{host}:{self.broker_ports[i]}"\n'
                f'[grpc]\nlisten = "{host}:{self.grpc_ports[i]}"\n'
                f'[metrics]\nlisten = "{host}:{self.metrics_ports[i]}"\n'
                f"[cluster]\ncontrollers = [{controllers}]\n{self.broker_extra}{self.cluster_extra(i)}"
            )
        path.write_text(text + self.tls_section(name))
        return path

    def start(self, name):
        log = open(self.workdir / f"{name}.log", "ab")
        env = dict(os.environ, NO_COLOR="1")
        if self.failpoints_on:
            env["STRATA_TEST_FAILPOINTS_DIR"] = str(self.failpoints)
        self.procs[name] = subprocess.Popen(
            [*self.launcher(name), self.binary, "server", "--config", str(self._config(name))],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env,
        )
        port = self.controller_ports if name.startswith("controller") else self.broker_ports
        i = int(name.split("-")[1])
        deadline = time.monotonic() + 30
        while not port_accepts_at(self.host(name), port[i]):
            assert self.procs[name].poll() is None, f"{name} exited:\n{self.log_tail(name)}"
            assert time.monotonic() < deadline, f"{name} did not start:\n{self.log_tail(name)}"
            time.sleep(0.05)

    def start_all(self):
        """3 controllers with an elected leader, then 3 registered, unfenced brokers."""
        for i in (1, 2, 3):
            self.start(f"controller-{i}")
        self.leader()
        for i in (1, 2, 3):
            self.start(f"broker-{i}")
        self.wait_for(lambda m: len([b for b in m["brokers"].values() if not b["fenced"]]) == 3, "3 live brokers")

    def kill(self, name):
        p = self.procs.pop(name)
        p.send_signal(signal.SIGKILL)
        p.wait()

    def stop_all(self):
        """SIGTERM to the brokers, then to the controllers, as an operator stops a cluster: a
        broker's graceful stop asks the controllers to move its leaderships first, and waits
        up to 8 s for an answer that never comes when the controllers stop with it."""
        for group in ("broker", "controller"):
            stopping = [(n, p) for n, p in self.procs.items() if n.startswith(group)]
            for _, p in stopping:
                p.terminate()
            for _, p in stopping:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()

    def broker_metrics(self, i):
        """{metric line without value: value} from broker i's /metrics."""
        return scrape_metrics(self.metrics_ports[i], timeout=5)

    def log_tail(self, name, lines=40):
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def cli(self, *args, controller=None, check=True):
        controller = controller or next(
            self.controller_addr(int(n.split("-")[1])) for n in self.procs if n.startswith("controller")
        )
        env = dict(os.environ)
        env.pop("RUST_BACKTRACE", None)
        r = subprocess.run([self.binary, *args[:1], "--controller", controller, *self.client_tls(), *args[1:]],
                           capture_output=True, text=True, timeout=30, env=env)
        if check:
            assert r.returncode == 0, f"strata {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
        return r

    def quorum(self, controller):
        r = self.cli("quorum", "describe", controller=controller, check=False)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def metadata(self, controller=None):
        return json.loads(self.cli("quorum", "metadata", controller=controller).stdout)

    def leader(self, timeout=15):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for n in self.procs:
                if n.startswith("controller"):
                    q = self.quorum(self.controller_addr(int(n.split("-")[1])))
                    if q and q["leader_id"] is not None and f"controller-{q['leader_id']}" in self.procs:
                        return q["leader_id"]
            time.sleep(0.1)
        raise AssertionError("no controller leader elected in time")

    def wait_for(self, predicate, what, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.metadata()
            if predicate(m):
                return m
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; metadata: {json.dumps(m)[:2000]}")


@pytest.fixture
def cluster(request, tmp_path):
    c = Cluster(strata_bin(), tmp_path)
    try:
        c.start_all()
        yield c
    finally:
        c.stop_all()
        attach_logs_on_failure(request, c)


def attach_logs_on_failure(request, c, lines=60):
    """Every process's log tail in the report of a failed test, so a failure seen once (in
    CI) can be diagnosed."""
    failed = any(
        getattr(request.node, "rep_" + when, None) is not None and getattr(request.node, "rep_" + when).failed
        for when in ("setup", "call")
    )
    if failed:
        for log in sorted(c.workdir.glob("*.log")):
            request.node.add_report_section("teardown", log.stem, c.log_tail(log.stem, lines))


def leaders(m, topic):
    return collections.Counter(p["leader"] for p in m["topics"][topic]["partitions"])


def test_placement_controller_failover_and_broker_fencing(cluster):
    # 12 partitions, RF=3: leaders spread evenly over the three brokers.
    cluster.cli("topic", "create", "orders", "-p", "12", "--replication-factor", "3")
    m = cluster.metadata()
    assert sorted(leaders(m, "orders").values()) == [4, 4, 4], leaders(m, "orders")
    for p in m["topics"]["orders"]["partitions"]:
        assert sorted(p["replicas"]) == [1, 2, 3] and p["isr"] == p["replicas"]

    # The same spec again is a no-op; another spec is refused with a clear message.
    again = cluster.cli("topic", "create", "orders", "-p", "12", "--replication-factor", "3")
    assert "already exists with this spec" in again.stdout
    refused = cluster.cli("topic", "create", "orders", "-p", "4", "--replication-factor", "3", check=False)
    assert refused.returncode != 0 and "12 partitions" in refused.stderr, refused.stderr

    # SIGKILL the controller leader: another is elected, the metadata is intact, writes work.
    old = cluster.leader()
    version = m["version"]
    cluster.kill(f"controller-{old}")
    started = time.monotonic()
    new = cluster.leader()
    elected_after = time.monotonic() - started
    assert new != old
    print(f"new controller leader {new} after {elected_after:.2f}s")
    assert elected_after < 10
    m = cluster.metadata()
    assert m["version"] >= version and "orders" in m["topics"]
    cluster.cli("topic", "create", "single", "-p", "3", "--replication-factor", "1")

    # SIGKILL a broker: it is fenced after its lease; leaderships move; RF=1 partitions on it
    # report as offline instead of vanishing.
    victim = 3
    on_victim = [i for i, p in enumerate(cluster.metadata()["topics"]["single"]["partitions"]) if p["replicas"] == [victim]]
    assert len(on_victim) == 1
    cluster.kill(f"broker-{victim}")
    # (right after the controller failover the brokers' sessions may still be reconnecting,
    # so this may take the lease; test_replication checks the fast path)
    m = cluster.wait_for(lambda m: m["brokers"][str(victim)]["fenced"], f"broker {victim} fenced", timeout=LEASE_S * 4)
    assert victim not in leaders(m, "orders")
    for p in m["topics"]["orders"]["partitions"]:
        assert victim not in p["isr"] and p["leader"] in p["isr"]
    offline = [i for i, p in enumerate(m["topics"]["single"]["partitions"]) if p["leader"] is None]
    assert offline == on_victim

    # Restart it: a new incarnation registers (new epoch) and its partition comes back.
    epoch_before = m["brokers"][str(victim)]["epoch"]
    cluster.start(f"broker-{victim}")
    m = cluster.wait_for(
        lambda m: not m["brokers"][str(victim)]["fenced"]
        and m["topics"]["single"]["partitions"][on_victim[0]]["leader"] == victim,
        f"broker {victim} back",
    )
    assert m["brokers"][str(victim)]["epoch"] > epoch_before

    # A clean stop moves leaderships away first (controlled shutdown).
    cluster.procs[f"broker-{victim}"].terminate()
    cluster.procs.pop(f"broker-{victim}").wait(timeout=15)
    # (faster than the lease could expire)
    cluster.wait_for(lambda m: m["brokers"][str(victim)]["fenced"], "controlled shutdown", timeout=LEASE_S - 1)


def test_kafka_clients_through_any_bootstrap_broker(cluster):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from conftest import check_partitions, consume_partitions, kcat_bin, parse_value, rdkafka_conf, record_key, record_value

    b = {i: f"127.0.0.1:{cluster.broker_ports[i]}" for i in (1, 2, 3)}

    # CreateTopics through broker 2 goes to the controllers.
    admin = AdminClient(rdkafka_conf({"bootstrap.servers": b[2]}))
    futures = admin.create_topics([NewTopic("events", num_partitions=12, replication_factor=1)], operation_timeout=20)
    futures["events"].result(timeout=30)
    m = cluster.metadata()
    assert sorted(leaders(m, "events").values()) == [4, 4, 4]

    # Every broker describes the whole cluster.
    for i in (1, 2, 3):
        md = admin.list_topics(timeout=10) if i == 2 else AdminClient({"bootstrap.servers": b[i]}).list_topics(timeout=10)
        assert sorted(md.brokers) == [1, 2, 3]
        assert len(md.topics["events"].partitions) == 12
        assert {p.leader for p in md.topics["events"].partitions.values()} == {1, 2, 3}

    # Produce through broker 3 only; librdkafka routes each partition to its leader.
    n = 12_000
    acked = {}

    def on_delivery(err, msg):
        assert err is None, err
        acked[int(parse_value(msg.value()))] = (msg.partition(), msg.offset())

    p = Producer(rdkafka_conf({"bootstrap.servers": b[3], "acks": "all", "enable.idempotence": True, "linger.ms": 5}))
    for i in range(n):
        p.produce("events", record_value(i).encode(), record_key(i).encode(), on_delivery=on_delivery)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert len(acked) == n

    # Consume through broker 1 only: everything, in per-partition order, where it was acked.
    out, hwm = consume_partitions(b[1], "events", 12, time.monotonic() + 60)
    check_partitions(out, n, 12)
    for part, recs in out.items():
        for off, _, v in recs:
            assert acked[v] == (part, off)

    # kcat through broker 2 sees the same records.
    r = subprocess.run([kcat_bin(), "-b", b[2], "-C", "-t", "events", "-e", "-q", "-f", "%p %o\\n"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == n

    # Partitions and configs change through any broker, via the controllers.
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions

    admin.create_partitions([NewPartitions("events", 15)])["events"].result(timeout=30)
    res = ConfigResource(ConfigResource.Type.TOPIC, "events",
                         incremental_configs=[ConfigEntry("retention.ms", "3600000",
                                                          incremental_operation=AlterConfigOpType.SET)])
    list(admin.incremental_alter_configs([res]).values())[0].result(timeout=30)
    m = cluster.metadata()
    assert len(m["topics"]["events"]["partitions"]) == 15
    assert m["topics"]["events"]["configs"]["retention.ms"] == "3600000"
    admin3 = AdminClient({"bootstrap.servers": b[3]})  # kept alive until its futures resolve
    described = admin3.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "events")])
    entries = list(described.values())[0].result(timeout=30)
    assert entries["retention.ms"].value == "3600000"

    # Topics created and partitions added with a manual replica assignment (librdkafka's
    # 0081) get exactly those replicas, the first leading; a broker nobody registered is
    # refused whole with INVALID_REPLICA_ASSIGNMENT. (Before, any assignment was refused.)
    from confluent_kafka import KafkaError, KafkaException

    # (kafka-python here: confluent-kafka 2.16's NewTopic refuses any replica_assignment)
    from kafka.admin import KafkaAdminClient, NewTopic as KpNewTopic
    from kafka.errors import InvalidReplicationAssignmentError

    kp = KafkaAdminClient(bootstrap_servers=b[1])
    try:
        kp.create_topics([KpNewTopic("placed", -1, -1, replica_assignments={0: [2, 3]})])
        with pytest.raises(InvalidReplicationAssignmentError):
            kp.create_topics([KpNewTopic("misplaced", -1, -1, replica_assignments={0: [2, 9]})],
                             raise_errors=True)
    finally:
        kp.close()
    assert [(p["replicas"], p["leader"]) for p in cluster.metadata()["topics"]["placed"]["partitions"]] == [([2, 3], 2)]
    assert "misplaced" not in cluster.metadata()["topics"]
    admin.create_partitions([NewPartitions("placed", 3, replica_assignment=[[3, 1], [2, 3]])])["placed"].result(timeout=30)
    placed = cluster.metadata()["topics"]["placed"]["partitions"]
    assert [(p["replicas"], p["leader"]) for p in placed[1:]] == [([3, 1], 3), ([2, 3], 2)], placed
    with pytest.raises(KafkaException) as refused:
        admin.create_partitions([NewPartitions("placed", 4, replica_assignment=[[1, 9]])])["placed"].result(timeout=30)
    assert refused.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT, refused.value
    assert len(cluster.metadata()["topics"]["placed"]["partitions"]) == 3

    # acks=all on a replicated topic is acknowledged once the ISR has the record.
    cluster.cli("topic", "create", "replicated", "-p", "1", "--replication-factor", "3")
    errors = []
    p = Producer(rdkafka_conf({"bootstrap.servers": b[1], "acks": "all", "message.timeout.ms": 20000}))
    p.produce("replicated", b"v", on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert errors == [None], errors


def test_losing_the_controller_majority_stops_metadata_at_once_and_leadership_after_the_lease(cluster):
    """Without a controller majority nobody can renew a broker's lease. Metadata changes stop
    at once; each broker goes on leading until its own lease runs out, then stops (Metadata
    names no leader, produce is refused with NOT_LEADER_OR_FOLLOWER), because a majority it
    cannot reach could by then have fenced it and elected another leader (issue 16, item 4).
    With a majority again, leases are renewed and writes resume without restarting anything."""
    from confluent_kafka import Producer

    from conftest import consume_partitions, rdkafka_conf, record_value
    from kafka_wire import KafkaWire

    NOT_LEADER_OR_FOLLOWER = 6

    cluster.cli("topic", "create", "steady", "-p", "3", "--replication-factor", "1")
    cluster.wait_for(lambda m: "steady" in m["topics"], "topic steady")
    broker = f"127.0.0.1:{cluster.broker_ports[1]}"
    # give the brokers time to pick the topic up from the metadata stream
    time.sleep(1)

    layout = {i: p["leader"] for i, p in enumerate(cluster.metadata()["topics"]["steady"]["partitions"])}
    leader = cluster.leader()
    survivor = next(i for i in (1, 2, 3) if i != leader)
    for i in (1, 2, 3):
        if i != survivor:
            cluster.kill(f"controller-{i}")
    lost_at = time.monotonic()

    # Metadata changes stop with a clear error...
    refused = cluster.cli("topic", "create", "blocked", "-p", "1", controller=cluster.controller_addr(survivor), check=False)
    assert refused.returncode != 0
    assert "leader" in refused.stderr or "unavailable" in refused.stderr.lower(), refused.stderr

    # ...and once the lease has run out, no broker acts as a leader.
    time.sleep(max(0.0, lost_at + LEASE_S + 0.5 - time.monotonic()))
    for b in (1, 2, 3):
        # (a broker without a lease closes the connection after a Metadata answer)
        wire = KafkaWire(cluster.broker_ports[b])
        named = wire.partition_leaders("steady")
        wire.close()
        own = [i for i, led in layout.items() if led == b]
        assert all(named[i] == -1 for i in own), (
            f"broker {b} still names itself the leader of {own} ({named}) {LEASE_S} s after the controllers were lost")
        wire = KafkaWire(cluster.broker_ports[b])
        for i in own:
            error, _ = wire.latest_offset("steady", i)
            assert error == NOT_LEADER_OR_FOLLOWER, f"broker {b} answered ListOffsets for partition {i} with {error}"
        wire.close()
    refused_acks = []
    p = Producer(rdkafka_conf({"bootstrap.servers": broker, "acks": "all", "message.timeout.ms": 2000}))
    for i in range(10):
        p.produce("steady", b"refused", partition=i % 3, on_delivery=lambda e, m: refused_acks.append(e))
    p.flush(10)
    assert len(refused_acks) == 10 and all(e is not None for e in refused_acks), refused_acks

    # A majority again: a leader is elected, leases renewed, writes resume.
    cluster.start(f"controller-{leader}")
    cluster.leader(timeout=20)
    cluster.cli("topic", "create", "unblocked", "-p", "1", controller=cluster.controller_addr(survivor))
    acked = []
    p = Producer(rdkafka_conf({"bootstrap.servers": broker, "acks": "all", "message.timeout.ms": 30000}))
    for i in range(1000):
        p.produce("steady", record_value(i).encode(), on_delivery=lambda e, m: acked.append(e is None))
    assert p.flush(45) == 0 and all(acked) and len(acked) == 1000
    out, _ = consume_partitions(broker, "steady", 3, time.monotonic() + 30)
    assert sorted(v for recs in out.values() for _, _, v in recs) == list(range(1000))


def test_rust_client_over_grpc_agrees_with_kafka_clients(cluster):
    from confluent_kafka import Producer

    from conftest import rdkafka_conf

    cluster.cli("topic", "create", "native", "-p", "12", "--replication-factor", "1")
    cluster.wait_for(lambda m: "native" in m["topics"], "topic native")
    time.sleep(1)
    grpc = {i: f"127.0.0.1:{cluster.grpc_ports[i]}" for i in (1, 2, 3)}
    kafka = {i: f"127.0.0.1:{cluster.broker_ports[i]}" for i in (1, 2, 3)}
    env = dict(os.environ)
    env.pop("RUST_BACKTRACE", None)

    # The Rust producer, bootstrapped from broker 3, routes every partition to its leader.
    n = 3000
    lines = "".join(f"k{i % 300}:v{i}\n" for i in range(n))
    r = subprocess.run([cluster.binary, "produce", "--grpc", grpc[3], "-t", "native", "-K", ":", "--print-offsets"],
                       input=lines, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    placed = [tuple(map(int, l.split())) for l in r.stdout.splitlines()]
    assert len(placed) == n and len(set(placed)) == n

    # Kafka clients (kcat through broker 1) read exactly those records.
    from conftest import kcat_bin

    k = subprocess.run([kcat_bin(), "-b", kafka[1], "-C", "-t", "native", "-e", "-q", "-f", "%p %o %k %s\\n"],
                       capture_output=True, text=True, timeout=60)
    assert k.returncode == 0, k.stderr
    by_kafka = {}
    for line in k.stdout.splitlines():
        p, o, key, v = line.split(" ", 3)
        by_kafka[int(v[1:])] = (int(p), int(o), key)
    assert len(by_kafka) == n
    for i in range(n):
        assert by_kafka[i][:2] == placed[i], f"record {i}"

    # The Rust consumer through broker 2 sees the same.
    c = subprocess.run([cluster.binary, "consume", "--grpc", grpc[2], "-t", "native", "--idle", "2s"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert c.returncode == 0, c.stderr
    assert sorted(tuple(map(int, l.split()[:2])) for l in c.stdout.splitlines()) == sorted(placed)

    # Keyed records land where librdkafka's murmur2 partitioner puts the same keys.
    rust_partition = {by_kafka[i][2]: by_kafka[i][0] for i in range(n)}
    librdkafka = {}
    p = Producer(rdkafka_conf({"bootstrap.servers": kafka[2], "partitioner": "murmur2_random"}))
    for key in list(rust_partition)[:100]:
        p.produce("native", b"x", key.encode(), on_delivery=lambda e, m: librdkafka.__setitem__(m.key().decode(), m.partition()))
    assert p.flush(30) == 0
    assert {k: rust_partition[k] for k in librdkafka} == librdkafka


def test_brokers_all_fenced_for_silence_keep_clients_and_recover(cluster):
    """Issue 16, items 3 and 5. Every broker goes silent to the controllers (failpoint: its
    heartbeats stop) while clients still reach it: the controllers fence all three and each
    stops leading when its own lease runs out. Metadata must still list the broker that
    answers (an empty list made librdkafka forget every broker and one producer never sent
    again); when the heartbeats resume, the same producer, never restarted, delivers
    everything it was given."""
    from confluent_kafka import Producer

    from conftest import rdkafka_conf, record_value
    from kafka_wire import KafkaWire

    cluster.cli("topic", "create", "wedge", "-p", "3", "--replication-factor", "3",
                "--config", "min.insync.replicas=2")
    cluster.wait_for(lambda m: "wedge" in m["topics"], "topic wedge")
    time.sleep(1)
    bootstrap = ",".join(f"127.0.0.1:{cluster.broker_ports[i]}" for i in (1, 2, 3))
    acked, failed = [], []
    p = Producer(rdkafka_conf({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                               "message.timeout.ms": 120000, "metadata.max.age.ms": 1000,
                               "topic.metadata.refresh.interval.ms": 1000}))

    def on_delivery(err, msg):
        (failed if err else acked).append(err or msg.value())

    sent = 0

    def produce_for(seconds):
        nonlocal sent
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            p.produce("wedge", record_value(sent).encode(), on_delivery=on_delivery)
            sent += 1
            p.poll(0.02)

    produce_for(2)
    assert acked, "nothing acknowledged before the fault"
    for i in (1, 2, 3):
        cluster.arm(f"broker-{i}-silent-to-controllers")
    try:
        cluster.wait_for(lambda m: all(b["fenced"] for b in m["brokers"].values()),
                         "every broker fenced", timeout=LEASE_S * 4)
        produce_for(3)  # the producer keeps going into the outage
        for i in (1, 2, 3):
            wire = KafkaWire(cluster.broker_ports[i])
            listed = wire.broker_ids()
            wire.close()
            assert i in listed, f"broker {i}, fenced but reachable, answers Metadata listing only {listed}"
    finally:
        for i in (1, 2, 3):
            cluster.disarm(f"broker-{i}-silent-to-controllers")
    healed = time.monotonic()
    produce_for(2)
    remaining = p.flush(60)
    print(f"all {sent} records acknowledged {time.monotonic() - healed:.1f} s after the heal")
    assert remaining == 0 and not failed, f"{remaining} unsent, {len(failed)} failed: {failed[:3]}"
    assert len(acked) == sent
