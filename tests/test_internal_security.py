"""The internal planes under mTLS (`[tls]`), attacked the way issue 15 found them open: a
3-controller + 3-broker cluster of real processes whose gRPC ports (Raft, controller API,
broker data plane, replication) require a certificate signed by the cluster CA, each bound
to the identity it names (`strata certs --node broker-1` is broker 1, and only broker 1).

The attacker speaks gRPC with Python's grpcio and stubs compiled from the repository's
.proto files; it holds a certificate from the same CA (mallory), or a real node's
certificate used in another node's name. Every attack must be refused, and the cluster's
metadata and data must be unchanged afterwards.
"""

import importlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from confluent_kafka import Producer

from conftest import rdkafka_conf, strata_bin
from test_cluster import Cluster, attach_logs_on_failure

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "mf.settlement.nav"
STALE_BROKER_EPOCH = 77
OFFSET_OUT_OF_RANGE = 1


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    """The strata.v1 messages and stubs, compiled from proto/proto with grpcio-tools."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("pb")
    proto_dir = ROOT / "proto" / "proto"
    files = [str(p.relative_to(proto_dir)) for p in sorted((proto_dir / "strata" / "v1").glob("*.proto"))]
    well_known = Path(protoc.__file__).parent / "_proto"
    rc = protoc.main(["protoc", f"-I{proto_dir}", f"-I{well_known}",
                      f"--python_out={out}", f"--grpc_python_out={out}", *files])
    assert rc == 0, "compiling the .proto files failed"
    sys.path.insert(0, str(out))
    try:
        yield SimpleNamespace(**{
            n: importlib.import_module(f"strata.v1.{n}")
            for n in ("raft_pb2", "raft_pb2_grpc", "controller_pb2", "controller_pb2_grpc",
                      "broker_pb2", "broker_pb2_grpc")
        })
    finally:
        sys.path.remove(str(out))


@pytest.fixture
def secure(request, tmp_path):
    # A long lease and lag time: a SIGSTOPped follower stays in the ISR for the whole test,
    # so only a forged fetch could complete an acks=all write while it is stopped.
    c = Cluster(strata_bin(), tmp_path, broker_extra='replica_lag_time_max = "120s"\n', tls=True, lease_s=60)
    try:
        c.start_all()
        yield c
    finally:
        for p in c.procs.values():
            p.send_signal(signal.SIGCONT)
        c.stop_all()
        attach_logs_on_failure(request, c)


def channel(cluster, addr, cert=None):
    """A gRPC channel to addr over TLS: with `cert` ("client-mallory", "node-broker-2") as
    the client certificate, or none."""
    ca = (cluster.certs / "ca.pem").read_bytes()
    if cert is None:
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
    else:
        creds = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=(cluster.certs / f"{cert}.key").read_bytes(),
            certificate_chain=(cluster.certs / f"{cert}.pem").read_bytes())
    return grpc.secure_channel(addr, creds)


def refused(call, code=grpc.StatusCode.PERMISSION_DENIED):
    """Makes the call and returns its error's details; fails if it was answered."""
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == code, f"{e.value.code()}: {e.value.details()}"
    return e.value.details() or ""


def terms(cluster):
    return {i: cluster.quorum(cluster.controller_addr(i))["term"] for i in (1, 2, 3)}


