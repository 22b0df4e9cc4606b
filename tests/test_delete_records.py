"""DeleteRecords (Kafka API 21, `AdminClient.delete_records`, `kafka-delete-records.sh`)
through confluent-kafka against real strata processes.

- single node: every partition's low watermark moves to the point asked (OFFSET_END = the
  high watermark), a point past the high watermark is refused with OFFSET_OUT_OF_RANGE and
  changes nothing, a consumer at a deleted offset is reset to the new start and never sees
  a deleted record, the start survives a SIGKILL, and internal and compact-only topics are
  refused;
- 3 + 3 cluster, RF=3: the answer comes once the ISR has deleted the records, so after the
  leader is SIGKILLed the new leader serves none of them either.
"""

import time

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import rdkafka_conf, strata_bin
from test_cluster import LEASE_S, cluster  # noqa: F401 (the 3 + 3 cluster fixture)

TIMEOUT = 20


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int):
    p = Producer(rdkafka_conf({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5}))
    errors = []
    for part in range(partitions):
        for i in range(per_partition):
            p.produce(topic, value=f"{part}-{i}".encode(), partition=part,
                      on_delivery=lambda err, _m: err and errors.append(err))
    assert p.flush(TIMEOUT) == 0 and not errors, errors[:3]


def delete(admin: AdminClient, points: list) -> dict:
    """{partition: low watermark or the KafkaError} of one DeleteRecords."""
    futures = admin.delete_records(points, request_timeout=TIMEOUT, operation_timeout=TIMEOUT)
    out = {}
    for tp, f in futures.items():
        try:
            out[tp.partition] = f.result().low_watermark
        except KafkaException as e:
            out[tp.partition] = e.args[0]
    return out


def watermarks(bootstrap: str, topic: str, partitions: int) -> dict:
    c = Consumer(rdkafka_conf({"bootstrap.servers": bootstrap, "group.id": "wm"}))
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT) for p in range(partitions)}
    finally:
        c.close()


def read(bootstrap: str, topic: str, partition: int, start, until: int) -> list:
    """(offset, value) of every record from `start` (an offset or OFFSET_BEGINNING) up to
    offset `until`, with auto.offset.reset=earliest."""
    c = Consumer(rdkafka_conf({"bootstrap.servers": bootstrap, "group.id": "reader",
                               "enable.auto.commit": False, "auto.offset.reset": "earliest"}))
    out = []
    try:
        c.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + TIMEOUT
        while not out or out[-1][0] < until - 1:
            assert time.monotonic() < deadline, f"read {len(out)} records: {out[-3:]}"
            for m in c.consume(num_messages=500, timeout=0.5):
                assert m.error() is None, m.error()
                out.append((m.offset(), m.value().decode()))
        return out
    finally:
        c.close()


def test_delete_records_moves_the_low_watermark_and_survives_a_crash(broker):
    topic, parts, n = "dr", 3, 100
    broker.create_topic(topic, parts)
    produce(broker.bootstrap, topic, parts, n)
    admin = AdminClient(rdkafka_conf({"bootstrap.servers": broker.bootstrap}))

    got = delete(admin, [TopicPartition(topic, 0, OFFSET_END), TopicPartition(topic, 1, 50),
                         TopicPartition(topic, 2, n + 1)])
    assert got[0] == n and got[1] == 50, got
    assert isinstance(got[2], KafkaError) and got[2].code() == KafkaError.OFFSET_OUT_OF_RANGE, got
    assert watermarks(broker.bootstrap, topic, parts) == {0: (n, n), 1: (50, n), 2: (0, n)}

    # A consumer at a deleted offset is reset to the new start; from the beginning it reads
    # exactly what is left.
    assert read(broker.bootstrap, topic, 1, 10, n)[0] == (50, "1-50")
    left = read(broker.bootstrap, topic, 1, OFFSET_BEGINNING, n)
    assert left == [(i, f"1-{i}") for i in range(50, n)], left[:3]
    # Moving the point back changes nothing.
    assert delete(admin, [TopicPartition(topic, 1, 20)]) == {1: 50}

    broker.kill()
    broker.start()
    assert watermarks(broker.bootstrap, topic, parts) == {0: (n, n), 1: (50, n), 2: (0, n)}
    # Appends go on after the deleted records.
    produce(broker.bootstrap, topic, 1, 1)
    assert read(broker.bootstrap, topic, 0, OFFSET_BEGINNING, n + 1) == [(n, "0-0")]


def test_delete_records_is_refused_on_internal_and_compact_only_topics(broker):
    admin = AdminClient(rdkafka_conf({"bootstrap.servers": broker.bootstrap}))
    broker.create_topic("latest", 1, {"cleanup.policy": "compact"})
    p = Producer(rdkafka_conf({"bootstrap.servers": broker.bootstrap}))
    p.produce("latest", key=b"k", value=b"v")
    assert p.flush(TIMEOUT) == 0
    got = delete(admin, [TopicPartition("latest", 0, OFFSET_END)])
    assert got[0].code() == KafkaError.POLICY_VIOLATION, got
    assert watermarks(broker.bootstrap, "latest", 1) == {0: (0, 1)}

    # A group commit creates __consumer_offsets; its records are the groups' state.
    c = Consumer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "group.id": "g"}))
    c.commit(offsets=[TopicPartition("latest", 0, 1)], asynchronous=False)
    c.close()
    got = delete(admin, [TopicPartition("__consumer_offsets", 0, OFFSET_END)])
    assert got[0].code() == KafkaError.TOPIC_EXCEPTION, got  # INVALID_TOPIC_EXCEPTION (17)


