"""The fault-injection suite (issue 16): a 3-controller + 3-broker cluster, each node in its
own network namespace (netcluster.py), under a seeded nemesis, with idempotent acks=all
producers and a consumer group committing every second; then the checks.

    python3 tests/faults/chaos.py --seed 7 --faults 15      # a long run (needs root)

Faults: SIGKILL or SIGSTOP of a partition leader, its data directory filled up (each broker's
is a small tmpfs), of the Raft-leader controller, two brokers
killed at once, a leader cut off from the controllers and its followers while clients still
reach it, the Raft-leader controller cut off from every other node or from the other
controllers only (the brokers still reach it), the object store cut off from every broker
(while they upload segments and delete expired ones). Each is held for a few seconds,
undone, and the cluster is given time to heal (every broker unfenced, every ISR full) before
the next.

The topics tier to the object store (moto_server in a namespace of its own) with small
segments and little local retention, so the records are read back through the cold tier;
a second topic, "churn", keeps a few seconds of history, so remote segments are deleted all
the time.

Checks at the end: no acknowledged record lost or moved, none duplicated, each producer's
records in order within a partition, the three replicas of every partition byte-identical
(where all three still hold it locally), every partition's newest manifest contiguous and
naming only objects that exist, uploads and remote deletes resumed after the last outage,
no unnamed object left once the orphan grace has passed,
the consumer group never committed past an acknowledged record it had not consumed, its
committed offsets never went backwards, no broker fenced while only a controller was faulty,
and per fault the unavailability: the longest time any partition went without an
acknowledged write, from the fault until the cluster healed (for two brokers killed at once,
which min.insync.replicas=2 cannot survive, from their restart). It is measured twice: by a
probe that writes to every partition through every broker (the cluster's figure: when the
partition took acks=all writes again) and by the producers (what an idempotent librdkafka
producer saw, which adds its request timeout at a silent leader).

It prints one summary line with the seed; `run()` returns the findings for the pytest
wrapper (tests/test_faults.py).
"""

import argparse
import json
import os
import random
import signal
import statistics
import struct
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from conftest import consume_partitions, parse_value, rdkafka_conf, record_value, strata_bin  # noqa: E402
from kafka_wire import raw_batch, record  # noqa: E402
from netcluster import KAFKA_PORT, NetCluster  # noqa: E402
from test_tiered import newest_manifest_keys  # noqa: E402

TOPIC = "settlements"
PARTITIONS = 6
# Small segments and local retention: segments roll every few seconds and are uploaded, and
# most of the history is read back from the cold tier.
SEGMENT_BYTES = 16 << 10
LOCAL_RETENTION_BYTES = 32 << 10
CHURN = "churn"
CHURN_RETENTION_MS = 8000
LEASE_S = 3
RAFT_HEARTBEAT_MS = 100  # the controllers' (elections time out after 3 to 6 of them)
LAG_S = 4
PRODUCERS = 2
REQUEST_TIMEOUT_S = 1.0  # the producers' request.timeout.ms (see Producers)
RATE = 250  # records per second per producer
PROBE_K0 = 10  # probe values start at 10 * 10^8 (the producers' at 0 and 10^8)
PROBE_INTERVAL_S = 0.1  # each probe thread's pause between two writes
PROBE_TIMEOUT_S = 2.0  # how long a probe thread waits for one broker's answer
# move-replica: the copy back to the broker a partition left is throttled (bytes per second),
# so it takes a second or more and is still going when the cluster's checks look at it.
MOVE_THROTTLE = 32 << 10
KINDS = ["kill-leader", "pause-leader", "kill-controller", "pause-controller", "two-brokers",
         "partition-leader", "isolate-controller", "split-controller", "store-outage", "full-disk",
         "move-replica"]
# Faults of controllers only: no broker may be fenced for them.
CONTROLLER_KINDS = {"kill-controller", "pause-controller", "isolate-controller", "split-controller"}


def longest_gap(ack_times, lock, start, end):
    """(seconds, partition, gap start - `start`): the longest time in [start, end] that a
    partition went without an acknowledgement, given {partition: [ack times]}."""
    longest = (0.0, None, 0.0)
    with lock:
        for p, times in ack_times.items():
            inside = [start] + [t for t in times if start <= t <= end] + [end]
            for a, b in zip(inside, inside[1:]):
                if b - a > longest[0]:
                    longest = (b - a, p, a - start)
    return longest


