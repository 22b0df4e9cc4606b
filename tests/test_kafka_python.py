"""kafka-python (pure-Python client) against a real strata process."""

import logging
import os
import time


from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from conftest import (
    N_RECORDS,
    check_partitions,
    parse_value,
    record_key,
    record_value,
    scrape_metrics,
)

PARTITIONS = 6
PRODUCE_DEADLINE_S = 50
CONSUME_DEADLINE_S = 50

if os.environ.get("STRATA_TEST_KAFKA_PYTHON_DEBUG"):
    logging.basicConfig(level=logging.DEBUG)


def test_kafka_python_produce_consume_100k(broker):
    topic = "kpy-100k"
    broker.create_topic(topic, PARTITIONS)

    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        acks="all",
        linger_ms=5,
        batch_size=64 * 1024,
        # Idempotence (also kafka-python 3.x's default) keeps per-partition order with 5 in flight.
        enable_idempotence=True,
        max_in_flight_requests_per_connection=5,
        request_timeout_ms=30000,
    )
    acked = {}
    errors = []

    def ok(v):
        def cb(md):
            acked[v] = (md.partition, md.offset)

        return cb

    deadline = time.monotonic() + PRODUCE_DEADLINE_S
    try:
        for i in range(N_RECORDS):
            if i % 5000 == 0:
                assert time.monotonic() < deadline, f"producing took longer than {PRODUCE_DEADLINE_S}s ({i} sent)"
            fut = producer.send(topic, key=record_key(i).encode(), value=record_value(i).encode())
            fut.add_callback(ok(i))
            fut.add_errback(lambda e, i=i: errors.append((i, e)))
        producer.flush(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        producer.close(timeout=5)
    assert not errors, errors[:5]
    assert len(acked) == N_RECORDS, f"{len(acked)} acknowledged of {N_RECORDS}"

    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=10000,
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        assert set(consumer.partitions_for_topic(topic) or ()) == set(range(PARTITIONS))
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        begin = consumer.beginning_offsets(tps)
        assert all(begin[tp] == 0 for tp in tps), begin
        assert sum(end.values()) == N_RECORDS, end
        per_partition = {p: [] for p in range(PARTITIONS)}
        deadline = time.monotonic() + CONSUME_DEADLINE_S
        while any(len(per_partition[tp.partition]) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, (
                f"consuming took longer than {CONSUME_DEADLINE_S}s: "
                f"{ {p: len(r) for p, r in per_partition.items()} } of {end}"
            )
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                for m in msgs:
                    per_partition[tp.partition].append(
                        (m.offset, m.key.decode() if m.key is not None else None, parse_value(m.value))
                    )
    finally:
        consumer.close()

    check_partitions(per_partition, N_RECORDS, PARTITIONS)
    for p, recs in per_partition.items():
        for off, _, v in recs:
            assert acked[v] == (p, off), f"value {v} acknowledged at {acked[v]}, consumed at {(p, off)}"


def test_kafka_python_deletes_group_offsets_except_those_an_active_group_consumes(broker):
    """OffsetDelete (KIP-496; librdkafka's 0081 DeleteConsumerGroupOffsets) through
    kafka-python's admin client: an empty group's committed offsets go; while a member
    consumes a topic, that topic's offsets stay (GROUP_SUBSCRIBED_TO_TOPIC); an unknown group
    is GROUP_ID_NOT_FOUND. Before Strata served the API, kafka-python refused the call
    (the broker's ApiVersions did not list OffsetDelete)."""
    from kafka.admin import KafkaAdminClient
    from kafka.errors import GroupIdNotFoundError, GroupSubscribedToTopicError, NoError
    from kafka.structs import OffsetAndMetadata

    broker.create_topic("kp-offdel-a", 2)
    broker.create_topic("kp-offdel-b", 1)
    a0, a1, b0 = (TopicPartition("kp-offdel-a", 0), TopicPartition("kp-offdel-a", 1),
                  TopicPartition("kp-offdel-b", 0))
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    consumer = None
    try:
        # The group's coordinator may still be loading its offsets partition (as in Kafka,
        # COORDINATOR_NOT_AVAILABLE until it has); kafka-python's admin does not retry it.
        from kafka.errors import CoordinatorNotAvailableError
        deadline = time.monotonic() + 30
        while True:
            try:
                admin.alter_group_offsets("offdel", {tp: OffsetAndMetadata(5, "", -1) for tp in (a0, a1, b0)})
                break
            except CoordinatorNotAvailableError:
                assert time.monotonic() < deadline, "the group's coordinator never became available"
                time.sleep(0.2)
        assert admin.delete_group_offsets("offdel", [a0, b0]) == {a0: NoError, b0: NoError}
        left = admin.list_group_offsets("offdel")["offdel"]
        assert {tp: o.offset for tp, o in left.items() if o.offset >= 0} == {a1: 5}, left

        # a member consuming kp-offdel-a: its offsets stay, kp-offdel-b's go
        admin.alter_group_offsets("offdel", {b0: OffsetAndMetadata(7, "", -1)})
        consumer = KafkaConsumer("kp-offdel-a", bootstrap_servers=broker.bootstrap, group_id="offdel",
                                 enable_auto_commit=False)
        deadline = time.monotonic() + 30
        while not consumer.assignment():
            assert time.monotonic() < deadline, "the consumer was never assigned its partitions"
            consumer.poll(timeout_ms=200)
        assert admin.delete_group_offsets("offdel", [a1, b0]) == {a1: GroupSubscribedToTopicError, b0: NoError}
        left = admin.list_group_offsets("offdel")["offdel"]
        assert {tp: o.offset for tp, o in left.items() if o.offset >= 0} == {a1: 5}, left

        try:
            admin.delete_group_offsets("no-such-group", [a0])
            raise AssertionError("deleting an unknown group's offsets succeeded")
        except GroupIdNotFoundError:
            pass
    finally:
        if consumer is not None:
            consumer.close()
        admin.close()


def test_kafka_python_deletes_records_and_describes_log_dirs(broker):
    """DeleteRecords and DescribeLogDirs through kafka-python's admin client: the low
    watermark moves (and a consumer from the beginning starts there), and the log directory
    lists the broker's replicas with their sizes and the file system's space (v4)."""
    from kafka.admin import KafkaAdminClient

    broker.create_topic("kp-dr", 2)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    for i in range(40):
        producer.send("kp-dr", value=record_value(i).encode(), partition=i % 2)
    producer.flush(30)
    producer.close()
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        p0, p1 = TopicPartition("kp-dr", 0), TopicPartition("kp-dr", 1)
        got = admin.delete_records({p0: 15, p1: -1})
        assert {tp: m["low_watermark"] for tp, m in got.items()} == {p0: 15, p1: 20}, got

        dirs = admin.describe_log_dirs()
        assert len(dirs) == 1, dirs
        results = dirs[0]["log_dirs"]
        assert len(results) == 1 and results[0]["error_code"] == 0, results
        d = results[0]
        assert d["log_dir"].endswith("logs") and d["total_bytes"] > 0 and d["usable_bytes"] > 0, d
        sizes = {(t["name"], p["partition_index"]): p["partition_size"]
                 for t in d["topics"] for p in t["partitions"]}
        assert sizes[("kp-dr", 0)] > 0 and sizes[("kp-dr", 1)] > 0, sizes
        only = admin.describe_log_dirs({"kp-dr": [1]})[0]["log_dirs"][0]["topics"]
        assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in only] == [("kp-dr", [1])], only
    finally:
        admin.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=5000)
    consumer.assign([p0])
    first = next(iter(consumer))
    consumer.close()
    assert first.offset == 15, first