def test_a_new_leader_serves_none_of_the_deleted_records(cluster):
    topic, n = "settlements", 500
    cluster.cli("topic", "create", topic, "-p", "1", "--replication-factor", "3",
                "--config", "min.insync.replicas=2")
    m = cluster.wait_for(lambda m: topic in m["topics"] and m["topics"][topic]["partitions"][0]["leader"] > 0,
                         "topic led")
    bootstrap = ",".join(f"127.0.0.1:{cluster.broker_ports[i]}" for i in (1, 2, 3))
    produce(bootstrap, topic, 1, n)
    admin = AdminClient(rdkafka_conf({"bootstrap.servers": bootstrap}))
    assert delete(admin, [TopicPartition(topic, 0, 300)]) == {0: 300}

    leader = m["topics"][topic]["partitions"][0]["leader"]
    cluster.kill(f"broker-{leader}")
    cluster.wait_for(lambda m: m["topics"][topic]["partitions"][0]["leader"] not in (-1, leader),
                     "a new leader", timeout=LEASE_S * 3)
    survivors = ",".join(f"127.0.0.1:{cluster.broker_ports[i]}" for i in (1, 2, 3) if i != leader)
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            wm = watermarks(survivors, topic, 1)[0]
            break
        except KafkaException:
            assert time.monotonic() < deadline
            time.sleep(0.3)
    assert wm == (300, n), wm
    left = read(survivors, topic, 0, OFFSET_BEGINNING, n)
    assert left == [(i, f"0-{i}") for i in range(300, n)], left[:3]


def test_deleted_records_in_the_cold_tier_are_served_no_more(tmp_path):
    """A tiered topic whose older records live only in the cold tier (`file://`): a
    DeleteRecords point below the local log start is honoured by fetches and ListOffsets at
    once, and the remote segments wholly below it are deleted by the next retention round."""
    from conftest import Broker, scrape_metrics

    b = Broker(strata_bin(), tmp_path)
    b.extra_env = {
        "STRATA__COLD__URL": f"file://{tmp_path / 'cold'}",
        "STRATA__COLD__INTERVAL": "200ms",
        "STRATA__TOPICS__RETENTION_CHECK_INTERVAL": "200ms",
    }
    b.start()
    try:
        topic, n = "archive", 20_000
        b.create_topic(topic, 1, {"segment.bytes": 64 << 10, "remote.storage.enable": "true",
                                  "local.retention.bytes": 128 << 10, "retention.ms": -1})
        p = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 20,
                                   "batch.size": 16384}))
        for i in range(n):
            p.produce(topic, value=f"0-{i}-{'x' * 80}".encode(), partition=0)
            if i % 1000 == 0:
                p.poll(0)
        assert p.flush(TIMEOUT) == 0
        start_metric = f'strata_partition_log_start_offset{{topic="{topic}",partition="0"}}'
        deadline = time.monotonic() + 60
        while True:
            m = scrape_metrics(b.metrics_port)
            local_start = int(m.get(start_metric, 0))
            if m.get("strata_under_tiered_bytes", 1) == 0 and local_start > 5_000:
                break
            assert time.monotonic() < deadline, f"not tiered: local start {local_start}"
            time.sleep(0.3)
        deleted_before = m.get("strata_remote_segments_deleted_total", 0)
        point = local_start // 2 + 7  # inside a remote segment, below the local log
        admin = AdminClient(rdkafka_conf({"bootstrap.servers": b.bootstrap}))
        assert delete(admin, [TopicPartition(topic, 0, point)]) == {0: point}
        assert watermarks(b.bootstrap, topic, 1) == {0: (point, n)}
        got = read(b.bootstrap, topic, 0, 0, point + 10)
        assert got[0][0] == point and got[0][1].startswith(f"0-{point}-"), got[:2]
        deadline = time.monotonic() + 30
        while scrape_metrics(b.metrics_port).get("strata_remote_segments_deleted_total", 0) <= deleted_before:
            assert time.monotonic() < deadline, "no remote segment below the point was deleted"
            time.sleep(0.3)
        # A restart keeps the point. (Until the tiering task has read the manifest again,
        # a moment after the start, the earliest offset is not answered.)
        b.kill()
        b.start()
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                wm = watermarks(b.bootstrap, topic, 1)
            except KafkaException as e:  # OFFSET_NOT_AVAILABLE until the manifest is read
                assert e.args[0].code() == KafkaError.OFFSET_NOT_AVAILABLE, e
                wm = None
            if wm == {0: (point, n)}:
                break
            assert wm is None or wm[0][0] >= point, f"a deleted record came back: {wm}"
            assert time.monotonic() < deadline, wm
            time.sleep(0.2)
        assert read(b.bootstrap, topic, 0, OFFSET_BEGINNING, point + 1)[0][0] == point
    finally:
        b.stop()