class Producers:
    """Idempotent acks=all confluent-kafka producers, each in its own thread; producer k
    writes value-(k * 10^8 + i) for i = 0, 1, ... with 50 keys.

    `request.timeout.ms` is 1 s, and metadata is refreshed every 500 ms: when a leader goes
    silent, an idempotent librdkafka producer waits for its requests in flight there to
    time out before it sends to the new leader (to keep order), so these client settings
    add to what a silent leader costs (librdkafka's default timeout, 30 s, would dominate
    every figure). Retries back off from 100 ms up to `retry.backoff.max.ms`, 250 ms here:
    with librdkafka's default cap (1 s), a producer refused for a second (two brokers down,
    NOT_ENOUGH_REPLICAS) sleeps up to a further second after the cluster has healed, and
    the figure would measure that sleep."""

    def __init__(self, bootstrap):
        from confluent_kafka import Producer

        self.acked = {}  # value -> (partition, offset)
        self.ack_times = {p: [] for p in range(PARTITIONS)}
        self.failed = {}
        self.sent = [0] * PRODUCERS
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.producers = [Producer(rdkafka_conf({
            "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "request.timeout.ms": int(REQUEST_TIMEOUT_S * 1000), "message.timeout.ms": 300000,
            "retry.backoff.ms": 100, "retry.backoff.max.ms": 250, "metadata.max.age.ms": 500,
            "topic.metadata.refresh.interval.ms": 500,
            **({"debug": os.environ["CHAOS_PRODUCER_DEBUG"]} if os.environ.get("CHAOS_PRODUCER_DEBUG") else {}),
        })) for _ in range(PRODUCERS)]
        self.threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(PRODUCERS)]

    def _on_delivery(self, err, msg):
        v = parse_value(msg.value())
        with self.lock:
            if err is None:
                self.acked[v] = (msg.partition(), msg.offset())
                self.ack_times[msg.partition()].append(time.monotonic())
            else:
                self.failed[v] = str(err)

    def _run(self, k):
        p = self.producers[k]
        started = time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - started) * RATE)
            while self.sent[k] < due:
                i = self.sent[k]
                try:
                    p.produce(TOPIC, record_value(k * 10**8 + i).encode(), f"key-{i % 50}".encode(),
                              on_delivery=self._on_delivery)
                except BufferError:
                    break
                self.sent[k] += 1
            p.poll(0.01)

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def finish(self, timeout=120):
        self.stop.set()
        for t in self.threads:
            t.join()
        return sum(p.flush(timeout) for p in self.producers)

    def longest_gap(self, start, end):
        return longest_gap(self.ack_times, self.lock, start, end)


