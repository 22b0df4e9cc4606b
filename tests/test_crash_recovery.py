"""SIGKILL the broker while a client produces with acks=all; after a restart every
acknowledged record must be where the broker said it was."""

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from conftest import check_partitions, consume_partitions, parse_value, record_key, record_value, rdkafka_conf

PARTITIONS = 3
CYCLES = 3
PRODUCE_BEFORE_KILL_S = 2.0
PRODUCE_AFTER_KILL_S = 0.5
TEST_BUDGET_S = 90



def produce_until_killed(broker, topic: str, first_value: int, acked: dict, deadline: float) -> int:
    """Produces values first_value.. until PRODUCE_BEFORE_KILL_S, SIGKILLs the broker, keeps
    producing PRODUCE_AFTER_KILL_S more, then abandons the producer. Delivery reports
    without error are recorded in `acked` as {value: (partition, offset)}. Returns the next
    unused value."""
    producer = Producer(
        rdkafka_conf(
            {
                "bootstrap.servers": broker.bootstrap,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 5000,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 200,
                # Don't let librdkafka log every failed reconnect to stderr at ERROR.
                "log.connection.close": False,
            }
        )
    )
    failed = []

    def on_delivery(err, msg):
        v = parse_value(msg.value())
        if err is None:
            assert v not in acked, f"value {v} acknowledged twice"
            acked[v] = (msg.partition(), msg.offset())
        else:
            failed.append(v)

    v = first_value
    start = time.monotonic()
    killed_at = None
    while True:
        now = time.monotonic()
        assert now < deadline, "test budget exhausted while producing"
        if killed_at is None and now - start >= PRODUCE_BEFORE_KILL_S:
            broker.kill()
            killed_at = now
        if killed_at is not None and now - killed_at >= PRODUCE_AFTER_KILL_S:
            break
        # ~20k records/s in many small requests, so the kill lands among many appends.
        for _ in range(100):
            try:
                producer.produce(topic, key=record_key(v), value=record_value(v), on_delivery=on_delivery)
                v += 1
            except BufferError:
                break
        producer.poll(0.005)
    # Stop: give in-flight deliveries a moment, then drop whatever is left unacknowledged.
    producer.flush(1.0)
    producer.purge(in_queue=True, in_flight=True)
    producer.flush(1.0)
    del producer
    return v


def consume_everything(bootstrap: str, topic: str, deadline: float):
    return consume_partitions(bootstrap, topic, PARTITIONS, deadline)


def verify(per_partition: dict, acked: dict):
    check_partitions(per_partition, None, PARTITIONS)
    at = {}
    for p, recs in per_partition.items():
        for off, _, v in recs:
            at[(p, off)] = v
    lost = [(v, where, at.get(where)) for v, where in sorted(acked.items()) if at.get(where) != v]
    assert not lost, (
        f"{len(lost)} of {len(acked)} acknowledged records are not at their acknowledged offset "
        f"(value, (partition, offset), found): {lost[:10]}"
    )


def test_sigkill_while_producing_keeps_acknowledged_records(broker):
    deadline = time.monotonic() + TEST_BUDGET_S
    topic = "crash"
    broker.create_topic(topic, PARTITIONS)
    acked = {}
    next_value = 0
    history = []
    for cycle in range(CYCLES):
        # Leave enough budget for a cycle (~4 s of producing) plus the final verification.
        if cycle > 0 and deadline - time.monotonic() < 30:
            break
        before = len(acked)
        next_value = produce_until_killed(broker, topic, next_value, acked, deadline)
        assert not broker.running()
        new_acks = len(acked) - before
        assert new_acks > 0, f"cycle {cycle}: nothing acknowledged in {PRODUCE_BEFORE_KILL_S}s\n" + broker.stderr_tail()
        broker.restart()
        per_partition, hwm = consume_everything(broker.bootstrap, topic, deadline)
        history.append(
            dict(cycle=cycle, sent=next_value, acked=len(acked), stored=sum(hwm.values()), hwm=hwm)
        )
        try:
            verify(per_partition, acked)
        except AssertionError as e:
            raise AssertionError(f"after crash {cycle + 1}: {e}\nhistory: {history}\n" + broker.stderr_tail()) from None
        # Everything stored is something that was sent; acknowledged records are all stored.
        assert len(acked) <= sum(hwm.values()) <= next_value, history
    assert len(history) >= 2, f"only {len(history)} kill/restart cycles fit in the budget: {history}"
    print("crash cycles:", history)
