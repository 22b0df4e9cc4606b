"""Kafka's standard topic configs and the config APIs, with confluent-kafka's AdminClient
(librdkafka 2.x) against a real strata process: CreateTopics with every standard config,
DescribeConfigs of topics (sources, synonyms) and of the broker, dynamic broker and group
configs (set at run time, kept across a SIGKILL), the legacy AlterConfigs
(API 33, `AdminClient.alter_configs`), IncrementalAlterConfigs APPEND / SUBTRACT, and the
behaviour behind `message.timestamp.type=LogAppendTime`, the timestamp window and
`compression.type` (the leader re-encodes batches, checked in the segment files)."""

import struct
import time

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)

from conftest import rdkafka_conf
from kafka_wire import KafkaWire

TIMEOUT = 20

# Every standard Kafka topic config Strata used to refuse as unknown, with a valid
# non-default value.
NEW_CONFIGS = {
    "message.timestamp.type": "LogAppendTime",
    "message.timestamp.difference.max.ms": "3600000",
    "message.timestamp.before.max.ms": "7200000",
    "message.timestamp.after.max.ms": "600000",
    "file.delete.delay.ms": "1000",
    "max.compaction.lag.ms": "60000",
    "compression.type": "zstd",
    "compression.gzip.level": "6",
    "compression.lz4.level": "10",
    "compression.zstd.level": "5",
    "segment.ms": "1",
    "segment.jitter.ms": "100",
    "segment.index.bytes": "4096",
    "flush.ms": "1000",
    "preallocate": "true",
    "message.downconversion.enable": "false",
    "message.format.version": "3.0-IV1",
    "leader.replication.throttled.replicas": "0:1,1:1",
    "follower.replication.throttled.replicas": "*",
}


def admin(broker) -> AdminClient:
    return AdminClient(rdkafka_conf({"bootstrap.servers": broker.bootstrap}))


def create(a: AdminClient, name: str, configs: dict, partitions: int = 1):
    fs = a.create_topics([NewTopic(name, partitions, 1, config=configs)], request_timeout=TIMEOUT)
    fs[name].result(timeout=TIMEOUT)


def describe(a: AdminClient, kind, name: str) -> dict:
    res = ConfigResource(kind, name)
    return a.describe_configs([res], request_timeout=TIMEOUT)[res].result(timeout=TIMEOUT)


def error_code(exc: KafkaException) -> int:
    return exc.args[0].code()