class Probe:
    """The cluster's own unavailability, without any client's timeouts in it: for every
    partition and every broker, a thread sends one acks=all record (Produce v3, no
    idempotence) every PROBE_INTERVAL_S to that broker, on a connection of its own. Only a
    broker leading the partition with its lease held and its ISR large enough acknowledges,
    so the moments a partition "accepts acks=all writes" are the acknowledgements any of its
    three threads got. A thread stuck at a silent broker holds up only itself: no metadata,
    no request timeout and no in-order wait decide when the next leader is seen taking
    writes (the producers' figures carry those, see `Producers`).

    Probe record values are (PROBE_K0 + thread) * 10^8 + i; acknowledged ones must be in the
    log like any other (checked for loss and duplicates; not for order, since a request that
    timed out may still be appended after a later one)."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.acked = {}  # value -> (partition, offset)
        self.ack_times = {p: [] for p in range(PARTITIONS)}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(p, b), daemon=True)
                        for p in range(PARTITIONS) for b in (1, 2, 3)]

    def _run(self, p, b):
        from kafka_wire import KafkaWire

        k = PROBE_K0 + (p * 3 + b - 1)
        host = self.cluster.host(f"broker-{b}")
        wire = None
        i = 0
        while not self.stop.is_set():
            try:
                if wire is None:
                    wire = KafkaWire(KAFKA_PORT, timeout=PROBE_TIMEOUT_S, host=host)
                v = k * 10**8 + i
                i += 1
                records = raw_batch(0, 0, record(record_value(v).encode(), key=f"probe-{p}".encode()),
                                    int(time.time() * 1000))
                error, offset = wire.produce_raw(TOPIC, p, records, acks=-1)
                if error == 0:
                    with self.lock:
                        self.acked[v] = (p, offset)
                        self.ack_times[p].append(time.monotonic())
            except (OSError, ConnectionError, AssertionError, struct.error):
                # a silent, stopped or restarting broker: only this thread waits for it
                if wire is not None:
                    wire.close()
                    wire = None
            self.stop.wait(PROBE_INTERVAL_S)
        if wire is not None:
            wire.close()

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)

    def longest_gap(self, start, end):
        return longest_gap(self.ack_times, self.lock, start, end)


class Churn:
    """An acks=all producer writing to the churn topic (a few seconds of retention): its old
    segments are deleted from the object store all the time. Its records are not checked
    (retention deletes them); what retention leaves must stay consistent."""

    def __init__(self, bootstrap):
        from confluent_kafka import Producer

        self.producer = Producer(rdkafka_conf({
            "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "message.timeout.ms": 300000,
            "request.timeout.ms": 2000,
        }))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        i = 0
        pad = "c" * 100
        while not self.stop.is_set():
            for _ in range(20):
                try:
                    self.producer.produce(CHURN, f"{i}|{pad}".encode())
                except BufferError:
                    break
                i += 1
            self.producer.poll(0.05)

    def start(self):
        self.thread.start()
        return self

    def finish(self):
        self.stop.set()
        self.thread.join()
        self.producer.flush(60)


class GroupMember:
    """One consumer-group member (confluent-kafka) reading every partition and committing
    what it consumed every second; records what it read and each successful commit."""

    def __init__(self, bootstrap):
        self.bootstrap = bootstrap
        self.consumed = {p: set() for p in range(PARTITIONS)}
        self.commits = {p: [] for p in range(PARTITIONS)}
        self.errors = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        from confluent_kafka import Consumer, KafkaError

        c = Consumer(rdkafka_conf({
            "bootstrap.servers": self.bootstrap, "group.id": "chaos-group", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": 10000, "metadata.max.age.ms": 1000,
            "topic.metadata.refresh.interval.ms": 1000,
        }))
        c.subscribe([TOPIC])
        position = {}
        last_commit = time.monotonic()
        try:
            while not self.stop.is_set():
                for m in c.consume(num_messages=1000, timeout=0.2):
                    if m.error():
                        if m.error().code() != KafkaError._PARTITION_EOF:
                            self.errors.append(str(m.error()))
                        continue
                    self.consumed[m.partition()].add(m.offset())
                    position[m.partition()] = m.offset() + 1
                if position and time.monotonic() - last_commit >= 1:
                    last_commit = time.monotonic()
                    from confluent_kafka import TopicPartition
                    offsets = [TopicPartition(TOPIC, p, o) for p, o in position.items()]
                    try:
                        done = c.commit(offsets=offsets, asynchronous=False)
                        for tp in done or []:
                            if tp.error is None and tp.offset >= 0:
                                self.commits[tp.partition].append(tp.offset)
                    except Exception as e:  # a commit refused during a fault is retried next second
                        self.errors.append(f"commit: {e}")
        finally:
            c.close()

    def start(self):
        self.thread.start()
        return self

    def finish(self):
        self.stop.set()
        self.thread.join(timeout=60)


def leaders(m):
    return [p["leader"] for p in m["topics"][TOPIC]["partitions"]]


def busiest_leader(cluster, rng):
    counts = {}
    for b in leaders(cluster.freshest_metadata()):
        if b is not None:
            counts[b] = counts.get(b, 0) + 1
    top = max(counts.values())
    return rng.choice(sorted(b for b, n in counts.items() if n == top))


def healthy(m):
    brokers_ok = len(m["brokers"]) == 3 and not any(b["fenced"] for b in m["brokers"].values())
    parts = m["topics"][TOPIC]["partitions"] + m["topics"].get(CHURN, {"partitions": []})["partitions"]
    return brokers_ok and all(p["leader"] is not None and sorted(p["isr"]) == [1, 2, 3]
                              and sorted(p["replicas"]) == [1, 2, 3] and p.get("reassignment") is None
                              for p in parts)


def wait_healthy(cluster, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if healthy(cluster.freshest_metadata()):
                return True
        except AssertionError:
            pass
        time.sleep(0.3)
    return False


def inject(cluster, kind, rng, log):
    """Applies one fault, holds it, undoes it. Returns (started, undone, fenced brokers seen
    at the end of the hold, description)."""
    net = cluster.net
    hold = rng.uniform(LEASE_S * 1.2, LEASE_S * 2)
    fenced = []
    # (the target is chosen first: the clock starts when the fault is applied)
    if kind in ("kill-leader", "pause-leader", "partition-leader", "full-disk"):
        b = busiest_leader(cluster, rng)
        name = f"broker-{b}"
        desc = f"{kind} broker {b}"
        started = time.monotonic()
        if kind == "kill-leader":
            cluster.kill(name)
            time.sleep(hold)
            undone = time.monotonic()
            cluster.start(name)
        elif kind == "pause-leader":
            cluster.procs[name].send_signal(signal.SIGSTOP)
            time.sleep(hold)
            undone = time.monotonic()
            cluster.procs[name].send_signal(signal.SIGCONT)
        elif kind == "full-disk":
            filled = cluster.fill_disk(name)
            desc += f" ({filled >> 20} MiB balloon)"
            time.sleep(hold)
            undone = time.monotonic()
            cluster.free_disk(name)
        else:
            others = [f"controller-{i}" for i in (1, 2, 3)] + [f"broker-{i}" for i in (1, 2, 3) if i != b]
            for o in others:
                net.cut(name, o)
            time.sleep(hold)
            undone = time.monotonic()
            net.heal_all()
    elif kind == "two-brokers":
        pair = rng.sample([1, 2, 3], 2)
        desc = f"{kind} {pair}"
        started = time.monotonic()
        for b in pair:
            cluster.kill(f"broker-{b}")
        time.sleep(hold)
        undone = time.monotonic()
        for b in pair:
            cluster.start(f"broker-{b}")
    elif kind == "move-replica":
        # A partition the busiest broker leads moves off it (a reassignment: the leadership
        # handed to a remaining replica, the broker's copy deleted) and, after the hold on two
        # replicas, back onto it at a throttled copy rate, from an empty log.
        m = cluster.freshest_metadata()
        b = busiest_leader(cluster, rng)
        p = rng.choice([i for i, leader in enumerate(leaders(m)) if leader == b])
        replicas = m["topics"][TOPIC]["partitions"][p]["replicas"]
        desc = f"{kind} {TOPIC}-{p} off broker {b} and back"
        started = time.monotonic()
        cluster.cli("topic", "reassign", TOPIC, "--partition", str(p), "--replicas",
                    ",".join(str(r) for r in replicas if r != b), "--wait")
        time.sleep(hold)
        undone = time.monotonic()
        cluster.cli("topic", "reassign", TOPIC, "--partition", str(p), "--replicas",
                    ",".join(str(r) for r in replicas), "--throttle", str(MOVE_THROTTLE))
    elif kind == "store-outage":
        desc = kind
        started = time.monotonic()
        for b in (1, 2, 3):
            net.cut("s3", f"broker-{b}")
        time.sleep(hold)
        undone = time.monotonic()
        net.heal_all()
    else:
        c = cluster.leader()
        name = f"controller-{c}"
        desc = f"{kind} {c}"
        # long enough for a wrongful fencing (a full lease after the new leader took over)
        hold = rng.uniform(LEASE_S * 1.7, LEASE_S * 2.2)
        started = time.monotonic()
        if kind == "kill-controller":
            cluster.kill(name)
            fenced = watch_fenced(cluster, hold)
            undone = time.monotonic()
            cluster.start(name)
        elif kind == "pause-controller":
            cluster.procs[name].send_signal(signal.SIGSTOP)
            fenced = watch_fenced(cluster, hold)
            undone = time.monotonic()
            cluster.procs[name].send_signal(signal.SIGCONT)
        else:
            # isolate: from every node; split: from the other controllers only, the brokers
            # still reach it (it must not renew their leases without a quorum)
            others = [f"controller-{i}" for i in (1, 2, 3) if i != c]
            if kind == "isolate-controller":
                others += [f"broker-{i}" for i in (1, 2, 3)]
            for o in others:
                net.cut(name, o)
            fenced = watch_fenced(cluster, hold)
            undone = time.monotonic()
            net.heal_all()
    log(f"  {desc}: held {hold:.1f} s from {time.strftime('%H:%M:%S', time.gmtime(time.time() - (time.monotonic() - started)))} UTC")
    return started, undone, fenced, desc


def fenced_brokers(cluster):
    return sorted(int(b) for b, v in cluster.freshest_metadata()["brokers"].items() if v["fenced"])


def watch_fenced(cluster, seconds):
    """Every broker seen fenced while `seconds` pass (polled, from the freshest controller)."""
    seen = set()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            seen.update(fenced_brokers(cluster))
        except AssertionError:
            pass  # no controller answered this time
        time.sleep(max(0.0, min(0.3, end - time.monotonic())))
    return sorted(seen)


def batches(data):
    """[(base offset, batch bytes)] of a log segment's record batches."""
    out, at = [], 0
    while at + 12 <= len(data):
        base = int.from_bytes(data[at:at + 8], "big")
        size = 12 + int.from_bytes(data[at + 8:at + 12], "big")
        out.append((base, data[at:at + size]))
        at += size
    return out


