"""Bounded resources (issue 17): no client, file or request can exhaust a node.

Attacks and bad inputs from the issue, against real processes: each must be refused with
a clear error while the node keeps serving everyone else."""

import grpc
import pytest

from test_cluster import cluster  # noqa: F401  (fixture: 3 controllers + 3 brokers)
from test_internal_security import pb  # noqa: F401  (fixture: stubs compiled from proto/)


def test_controllers_refuse_unbounded_counts_and_invalid_configs_and_stay_up(cluster, pb):  # noqa: F811
    """CreatePartitions / CreateTopic with 4,000,000,000 partitions on the controller API
    aborted every controller (`memory allocation of 96000000000 bytes failed`), and again at
    every restart since the entry was in the Raft log; 50,000 partitions were accepted; a
    config the brokers cannot use was accepted and later silently replaced by defaults.
    Every controller, the leader and the followers that forward to it, must refuse them
    before they reach the log, and stay up."""
    cluster.cli("topic", "create", "settlements", "-p", "2", "--replication-factor", "3")
    req = pb.controller_pb2
    attacks = {
        "4e9 partitions added": lambda s: s.CreatePartitions(
            req.CreatePartitionsRequest(name="settlements", total=4_000_000_000), timeout=10),
        "a topic of 4e9 partitions": lambda s: s.CreateTopic(
            req.CreateTopicRequest(name="huge", partitions=4_000_000_000, replication_factor=3), timeout=10),
        "a topic of 50,000 partitions": lambda s: s.CreateTopic(
            req.CreateTopicRequest(name="big", partitions=50_000, replication_factor=3), timeout=10),
        "min.insync.replicas=two": lambda s: s.CreateTopic(
            req.CreateTopicRequest(name="typo", partitions=1, replication_factor=3,
                                   configs={"min.insync.replicas": "two"}), timeout=10),
        "retention.ms=soon": lambda s: s.AlterTopicConfigs(
            req.AlterTopicConfigsRequest(name="settlements", set={"retention.ms": "soon"}), timeout=10),
    }
    for i in (1, 2, 3):
        stub = pb.controller_pb2_grpc.ControllerStub(grpc.insecure_channel(cluster.controller_addr(i)))
        for what, call in attacks.items():
            with pytest.raises(grpc.RpcError) as e:
                call(stub)
            code, details = e.value.code(), e.value.details() or ""
            assert code == grpc.StatusCode.INVALID_ARGUMENT, f"controller {i}, {what}: {code} {details}"
            expected = "10000" if "partitions" in what else what.split("=")[0]
            assert expected in details, f"controller {i}, {what}: the reason does not say why: {details!r}"
            print(f"controller {i}, {what}: {details}")
    for name, p in cluster.procs.items():
        assert p.poll() is None, f"{name} exited:\n{cluster.log_tail(name)}"
    m = cluster.metadata()
    assert len(m["topics"]["settlements"]["partitions"]) == 2
    assert not {"huge", "big", "typo"} & set(m["topics"]), sorted(m["topics"])
    assert "retention.ms" not in m["topics"]["settlements"].get("configs", {})
    # and the quorum still takes a valid change
    cluster.cli("topic", "create", "settlements-2", "-p", "3", "--replication-factor", "3")
    cluster.wait_for(lambda m: "settlements-2" in m["topics"], "the valid topic")