def test_every_standard_topic_config_is_accepted_and_described(broker):
    a = admin(broker)
    create(a, "all-configs", NEW_CONFIGS)
    described = describe(a, ResourceType.TOPIC, "all-configs")
    for key, value in NEW_CONFIGS.items():
        assert key in described, f"{key} not described; got {sorted(described)}"
        entry = described[key]
        assert entry.value == value, (key, entry.value)
        assert entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, (key, entry.source)
        assert not entry.is_default and not entry.is_read_only and not entry.is_sensitive
    # Configs the topic did not set are described too, with Kafka's defaults.
    assert described["retention.ms"].value == "604800000"
    assert described["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert described["retention.ms"].is_default
    for key, default in [
        ("min.compaction.lag.ms", "0"),
        ("unclean.leader.election.enable", "false"),
        ("remote.storage.enable", "false"),
    ]:
        assert described[key].value == default, key
    # A topic config set on the topic names its broker-level synonym (Kafka's names) after
    # itself, in order of precedence.
    synonyms = described["segment.ms"].synonyms
    assert "segment.ms" in synonyms and "log.roll.ms" in synonyms, synonyms


def test_a_fresh_topic_has_kafkas_defaults_for_the_new_configs(broker):
    a = admin(broker)
    create(a, "defaults", {})
    d = describe(a, ResourceType.TOPIC, "defaults")
    for key, default in [
        ("message.timestamp.type", "CreateTime"),
        ("message.timestamp.difference.max.ms", "9223372036854775807"),
        ("message.timestamp.before.max.ms", "9223372036854775807"),
        ("message.timestamp.after.max.ms", "9223372036854775807"),
        ("file.delete.delay.ms", "60000"),
        ("max.compaction.lag.ms", "9223372036854775807"),
        ("compression.type", "producer"),
        ("preallocate", "false"),
    ]:
        assert d[key].value == default, (key, d[key].value)
        assert d[key].source == ConfigSource.DEFAULT_CONFIG.value, key


@pytest.mark.parametrize(
    "key,value",
    [
        ("message.timestamp.type", "WallClockTime"),
        ("message.timestamp.type", "logappendtime"),
        ("message.timestamp.difference.max.ms", "-1"),
        ("message.timestamp.before.max.ms", "soon"),
        ("message.timestamp.after.max.ms", "-5"),
        ("file.delete.delay.ms", "-1"),
        ("max.compaction.lag.ms", "0"),
        ("compression.type", "brotli"),
        ("compression.gzip.level", "12"),
        ("compression.zstd.level", "23"),
        ("segment.ms", "0"),
        ("segment.index.bytes", "3"),
        ("segment.jitter.ms", "-1"),
        ("flush.ms", "-1"),
        ("preallocate", "maybe"),
        ("message.downconversion.enable", "yes"),
        ("message.format.version", "banana"),
        ("leader.replication.throttled.replicas", "0-1"),
        ("follower.replication.throttled.replicas", "a:b"),
    ],
)
def test_bad_values_are_refused_with_invalid_config(broker, key, value):
    a = admin(broker)
    with pytest.raises(KafkaException) as e:
        create(a, "bad", {key: value})
    assert error_code(e.value) == KafkaError.INVALID_CONFIG, e.value
    assert key in str(e.value), e.value
    # refused for its value, not as a config Strata does not know
    assert "unknown topic config" not in str(e.value), e.value


def test_legacy_alter_configs_replaces_the_topics_configs(broker):
    a = admin(broker)
    create(a, "legacy", {"retention.ms": "3600000", "max.compaction.lag.ms": "5000"})

    def alter(configs: dict, **kw):
        res = ConfigResource(ResourceType.TOPIC, "legacy", set_config=configs)
        return a.alter_configs([res], request_timeout=TIMEOUT, **kw)[res].result(timeout=TIMEOUT)

    # validate_only changes nothing
    alter({"segment.ms": "60000"}, validate_only=True)
    d = describe(a, ResourceType.TOPIC, "legacy")
    assert d["retention.ms"].value == "3600000"
    assert d["segment.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    # the legacy API sets exactly the configs given: the others return to their defaults
    alter({"segment.ms": "60000", "message.timestamp.type": "LogAppendTime"})
    d = describe(a, ResourceType.TOPIC, "legacy")
    assert d["segment.ms"].value == "60000"
    assert d["segment.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert d["message.timestamp.type"].value == "LogAppendTime"
    assert d["retention.ms"].value == "604800000"
    assert d["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert d["max.compaction.lag.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    # a bad value is refused and changes nothing
    with pytest.raises(KafkaException) as e:
        alter({"segment.ms": "60000", "compression.type": "brotli"})
    assert error_code(e.value) == KafkaError.INVALID_CONFIG
    assert describe(a, ResourceType.TOPIC, "legacy")["message.timestamp.type"].value == "LogAppendTime"

    # an unknown topic
    res = ConfigResource(ResourceType.TOPIC, "no-such-topic", set_config={"segment.ms": "60000"})
    with pytest.raises(KafkaException) as e:
        a.alter_configs([res], request_timeout=TIMEOUT)[res].result(timeout=TIMEOUT)
    assert error_code(e.value) == KafkaError.UNKNOWN_TOPIC_OR_PART


def incremental(a: AdminClient, kind, name: str, ops: list, validate_only=False):
    """IncrementalAlterConfigs of one resource; ops: (name, value, AlterConfigOpType)."""
    res = ConfigResource(
        kind,
        name,
        incremental_configs=[ConfigEntry(k, v, incremental_operation=op) for k, v, op in ops],
    )
    a.incremental_alter_configs(
        [res], request_timeout=TIMEOUT, validate_only=validate_only
    )[res].result(timeout=TIMEOUT)


def produce_one(bootstrap: str, topic: str, size: int):
    """Produces one record of `size` bytes; returns the delivery error (None: acknowledged)."""
    p = Producer(rdkafka_conf({"bootstrap.servers": bootstrap, "acks": "all",
                               "message.max.bytes": 2_000_000}))
    got = []
    p.produce(topic, value=b"x" * size, on_delivery=lambda err, _msg: got.append(err))
    p.flush(TIMEOUT)
    assert got, "no delivery report"
    return got[0]


# Kafka's DescribeConfigs sources (ConfigSource) for dynamic configs, the broker resource
# type and IncrementalAlterConfigs' SET, for the raw wire requests.
DYNAMIC_BROKER, DYNAMIC_DEFAULT, GROUP_CONFIG = 2, 3, 8
RESOURCE_BROKER, OP_SET = 4, 0


def test_dynamic_broker_configs_change_topic_defaults_at_run_time_and_survive_a_crash(broker):
    a = admin(broker)
    create(a, "dyn-default", {})
    create(a, "dyn-own", {"max.message.bytes": "200000"})
    assert produce_one(broker.bootstrap, "dyn-default", 50_000) is None

    # message.max.bytes: the broker-level default of max.message.bytes, for this broker
    incremental(a, ResourceType.BROKER, "1",
                [("message.max.bytes", "10000", AlterConfigOpType.SET)])
    t = describe(a, ResourceType.TOPIC, "dyn-default")["max.message.bytes"]
    assert (t.value, t.source) == ("10000", DYNAMIC_BROKER), t
    err = produce_one(broker.bootstrap, "dyn-default", 50_000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    # a topic's own value wins over the broker's
    assert produce_one(broker.bootstrap, "dyn-own", 50_000) is None
    b = describe(a, ResourceType.BROKER, "1")["message.max.bytes"]
    assert (b.value, b.source, b.is_read_only) == ("10000", DYNAMIC_BROKER, False), b

    # the cluster-wide default (the broker resource named "", which confluent-kafka will
    # not send: kafka-configs.sh --entity-default does), below the broker's own
    wire = KafkaWire(broker.port)
    try:
        assert wire.incremental_alter_configs(RESOURCE_BROKER, "", [
            ("log.retention.ms", OP_SET, "3600000"),
            ("message.max.bytes", OP_SET, "500000"),
        ]) == (0, None)
        # per-broker listener configs are not cluster-wide defaults
        code, msg = wire.incremental_alter_configs(
            RESOURCE_BROKER, "", [("sasl.kerberos.min.time.before.relogin", OP_SET, "58000")])
        assert code == KafkaError.INVALID_CONFIG and "per broker" in msg, (code, msg)
        code, cluster = wire.describe_configs(RESOURCE_BROKER, "")
    finally:
        wire.close()
    assert code == 0
    assert cluster == {"log.retention.ms": ("3600000", DYNAMIC_DEFAULT),
                       "message.max.bytes": ("500000", DYNAMIC_DEFAULT)}, cluster
    t = describe(a, ResourceType.TOPIC, "dyn-default")
    assert (t["retention.ms"].value, t["retention.ms"].source) == ("3600000", DYNAMIC_DEFAULT)
    assert t["max.message.bytes"].value == "10000"

    # they live in the metadata log: a SIGKILL and restart keeps them
    broker.kill()
    broker.start()
    a = admin(broker)
    t = describe(a, ResourceType.TOPIC, "dyn-default")["max.message.bytes"]
    assert (t.value, t.source) == ("10000", DYNAMIC_BROKER), t
    err = produce_one(broker.bootstrap, "dyn-default", 50_000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err

    # deleting the broker's own value leaves the cluster default in force
    incremental(a, ResourceType.BROKER, "1", [("message.max.bytes", "", AlterConfigOpType.DELETE)])
    t = describe(a, ResourceType.TOPIC, "dyn-default")["max.message.bytes"]
    assert (t.value, t.source) == ("500000", DYNAMIC_DEFAULT), t
    assert produce_one(broker.bootstrap, "dyn-default", 50_000) is None


def test_dynamic_broker_configs_refuse_what_cannot_change_and_bad_values(broker):
    a = admin(broker)

    def refused(kind, name, ops, validate_only=False):
        with pytest.raises(KafkaException) as e:
            incremental(a, kind, name, ops, validate_only)
        return error_code(e.value), str(e.value)

    SET = AlterConfigOpType.SET
    # read from the config file at start: Kafka's INVALID_REQUEST
    code, msg = refused(ResourceType.BROKER, "1", [("log.dirs", "/tmp/x", SET)])
    assert code == KafkaError.INVALID_REQUEST and "log.dirs" in msg, msg
    # bad values: INVALID_CONFIG, naming the config
    code, msg = refused(ResourceType.BROKER, "1", [("log.retention.ms", "soon", SET)])
    assert code == KafkaError.INVALID_CONFIG and "log.retention.ms" in msg, msg
    code, msg = refused(ResourceType.BROKER, "1", [("background.threads", "0", SET)])
    assert code == KafkaError.INVALID_CONFIG and "background.threads" in msg, msg
    # another broker's id (Kafka's clients send that to broker 7 itself)
    wire = KafkaWire(broker.port)
    try:
        code, msg = wire.incremental_alter_configs(
            RESOURCE_BROKER, "7", [("background.threads", OP_SET, "9")])
    finally:
        wire.close()
    assert code == KafkaError.INVALID_REQUEST and "expected 1" in msg, (code, msg)

    # validate_only changes nothing
    incremental(a, ResourceType.BROKER, "1", [("background.threads", "9", SET)],
                validate_only=True)
    assert describe(a, ResourceType.BROKER, "1")["background.threads"].value == "10"

    # Kafka's stored-only dynamic configs (librdkafka's 0081_admin sets these)
    incremental(a, ResourceType.BROKER, "1", [
        ("sasl.kerberos.min.time.before.relogin", "58000", SET),
        ("background.threads", "9", SET),
        ("log.cleanup.policy", "compact", AlterConfigOpType.APPEND),
    ])
    d = describe(a, ResourceType.BROKER, "1")
    assert d["sasl.kerberos.min.time.before.relogin"].value == "58000"
    assert d["background.threads"].source == DYNAMIC_BROKER
    assert d["log.cleanup.policy"].value == "delete,compact"

    # the legacy AlterConfigs replaces the broker's dynamic configs whole
    res = ConfigResource(ResourceType.BROKER, "1", set_config={"background.threads": "4"})
    a.alter_configs([res], request_timeout=TIMEOUT)[res].result(timeout=TIMEOUT)
    d = describe(a, ResourceType.BROKER, "1")
    assert (d["background.threads"].value, d["background.threads"].source) == ("4", DYNAMIC_BROKER)
    assert (d["log.cleanup.policy"].value, d["log.cleanup.policy"].source) == (
        "delete", ConfigSource.DEFAULT_CONFIG.value)
    assert d["sasl.kerberos.min.time.before.relogin"].value == "60000"


def test_group_configs_are_stored_checked_and_described(broker):
    a = admin(broker)
    # a group that does not exist (yet) answers the defaults, as Kafka 4.0 does
    d = describe(a, ResourceType.GROUP, "cfg-group")
    assert d["consumer.session.timeout.ms"].value == "45000", d
    assert d["consumer.heartbeat.interval.ms"].value == "5000", d

    incremental(a, ResourceType.GROUP, "cfg-group",
                [("consumer.session.timeout.ms", "50000", AlterConfigOpType.SET)])
    s = describe(a, ResourceType.GROUP, "cfg-group")["consumer.session.timeout.ms"]
    assert (s.value, s.source) == ("50000", GROUP_CONFIG), s

    for key, value in (("consumer.session.timeout.ms", "1000"), ("no.such.config", "1")):
        with pytest.raises(KafkaException) as e:
            incremental(a, ResourceType.GROUP, "cfg-group", [(key, value, AlterConfigOpType.SET)])
        assert error_code(e.value) == KafkaError.INVALID_CONFIG, e.value

    incremental(a, ResourceType.GROUP, "cfg-group",
                [("consumer.session.timeout.ms", "", AlterConfigOpType.DELETE)])
    s = describe(a, ResourceType.GROUP, "cfg-group")["consumer.session.timeout.ms"]
    assert (s.value, s.source) == ("45000", ConfigSource.DEFAULT_CONFIG.value), s


def test_incremental_append_and_subtract_on_list_configs(broker):
    a = admin(broker)
    create(a, "lists", {})

    def op(name, value, kind):
        res = ConfigResource(
            ResourceType.TOPIC,
            "lists",
            incremental_configs=[ConfigEntry(name, value, incremental_operation=kind)],
        )
        a.incremental_alter_configs([res], request_timeout=TIMEOUT)[res].result(timeout=TIMEOUT)
        return describe(a, ResourceType.TOPIC, "lists")[name].value

    assert op("cleanup.policy", "compact", AlterConfigOpType.APPEND) == "delete,compact"
    # appending what is there already changes nothing
    assert op("cleanup.policy", "compact", AlterConfigOpType.APPEND) == "delete,compact"
    assert op("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT) == "compact"
    assert op("leader.replication.throttled.replicas", "0:1", AlterConfigOpType.APPEND) == "0:1"
    # APPEND on a config that is not a list is refused, as Kafka does
    with pytest.raises(KafkaException) as e:
        op("retention.ms", "5", AlterConfigOpType.APPEND)
    assert error_code(e.value) == KafkaError.INVALID_CONFIG
    assert "retention.ms" in str(e.value)


def _consume(bootstrap: str, topic: str, n: int) -> list:
    c = Consumer(rdkafka_conf({
        "bootstrap.servers": bootstrap,
        "group.id": "configs-test",
        "enable.auto.commit": False,
    }))
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out = []
        deadline = time.monotonic() + TIMEOUT
        while len(out) < n:
            assert time.monotonic() < deadline, f"consumed {len(out)} of {n}"
            for m in c.consume(num_messages=n, timeout=0.5):
                if m.error() is not None:
                    raise KafkaException(m.error())
                out.append(m)
        return out
    finally:
        c.close()


def test_log_append_time_topic_stamps_the_brokers_time(broker):
    a = admin(broker)
    create(a, "appendtime", {"message.timestamp.type": "LogAppendTime"})
    create(a, "createtime", {})
    p = Producer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "linger.ms": 5}))
    reports = []
    before = int(time.time() * 1000)
    for topic in ("appendtime", "createtime"):
        for i in range(10):
            # a producer timestamp far in the past: the broker's append time replaces it
            p.produce(topic, value=f"v{i}", timestamp=1000 + i,
                      on_delivery=lambda err, m: reports.append((err, m.topic(), m.timestamp())))
    assert p.flush(TIMEOUT) == 0
    after = int(time.time() * 1000)
    assert all(err is None for err, _, _ in reports), reports
    for err, topic, (kind, ts) in reports:
        if topic == "appendtime":
            # the Produce response's log_append_time_ms
            assert kind == TIMESTAMP_LOG_APPEND_TIME and before <= ts <= after, (kind, ts)
    msgs = _consume(broker.bootstrap, "appendtime", 10)
    stamps = {m.timestamp() for m in msgs}
    for kind, ts in stamps:
        assert kind == TIMESTAMP_LOG_APPEND_TIME, stamps
        assert before <= ts <= after, (ts, before, after)
    assert [m.value().decode() for m in msgs] == [f"v{i}" for i in range(10)]
    plain = _consume(broker.bootstrap, "createtime", 10)
    assert [m.timestamp() for m in plain] == [(TIMESTAMP_CREATE_TIME, 1000 + i) for i in range(10)]

    # ListOffsets by time sees the append time: the records are found from the produce window
    # on, never from the producer's old timestamps.
    c = Consumer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "group.id": "x"}))
    try:
        found = c.offsets_for_times([TopicPartition("appendtime", 0, before)], timeout=TIMEOUT)
        assert found[0].offset == 0, found
        found = c.offsets_for_times([TopicPartition("appendtime", 0, after + 3_600_000)], timeout=TIMEOUT)
        assert found[0].offset == -1, found
        found = c.offsets_for_times([TopicPartition("createtime", 0, 5000)], timeout=TIMEOUT)
        assert found[0].offset == -1, found
    finally:
        c.close()


CODEC_IDS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def stored_codecs(broker, topic: str) -> list:
    """The codec id of every batch in the partition's segment files, read from disk."""
    (directory,) = [d for d in broker.data_dir.rglob(f"{topic}-0") if d.is_dir()]
    codecs = []
    for segment in sorted(directory.glob("*.log")):
        data, at = segment.read_bytes(), 0
        while at + 61 <= len(data):
            (length,) = struct.unpack_from(">i", data, at + 8)
            (attributes,) = struct.unpack_from(">h", data, at + 21)
            codecs.append(attributes & 0x07)
            at += 12 + length
    return codecs


def test_compression_type_re_encodes_batches_in_the_topics_codec(broker):
    """Kafka's topic `compression.type`: the leader stores (and serves) every batch in the
    topic's codec whatever the producer used; `producer` keeps the producer's. The records
    read back are the ones produced."""
    a = admin(broker)
    topics = {"as-produced": "producer", "to-zstd": "zstd", "to-gzip": "gzip",
              "to-none": "uncompressed", "to-snappy": "snappy"}
    for topic, codec in topics.items():
        create(a, topic, {"compression.type": codec, "compression.gzip.level": "1"})
    p = Producer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "compression.type": "lz4",
                               "linger.ms": 20, "enable.idempotence": True, "acks": "all"}))
    values = [f"settlement {i} " * 20 for i in range(300)]
    errors = []
    for topic in topics:
        for v in values:
            p.produce(topic, key=v[:14], value=v, on_delivery=lambda err, m: err and errors.append(err))
        p.poll(0)
    assert p.flush(TIMEOUT) == 0 and not errors, errors
    for topic, codec in topics.items():
        want = CODEC_IDS["lz4" if codec == "producer" else codec]
        codecs = stored_codecs(broker, topic)
        assert codecs and set(codecs) == {want}, (topic, codecs)
        got = [m.value().decode() for m in _consume(broker.bootstrap, topic, len(values))]
        assert got == values, topic
    assert describe(a, ResourceType.TOPIC, "to-gzip")["compression.type"].value == "gzip"