def batch_header(cluster, p, offset):
    """The header of the batch holding `offset` (producer id, epoch, base sequence, leader
    epoch), from any broker's local log or else the cold tier: what tells a duplicate's
    cause."""
    def parse(data, where):
        for base, b in batches(data):
            last = base + int.from_bytes(b[23:27], "big")
            if base <= offset <= last:
                return (f"{where}: batch {base}..{last} leader epoch {int.from_bytes(b[12:16], 'big', signed=True)} "
                        f"producer {int.from_bytes(b[43:51], 'big', signed=True)} epoch "
                        f"{int.from_bytes(b[51:53], 'big', signed=True)} base sequence "
                        f"{int.from_bytes(b[53:57], 'big', signed=True)}")
        return None
    for br in (1, 2, 3):
        d = cluster.workdir / f"broker-{br}" / "logs" / f"{TOPIC}-{p}"
        for f in sorted(d.glob("*.log")):
            found = parse(f.read_bytes(), f"broker {br}")
            if found:
                return found
    try:
        tier, _ = cold_tier(cluster)
        for seg in tier.get(TOPIC, {}).get(p, {}).get("segments", []):
            if seg["base_offset"] <= offset < seg["end_offset"]:
                body = cluster.s3_client().get_object(Bucket=cluster.bucket, Key=f"strata/{seg['key']}")["Body"].read()
                return parse(body, "cold tier")
    except Exception as e:  # a diagnostic only
        return f"not found ({e})"
    return "not found"


