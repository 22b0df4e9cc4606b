"""confluent-kafka (librdkafka 2.x) against a real strata process."""

import time


from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from conftest import (
    consume_partitions,
    rdkafka_conf,
    N_RECORDS,
    check_partitions,
    parse_value,
    record_key,
    record_value,
)

PARTITIONS = 6
PRODUCE_DEADLINE_S = 45
CONSUME_DEADLINE_S = 45




def produce_all(bootstrap: str, topic: str, n: int, extra: dict | None = None):
    """Produces n keyed records in order; returns {value: (partition, offset)} from the
    delivery reports and the list of delivery errors."""
    conf = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": 30000,
        # The broker is single-node: keep per-partition order even across retries.
        "max.in.flight.requests.per.connection": 5,
    }
    conf.update(extra or {})
    producer = Producer(rdkafka_conf(conf))
    acked = {}
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append((err, msg.value()))
            return
        v = parse_value(msg.value())
        if v in acked:
            errors.append((f"duplicate delivery report for {v}", msg.value()))
        acked[v] = (msg.partition(), msg.offset())

    deadline = time.monotonic() + PRODUCE_DEADLINE_S
    i = 0
    while i < n:
        assert time.monotonic() < deadline, f"producing took longer than {PRODUCE_DEADLINE_S}s ({i} queued)"
        try:
            producer.produce(topic, key=record_key(i), value=record_value(i), on_delivery=on_delivery)
            i += 1
        except BufferError:
            producer.poll(0.05)
            continue
        if i % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(max(1.0, deadline - time.monotonic()))
    assert remaining == 0, f"{remaining} messages still undelivered after flush; errors: {errors[:5]}"
    return acked, errors


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int, extra: dict | None = None):
    """Reads all partitions from offset 0 to the high watermark with assign() (no group).

    Returns {partition: [(offset, key, value_int), ...]}."""
    out, hwm = consume_partitions(bootstrap, topic, partitions, time.monotonic() + CONSUME_DEADLINE_S, extra)
    assert sum(hwm.values()) == expected, f"high watermarks {hwm} do not sum to {expected}"
    return out


def check_acks_match(acked: dict, per_partition: dict):
    consumed = {}
    for p, recs in per_partition.items():
        for off, _, v in recs:
            consumed[v] = (p, off)
    for v, where in acked.items():
        assert consumed.get(v) == where, f"value {v} acknowledged at {where}, consumed at {consumed.get(v)}"


def test_produce_consume_100k_acks_all(broker):
    topic = "ck-acks-all"
    broker.create_topic(topic, PARTITIONS)
    acked, errors = produce_all(broker.bootstrap, topic, N_RECORDS)
    assert not errors, errors[:5]
    assert len(acked) == N_RECORDS
    per_partition = consume_all(broker.bootstrap, topic, PARTITIONS, N_RECORDS)
    check_partitions(per_partition, N_RECORDS, PARTITIONS)
    check_acks_match(acked, per_partition)
    # Keys spread over all partitions.
    assert all(per_partition[p] for p in range(PARTITIONS)), {p: len(r) for p, r in per_partition.items()}


def test_produce_consume_100k_idempotent(broker):
    topic = "ck-idempotent"
    broker.create_topic(topic, PARTITIONS)
    acked, errors = produce_all(
        broker.bootstrap,
        topic,
        N_RECORDS,
        {"enable.idempotence": True},
    )
    assert not errors, errors[:5]
    assert len(acked) == N_RECORDS
    per_partition = consume_all(broker.bootstrap, topic, PARTITIONS, N_RECORDS)
    # check_partitions asserts each value exactly once (no duplicates) and per-partition order.
    check_partitions(per_partition, N_RECORDS, PARTITIONS)
    check_acks_match(acked, per_partition)


