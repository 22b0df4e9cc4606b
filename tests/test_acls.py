"""ACLs (issue 15) against a real `strata dev` with SASL_SSL and real clients: the settlement
profile end to end (the order service may write `mf.settlement.*` and nothing else, the audit
team may read everything and write nothing, only the operator may alter, change configs or
delete), each denied operation answered with Kafka's authorization error and changing
nothing, anonymous changes refused, and the ACL APIs themselves guarded."""

import time

import pytest

from conftest import rdkafka_conf
from test_security import SecureNode, sasl_conf

USERS = ("admin", "orders", "audit", "ops")
SETTLEMENT = "mf.settlement.trades"
CLICKS = "clickstream"


@pytest.fixture
def acl_node(tmp_path):
    # closed by default once clients authenticate; admin is a super user
    n = SecureNode(tmp_path, '[auth]\nsuper_users = ["User:admin"]\n')
    try:
        for user in USERS:
            (tmp_path / f"{user}.pw").write_text(f"pw-{user}\n")
            (tmp_path / f"{user}.pw").chmod(0o600)
            n.user("create", user, "--password-file", str(tmp_path / f"{user}.pw"), "--mechanism", "SCRAM-SHA-512")
        for topic in (SETTLEMENT, CLICKS):
            n.cli("topic", "create", topic, "--controller", f"127.0.0.1:{n.controller}",
                  "--config", "retention.ms=604800000")
        acl = ["acl", "add", "--controller", f"127.0.0.1:{n.controller}"]
        n.cli(*acl, "--allow-principal", "User:orders", "--operation", "Write",
              "--topic", "mf.settlement.", "--resource-pattern-type", "prefixed")
        n.cli(*acl, "--allow-principal", "User:orders", "--operation", "IdempotentWrite", "--cluster")
        n.cli(*acl, "--allow-principal", "User:audit", "--operation", "Read", "--topic", "*")
        n.cli(*acl, "--allow-principal", "User:audit", "--operation", "Read", "--group", "audit-",
              "--resource-pattern-type", "prefixed")
        n.cli(*acl, "--allow-principal", "User:ops", "--operation", "All", "--topic", "*")
        yield n
    finally:
        n.stop()


def conf(node, user):
    return rdkafka_conf(sasl_conf(node, "SCRAM-SHA-512", password=f"pw-{user}", user=user))


def produce(node, user, topic, value, idempotent=False):
    from confluent_kafka import Producer

    results = []
    p = Producer(dict(conf(node, user), acks="all", **{"enable.idempotence": idempotent,
                                                        "message.timeout.ms": 10000}))
    p.produce(topic, value.encode(), on_delivery=lambda err, msg: results.append(err))
    p.flush(20)
    return results[0] if results else "no delivery report"


def consume(node, user, topic, group, seconds=10):
    """(values read, the first error)."""
    from confluent_kafka import Consumer

    c = Consumer(dict(conf(node, user), **{"group.id": group, "auto.offset.reset": "earliest"}))
    c.subscribe([topic])
    values, error = [], None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not values and error is None:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            error = m.error()
        else:
            values.append(m.value().decode())
    c.close()
    return values, error


def topic_configs(node, user, topic):
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient(conf(node, user))
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return {k: v.value for k, v in admin.describe_configs([res])[res].result(timeout=20).items()}