def replicas_identical(cluster):
    """Stops the cluster and compares every partition's three local log copies byte for
    byte, from the first batch all three still hold (local retention deletes each copy's
    old segments on its own schedule) to the end."""
    cluster.stop_all()
    differ = []
    for p in range(PARTITIONS):
        logs = {}
        for b in (1, 2, 3):
            d = cluster.workdir / f"broker-{b}" / "logs" / f"{TOPIC}-{p}"
            logs[b] = [x for f in sorted(d.glob("*.log")) for x in batches(f.read_bytes())]
        common = max((v[0][0] for v in logs.values() if v), default=None)
        tails = {b: b"".join(data for base, data in v if base >= common) for b, v in logs.items()}
        if not all(v for v in logs.values()) or not (tails[1] == tails[2] == tails[3]) or not tails[1]:
            differ.append((p, {b: (v[0][0] if v else None, len(tails[b])) for b, v in logs.items()}))
    return differ


def cold_tier(cluster):
    """{topic: {partition: newest manifest}} from the bucket, and every key in it. A manifest
    listed can be gone when read (each update deletes older versions, and retention keeps
    updating `churn`'s): then that partition's manifests are listed again."""
    s3 = cluster.s3_client()
    newest, keys = newest_manifest_keys(s3, cluster.bucket)
    ids = {str(t["id"]).replace("-", ""): name for name, t in cluster.freshest_metadata()["topics"].items()}
    out = {}
    for part, k in newest.items():
        _, _cluster, topic_id, index = part.split("/")
        for attempt in range(50):
            try:
                m = json.loads(s3.get_object(Bucket=cluster.bucket, Key=k)["Body"].read())
                break
            except s3.exceptions.NoSuchKey:
                if attempt == 49:
                    raise
                time.sleep(0.05)
                k = newest_manifest_keys(s3, cluster.bucket, prefix=f"{part}/manifest/")[0][part]
        out.setdefault(ids.get(topic_id.replace("-", ""), topic_id), {})[int(index)] = m
    return out, keys


