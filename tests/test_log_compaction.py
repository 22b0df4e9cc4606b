"""Compaction of the hot (local) log for `cleanup.policy=compact` topics that are not tiered
(issue 19, item 4), against a real `strata dev` process and real clients: librdkafka
(confluent-kafka) produces keyed records, tombstones and keyless records are refused
(KIP-467), the broker compacts its own log within seconds, and consumers then read each
key's latest record at the offset it was acknowledged at, also after a SIGKILL."""

import shutil
import time

from conftest import free_port, rdkafka_conf, scrape_metrics, strata_bin

KEYS = 40
ROUNDS = 60


def produce(bootstrap, topic, records):
    """Produces (key, value) pairs; returns {offset: (key, value)} from the delivery reports."""
    from confluent_kafka import Producer

    p = Producer(rdkafka_conf({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                               "enable.idempotence": True, "batch.size": 4096}))
    acked, errors = {}, []

    def done(err, msg):
        if err:
            errors.append(err)
        else:
            acked[msg.offset()] = (msg.key().decode(), msg.value().decode() if msg.value() is not None else None)

    for key, value in records:
        p.produce(topic, key=key.encode(), value=None if value is None else value.encode(), on_delivery=done)
        p.poll(0)
    assert p.flush(60) == 0 and not errors, errors
    return acked


def consume_all(bootstrap, topic):
    """{offset: (key, value)} of everything the partition serves, read from the start."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(rdkafka_conf({"bootstrap.servers": bootstrap, "group.id": f"g{time.monotonic_ns()}",
                               "enable.auto.commit": False, "auto.offset.reset": "earliest"}))
    _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    c.assign([TopicPartition(topic, 0, 0)])
    seen, deadline = {}, time.monotonic() + 30
    last = -1
    while last + 1 < high and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        assert m.offset() > last, "offsets must increase"
        last = m.offset()
        seen[m.offset()] = (m.key().decode(), m.value().decode() if m.value() is not None else None)
    c.close()
    assert last + 1 >= high, f"read up to {last}, the high watermark is {high}"
    return seen


def fund_records():
    """ROUNDS updates of KEYS funds, tombstones for three of them, then filler records of
    other keys so the segments holding the funds' latest values are sealed."""
    records = [(f"fund-{k:02}", f"nav-{r}-{k}-" + "x" * 40) for r in range(ROUNDS) for k in range(KEYS)]
    records += [(f"fund-{k:02}", None) for k in range(3)]
    records += [(f"filler-{i % 5}", "f" * 200) for i in range(200)]
    return records


def latest_offsets(acked):
    latest = {}
    for offset in sorted(acked):
        latest[acked[offset][0]] = offset
    return latest


def check_compacted(bootstrap, topic, acked):
    """Reads the partition whole: every record served is the one acknowledged at its offset,
    every key's latest record is served, and most superseded fund values are gone."""
    seen = consume_all(bootstrap, topic)
    for offset, kv in seen.items():
        assert acked[offset] == kv, f"offset {offset}: served {kv}, acknowledged {acked[offset]}"
    latest = latest_offsets(acked)
    for key, offset in latest.items():
        assert offset in seen, f"the latest record of {key} (offset {offset}) is gone"
    funds = [o for o, (k, _) in seen.items() if k.startswith("fund-")]
    assert len(funds) < KEYS * 3, f"{len(funds)} fund records left of {KEYS * ROUNDS}"
    assert all(seen[latest[f"fund-{k:02}"]][1] is None for k in range(3)), "a tombstone is gone"
    return seen


def wait_compacted(metrics, what, timeout=40):
    """Waits until `metrics()` (a scrape) counts enough removed records that the fund values
    superseded before the last three rounds are gone: a round may start while the producer
    is still writing, and only the next one reaches the rest."""
    deadline = time.monotonic() + timeout
    while (removed := metrics().get("strata_log_compaction_records_removed_total", 0)) < KEYS * (ROUNDS - 3):
        assert time.monotonic() < deadline, f"{what} removed only {removed} records within {timeout} s"
        time.sleep(0.5)


COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "16384", "min.cleanable.dirty.ratio": "0.01"}


def test_the_broker_compacts_its_own_log_and_serves_each_keys_latest_record(broker):
    broker.extra_env["STRATA__TOPICS__COMPACTION_CHECK_INTERVAL"] = "1s"
    broker.restart()
    broker.create_topic("prices", 1, COMPACTED)
    records = fund_records()
    acked = produce(broker.bootstrap, "prices", records)
    assert len(acked) == len(records)

    wait_compacted(lambda: scrape_metrics(broker.metrics_port), "the broker")

    def check():
        return check_compacted(broker.bootstrap, "prices", acked)

    before = check()
    broker.kill()
    broker.start()
    assert check() == before

    # keyless records on a compacted topic are refused with INVALID_RECORD (KIP-467)
    from confluent_kafka import KafkaError, Producer

    p = Producer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "acks": "all"}))
    errors = []
    p.produce("prices", value=b"no key", on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert errors and errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD, errors


def test_replicas_compact_their_own_logs_and_a_replaced_replica_copies_a_compacted_log(tmp_path):
    """RF=3: every replica compacts its own copy; a broker replaced by one with an empty disk
    copies the leader's compacted log (batches that skip removed offsets) and, once the two
    others are SIGKILLed, serves every key's latest record at its acknowledged offset."""
    from test_cluster import LEASE_S, Cluster
    from test_runbooks import describe, leaders_seen

    c = Cluster(strata_bin(), tmp_path, broker_extra='[topics]\ncompaction_check_interval = "1s"\n')
    try:
        c.start_all()
        config = [a for k, v in COMPACTED.items() for a in ("--config", f"{k}={v}")]
        c.cli("topic", "create", "navs", "-p", "1", "--replication-factor", "3",
              "--config", "min.insync.replicas=2", *config)
        c.wait_for(lambda m: "navs" in m["topics"], "topic created")
        bootstrap = ",".join(f"127.0.0.1:{c.broker_ports[i]}" for i in (1, 2, 3))
        leaders_seen(bootstrap, "navs")
        acked = produce(bootstrap, "navs", fund_records())
        for i in (1, 2, 3):
            wait_compacted(lambda: c.broker_metrics(i), f"broker {i}")
        check_compacted(bootstrap, "navs", acked)

        leader = describe(c, "navs")[0]["leader"]
        replaced = next(i for i in (1, 2, 3) if i != leader)
        c.kill(f"broker-{replaced}")
        others = sorted({1, 2, 3} - {replaced})
        deadline = time.monotonic() + 20
        while describe(c, "navs")[0]["isr"] != others:
            assert time.monotonic() < deadline, f"the killed broker stayed in the ISR: {describe(c, 'navs')}"
            time.sleep(0.2)
        # its disk is lost: the leader must not take its old fetches for the new, empty log
        shutil.rmtree(c.workdir / f"broker-{replaced}")
        for ports in (c.broker_ports, c.grpc_ports, c.metrics_ports):
            ports[replaced] = free_port()
        c.start(f"broker-{replaced}")
        deadline = time.monotonic() + 40
        while describe(c, "navs")[0]["isr"] != [1, 2, 3]:
            assert time.monotonic() < deadline, f"the replacement never rejoined the ISR: {describe(c, 'navs')}"
            time.sleep(0.3)
        for i in (1, 2, 3):
            if i != replaced:
                c.kill(f"broker-{i}")
        c.wait_for(lambda m: m["topics"]["navs"]["partitions"][0]["leader"] == replaced,
                   f"broker {replaced} leads", timeout=LEASE_S * 4)
        alone = f"127.0.0.1:{c.broker_ports[replaced]}"
        leaders_seen(alone, "navs", leader=replaced)
        check_compacted(alone, "navs", acked)
    finally:
        c.stop_all()