def alter_config(node, user, topic, key, value):
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient(conf(node, user))
    res = ConfigResource(ConfigResource.Type.TOPIC, topic,
                         incremental_configs=[ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
    return error_code(admin.incremental_alter_configs([res])[res])  # while the client lives


def error_code(future):
    from confluent_kafka import KafkaException

    try:
        future.result(timeout=20)
        return None
    except KafkaException as e:
        return e.args[0].code()


def test_the_settlement_profile_end_to_end(acl_node):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient

    n = acl_node
    # the order service writes settlements (idempotently), and nothing else
    assert produce(n, "orders", SETTLEMENT, "trade-1", idempotent=True) is None
    err = produce(n, "orders", CLICKS, "click-1")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    values, err = consume(n, "orders", SETTLEMENT, "audit-x")
    assert not values and err is not None and err.code() in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED), err
    # the audit team reads everything, with its own groups, and writes nothing
    values, err = consume(n, "audit", SETTLEMENT, "audit-nightly")
    assert values == ["trade-1"], (values, err)
    values, err = consume(n, "audit", SETTLEMENT, "orders-app")
    assert not values and err is not None and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, err
    err = produce(n, "audit", SETTLEMENT, "forged")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    # what each sees: Describe follows from Write or Read
    seen = lambda user: set(AdminClient(conf(n, user)).list_topics(timeout=10).topics)  # noqa: E731
    assert seen("orders") == {SETTLEMENT}
    assert {SETTLEMENT, CLICKS} <= seen("audit")
    # only the operator reshapes topics: durability and retention settings, deletes
    for user in ("orders", "audit"):
        assert alter_config(n, user, SETTLEMENT, "retention.ms", "1") == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert alter_config(n, user, SETTLEMENT, "min.acks", "0") == KafkaError.TOPIC_AUTHORIZATION_FAILED
        admin = AdminClient(conf(n, user))
        fs = admin.delete_topics([SETTLEMENT], operation_timeout=10)
        assert error_code(fs[SETTLEMENT]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert topic_configs(n, "ops", SETTLEMENT)["retention.ms"] == "604800000"
    assert alter_config(n, "ops", SETTLEMENT, "retention.ms", "86400000") is None
    assert topic_configs(n, "ops", SETTLEMENT)["retention.ms"] == "86400000"
    # nothing the refused requests asked for happened: the record, the topic are there
    values, _ = consume(n, "audit", SETTLEMENT, "audit-final")
    assert values == ["trade-1"]
    assert SETTLEMENT in seen("audit")
    ops_admin = AdminClient(conf(n, "ops"))
    assert error_code(ops_admin.delete_topics([CLICKS], operation_timeout=10)[CLICKS]) is None


def test_anonymous_clients_change_nothing(acl_node):
    """The attack of issue 15: an anonymous client lowered min.acks, set retention.ms=1 and
    deleted a settlement topic. On the PLAINTEXT listener of a cluster that authenticates,
    anonymous requests find nothing open."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    n = acl_node
    assert produce(n, "orders", SETTLEMENT, "trade-1") is None
    assert alter_config(n, "ops", SETTLEMENT, "min.acks", "all") is None
    before = topic_configs(n, "ops", SETTLEMENT)
    anon = AdminClient(rdkafka_conf({"bootstrap.servers": n.bootstrap("PLAIN")}))
    assert anon.list_topics(timeout=10).topics == {}, "anonymous Metadata lists no topic"
    res = ConfigResource(ConfigResource.Type.TOPIC, SETTLEMENT, incremental_configs=[
        ConfigEntry("min.acks", "0", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)])
    assert error_code(anon.incremental_alter_configs([res])[res]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    fs = anon.delete_topics([SETTLEMENT], operation_timeout=10)
    assert error_code(fs[SETTLEMENT]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert topic_configs(n, "ops", SETTLEMENT) == before
    assert before["min.acks"] == "all" and before["retention.ms"] == "604800000", before
    values, _ = consume(n, "audit", SETTLEMENT, "audit-check")
    assert values == ["trade-1"]


def test_acl_apis_are_guarded_and_describe_what_is_stored(acl_node):
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType,
                                       AdminClient, ResourcePatternType, ResourceType)

    n = acl_node
    grant = AclBinding(ResourceType.TOPIC, CLICKS, ResourcePatternType.LITERAL, "User:orders", "*",
                       AclOperation.WRITE, AclPermissionType.ALLOW)
    # orders may not grant itself more
    orders_admin = AdminClient(conf(n, "orders"))
    with pytest.raises(KafkaException) as e:
        orders_admin.create_acls([grant])[grant].result(timeout=20)
    assert e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert produce(n, "orders", CLICKS, "still-denied").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # the super user may
    admin = AdminClient(conf(n, "admin"))
    admin.create_acls([grant])[grant].result(timeout=20)
    deadline = time.monotonic() + 10
    while produce(n, "orders", CLICKS, "now-allowed") is not None:
        assert time.monotonic() < deadline, "the new ACL never took effect"
        time.sleep(0.5)
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    described = admin.describe_acls(everything).result(timeout=20)
    assert grant in described
    assert any(b.name == "mf.settlement." and b.resource_pattern_type == ResourcePatternType.PREFIXED
               for b in described)
    # the audit team may not see the rules: the broker answers CLUSTER_AUTHORIZATION_FAILED
    # (librdkafka 2.x hands an empty list for it), and no binding is disclosed
    audit_admin = AdminClient(conf(n, "audit"))
    try:
        assert audit_admin.describe_acls(everything).result(timeout=20) == []
    except KafkaException as e:
        assert e.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert "principal=User:audit" in n.tail() and "api=DescribeAcls" in n.tail()
    only_grant = AclBindingFilter(ResourceType.TOPIC, CLICKS, ResourcePatternType.LITERAL, "User:orders",
                                  None, AclOperation.ANY, AclPermissionType.ANY)
    deleted = admin.delete_acls([only_grant])[only_grant].result(timeout=20)
    assert deleted == [grant]
    listed = n.cli("acl", "list", "--controller", f"127.0.0.1:{n.controller}", "--principal", "User:orders").stdout
    assert "mf.settlement." in listed and CLICKS not in listed


def test_clients_see_what_each_principal_may_do(acl_node):
    """KIP-430 through confluent-kafka's admin client (librdkafka's 0081 DescribeTopics and
    DescribeCluster): DescribeCluster is served, and with include_authorized_operations each
    principal is told exactly the operations its ACLs allow. Before, DescribeCluster was
    not served and topics came back with no authorized operations."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AclOperation as Op, AdminClient

    def described(user):
        admin = AdminClient(conf(acl_node, user))
        cluster = admin.describe_cluster(include_authorized_operations=True, request_timeout=20).result()
        topic = admin.describe_topics(TopicCollection([SETTLEMENT]), include_authorized_operations=True,
                                      request_timeout=20)[SETTLEMENT].result()
        return cluster, set(topic.authorized_operations or [])

    cluster, topic_ops = described("audit")
    assert cluster.cluster_id and len(cluster.nodes) == 1, cluster
    assert topic_ops == {Op.READ, Op.DESCRIBE}, f"audit may read (and so describe) only: {topic_ops}"
    assert not cluster.authorized_operations, "audit has no cluster ACL: told nothing about the cluster"

    _, topic_ops = described("ops")
    assert topic_ops == {Op.READ, Op.WRITE, Op.CREATE, Op.DELETE, Op.ALTER, Op.DESCRIBE,
                         Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS}, topic_ops

    cluster, topic_ops = described("admin")  # a super user
    assert Op.ALTER in set(cluster.authorized_operations) and Op.CLUSTER_ACTION in set(cluster.authorized_operations)
    assert Op.DELETE in topic_ops