def manifest_problems(topic, p, m, keys):
    """What is wrong with a manifest: a gap or an overlap, or a named object missing."""
    segs = m["segments"]
    problems = []
    if segs and segs[0]["base_offset"] != m["log_start"]:
        problems.append(f"{topic}-{p}: first segment {segs[0]['base_offset']} is not the log start {m['log_start']}")
    for a, b in zip(segs, segs[1:]):
        if b["base_offset"] != a["end_offset"]:
            problems.append(f"{topic}-{p}: gap or overlap between {a['base_offset']}..{a['end_offset']} "
                            f"and {b['base_offset']}..{b['end_offset']}")
    for seg in segs:
        for suffix in ("", ".index", ".timeindex", ".epochs"):
            if f"strata/{seg['key']}{suffix}" not in keys:
                problems.append(f"{topic}-{p}: the manifest names a missing object {seg['key']}{suffix}")
    return problems


def check_cold_tier(cluster, after_outage, violations, log):
    """The cold tier at the end, with the cluster still up: every newest manifest sound; the
    settlements manifests start at 0 (nothing may be deleted) and reach the start of each
    leader's active segment (every sealed segment uploaded, so uploads resumed after the
    outages); the churn topic's remote log start moved past where it was when the last
    outage ended (remote deletes resumed); and, once the
    orphan grace has passed, no segment object that no manifest names."""
    # 60 s, and longer while the tier is still catching up (a leader that took over after a
    # run of failovers can inherit hundreds of segments to upload; they go up a few per
    # round, and the orphans of the deposed leaders' uploads are swept between rounds).
    deadline = time.monotonic() + 60
    last_deadline = time.monotonic() + 240
    seen = None
    while True:
        active = active_segments(cluster)
        tier, keys = cold_tier(cluster)
        problems = []
        for topic, parts in tier.items():
            for p, m in parts.items():
                problems += manifest_problems(topic, p, m, keys)
        settled = tier.get(TOPIC, {})
        for p in range(PARTITIONS):
            m = settled.get(p)
            end = m["segments"][-1]["end_offset"] if m and m["segments"] else 0
            if m is None or m["log_start"] != 0:
                problems.append(f"{TOPIC}-{p}: remote log start {m and m['log_start']}, not 0")
            elif after_outage is not None and end < active.get(p, 0):
                problems.append(f"{TOPIC}-{p}: uploads did not resume after the outage: the cold tier ends at {end}, "
                                f"the leader's active segment starts at {active.get(p)}")
        churn = tier.get(CHURN, {}).get(0)
        if after_outage is not None and (churn is None or churn["log_start"] <= after_outage):
            problems.append(f"{CHURN}-0: remote deletes did not resume after the outage: remote log start "
                            f"{churn and churn['log_start']}, {after_outage} when it ended")
        named = {f"strata/{seg['key']}" for parts in tier.values() for m in parts.values() for seg in m["segments"]}
        orphans = sorted(k for k in keys if k.endswith(".log") and k not in named)
        if orphans:
            problems.append(f"{len(orphans)} segment objects no manifest names, e.g. {orphans[:3]}")
        if not problems:
            break
        state = (problems, len(keys))
        if seen is not None and state != seen:  # still moving: uploads, deletes, sweeps
            deadline = min(last_deadline, max(deadline, time.monotonic() + 20))
        seen = state
        if time.monotonic() > deadline:
            break
        time.sleep(1)
    violations += problems
    log(f"cold tier: {sum(len(m['segments']) for parts in tier.values() for m in parts.values())} segments "
        f"named, {len(keys)} objects")


def active_segments(cluster):
    """{partition: base offset of its leader's active (last) local segment}."""
    out = {}
    for p, leader in enumerate(leaders(cluster.freshest_metadata())):
        if leader is not None:
            d = cluster.workdir / f"broker-{leader}" / "logs" / f"{TOPIC}-{p}"
            bases = sorted(int(f.stem) for f in d.glob("*.log"))
            if bases:
                out[p] = bases[-1]
    return out


def churn_remote_start(cluster):
    """The churn topic's remote log start (None without a manifest yet)."""
    m = cold_tier(cluster)[0].get(CHURN, {}).get(0)
    return m and m["log_start"]


