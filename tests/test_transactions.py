"""Transactions (KIP-98, issue 19 item 1), against a real `strata dev` process with
librdkafka (confluent-kafka): a transactional producer commits and aborts transactions
across partitions, a read_committed consumer sees every committed record once and no
aborted one, a read_uncommitted consumer sees both, the last stable offset holds back
read_committed readers while a transaction is open, and all of it survives a SIGKILL of
the broker (the coordinator's state and the aborted-transaction list are rebuilt)."""

import time

from conftest import rdkafka_conf


def txn_producer(bootstrap, txn_id, timeout_ms=60000):
    from confluent_kafka import Producer

    p = Producer(rdkafka_conf({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                               "transaction.timeout.ms": timeout_ms, "linger.ms": 2}))
    p.init_transactions(30)
    return p


def read(bootstrap, topic, partitions, isolation, wait=8.0):
    """Every (partition, offset, value) a consumer with `isolation` reads from the start."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(rdkafka_conf({"bootstrap.servers": bootstrap, "group.id": f"g{time.monotonic_ns()}",
                               "enable.auto.commit": False, "auto.offset.reset": "earliest",
                               "isolation.level": isolation}))
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen, idle_until = [], time.monotonic() + wait
    while time.monotonic() < idle_until:
        m = c.poll(0.3)
        if m is None or m.error():
            continue
        seen.append((m.partition(), m.offset(), m.value().decode()))
        idle_until = time.monotonic() + 2.0
    c.close()
    return seen


def java_partition(key, partitions):
    """The partition Kafka (and Strata) put `key` in: abs(Java's String.hashCode) % n."""
    h = 0
    for ch in key:  # (ASCII keys: one UTF-16 unit each)
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def values(seen):
    return sorted(v for _, _, v in seen)


def test_committed_records_are_read_once_and_aborted_ones_never(broker):
    broker.create_topic("settlements", 3)
    p = txn_producer(broker.bootstrap, "settler-1")
    committed, aborted = [], []
    for t in range(6):
        p.begin_transaction()
        batch = [f"t{t}-r{i}" for i in range(20)]
        for i, v in enumerate(batch):
            p.produce("settlements", value=v.encode(), partition=i % 3)
        if t % 3 == 2:
            assert p.flush(30) == 0  # on the broker before the abort (else librdkafka purges them)
            p.abort_transaction(30)
            aborted += batch
        else:
            p.commit_transaction(30)
            committed += batch
    committed_view = read(broker.bootstrap, "settlements", 3, "read_committed")
    assert values(committed_view) == sorted(committed), "read_committed: every committed record once, no aborted one"
    everything = read(broker.bootstrap, "settlements", 3, "read_uncommitted")
    assert values(everything) == sorted(committed + aborted)

    # an open transaction holds read_committed readers back at its first offset
    p.begin_transaction()
    for i in range(5):
        p.produce("settlements", value=f"open-{i}".encode(), partition=0)
    p.flush(10)
    assert values(read(broker.bootstrap, "settlements", 3, "read_committed", wait=4)) == sorted(committed)
    assert len(read(broker.bootstrap, "settlements", 3, "read_uncommitted", wait=4)) == len(everything) + 5
    p.commit_transaction(30)
    committed += [f"open-{i}" for i in range(5)]
    assert values(read(broker.bootstrap, "settlements", 3, "read_committed")) == sorted(committed)

    # SIGKILL: the coordinator's state and the aborted list come back from the logs
    broker.kill()
    broker.start()
    assert values(read(broker.bootstrap, "settlements", 3, "read_committed")) == sorted(committed)
    p2 = txn_producer(broker.bootstrap, "settler-1")  # same id: a new epoch
    p2.begin_transaction()
    p2.produce("settlements", value=b"after-restart", partition=1)
    p2.commit_transaction(30)
    committed.append("after-restart")
    assert values(read(broker.bootstrap, "settlements", 3, "read_committed")) == sorted(committed)


INVALID_TXN_STATE = 48
RETRIABLE = {14, 15, 16, 51}  # load in progress, not available, not coordinator, concurrent


def test_a_stray_transactional_batch_cannot_leave_a_hanging_transaction(broker):
    """KIP-890: the partition leader asks the transaction coordinator before a batch opens
    a transaction on its partition. A batch for a partition never added, and a late batch
    of a transaction already aborted, are refused (INVALID_TXN_STATE); without the check
    each opened a transaction no marker would ever close, and the last stable offset (what
    read_committed consumers may read) stayed behind it for good."""
    from kafka_wire import KafkaWire

    broker.create_topic("hang", 1)
    w = KafkaWire(broker.port)
    txn = "stray-batches"
    deadline = time.monotonic() + 30
    while True:
        err, pid, epoch = w.init_transactional_producer(txn)
        if err == 0:
            break
        assert err in RETRIABLE and time.monotonic() < deadline, f"InitProducerId: {err}"
        w.find_coordinator(txn, 1)
        time.sleep(0.2)

    def stable():
        err, lso = w.stable_offset("hang", 0)
        assert err == 0
        return lso

    def high_watermark():
        err, hw = w.latest_offset("hang", 0)
        assert err == 0
        return hw

    # a partition never added to the transaction: refused, nothing holds readers back
    err, _ = w.produce_txn("hang", 0, [b"stray"], txn, pid, epoch, 0)
    assert err == INVALID_TXN_STATE, f"a batch outside the transaction was taken: {err}"
    assert (stable(), high_watermark()) == (0, 0)

    # added: taken, and the next batch joins the open transaction
    assert w.add_partitions_to_txn(txn, pid, epoch, "hang", [0]) == {0: 0}
    assert w.produce_txn("hang", 0, [b"a"], txn, pid, epoch, 0) == (0, 0)
    assert w.produce_txn("hang", 0, [b"b"], txn, pid, epoch, 1) == (0, 1)
    assert (stable(), high_watermark()) == (0, 2), "the open transaction holds readers back"

    # aborted: a late batch of the ended transaction cannot open it again
    assert w.end_txn(txn, pid, epoch, False) == 0
    deadline = time.monotonic() + 10
    while stable() != 3:  # the abort marker at offset 2
        assert time.monotonic() < deadline, f"LSO {stable()} never passed the abort marker"
        time.sleep(0.1)
    err, _ = w.produce_txn("hang", 0, [b"late"], txn, pid, epoch, 2)
    assert err == INVALID_TXN_STATE, f"a late batch reopened the transaction: {err}"
    time.sleep(0.5)
    assert (stable(), high_watermark()) == (3, 3), "a late batch holds readers back"
    w.close()


def test_a_restarted_producer_fences_the_old_one_and_aborts_its_open_transaction(broker):
    from confluent_kafka import KafkaException

    broker.create_topic("orders", 1)
    old = txn_producer(broker.bootstrap, "order-writer")
    old.begin_transaction()
    old.produce("orders", value=b"zombie", partition=0)
    old.flush(10)
    new = txn_producer(broker.bootstrap, "order-writer")  # aborts the zombie's transaction
    new.begin_transaction()
    new.produce("orders", value=b"fresh", partition=0)
    new.commit_transaction(30)
    fenced = False
    try:
        old.produce("orders", value=b"late", partition=0)
        old.commit_transaction(10)
    except KafkaException as e:
        fenced = True
        assert e.args[0].fatal() or not e.args[0].retriable(), e
    assert fenced, "the old producer's commit must fail"
    assert values(read(broker.bootstrap, "orders", 1, "read_committed")) == ["fresh"]


def test_a_transaction_past_its_timeout_is_aborted_by_the_coordinator(broker):
    broker.create_topic("payouts", 1)
    p = txn_producer(broker.bootstrap, "payout-writer", timeout_ms=2000)
    p.begin_transaction()
    p.produce("payouts", value=b"never-committed", partition=0)
    p.flush(10)
    # the coordinator aborts it: read_committed readers are no longer held back, and
    # the records are aborted
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if read(broker.bootstrap, "payouts", 1, "read_uncommitted", wait=1) and not read(
                broker.bootstrap, "payouts", 1, "read_committed", wait=1):
            from confluent_kafka import Consumer, TopicPartition
            c = Consumer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "group.id": "lso",
                                       "isolation.level": "read_committed"}))
            _, high = c.get_watermark_offsets(TopicPartition("payouts", 0), timeout=10)
            c.close()
            if high >= 2:  # past the abort marker
                break
        time.sleep(0.5)
    else:
        raise AssertionError("the expired transaction was not aborted")