def test_controllers_refuse_raft_and_broker_calls_from_the_wrong_certificate(secure, pb):
    secure.cli("topic", "create", TOPIC, "-p", "1", "--replication-factor", "3", "-c", "min.insync.replicas=2")
    before = secure.metadata()
    terms_before = terms(secure)
    addr = secure.controller_addr(secure.leader())
    vote = pb.raft_pb2.RaftPayload(json=json.dumps({
        "vote": {"leader_id": {"term": 1002, "node_id": 1}, "committed": False}, "last_log_id": None}).encode())
    # An AppendEntries from a self-declared leader at a huge term, carrying a DeleteTopic.
    append = pb.raft_pb2.RaftPayload(json=json.dumps({
        "vote": {"leader_id": {"term": 1003, "node_id": 1}, "committed": True},
        "prev_log_id": None, "leader_commit": None,
        "entries": [{"log_id": {"leader_id": {"term": 1003, "node_id": 1}, "index": 999},
                     "payload": {"Normal": {"DeleteTopic": {"name": TOPIC}}}}]}).encode())

    # Plaintext to a TLS port, and TLS without a client certificate: no connection at all.
    plain = pb.raft_pb2_grpc.RaftStub(grpc.insecure_channel(addr))
    refused(lambda: plain.Vote(vote, timeout=5), grpc.StatusCode.UNAVAILABLE)
    anonymous = pb.raft_pb2_grpc.RaftStub(channel(secure, addr))
    refused(lambda: anonymous.Vote(vote, timeout=5), grpc.StatusCode.UNAVAILABLE)

    # A certificate from the cluster CA that is not a voter's: Raft is refused, whoever it is.
    for cert in ("client-mallory", "node-broker-1"):
        raft = pb.raft_pb2_grpc.RaftStub(channel(secure, addr, cert))
        why = refused(lambda: raft.Vote(vote, timeout=5))
        assert "only from the voters" in why, why
        refused(lambda: raft.AppendEntries(append, timeout=5))
    # A voter's certificate speaking in another voter's name.
    other = next(i for i in (1, 2, 3) if secure.controller_addr(i) != addr and i != 1)
    raft = pb.raft_pb2_grpc.RaftStub(channel(secure, addr, f"node-controller-{other}"))
    why = refused(lambda: raft.Vote(vote, timeout=5))
    assert "in the name of" in why, why

    # Broker calls for broker 1 without broker 1's certificate.
    evil = [pb.controller_pb2.Endpoint(name="kafka", host="evil.example", port=9092)]
    epoch1 = before["brokers"]["1"]["epoch"]
    for cert in ("client-mallory", "node-broker-2"):
        api = pb.controller_pb2_grpc.ControllerStub(channel(secure, addr, cert))
        why = refused(lambda: api.RegisterBroker(pb.controller_pb2.RegisterBrokerRequest(
            broker_id=1, incarnation="6f1c1c36-0d6e-4bde-9d3b-5b2b5a2f0a11", endpoints=evil), timeout=5))
        assert "broker 1" in why, why
        refused(lambda: api.ControlledShutdown(
            pb.controller_pb2.ControlledShutdownRequest(broker_id=1, broker_epoch=epoch1), timeout=5))
        refused(lambda: api.Heartbeat(
            pb.controller_pb2.HeartbeatRequest(broker_id=1, broker_epoch=epoch1), timeout=5))

    # Admin calls and the metadata stream (it holds the SCRAM stored keys) from a stranger.
    api = pb.controller_pb2_grpc.ControllerStub(channel(secure, addr, "client-mallory"))
    refused(lambda: api.DeleteTopic(pb.controller_pb2.DeleteTopicRequest(name=TOPIC), timeout=5))
    refused(lambda: api.AlterTopicConfigs(pb.controller_pb2.AlterTopicConfigsRequest(
        name=TOPIC, set={"min.acks": "0", "retention.ms": "1"}), timeout=5))
    refused(lambda: next(iter(api.Watch(pb.controller_pb2.WatchRequest(from_version=0), timeout=5))))
    # The CLI without a certificate cannot even connect.
    plain_cli = subprocess.run([secure.binary, "topic", "delete", TOPIC, "--controller", addr],
                               capture_output=True, text=True, timeout=30)
    assert plain_cli.returncode != 0, plain_cli.stdout

    # Nothing changed: no election, broker 1's registration, the topic and its configs.
    assert terms(secure) == terms_before
    after = secure.metadata()
    assert after["brokers"] == before["brokers"]
    assert after["topics"][TOPIC]["id"] == before["topics"][TOPIC]["id"]
    assert after["topics"][TOPIC]["configs"] == before["topics"][TOPIC]["configs"]
    # The admin's certificate may do what mallory's may not.
    secure.cli("topic", "delete", TOPIC)
    assert TOPIC not in secure.metadata()["topics"]


def replicated_topic(secure):
    """TOPIC with one partition on all three brokers, once its ISR is full: (metadata, the
    topic, its partition)."""
    secure.cli("topic", "create", TOPIC, "-p", "1", "--replication-factor", "3")
    m = secure.wait_for(lambda m: TOPIC in m["topics"]
                        and len(m["topics"][TOPIC]["partitions"][0]["isr"]) == 3, "a full ISR")
    return m, m["topics"][TOPIC], m["topics"][TOPIC]["partitions"][0]


