"""kafka-topics.sh and kafka-acls.sh for librdkafka's test suite, done through Strata's Kafka
admin APIs with confluent-kafka's AdminClient.

librdkafka's runner shells out to "$KAFKA_PATH/bin/kafka-topics.sh --bootstrap-server B ..."
(test_kafka_topics) and "$KAFKA_PATH/bin/kafka-acls.sh ..." (test_kafka_cmd); the suite script
points KAFKA_PATH at tests/librdkafka, whose bin/ wrappers run this file. Only the options the
tests use are understood; anything else is an error naming the option, so a new test that needs
more says so instead of passing by accident.

Usage: kafka_shim.py topics|acls [kafka-tools options]
"""

import sys

TIMEOUT_S = 30.0


def die(msg: str) -> None:
    print(f"kafka_shim: {msg}", file=sys.stderr)
    sys.exit(2)


def parse(argv, flags, valued, multi=()):
    """Kafka-tools style options: --flag, --opt value (or --opt=value); multi options repeat."""
    out = {m: [] for m in multi}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            die(f"unexpected argument {arg!r}")
        name, eq, val = arg[2:].partition("=")
        if name in flags:
            out[name] = True
            i += 1
            continue
        if name not in valued and name not in multi:
            die(f"option --{name} is not supported by this shim (only --"
                + ", --".join(sorted(set(flags) | set(valued) | set(multi))) + ")")
        if not eq:
            if i + 1 >= len(argv):
                die(f"--{name} needs a value")
            val = argv[i + 1]
            i += 2
        else:
            i += 1
        if name in multi:
            out[name].append(val)
        else:
            out[name] = val
    return out


def admin(bootstrap):
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:
        die(f"confluent_kafka is not importable by {sys.executable}; install tests/requirements.txt "
            "into the test virtualenv (scripts/test.sh does) or set LRK_SHIM_PYTHON")
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})


def wait_all(futures, what):
    failed = False
    for key, fut in futures.items():
        try:
            fut.result(timeout=TIMEOUT_S)
            print(f"{what} {key}: ok")
        except Exception as e:  # noqa: BLE001 - the tool reports and exits non-zero
            print(f"{what} {key}: {e}", file=sys.stderr)
            failed = True
    if failed:
        sys.exit(1)


def topics(argv):
    from confluent_kafka.admin import NewPartitions, NewTopic

    o = parse(argv, flags={"create", "alter", "delete", "list", "if-not-exists", "if-exists"},
              valued={"bootstrap-server", "topic", "partitions", "replication-factor"},
              multi=("config",))
    bootstrap = o.get("bootstrap-server") or die("--bootstrap-server is required")
    a = admin(bootstrap)
    if o.get("list"):
        for name in sorted(a.list_topics(timeout=TIMEOUT_S).topics):
            print(name)
        return
    topic = o.get("topic") or die("--topic is required")
    if o.get("create"):
        configs = {}
        for kv in o["config"]:
            k, eq, v = kv.partition("=")
            if not eq:
                die(f"--config {kv!r} is not key=value")
            configs[k] = v
        nt = NewTopic(topic, num_partitions=int(o.get("partitions", -1)),
                      replication_factor=int(o.get("replication-factor", -1)), config=configs)
        wait_all(a.create_topics([nt], request_timeout=TIMEOUT_S), "create topic")
    elif o.get("alter"):
        if "partitions" not in o:
            die("--alter needs --partitions (the only alteration this shim does)")
        wait_all(a.create_partitions([NewPartitions(topic, int(o["partitions"]))],
                                     request_timeout=TIMEOUT_S), "create partitions")
    elif o.get("delete"):
        wait_all(a.delete_topics([topic], request_timeout=TIMEOUT_S), "delete topic")
    else:
        die("one of --create, --alter, --delete, --list is required")


def acls(argv):
    from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation,
                                       AclPermissionType, ResourcePatternType, ResourceType)

    o = parse(argv, flags={"add", "remove", "force"},
              valued={"bootstrap-server", "resource-pattern-type"},
              multi=("allow-principal", "deny-principal", "allow-host", "deny-host", "operation",
                     "topic", "group"))
    bootstrap = o.get("bootstrap-server") or die("--bootstrap-server is required")
    if bool(o.get("add")) == bool(o.get("remove")):
        die("one of --add, --remove is required")
    pattern = ResourcePatternType[o.get("resource-pattern-type", "literal").upper()]
    resources = [(ResourceType.TOPIC, t) for t in o["topic"]] + \
                [(ResourceType.GROUP, g) for g in o["group"]]
    if not resources:
        die("--topic or --group is required")
    ops = []
    for op in o["operation"] or die("--operation is required"):
        name = {"all": "ALL", "read": "READ", "write": "WRITE", "create": "CREATE",
                "delete": "DELETE", "alter": "ALTER", "describe": "DESCRIBE",
                "describeconfigs": "DESCRIBE_CONFIGS", "alterconfigs": "ALTER_CONFIGS",
                "idempotentwrite": "IDEMPOTENT_WRITE", "clusteraction": "CLUSTER_ACTION"}.get(
                    op.lower()) or die(f"unknown --operation {op!r}")
        ops.append(AclOperation[name])
    bindings = []
    for perm, principals, hosts in (
            (AclPermissionType.ALLOW, o["allow-principal"], o["allow-host"] or ["*"]),
            (AclPermissionType.DENY, o["deny-principal"], o["deny-host"] or ["*"])):
        for p in principals:
            for h in hosts:
                for rtype, rname in resources:
                    for op in ops:
                        cls = AclBinding if o.get("add") else AclBindingFilter
                        bindings.append(cls(rtype, rname, pattern, p, h, op, perm))
    if not bindings:
        die("--allow-principal or --deny-principal is required")
    a = admin(bootstrap)  # kept alive until the futures resolve
    if o.get("add"):
        futs = a.create_acls(bindings, request_timeout=TIMEOUT_S)
        wait_all({str(b): f for b, f in futs.items()}, "create acl")
    else:  # --remove (--force: kafka-acls.sh would otherwise ask for confirmation)
        futs = a.delete_acls(bindings, request_timeout=TIMEOUT_S)
        wait_all({str(b): f for b, f in futs.items()}, "delete acl")


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("topics", "acls"):
        die("usage: kafka_shim.py topics|acls [options]")
    print("kafka_shim:", sys.argv[1], " ".join(sys.argv[2:]), file=sys.stderr)
    {"topics": topics, "acls": acls}[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