def test_records_outside_the_timestamp_window_are_refused(broker):
    a = admin(broker)
    create(a, "window", {"message.timestamp.before.max.ms": "3600000",
                         "message.timestamp.after.max.ms": "60000"})
    create(a, "difference", {"message.timestamp.difference.max.ms": "60000"})
    now = int(time.time() * 1000)
    cases = [
        ("window", now - 600_000, None),  # 10 minutes old: within the hour
        ("window", now - 7_200_000, KafkaError.INVALID_TIMESTAMP),
        ("window", now + 600_000, KafkaError.INVALID_TIMESTAMP),
        ("difference", now - 600_000, KafkaError.INVALID_TIMESTAMP),
        ("difference", now + 600_000, KafkaError.INVALID_TIMESTAMP),
        ("difference", now, None),
    ]
    for topic, ts, want in cases:
        p = Producer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "retries": 0}))
        got = []
        p.produce(topic, value=b"x", timestamp=ts, on_delivery=lambda err, m: got.append(err))
        assert p.flush(TIMEOUT) == 0
        code = got[0].code() if got[0] is not None else None
        assert code == want, (topic, ts - now, got[0])


def test_broker_describe_configs(broker):
    a = admin(broker)
    d = describe(a, ResourceType.BROKER, "1")
    assert d["broker.id"].value == "1" and d["broker.id"].is_read_only
    assert d["broker.id"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert "broker.rack" in d, sorted(d)
    assert d["broker.rack"].value is None  # `strata dev` names no rack
    for key in ("advertised.listeners", "log.dirs", "num.partitions",
                "log.retention.ms", "log.segment.bytes", "auto.create.topics.enable",
                "log.message.timestamp.type"):
        assert key in d, (key, sorted(d))
    assert d["log.retention.ms"].value == "604800000"
    # KIP-368: 0 while re-authentication is off (librdkafka's 0142 reads it)
    assert d["connections.max.reauth.ms"].value == "0"
    assert str(broker.port) in d["advertised.listeners"].value