def run(workdir: Path, seed: int, faults: int, log=print, kinds=None):
    """`kinds`: the fault kinds to draw from (default: all of KINDS)."""
    rng = random.Random(seed)
    schedule = []
    while len(schedule) < faults:
        round_ = list(kinds or KINDS)
        rng.shuffle(round_)
        schedule += round_
    schedule = schedule[:faults]
    cluster = NetCluster(strata_bin(), workdir, lease_s=LEASE_S, raft_heartbeat_ms=RAFT_HEARTBEAT_MS,
                         broker_extra=f'replica_lag_time_max = "{LAG_S}s"\n')
    findings = {"seed": seed, "faults": [], "violations": []}
    violations = findings["violations"]
    try:
        cluster.start_all()
        tiered = ["--config", "remote.storage.enable=true", "--config", f"segment.bytes={SEGMENT_BYTES}",
                  "--config", f"local.retention.bytes={LOCAL_RETENTION_BYTES}"]
        cluster.cli("topic", "create", TOPIC, "-p", str(PARTITIONS), "--replication-factor", "3",
                    "--config", "min.insync.replicas=2", "--config", "retention.ms=-1", *tiered)
        cluster.cli("topic", "create", CHURN, "-p", "1", "--replication-factor", "3",
                    "--config", "min.insync.replicas=2", "--config", f"retention.ms={CHURN_RETENTION_MS}", *tiered)
        assert wait_healthy(cluster, 30), "the topic never got a full ISR"
        producers = Producers(cluster.bootstrap()).start()
        probe = Probe(cluster).start()
        member = GroupMember(cluster.bootstrap()).start()
        churn = Churn(cluster.bootstrap()).start()
        after_outage = None
        time.sleep(3)
        for n, kind in enumerate(schedule):
            log(f"fault {n + 1}/{len(schedule)}: {kind}")
            started, undone, fenced, desc = inject(cluster, kind, rng, log)
            if kind in CONTROLLER_KINDS and fenced:
                violations.append(f"{desc}: brokers {fenced} fenced although only a controller was faulty")
            ok = wait_healthy(cluster)
            healed = time.monotonic()
            if not ok:
                violations.append(f"{desc}: the cluster did not heal within 90 s")
            time.sleep(1)
            since = undone if kind == "two-brokers" else started
            now = time.monotonic()
            gap, partition, at = probe.longest_gap(since, now)
            client_gap, client_partition, client_at = producers.longest_gap(since, now)
            findings["faults"].append({"kind": kind, "desc": desc, "unavailable_s": gap,
                                       "client_gap_s": client_gap, "heal_s": healed - undone})
            if kind == "store-outage":
                after_outage = churn_remote_start(cluster) or 0
            log(f"  unavailable {gap * 1000:.0f} ms (partition {partition}, from {at:.1f} s in); "
                f"producers without an ack {client_gap * 1000:.0f} ms (partition {client_partition}, "
                f"from {client_at:.1f} s in); healed {healed - undone:.1f} s after it was undone")
        time.sleep(3)
        unsent = producers.finish()
        probe.finish()
        member.finish()
        churn.finish()
        check_cold_tier(cluster, after_outage, violations, log)
        if unsent:
            violations.append(f"{unsent} records neither acknowledged nor failed")
        if producers.failed:
            violations.append(f"{len(producers.failed)} records failed, e.g. {list(producers.failed.items())[:3]}")
        out, _ = consume_partitions(cluster.bootstrap(), TOPIC, PARTITIONS, time.monotonic() + 180)
        seen = {}
        dups = []
        order = []
        for p, recs in out.items():
            last = {}
            for off, _key, v in recs:
                if v in seen:
                    dups.append((v, seen[v], (p, off)))
                seen[v] = (p, off)
                k = v // 10**8
                if k >= PROBE_K0:
                    continue  # (see Probe: a probe's writes are not ordered)
                if v <= last.get(k, -1):
                    order.append((p, off, v))
                last[k] = v
        # (librdkafka may report a delivery without its offset: then only that it is there)
        lost = [(v, where, seen.get(v)) for v, where in [*producers.acked.items(), *probe.acked.items()]
                if v not in seen or (where[1] is not None and seen[v] != where)]
        findings["unknown_offsets"] = sum(1 for _, o in producers.acked.values() if o is None)
        if lost:
            violations.append(f"{len(lost)} acknowledged records lost or moved, e.g. {sorted(lost)[:3]}")
        if dups:
            violations.append(f"{len(dups)} records duplicated, e.g. {dups[:3]}")
            for _v, a, b in dups[:2]:
                for p, off in (a, b):
                    log(f"  batch holding {TOPIC}-{p} offset {off}: {batch_header(cluster, p, off)}")
        if order:
            violations.append(f"{len(order)} records out of producer order, e.g. {order[:3]}")
        acked_offsets = {p: set() for p in range(PARTITIONS)}
        for v, (p, o) in producers.acked.items():
            acked_offsets[p].add(o if o is not None else seen.get(v, (p, None))[1])
        for offsets in acked_offsets.values():
            offsets.discard(None)
        for p in range(PARTITIONS):
            commits = member.commits[p]
            if any(b < a for a, b in zip(commits, commits[1:])):
                violations.append(f"partition {p}: committed offsets went backwards: {commits}")
            top = max(commits, default=0)
            skipped = sorted(o for o in acked_offsets[p] if o < top and o not in member.consumed[p])
            if skipped:
                violations.append(f"partition {p}: the group committed {top} past {len(skipped)} "
                                  f"acknowledged records it never consumed, e.g. {skipped[:5]}")
        findings["acked"] = len(producers.acked)
        findings["probe_acked"] = len(probe.acked)
        findings["commits"] = sum(len(c) for c in member.commits.values())
        differ = replicas_identical(cluster)
        if differ:
            violations.append(f"replicas differ: {differ}")
    finally:
        cluster.teardown()
    by_kind, clients_by_kind = {}, {}
    for f in findings["faults"]:
        by_kind.setdefault(f["kind"], []).append(f["unavailable_s"])
        clients_by_kind.setdefault(f["kind"], []).append(f["client_gap_s"])
    findings["by_kind"] = by_kind
    findings["clients_by_kind"] = clients_by_kind

    def ms(v):
        return f"p50:{statistics.median(v) * 1000:.0f}ms/max:{max(v) * 1000:.0f}ms"
    summary = " ".join(f"{k}={ms(v)}(producers:{ms(clients_by_kind[k])})" for k, v in sorted(by_kind.items()))
    log(f"faults seed={seed} faults={len(findings['faults'])} acked={findings.get('acked', 0)} "
        f"probe_acked={findings.get('probe_acked', 0)} "
        f"(without offset: {findings.get('unknown_offsets', 0)}) "
        f"commits={findings.get('commits', 0)} violations={len(violations)} {summary}")
    for v in violations:
        log(f"VIOLATION: {v}")
    return findings


