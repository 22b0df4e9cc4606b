"""A full disk fails the writes that hit it and leaves the log readable and writable again.

The broker runs with RLIMIT_FSIZE (and SIGXFSZ ignored), so a segment write past the limit
fails with EFBIG exactly as a full disk fails with ENOSPC: the produce gets
KAFKA_STORAGE_ERROR, the segment is cut back to its last whole batch, and every
acknowledged record stays readable, also after a restart without the limit.
"""

import resource
import signal
import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition


LIMIT_BYTES = 3 * 1024 * 1024
VALUE_PAD = "x" * 800


def value(i):
    return f"{i}|{VALUE_PAD}".encode()


def parse(v):
    return int(v.split(b"|", 1)[0])


def limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, LIMIT_BYTES))


def produce(bootstrap, topic, start, count):
    acked, failed = {}, []

    def on_delivery(err, msg):
        if err is None:
            acked[msg.offset()] = parse(msg.value())
        else:
            failed.append(err.code())

    p = Producer({
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "retries": 0,
        "enable.idempotence": False,
        "linger.ms": 0,
        "message.timeout.ms": 10000,
    })
    for i in range(start, start + count):
        p.produce(topic, value(i), partition=0, on_delivery=on_delivery)
        p.poll(0)
        if i % 200 == 0:
            p.flush(10)
    assert p.flush(30) == 0
    return acked, failed


def consume_all(bootstrap, topic):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "disk-errors", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got, deadline = {}, time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)
                if len(got) >= high:
                    break
                continue
            assert m.error() is None, m.error()
            got[m.offset()] = parse(m.value())
    finally:
        c.close()
    return got


def test_disk_full_fails_the_write_and_keeps_the_log(broker):
    broker.create_topic("full", 1)
    broker.stop()
    broker.preexec = limit_file_size
    broker.start()

    acked, failed = produce(broker.bootstrap, "full", 0, 6000)  # ~5 MB: past the limit
    assert acked, "nothing was acknowledged before the disk filled"
    assert failed, "no write failed although the segment reached the file size limit"
    assert set(failed) == {KafkaError.KAFKA_STORAGE_ERROR}, failed
    assert broker.running(), "the broker must survive a full disk"

    stored = consume_all(broker.bootstrap, "full")
    assert stored == acked, "the log must hold exactly the acknowledged records"

    # Space comes back (restart without the limit): writes continue after the last record.
    broker.stop()
    broker.preexec = None
    broker.start()
    more, failed = produce(broker.bootstrap, "full", 10_000, 100)
    assert not failed
    assert min(more) == max(acked) + 1
    stored = consume_all(broker.bootstrap, "full")
    assert stored == {**acked, **more}