def test_unknown_topic_fails_bounded(broker):
    """Producing to a topic that does not exist (auto-creation is off) fails with
    UNKNOWN_TOPIC_OR_PART (or another delivery error) within message.timeout.ms."""
    producer = Producer(
        rdkafka_conf(
            {
                "bootstrap.servers": broker.bootstrap,
                "acks": "all",
                "message.timeout.ms": 5000,
                "topic.metadata.propagation.max.ms": 1000,
            }
        )
    )
    reports = []
    producer.produce("no-such-topic", key="k", value="v", on_delivery=lambda err, msg: reports.append(err))
    start = time.monotonic()
    remaining = producer.flush(15)
    elapsed = time.monotonic() - start
    assert remaining == 0, "delivery report never came"
    assert elapsed < 12, f"delivery failure took {elapsed:.1f}s"
    assert len(reports) == 1 and reports[0] is not None, reports
    assert reports[0].code() in (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._MSG_TIMED_OUT,
    ), reports[0]
    # The broker is still fine afterwards.
    assert broker.running()


def test_pipelined_async_commits_apply_in_request_order(broker):
    """Issue 16, item 7 (librdkafka's 0030_offset_commit). Fifty async OffsetCommits of one
    partition go out pipelined on one connection; each is applied once durable, so without
    ordering an older one could land last. The committed offset must be the last one sent."""
    topic = "ck-commit-order"
    broker.create_topic(topic, 1)
    done = []
    consumer = Consumer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "group.id": "commit-order",
                                      "enable.auto.commit": False,
                                      "on_commit": lambda err, parts: done.append(err)}))
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    try:
        for round_ in range(5):
            done.clear()
            last = (round_ + 1) * 50
            for offset in range(round_ * 50 + 1, last + 1):
                consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=True)
            deadline = time.monotonic() + 30
            while len(done) < 50 and time.monotonic() < deadline:
                consumer.poll(0.05)
            assert len(done) == 50 and not any(done), f"round {round_}: {len(done)} commit answers, errors {[e for e in done if e]}"
            [committed] = consumer.committed([tp], timeout=10)
            assert committed.offset == last, f"round {round_}: committed {committed.offset}, the last commit sent was {last}"
    finally:
        consumer.close()


def test_a_fetch_never_exceeds_its_max_bytes(broker):
    """Issue 16, item 8 (librdkafka's 0082_fetch_max_bytes). Two partitions each hold one
    ~900 KB batch and the consumer allows 1,000,000 bytes per fetch: only the first
    non-empty partition may go over by one batch (KIP-74), so one response carries one of
    them. Two would exceed receive.message.max.bytes; librdkafka drops such a response
    ("Invalid response size") and retries it forever."""
    topic = "ck-fetch-max"
    broker.create_topic(topic, 2)
    producer = Producer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "acks": "all",
                                      "message.max.bytes": 1_000_000}))
    for p in (0, 1):
        producer.produce(topic, value=bytes([65 + p]) * 900_000, partition=p)
    assert producer.flush(30) == 0
    consumer = Consumer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "group.id": "fetch-max",
                                      "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                      "fetch.max.bytes": 1_000_000, "max.partition.fetch.bytes": 1_000_000,
                                      "receive.message.max.bytes": 1_000_512}))
    consumer.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
    got = {}
    errors = []
    try:
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is None:
                continue
            if m.error():
                errors.append(str(m.error()))
                continue
            got[m.partition()] = len(m.value())
    finally:
        consumer.close()
    assert got == {0: 900_000, 1: 900_000}, f"read {got} within 20 s; consumer errors: {errors[:3]}"