def main():
    global LEASE_S, RAFT_HEARTBEAT_MS, REQUEST_TIMEOUT_S
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=None, help="nemesis seed (default: random, printed)")
    ap.add_argument("--faults", type=int, default=15)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--lease", type=float, default=LEASE_S,
                    help=f"the brokers' lease in seconds (default {LEASE_S}); faults are held for 1.2 to 2 leases")
    ap.add_argument("--raft-heartbeat-ms", type=int, default=RAFT_HEARTBEAT_MS,
                    help=f"the controllers' Raft heartbeat (default {RAFT_HEARTBEAT_MS} ms)")
    ap.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S,
                    help=f"the producers' request.timeout.ms, in seconds (default {REQUEST_TIMEOUT_S})")
    ap.add_argument("--kinds", default=None,
                    help=f"comma-separated fault kinds to draw from (default: all of {','.join(KINDS)})")
    args = ap.parse_args()
    kinds = args.kinds.split(",") if args.kinds else None
    if kinds and not set(kinds) <= set(KINDS):
        ap.error(f"unknown fault kinds {sorted(set(kinds) - set(KINDS))}; known: {', '.join(KINDS)}")
    LEASE_S = args.lease
    REQUEST_TIMEOUT_S = args.request_timeout
    RAFT_HEARTBEAT_MS = args.raft_heartbeat_ms
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    import tempfile
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="strata-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"seed {seed}, {args.faults} faults, lease {LEASE_S} s, raft heartbeat {RAFT_HEARTBEAT_MS} ms, "
          f"producers' request timeout {REQUEST_TIMEOUT_S} s, "
          f"work dir {workdir}", flush=True)
    findings = run(workdir, seed, args.faults, log=lambda s: print(s, flush=True), kinds=kinds)
    sys.exit(1 if findings["violations"] else 0)


if __name__ == "__main__":
    main()