def test_transactions_across_a_cluster_survive_the_sigkill_of_a_broker(tmp_path, request):
    """3 controllers + 3 brokers: a transaction's partitions are led by all three brokers, so
    its markers go to other brokers over the replica plane; the transaction coordinator's
    broker (also the leader of some of the partitions) is SIGKILLed with a transaction open. Every
    transaction whose commit was acknowledged is read exactly once by read_committed
    consumers, and nothing else is."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    from test_cluster import Cluster, attach_logs_on_failure

    c = Cluster(__import__("conftest").strata_bin(), tmp_path)
    try:
        c.start_all()
        boot = ",".join(f"127.0.0.1:{c.broker_ports[i]}" for i in (1, 2, 3))
        admin = AdminClient(rdkafka_conf({"bootstrap.servers": boot}))
        fs = admin.create_topics([NewTopic("ledger", num_partitions=6, replication_factor=3,
                                           config={"min.insync.replicas": "2"})], operation_timeout=20)
        fs["ledger"].result(timeout=30)
        m = c.metadata()
        assert {p["leader"] for p in m["topics"]["ledger"]["partitions"]} == {1, 2, 3}

        p = txn_producer(boot, "ledger-writer")
        committed, given_up = [], []
        m = c.metadata()
        state = m["topics"]["__transaction_state"]["partitions"]
        coordinator = state[java_partition("ledger-writer", len(state))]["leader"]
        assert coordinator in (1, 2, 3)

        def one(t, before_commit=None):
            batch = [f"t{t}-r{i}" for i in range(12)]
            for attempt in range(5):
                try:
                    p.begin_transaction()
                    for i, v in enumerate(batch):
                        p.produce("ledger", value=f"{v}-a{attempt}".encode(), partition=i % 6)
                    if before_commit and attempt == 0:
                        p.flush(30)
                        before_commit()
                    for _ in range(5):
                        try:
                            p.commit_transaction(60)
                            break
                        except KafkaException as e:
                            # (librdkafka: a retriable commit error means "call it again")
                            if not e.args[0].retriable():
                                raise
                    else:
                        raise AssertionError(f"transaction {t}: the commit kept failing")
                    committed.extend(f"{v}-a{attempt}" for v in batch)
                    return
                except KafkaException as e:
                    err = e.args[0]
                    assert not err.fatal(), f"transaction {t}: fatal {err}"
                    given_up.extend(f"{v}-a{attempt}" for v in batch)
                    if err.txn_requires_abort():
                        p.abort_transaction(60)
                    time.sleep(0.5)
            raise AssertionError(f"transaction {t} never committed")

        for t in range(4):
            one(t)
        # the coordinator dies mid-transaction: its successor replays __transaction_state
        one(4, before_commit=lambda: c.kill(f"broker-{coordinator}"))
        for t in range(5, 10):
            one(t)
        c.start(f"broker-{coordinator}")
        for t in range(10, 14):
            one(t)
        seen = read(boot, "ledger", 6, "read_committed", wait=15)
        got = values(seen)
        assert len(got) == len(set(got)), "a committed record read twice"
        assert got == sorted(committed), (
            f"read_committed must see exactly the {len(committed)} acknowledged records; "
            f"missing {sorted(set(committed) - set(got))[:5]}, extra {sorted(set(got) - set(committed))[:5]}")
    finally:
        c.stop_all()
        attach_logs_on_failure(request, c)


def test_consume_transform_produce_is_exactly_once_across_aborts_and_a_sigkill(broker):
    """librdkafka's exactly-once loop: a read_committed consumer in group "eos" reads `in`,
    a transactional producer writes each record transformed to `out` and commits the
    consumer's offsets in the same transaction (AddOffsetsToTxn, TxnOffsetCommit). Some
    transactions are aborted (their records and offsets both vanish, and the processor
    reads the input again); the broker is SIGKILLed with a transaction open. Every input
    record then appears in `out` exactly once for read_committed readers."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    broker.create_topic("in", 3)
    broker.create_topic("out", 3)
    n = 240
    src = Producer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True}))
    for i in range(n):
        src.produce("in", value=f"order-{i}".encode(), partition=i % 3)
    assert src.flush(30) == 0

    def processor():
        c = Consumer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, "group.id": "eos",
                                   "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                   "isolation.level": "read_committed", "session.timeout.ms": 6000}))
        c.subscribe(["in"])
        return c, txn_producer(broker.bootstrap, "eos-processor")

    def some(c, wait=10.0):
        """Up to 20 input records, waiting up to `wait` s (a join takes a rebalance delay)."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            msgs = [m for m in c.consume(20, timeout=1) if not m.error()]
            if msgs:
                return msgs
        return []

    def step(c, p, commit=True, wait=10.0):
        """One transaction over up to 20 input records; False when the input is drained."""
        msgs = some(c, wait)
        if not msgs:
            return False
        p.begin_transaction()
        for m in msgs:
            p.produce("out", value=m.value().upper(), partition=m.partition())
        positions = c.position(c.assignment())
        p.send_offsets_to_transaction(positions, c.consumer_group_metadata(), 30)
        if commit:
            p.commit_transaction(30)
        else:
            assert p.flush(30) == 0
            p.abort_transaction(30)
            # the offsets were aborted too: read again from the committed ones
            committed = c.committed(c.assignment(), timeout=10)
            for tp in committed:
                c.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))
        return True

    c, p = processor()
    done = 0
    while done < 6:
        assert step(c, p, commit=(done % 3 != 1)), "input drained too early"
        done += 1
    # a transaction left open, then the broker dies
    msgs = some(c)
    assert msgs
    p.begin_transaction()
    for m in msgs:
        p.produce("out", value=m.value().upper(), partition=m.partition())
    p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 30)
    p.flush(10)
    broker.kill()
    broker.start()
    c.close()
    del p

    c, p = processor()  # init_transactions aborts the open transaction
    # (the first join waits for the dead processor's member to time out of the group)
    assert step(c, p, wait=90), "the new processor never got the input"
    while step(c, p):
        pass
    c.close()

    out = values(read(broker.bootstrap, "out", 3, "read_committed"))
    want = sorted(f"ORDER-{i}" for i in range(n))
    dups = sorted({v for v in out if out.count(v) > 1})
    assert not dups, f"{len(dups)} records written twice, e.g. {dups[:5]}"
    assert out == want, f"missing {sorted(set(want) - set(out))[:5]}"


def test_exactly_once_on_a_cluster_across_sigkills_of_the_processor_a_leader_and_the_coordinator(
        tmp_path, request):
    """The issue's exactly-once loop on 3 controllers + 3 brokers (RF=3, min.insync.replicas=2):
    tests/eos_processor.py, its own process, reads `in` read_committed and writes each record
    upper-cased to `out`, committing its group offsets in the same transaction. While it runs
    it is SIGKILLed itself (its successor, with the same transactional id, fences it and
    aborts what it left open), then the leader of one of `out`'s partitions, then the
    transaction coordinator's broker. Checked record by record: every input record is in
    `out` exactly once for a read_committed reader, and nothing else is."""
    import subprocess
    import sys
    from pathlib import Path

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from test_cluster import Cluster, attach_logs_on_failure

    n, parts = 1800, 6
    c = Cluster(__import__("conftest").strata_bin(), tmp_path)
    procs = []
    progress = tmp_path / "progress"
    try:
        c.start_all()
        boot = ",".join(f"127.0.0.1:{c.broker_ports[i]}" for i in (1, 2, 3))
        admin = AdminClient(rdkafka_conf({"bootstrap.servers": boot}))
        topics = [NewTopic(t, num_partitions=parts, replication_factor=3, config={"min.insync.replicas": "2"})
                  for t in ("in", "out")]
        for f in admin.create_topics(topics, operation_timeout=20).values():
            f.result(timeout=30)
        src = Producer(rdkafka_conf({"bootstrap.servers": boot, "enable.idempotence": True}))
        for i in range(n):
            src.produce("in", value=f"order-{i}".encode(), partition=i % parts)
        assert src.flush(60) == 0

        def start_processor():
            log = open(tmp_path / f"processor-{len(procs)}.log", "ab")
            procs.append(subprocess.Popen(
                [sys.executable, str(Path(__file__).parent / "eos_processor.py"), boot, "eos-cluster",
                 "eos", "in", "out", str(progress), "--idle", "25", "--pause", "0.1"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL))

        def last():
            lines = progress.read_text().splitlines() if progress.exists() else []
            kind, count = lines[-1].split() if lines else ("C", "0")
            return kind, int(count)

        def wait_progress(k, timeout=120, open_txn=False):
            """Until the running processor has committed k records (and, with `open_txn`,
            holds its next transaction open with its records written)."""
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                kind, count = last()
                if count >= k and (kind == "O" or not open_txn):
                    return
                assert procs[-1].poll() is None, f"the processor exited {procs[-1].returncode}"
                time.sleep(0.01)
            raise AssertionError(f"the processor did not reach {k} committed records")

        start_processor()
        wait_progress(300, open_txn=True)
        procs[-1].kill()  # SIGKILL inside a transaction whose records are written
        procs[-1].wait()
        progress.unlink()
        start_processor()
        wait_progress(200, timeout=150)  # (its join waits for the dead member's session)

        m = c.metadata()
        state = m["topics"]["__transaction_state"]["partitions"]
        coordinator = state[java_partition("eos-cluster", len(state))]["leader"]
        out_leaders = {p["leader"] for p in m["topics"]["out"]["partitions"]}
        victim = next(b for b in sorted(out_leaders) if b != coordinator)
        c.kill(f"broker-{victim}")  # a partition leader of `out` (and maybe of `in`)
        wait_progress(450)
        c.start(f"broker-{victim}")
        c.wait_for(lambda m: len([b for b in m["brokers"].values() if not b["fenced"]]) == 3, "3 live brokers")
        wait_progress(600)
        c.kill(f"broker-{coordinator}")  # the transaction coordinator
        wait_progress(800)
        c.start(f"broker-{coordinator}")

        assert procs[-1].wait(timeout=300) == 0, "the processor failed; see processor-1.log"
        out = values(read(boot, "out", parts, "read_committed", wait=15))
        want = sorted(f"ORDER-{i}" for i in range(n))
        dups = sorted({v for v in out if out.count(v) > 1})
        assert not dups, f"{len(dups)} records written twice, e.g. {dups[:5]}"
        assert out == want, (f"missing {sorted(set(want) - set(out))[:5]}, "
                             f"extra {sorted(set(out) - set(want))[:5]}")
        everything = values(read(boot, "out", parts, "read_uncommitted", wait=15))
        assert len(everything) > len(out), "the killed processor's open transaction left no records"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        c.stop_all()
        attach_logs_on_failure(request, c)


def test_transactions_are_listed_and_described_to_admin_clients(broker):
    """kafka-python's admin: ListTransactions (with state and producer filters) and
    DescribeTransactions of an open and then a committed transaction; an unknown id is
    TransactionalIdNotFound."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    broker.create_topic("invoices", 2)
    p = txn_producer(broker.bootstrap, "invoicer")
    p.begin_transaction()
    p.produce("invoices", value=b"a", partition=0)
    p.produce("invoices", value=b"b", partition=1)
    assert p.flush(10) == 0
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        def listed(**filters):
            """(transactional id, producer id, state) of every listing, from every broker."""
            return sorted((t.transactional_id, t.producer_id, t.state.value)
                          for ts in admin.list_transactions(**filters).values() for t in ts)

        (row,) = listed()
        assert row[0] == "invoicer" and row[2] == "Ongoing", row
        pid = row[1]
        assert listed(state_filters=["Ongoing"]) == [row]
        assert listed(state_filters=["PrepareCommit"]) == []
        assert listed(producer_id_filters=[pid]) == [row]
        assert listed(producer_id_filters=[pid + 1000]) == []
        d = admin.describe_transactions(["invoicer"])["invoicer"]
        assert d.state.value == "Ongoing" and d.producer_id == pid and d.transaction_timeout_ms == 60000
        assert sorted((tp.topic, tp.partition) for tp in d.topic_partitions) == [("invoices", 0), ("invoices", 1)]
        assert d.transaction_start_time_ms > 0
        p.commit_transaction(30)
        deadline = time.monotonic() + 10
        while admin.describe_transactions(["invoicer"])["invoicer"].state.value != "CompleteCommit":
            assert time.monotonic() < deadline, admin.describe_transactions(["invoicer"])
            time.sleep(0.2)
        assert not admin.describe_transactions(["invoicer"])["invoicer"].topic_partitions
        unknown = None
        try:
            admin.describe_transactions(["nobody-has-this-id"])
        except KafkaError as e:
            unknown = e
        assert unknown is not None and "TransactionalIdNotFound" in type(unknown).__name__, repr(unknown)
    finally:
        admin.close()