def test_consumers_started_together_get_one_generation(broker):
    """Issue 19, item 3 (librdkafka's 0102 and 0113): Kafka's group.initial.rebalance.delay.ms
    (3 s). Two consumers of a new group subscribe one second apart; the group waits for more
    members before its first generation, so each is assigned once, its share of the
    partitions, and neither is revoked. Without the delay the first took every partition at
    once and was revoked when the second joined."""
    import threading

    topic = "ck-initial-delay"
    broker.create_topic(topic, 4)
    assigned = {"a": [], "b": []}
    revoked = {"a": 0, "b": 0}
    stop = threading.Event()

    def member(name):
        c = Consumer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "group.id": "initial-delay",
                                   "enable.auto.commit": False, "session.timeout.ms": 10000,
                                   "partition.assignment.strategy": "range"}))
        c.subscribe([topic],
                    on_assign=lambda _c, parts: assigned[name].append(sorted(p.partition for p in parts)),
                    # (close() revokes too: only revocations before then count)
                    on_revoke=lambda _c, parts: revoked.__setitem__(
                        name, revoked[name] + (1 if parts and not stop.is_set() else 0)))
        try:
            while not stop.is_set():
                c.poll(0.1)
        finally:
            c.close()

    threads = [threading.Thread(target=member, args=("a",), daemon=True)]
    threads[0].start()
    time.sleep(1)
    threads.append(threading.Thread(target=member, args=("b",), daemon=True))
    threads[1].start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (assigned["a"] and assigned["b"]):
        time.sleep(0.1)
    time.sleep(2)  # time for a second rebalance, if there were one
    stop.set()
    for t in threads:
        t.join(timeout=20)
    assert len(assigned["a"]) == 1 and len(assigned["b"]) == 1 and revoked == {"a": 0, "b": 0}, (
        f"assignments {assigned}, revocations {revoked}: the group rebalanced more than once")
    assert sorted(assigned["a"][0] + assigned["b"][0]) == [0, 1, 2, 3] and assigned["a"][0] and assigned["b"][0], assigned


def test_large_reads_are_sent_from_the_segment_files_and_read_the_same(broker):
    """Issue 20, item 4: on a plaintext listener a fetch sends large reads that are in the
    page cache straight from the segment files (sendfile). A consumer reads every byte the
    same as with `kafka.sendfile = false`, and the metric shows the files were sent."""
    from conftest import scrape_metrics

    topic = "ck-sendfile"
    partitions, per_partition, size = 3, 600, 9_000
    broker.create_topic(topic, partitions)
    producer = Producer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "acks": "all",
                                      "linger.ms": 200, "batch.size": 1_000_000,
                                      "compression.type": "none"}))

    pattern = bytes(range(251)) * (size // 251 + 2)

    def value(p, i):
        head = f"{p}:{i}:".encode()
        at = (p * 7 + i) % 251
        return head + pattern[at:at + size - len(head)]

    for i in range(per_partition):
        for p in range(partitions):
            while True:
                try:
                    producer.produce(topic, value=value(p, i), partition=p)
                    break
                except BufferError:
                    producer.poll(0.05)
    assert producer.flush(60) == 0

    def read_all():
        consumer = Consumer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "group.id": "sendfile",
                                          "enable.auto.commit": False, "enable.partition.eof": True}))
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got = {p: 0 for p in range(partitions)}
        done = set()
        try:
            deadline = time.monotonic() + 60
            while len(done) < partitions:
                assert time.monotonic() < deadline, f"read {got} of {per_partition} each within 60 s"
                m = consumer.poll(0.5)
                if m is None:
                    continue
                if m.error():
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    if got[m.partition()] == per_partition:
                        done.add(m.partition())
                    continue
                p, i = m.partition(), got[m.partition()]
                assert m.offset() == i, (p, m.offset(), i)
                assert m.value() == value(p, i), f"partition {p} offset {i}: bytes differ"
                got[p] += 1
        finally:
            consumer.close()
        return scrape_metrics(broker.metrics_port)

    total = partitions * per_partition * size
    m = read_all()
    sent = m["strata_fetched_from_file_bytes_total"]
    print(f"sent from the files: {sent:.0f} of {m['strata_fetched_bytes_total']:.0f} fetched, {total} produced")
    assert sent >= 0.5 * total, f"{sent:.0f} of {total} record bytes sent from the files"
    assert sent <= m["strata_fetched_bytes_total"]

    broker.extra_env["STRATA__KAFKA__SENDFILE"] = "false"
    broker.restart()
    m = read_all()
    assert m["strata_fetched_from_file_bytes_total"] == 0
    assert m["strata_fetched_bytes_total"] >= total
