"""A full disk fails the writes that hit it and leaves the log readable and writable again;
a failed fsync costs its partition a restart by the broker, never the broker itself.

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


def test_a_leader_whose_disk_fills_hands_over_and_rejoins_once_freed(tmp_path, request):
    """3 brokers, each data directory a small tmpfs. Under acks=all load the partition
    leader's disk is filled (a balloon file): it leaves the cluster (the controllers fence it
    and move the leadership to an in-sync follower), so writes go on within a lease instead
    of failing with KAFKA_STORAGE_ERROR until someone frees space. Freed, it registers again
    and its replica rejoins the ISR; every acknowledged record reads back."""
    import os
    import subprocess

    from conftest import strata_bin
    from test_cluster import Cluster, attach_logs_on_failure
    from test_replication import LAG_S, LEASE_S, Load, create_topic, partition_leaders, verify, wait_full_isr

    assert os.geteuid() == 0, "this test mounts a tmpfs per broker: run it as root (CI does)"
    c = Cluster(strata_bin(), tmp_path, broker_extra=f'replica_lag_time_max = "{LAG_S}s"\n')
    mounts = []
    try:
        for i in (1, 2, 3):
            d = tmp_path / f"broker-{i}"
            d.mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "strata-test-disk", str(d)], check=True)
            mounts.append(d)
        c.start_all()
        create_topic(c, "ledger", 1)
        load = Load(c, rate=1000, topic="ledger").start()
        load.wait_acked(2000)
        victim = partition_leaders(c, "ledger")[0]
        balloon = tmp_path / f"broker-{victim}" / "balloon"
        filled = time.monotonic()
        with open(balloon, "wb", buffering=0) as f:
            for chunk in (1 << 20, 4096):
                try:
                    while True:
                        f.write(b"\0" * chunk)
                except OSError:
                    pass
        # the full broker is fenced and an in-sync follower leads
        m = c.wait_for(lambda m: m["brokers"][str(victim)]["fenced"]
                       and m["topics"]["ledger"]["partitions"][0]["leader"] not in (None, victim),
                       f"broker {victim} (disk full) fenced and its leadership moved", timeout=LEASE_S * 2)
        moved = time.monotonic() - filled
        at = load.acked_count()
        load.wait_acked(at + 2000, timeout=30)
        gap = load.longest_gap(filled, time.monotonic())
        assert gap < LEASE_S, f"acks=all writes stopped for {gap:.1f} s after the leader's disk filled"
        assert "the data directory is full" in c.log_tail(f"broker-{victim}", 200)
        # it stays out while the disk is full
        time.sleep(2)
        assert c.metadata()["brokers"][str(victim)]["fenced"], "a broker with a full disk registered again"
        balloon.unlink()
        freed = time.monotonic()
        wait_full_isr(c, "ledger", timeout=20)
        rejoined = time.monotonic() - freed
        load.wait_acked(load.acked_count() + 1000)
        load.finish()
        assert not load.failed, f"{len(load.failed)} produce failures, e.g. {list(load.failed.items())[:3]}"
        verify(c, load, partitions=1, topic="ledger")
        print(f"leadership moved {moved:.2f} s after the disk filled; longest write gap {gap:.2f} s; "
              f"back in the ISR {rejoined:.2f} s after it was freed")
    finally:
        for name, p in list(c.procs.items()):
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
        c.stop_all()
        attach_logs_on_failure(request, c, 80)
        for d in mounts:
            subprocess.run(["umount", "-l", str(d)], check=False)


def fsync_failpoint(pid, topic, partition):
    """The failpoint that makes one partition's fsyncs fail with EIO in process `pid`
    (hot/src/broker/partition.rs, `fsync_fails_while_a_test_asks`)."""
    return f"fsync-fails-{pid}-{topic}-{partition}"


def test_a_partition_whose_fsync_fails_is_restarted_without_restarting_the_broker(broker, tmp_path):
    """Issue 17, item 3. `strata dev` (a one-broker cluster): while fsyncs fail, acks=all
    writes fail (nothing is acknowledged that is not on disk); the broker leaves its own
    cluster, restarts the partition (reopened, cut back to its last successful fsync) and
    registers again, so it takes writes once fsyncs succeed again, in the same process. The
    log holds exactly what was acknowledged."""
    failpoints = tmp_path / "failpoints"
    failpoints.mkdir()
    broker.create_topic("fsync", 1)
    broker.stop()
    broker.extra_env["STRATA_TEST_FAILPOINTS_DIR"] = str(failpoints)
    broker.start()
    pid = broker.proc.pid
    acked, failed = produce(broker.bootstrap, "fsync", 0, 500)
    assert not failed and len(acked) == 500

    armed = failpoints / fsync_failpoint(pid, "fsync", 0)
    armed.touch()
    during, failed = produce(broker.bootstrap, "fsync", 1000, 50)
    assert failed, "writes were acknowledged while every fsync failed"
    assert not during, f"{len(during)} records acknowledged while every fsync failed"
    assert set(failed) <= {KafkaError.KAFKA_STORAGE_ERROR, KafkaError._MSG_TIMED_OUT}, failed
    armed.unlink()

    healed = time.monotonic()
    after = {}
    while not after:
        assert time.monotonic() - healed < 20, "the partition never took writes again:\n" + broker.stderr_tail()
        after, _ = produce(broker.bootstrap, "fsync", 2000, 1)
        if not after:
            time.sleep(0.2)
    writable = time.monotonic() - healed
    more, failed = produce(broker.bootstrap, "fsync", 3000, 200)
    assert not failed
    assert broker.running() and broker.proc.pid == pid, "the broker restarted"
    log = broker.stderr_tail(400)
    assert "fsync failed; partition stops accepting writes until the broker restarts it" in log
    assert "partition restarted after a storage failure" in log
    stored = consume_all(broker.bootstrap, "fsync")
    assert stored == {**acked, **after, **more}, "the log must hold exactly the acknowledged records"
    print(f"writable again {writable:.2f} s after fsyncs succeeded again, in the same process")


def test_a_leader_whose_fsync_fails_hands_over_restarts_the_partition_and_rejoins(tmp_path, request):
    """Issue 17, item 3, in a cluster: 3 brokers, RF=3, min.insync.replicas=2, an idempotent
    acks=all producer. The leader's fsyncs fail for 3 s (failpoint): it leaves the cluster so
    the leadership moves to an in-sync follower at a new epoch (it must never append again in
    the epoch whose unsynced writes it drops), restarts the partition cut back to its last
    successful fsync, registers again and rejoins the ISR, in the same process. Nothing
    acknowledged is lost and the replicas agree."""
    from conftest import strata_bin
    from test_cluster import Cluster, attach_logs_on_failure
    from test_replication import LAG_S, LEASE_S, Load, create_topic, partition_leaders, verify, wait_full_isr

    c = Cluster(strata_bin(), tmp_path, broker_extra=f'replica_lag_time_max = "{LAG_S}s"\n')
    try:
        c.start_all()
        create_topic(c, "ledger", 1)
        load = Load(c, rate=1000, topic="ledger").start()
        load.wait_acked(2000)
        victim = partition_leaders(c, "ledger")[0]
        pid = c.procs[f"broker-{victim}"].pid
        failpoint = fsync_failpoint(pid, "ledger", 0)
        c.arm(failpoint)
        armed = time.monotonic()
        c.wait_for(lambda m: m["topics"]["ledger"]["partitions"][0]["leader"] not in (None, victim),
                   f"the leadership moved away from broker {victim}, whose fsyncs fail", timeout=LEASE_S * 3)
        moved = time.monotonic() - armed
        load.wait_acked(load.acked_count() + 1000, timeout=30)
        gap = load.longest_gap(armed, time.monotonic())
        time.sleep(max(0.0, 3 - (time.monotonic() - armed)))
        c.disarm(failpoint)
        healed = time.monotonic()
        wait_full_isr(c, "ledger", timeout=30)
        rejoined = time.monotonic() - healed
        load.wait_acked(load.acked_count() + 1000)
        load.finish()
        assert not load.failed, f"{len(load.failed)} produce failures, e.g. {list(load.failed.items())[:3]}"
        assert c.procs[f"broker-{victim}"].poll() is None, "the broker whose fsyncs failed exited"
        log = c.log_tail(f"broker-{victim}", 400)
        assert "a partition this broker leads failed its storage: leaving the cluster" in log
        assert "partition restarted after a storage failure" in log
        assert gap < LEASE_S * 2, f"acks=all writes stopped for {gap:.1f} s after the leader's fsyncs failed"
        verify(c, load, partitions=1, topic="ledger")
        print(f"leadership moved {moved:.2f} s after fsyncs began failing; longest write gap {gap:.2f} s; "
              f"back in the ISR {rejoined:.2f} s after they succeeded again; same process")
    finally:
        c.stop_all()
        attach_logs_on_failure(request, c, 80)