def test_a_spoofed_or_stale_replica_fetch_cannot_complete_an_acks_all_write(secure, pb):
    m, t, part = replicated_topic(secure)
    leader = part["leader"]
    follower, bystander = [b for b in part["replicas"] if b != leader]
    bootstrap = f"127.0.0.1:{secure.broker_ports[leader]}"
    producer = Producer(rdkafka_conf({"bootstrap.servers": bootstrap, "acks": "all",
                                      "message.timeout.ms": 60000, "linger.ms": 0}))
    acked = []
    producer.produce(TOPIC, b"before", on_delivery=lambda err, msg: acked.append(err))
    producer.flush(20)
    assert acked == [None]

    # The follower freezes (it stays in the ISR); an acks=all write now waits for it.
    secure.procs[f"broker-{follower}"].send_signal(signal.SIGSTOP)
    producer.produce(TOPIC, b"settlement", on_delivery=lambda err, msg: acked.append(err))
    producer.poll(1)
    assert len(acked) == 1, "acknowledged while a follower in the ISR was stopped"

    leader_addr = f"127.0.0.1:{secure.grpc_ports[leader]}"
    epoch = m["brokers"][str(follower)]["epoch"]

    def request(replica_id, offset, broker_epoch):
        return pb.broker_pb2.ReplicaFetchRequest(
            replica_id=replica_id, topic=TOPIC, topic_id=t["id"], partition=0,
            leader_epoch=part["leader_epoch"], fetch_offset=offset, max_bytes=1 << 20,
            max_wait_ms=0, broker_epoch=broker_epoch)

    def fetch(cert, replica_id=follower, offset=10**9, broker_epoch=epoch):
        stub = pb.broker_pb2_grpc.ReplicaStub(channel(secure, leader_addr, cert))
        return stub.Fetch(request(replica_id, offset, broker_epoch), timeout=5)

    def fetch_stream(cert, offset, rpc="FetchSession"):
        # the same on a stream: FetchSession, the one followers use for all the partitions
        # of a leader, and FetchStream, the per-partition one of the version before
        stub = pb.broker_pb2_grpc.ReplicaStub(channel(secure, leader_addr, cert))
        r = request(follower, offset, epoch)
        r.tag = 7
        try:
            return list(getattr(stub, rpc)(iter([r]), timeout=5))
        except grpc.RpcError as e:
            return e

    # A stranger, and another real broker, fetching in the frozen follower's name and
    # claiming it holds everything (offset 2 is the leader's log end).
    def attempt(cert):
        try:
            return fetch(cert, offset=2)
        except grpc.RpcError as e:
            return e
    spoofs = [attempt("client-mallory"), attempt(f"node-broker-{bystander}")] + [
        fetch_stream(cert, 2, rpc) for cert in ("client-mallory", f"node-broker-{bystander}")
        for rpc in ("FetchSession", "FetchStream")]
    producer.poll(2)
    assert len(acked) == 1, "a spoofed fetch completed an acks=all write"
    for e in spoofs:
        assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.PERMISSION_DENIED, e
        assert f"CN=broker-{follower}" in e.details(), e.details()
    # The follower's own certificate at a dead incarnation's broker epoch (KIP-380).
    assert fetch(f"node-broker-{follower}", broker_epoch=epoch - 1).error.code == STALE_BROKER_EPOCH
    # ... and at its live epoch, claiming a position past the leader's log end.
    assert fetch(f"node-broker-{follower}").error.code == OFFSET_OUT_OF_RANGE
    # (a stream closed right after its request still gets the answer: a session once
    # dropped it when it saw the close before the answer was ready, so this is repeated)
    for rpc in ("FetchSession", "FetchStream"):
        for attempt in range(20):
            answers = fetch_stream(f"node-broker-{follower}", 10**9, rpc)
            assert isinstance(answers, list) and len(answers) == 1, (rpc, attempt, answers)
            [streamed] = answers
            assert streamed.error.code == OFFSET_OUT_OF_RANGE, (rpc, streamed)
            # a session's answer carries its request's tag
            assert streamed.tag == (7 if rpc == "FetchSession" else 0), (rpc, streamed)

    # None of it counted as the follower's position: the write is still unacknowledged.
    producer.poll(2)
    assert len(acked) == 1, "a forged fetch completed an acks=all write"
    secure.procs[f"broker-{follower}"].send_signal(signal.SIGCONT)
    producer.flush(30)
    assert acked == [None, None]