def test_idle_transactional_ids_are_forgotten_and_stay_forgotten_after_a_crash(tmp_path):
    """transactional.id.expiration ([transactions] transactional_id_expiration, 2 s here):
    an id whose transaction completed is forgotten once idle that long, and a coordinator
    replaying the partition after a SIGKILL forgets it too (a tombstone); an id with a
    transaction open is kept however long it is idle."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    from conftest import Broker, strata_bin

    b = Broker(strata_bin(), tmp_path)
    b.extra_env = {"STRATA__TRANSACTIONS__TRANSACTIONAL_ID_EXPIRATION": "2s"}
    b.start()
    try:
        b.create_topic("expiring", 1)
        done = txn_producer(b.bootstrap, "finished-writer")
        done.begin_transaction()
        done.produce("expiring", value=b"a", partition=0)
        done.commit_transaction(30)
        still = txn_producer(b.bootstrap, "open-writer")
        still.begin_transaction()
        still.produce("expiring", value=b"b", partition=0)
        assert still.flush(10) == 0

        def known(admin, txn_id, wait=20):
            """Whether the coordinator knows the id (retrying while it is loading)."""
            deadline = time.monotonic() + wait
            while True:
                try:
                    admin.describe_transactions([txn_id])
                    return True
                except KafkaError as e:
                    if "TransactionalIdNotFound" in type(e).__name__:
                        return False
                    assert time.monotonic() < deadline, repr(e)
                    time.sleep(0.3)

        admin = KafkaAdminClient(bootstrap_servers=b.bootstrap)
        try:
            assert known(admin, "finished-writer")
            deadline = time.monotonic() + 15
            while known(admin, "finished-writer"):
                assert time.monotonic() < deadline, "an idle transactional id was never forgotten"
                time.sleep(0.3)
            assert known(admin, "open-writer"), "an id with an open transaction was forgotten"
        finally:
            admin.close()
        b.kill()
        b.start()
        admin = KafkaAdminClient(bootstrap_servers=b.bootstrap)
        try:
            assert known(admin, "open-writer"), "the open transaction's id was lost in the crash"
            assert not known(admin, "finished-writer"), "forgotten before the crash, back after it"
        finally:
            admin.close()
    finally:
        b.close()


def test_a_topic_that_requires_transactions_refuses_other_producers(broker):
    """transactions.required=true: an idempotent and a plain producer are refused with
    INVALID_RECORD naming the config, a transactional producer writes; the config reads
    back through DescribeConfigs, and an unknown value is refused."""
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    broker.create_topic("settled", 1, {"transactions.required": "true"})
    for extra in ({"enable.idempotence": True}, {"enable.idempotence": False, "acks": "1"}):
        p = Producer(rdkafka_conf({"bootstrap.servers": broker.bootstrap, **extra}))
        errors = []
        p.produce("settled", value=b"plain", on_delivery=lambda err, msg: errors.append(err))
        p.flush(30)
        assert len(errors) == 1 and errors[0] is not None, errors
        assert errors[0].code() == KafkaError.INVALID_RECORD, errors[0]
    t = txn_producer(broker.bootstrap, "settler")
    t.begin_transaction()
    t.produce("settled", value=b"settled-1")
    t.commit_transaction(30)
    assert values(read(broker.bootstrap, "settled", 1, "read_committed")) == ["settled-1"]

    admin = AdminClient(rdkafka_conf({"bootstrap.servers": broker.bootstrap}))
    res = ConfigResource("topic", "settled")
    configs = admin.describe_configs([res])[res].result(timeout=10)
    assert configs["transactions.required"].value == "true"
    bad = admin.incremental_alter_configs([ConfigResource(
        "topic", "settled", incremental_configs=[ConfigEntry(
            "transactions.required", "maybe", incremental_operation=AlterConfigOpType.SET)])])
    try:
        bad[res].result(timeout=10)
        raise AssertionError("transactions.required=maybe was accepted")
    except Exception as e:  # noqa: BLE001 (the admin raises KafkaException)
        assert "transactions.required" in str(e) or "INVALID_CONFIG" in str(e), e


def test_aborted_transactions_tier_with_their_segments(tmp_path):
    """A tiered topic with committed and aborted transactions: once its segments are in the
    cold tier and local retention has deleted them, a read_committed consumer still sees
    only the committed records (the manifest carries each segment's aborted transactions),
    and strata-replay prints only them unless asked for --include-aborted."""
    import json
    import subprocess
    from pathlib import Path

    from conftest import Broker, strata_bin

    b = Broker(strata_bin(), tmp_path)
    b.extra_env = {"STRATA__COLD__INTERVAL": "200ms", "STRATA__TOPICS__RETENTION_CHECK_INTERVAL": "200ms"}
    b.start()
    try:
        b.create_topic("ledger", 1, {"segment.bytes": 16 << 10, "segment.ms": 1000, "remote.storage.enable": "true",
                                     "local.retention.bytes": 1, "retention.ms": -1})
        p = txn_producer(b.bootstrap, "tiered-writer")
        committed = []
        for t in range(12):
            p.begin_transaction()
            batch = [f"t{t}-{i}-" + "x" * 200 for i in range(30)]
            for v in batch:
                p.produce("ledger", value=v.encode(), partition=0)
            assert p.flush(30) == 0
            if t % 3 == 1:
                p.abort_transaction(30)
            else:
                p.commit_transaction(30)
                committed += batch
        time.sleep(1.2)  # segment.ms: the last segment rolls with the next batch
        p.begin_transaction()
        p.produce("ledger", value=b"last", partition=0)
        p.commit_transaction(30)
        committed.append("last")
        cold = b.data_dir / "cold"

        def manifest():
            ms = sorted(cold.glob("*/*/0/manifest/*.json"))
            return json.loads(ms[-1].read_text()) if ms else {"segments": []}

        def local_start():
            bases = [int(f.stem) for f in (b.data_dir / "logs").glob("ledger-0*/*.log")]
            return min(bases) if bases else 0

        deadline = time.monotonic() + 60
        while not (sum(len(s.get("aborted", [])) for s in manifest()["segments"]) == 4
                   and local_start() > 0):
            assert time.monotonic() < deadline, f"{manifest()} local start {local_start()}\n{b.stderr_tail()}"
            time.sleep(0.3)
        # local retention removed the beginning: those reads come from the cold tier
        got = values(read(b.bootstrap, "ledger", 1, "read_committed"))
        assert got == sorted(committed), f"{len(got)} read, {len(committed)} committed"
        url = f"file://{cold}"
    finally:
        b.stop()
    replay = str(Path(strata_bin()).parent / "strata-replay")

    def cat(*extra):
        r = subprocess.run([replay, "--url", url, "cat", "ledger", *extra], capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        return sorted(json.loads(line)["value"] for line in r.stdout.decode().splitlines())

    tiered = cat()
    assert set(tiered) <= set(committed) and len(tiered) == len(set(tiered))
    assert len(tiered) >= 8 * 30, "the committed transactions in the cold tier"
    everything = cat("--include-aborted")
    assert len(everything) == len(tiered) + 4 * 30, "the 4 aborted transactions are there too"