def test_kafka_python_consumes_through_an_incremental_fetch_session(broker):
    """kafka-python keeps a KIP-227 fetch session: after one full fetch it sends only the
    partitions whose position moved and hears only of partitions with news. Records written
    in waves to a few of 24 partitions at a time (so most of each session's partitions say
    nothing) are all read back once, at their offsets, through incremental fetches."""
    topic = "kpy-sessions"
    partitions = 24
    broker.create_topic(topic, partitions)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=2)
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
    )
    acked = {}
    seen = {}
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        consumer.poll(timeout_ms=500)  # the full fetch that opens the session
        for wave in range(6):
            # each wave writes to 4 partitions only
            targets = [(wave * 4 + k) % partitions for k in range(4)]
            futures = []
            for i in range(200):
                value = f"{wave}-{i}"
                p = targets[i % 4]
                futures.append((value, producer.send(topic, value=value.encode(), partition=p)))
            producer.flush(timeout=20)
            for value, f in futures:
                md = f.get(timeout=10)
                acked[value] = (md.partition, md.offset)
            deadline = time.monotonic() + 20
            while len(seen) < len(acked):
                assert time.monotonic() < deadline, f"wave {wave}: {len(seen)} of {len(acked)} read back"
                for tp, msgs in consumer.poll(timeout_ms=200).items():
                    for m in msgs:
                        v = m.value.decode()
                        assert v not in seen, f"{v} read twice, at {seen[v]} and {(tp.partition, m.offset)}"
                        seen[v] = (tp.partition, m.offset)
        metrics = scrape_metrics(broker.metrics_port)
    finally:
        consumer.close()
        producer.close(timeout=5)
    assert seen == acked
    assert metrics["strata_kafka_fetch_sessions"] >= 1, "no fetch session was open"
    assert metrics["strata_kafka_fetch_incremental_total"] >= 6, metrics["strata_kafka_fetch_incremental_total"]


def test_kafka_python_describes_the_producers_a_partition_remembers(broker):
    """DescribeProducers (KIP-664) through kafka-python's admin client: the idempotent
    producer that wrote to a partition is listed with its epoch and last sequence; a partition
    nobody wrote to lists none, and an unknown partition is an error."""
    from kafka.admin import KafkaAdminClient

    topic = "kpy-producers"
    broker.create_topic(topic, 2)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", enable_idempotence=True)
    try:
        for i in range(7):
            producer.send(topic, value=f"v{i}".encode(), partition=0).get(timeout=10)
        pid = producer._transaction_manager.producer_id_and_epoch.producer_id
    finally:
        producer.close(timeout=5)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        states = admin.describe_producers([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        active = states[TopicPartition(topic, 0)].active_producers
        assert [p.producer_id for p in active] == [pid], active
        assert active[0].producer_epoch == 0
        assert active[0].last_sequence == 6, active[0]
        assert active[0].last_timestamp > 0
        assert states[TopicPartition(topic, 1)].active_producers == []
        try:
            admin.describe_producers([TopicPartition(topic, 5)], broker_id=1)
        except Exception as e:  # noqa: BLE001 - kafka-python raises the broker's error
            assert "UnknownTopicOrPartition" in type(e).__name__, repr(e)
        else:
            raise AssertionError("an unknown partition was described")
    finally:
        admin.close()