def test_a_fetch_at_a_far_future_broker_epoch_does_not_lock_the_follower_out(secure, pb):
    """Issue 47: a replica fetch sent with the follower's own certificate at its broker epoch
    + 1000 was taken as a newer incarnation of it, and the leader then ignored the real
    follower's fetches (an older epoch) for good: every acks=all write waited for it until
    it left the ISR, and it stayed out across its own restart. A fetch must carry the epoch
    the controllers registered."""
    m, t, part = replicated_topic(secure)
    leader = part["leader"]
    follower = next(b for b in part["replicas"] if b != leader)
    epoch = m["brokers"][str(follower)]["epoch"]
    producer = Producer(rdkafka_conf({"bootstrap.servers": f"127.0.0.1:{secure.broker_ports[leader]}",
                                      "acks": "all", "message.timeout.ms": 60000, "linger.ms": 0}))

    def acked_within(value, seconds):
        acked = []
        producer.produce(TOPIC, value, on_delivery=lambda err, msg: acked.append(err))
        deadline = time.monotonic() + seconds
        while not acked and time.monotonic() < deadline:
            producer.poll(0.1)
        return acked == [None]

    assert acked_within(b"before", 20)
    stub = pb.broker_pb2_grpc.ReplicaStub(channel(secure, f"127.0.0.1:{secure.grpc_ports[leader]}",
                                                  f"node-broker-{follower}"))
    forged = stub.Fetch(pb.broker_pb2.ReplicaFetchRequest(
        replica_id=follower, topic=TOPIC, topic_id=t["id"], partition=0,
        leader_epoch=part["leader_epoch"], fetch_offset=1, max_bytes=1 << 20, max_wait_ms=0,
        broker_epoch=epoch + 1000), timeout=5)
    assert forged.error.code == STALE_BROKER_EPOCH, forged
    assert "no" in forged.error.message or "registration" in forged.error.message, forged.error.message
    # the real follower's fetches still count: writes are acknowledged in the follower's time
    # (the fixture's replica lag time is 120 s, so nothing else could complete them)
    for i in range(3):
        assert acked_within(b"after-%d" % i, 10), "an acks=all write waited for the locked-out follower"
    # and across the follower's restart (a new registration, at epoch + 1 or so)
    secure.kill(f"broker-{follower}")
    secure.start(f"broker-{follower}")
    secure.wait_for(lambda m: m["brokers"][str(follower)]["epoch"] > epoch
                    and not m["brokers"][str(follower)]["fenced"], "the follower registered again", timeout=60)
    assert acked_within(b"after-restart", 60)
    # back in the ISR once its fetches reach the leader's end: the leader hears them
    secure.wait_for(lambda m: sorted(m["topics"][TOPIC]["partitions"][0]["isr"]) == sorted(part["replicas"]),
                    "the restarted follower back in the ISR", timeout=60)
    assert acked_within(b"after-restart-2", 10)


def test_the_grpc_data_plane_authorizes_by_client_certificate(secure, pb):
    """The native gRPC client is a principal like a Kafka client: its certificate's subject
    (User:CN=writer), held to the same ACLs."""
    secure.cli("topic", "create", TOPIC, "-p", "1", "--replication-factor", "3")
    secure.cli("acl", "add", "--allow-principal", "User:CN=writer", "--operation", "Write",
               "--operation", "Describe", "--topic", TOPIC)
    m = secure.wait_for(lambda m: m["topics"].get(TOPIC, {}).get("partitions", [{}])[0].get("leader") is not None,
                        "a leader")
    leader = m["topics"][TOPIC]["partitions"][0]["leader"]
    grpc_addr = f"127.0.0.1:{secure.grpc_ports[leader]}"

    def produce(user):
        return subprocess.run([secure.binary, "produce", "--grpc", grpc_addr, "-t", TOPIC,
                               *secure.client_tls(user)],
                              input=b"nav 101.7\n", capture_output=True, timeout=60)

    # mallory has a valid certificate but no ACL on a topic that has ACLs: the topic is
    # hidden from her, and a produce or fetch straight to the leader is refused.
    denied = produce("mallory")
    assert denied.returncode != 0 and b"does not exist" in denied.stderr, denied.stderr
    stub = pb.broker_pb2_grpc.BrokerStub(channel(secure, grpc_addr, "client-mallory"))
    why = refused(lambda: stub.Produce(pb.broker_pb2.ProduceRequest(topic=TOPIC, partition=0, acks=-1,
                                                                    timeout_ms=5000, records=b""), timeout=5))
    assert "TOPIC_AUTHORIZATION_FAILED" in why, why
    why = refused(lambda: stub.Metadata(pb.broker_pb2.ClusterMetadataRequest(topics=[TOPIC]), timeout=5))
    assert "TOPIC_AUTHORIZATION_FAILED" in why, why
    allowed = produce("writer")
    assert allowed.returncode == 0, allowed.stderr
    refused(lambda: stub.Fetch(pb.broker_pb2.FetchRequest(topic=TOPIC, partition=0, offset=0,
                                                          max_bytes=1 << 20, max_wait_ms=0), timeout=5))
    hidden = stub.Metadata(pb.broker_pb2.ClusterMetadataRequest(), timeout=5)
    assert TOPIC not in [t.name for t in hidden.topics], "a topic mallory may not Describe is listed"
    # Exactly the writer's record is in the log (read back with the admin's certificate).
    admin = pb.broker_pb2_grpc.BrokerStub(channel(secure, grpc_addr, "client-admin"))
    end = admin.ListOffsets(pb.broker_pb2.ListOffsetsRequest(topic=TOPIC, partition=0, timestamp=-1), timeout=5)
    assert end.offset == 1
