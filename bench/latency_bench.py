#!/usr/bin/env python3
"""Tail latency on RF=3, printed, not asserted: a 3-controller + 3-broker cluster on this
machine, a topic of --partitions partitions (RF=3, min.insync.replicas=2, fsync on every
replica: flush.messages=1, the default), and strata-kafka-load (bench/kafka-load, a Rust
generator on librdkafka) offering --rate records/s of 800 B with keys, acks=all, idempotent,
consuming them in the same process:

- the disk's unloaded fsync latency (4 KiB append + fdatasync, p50/p99): the floor of
  every acknowledgement, measured in the same run;
- produce-to-ack and produce-to-consume latency, p50/p99/p99.9/max, from HDR histograms
  that start at the moment each record was due (so a client that falls behind shows it);
- inside the brokers, from their own histograms (bucket bounds): produce request in to
  response out, append to committed on the ISR, and that commit's stages: append to the
  leader's fsync, append to each follower's next fetch past it, a follower's turnaround
  (response in to next fetch out: its append and fsync), and one fsync;
- CPU seconds per million records of each broker process, and of the generator;
- metadata propagation: from the topic's creation being committed by the controllers to
  every broker's Kafka Metadata naming a leader for each of its partitions;
- controller failover: after the load, SIGKILL of the active controller, then the time until
  a new one commits a topic creation, and until that topic reaches every broker's Kafka
  Metadata.

With several partition counts (`--partitions 6,60,600,3000`) it runs each on a fresh
cluster in turn: the partition-scale table (the same total rate spread thinner).

Build the generator first:
  cargo build --release --manifest-path bench/kafka-load/Cargo.toml --target-dir target/kafka-load
  cargo build --release --bin strata
  .venv/bin/python bench/latency_bench.py --seconds 30
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from confluent_kafka.admin import AdminClient  # noqa: E402
from test_cluster import Cluster  # noqa: E402
from replication_bench import bucket_quantile  # noqa: E402

LOADGEN = ROOT / "target" / "kafka-load" / "release" / "strata-kafka-load"

# the brokers' own histograms: the request, the commit, and the commit's stages
INSIDE = (
    ("strata_produce_latency_seconds", "produce request in -> response out"),
    ("strata_commit_latency_seconds", "append -> committed on the ISR"),
    ("strata_stage_leader_durable_seconds", "  stage: append -> fsynced on the leader"),
    ("strata_stage_replica_ack_seconds", "  stage: append -> a follower's fetch past it"),
    ("strata_stage_follower_turnaround_seconds",
     "  stage: follower, response in -> next fetch out (append + fsync)"),
    ("strata_stage_fsync_seconds", "  stage: one fsync (any replica)"),
)


def fsync_latency_ms(directory, n=500):
    """4 KiB appends, each followed by fdatasync, on an idle disk: (p50, p99) in ms."""
    path = os.path.join(directory, "fsync-probe.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    block = os.urandom(4096)
    times = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            times.append((time.perf_counter() - t) * 1e3)
    finally:
        os.close(fd)
        os.unlink(path)
    times.sort()
    return times[len(times) // 2], times[int(len(times) * 0.99)]


def histogram(c, name):
    """Summed buckets of histogram `name` over the three brokers: {le: count}."""
    total = {}
    for i in (1, 2, 3):
        for k, v in c.broker_metrics(i).items():
            if k.startswith(f"{name}_bucket"):
                le = k.split('le="')[1].split('"')[0]
                total[le] = total.get(le, 0) + v
    return total


def all_brokers_see(admins, topic, partitions, started, timeout=120):
    """Seconds from `started` until every broker's Kafka Metadata names a leader for each of
    `topic`'s `partitions` partitions (polled back to back: the figure includes a round trip)."""
    pending = set(admins)
    while pending:
        for i in list(pending):
            md = admins[i].list_topics(topic=topic, timeout=10)
            t = md.topics.get(topic)
            if t is not None and t.error is None and len(t.partitions) == partitions and all(
                    p.leader >= 0 for p in t.partitions.values()):
                pending.discard(i)
        if time.monotonic() - started > timeout:
            sys.exit(f"{topic}: brokers {sorted(pending)} did not show its {partitions} partitions in {timeout} s")
    return time.monotonic() - started


def controller_failover(c, admins):
    """SIGKILL the active controller; seconds until the survivors commit a topic creation, and
    until every broker's Metadata shows that topic."""
    victim = c.leader()
    c.kill(f"controller-{victim}")
    killed = time.monotonic()
    while True:
        r = c.cli("topic", "create", "failover-probe", "-p", "1", "--replication-factor", "3", check=False)
        if r.returncode == 0:
            break
        if time.monotonic() - killed > 60:
            sys.exit(f"no controller accepted a topic creation 60 s after controller {victim}'s SIGKILL:\n{r.stderr}")
        time.sleep(0.05)
    committed = time.monotonic() - killed
    return victim, committed, all_brokers_see(admins, "failover-probe", 1, killed)


def run_one(args, partitions, tmp):
    work = Path(tmp) / f"p{partitions}"
    work.mkdir(parents=True, exist_ok=True)
    c = Cluster(args.binary, work)
    c.failpoints_on = False  # as in production: no failpoint lookups
    try:
        c.start_all()
        topic = f"latency-{partitions}"
        admins = {i: AdminClient({"bootstrap.servers": f"127.0.0.1:{c.broker_ports[i]}", "log_level": 2})
                  for i in (1, 2, 3)}
        for a in admins.values():
            a.list_topics(timeout=10)
        c.cli("topic", "create", topic, "-p", str(partitions), "--replication-factor", "3",
              "--config", "min.insync.replicas=2")
        propagation = all_brokers_see(admins, topic, partitions, time.monotonic())
        c.wait_for(lambda m: topic in m["topics"] and all(
            len(p["isr"]) == 3 for p in m["topics"][topic]["partitions"]), "topic with full ISRs",
            timeout=120)
        bootstrap = ",".join(f"127.0.0.1:{c.broker_ports[i]}" for i in (1, 2, 3))
        pids = [c.procs[f"broker-{i}"].pid for i in (1, 2, 3)]
        before = {h: histogram(c, h) for h, _ in INSIDE}
        out = Path(tmp) / f"load-{partitions}.json"
        cmd = [str(args.loadgen), "--bootstrap", bootstrap, "--topic", topic,
               "--partitions", str(partitions), "--replication", "3", "--rate", str(args.rate),
               "--seconds", str(args.seconds), "--warmup", str(args.warmup), "--json", str(out)]
        for pid in pids:
            cmd += ["--broker-pid", str(pid)]
        cmd += args.loadgen_args
        r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        print(r.stdout, end="", flush=True)
        if r.returncode != 0:
            sys.exit(f"strata-kafka-load exited {r.returncode}")
        after = {h: histogram(c, h) for h in before}
        figures = json.loads(out.read_text())
        for h, label in INSIDE:
            print(f"  inside the brokers, {label}: p50 {bucket_quantile(before[h], after[h], .5)}, "
                  f"p99 {bucket_quantile(before[h], after[h], .99)}, "
                  f"p99.9 {bucket_quantile(before[h], after[h], .999)}")
        rss, fds = [], []
        for pid in pids:
            status = Path(f"/proc/{pid}/status").read_text()
            rss.append(int(next(l.split()[1] for l in status.splitlines() if l.startswith("VmRSS:"))) / 1024)
            fds.append(len(os.listdir(f"/proc/{pid}/fd")))
        figures["rss_mib"] = rss
        figures["fds"] = fds
        print(f"  brokers: RSS {', '.join(f'{m:.0f}' for m in rss)} MiB; open fds {', '.join(map(str, fds))}")
        figures["propagation_s"] = propagation
        print(f"  metadata propagation: topic of {partitions} partitions committed -> every broker's Metadata "
              f"names all its leaders: {propagation * 1e3:.0f} ms")
        victim, committed, seen = controller_failover(c, admins)
        figures["failover_commit_s"], figures["failover_seen_s"] = committed, seen
        print(f"  controller failover: controller {victim} SIGKILLed -> a topic creation committed after "
              f"{committed * 1e3:.0f} ms, on every broker's Metadata after {seen * 1e3:.0f} ms")
        return figures
    finally:
        c.stop_all()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.environ.get("STRATA_BIN", str(ROOT / "target/release/strata")))
    ap.add_argument("--loadgen", default=str(LOADGEN))
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--rate", type=int, default=10_500)
    ap.add_argument("--partitions", default="12", help="a count, or several: 6,60,600,3000")
    ap.add_argument("loadgen_args", nargs="*",
                    help="passed to strata-kafka-load after --, e.g. -- --no-consume --linger-ms 1")
    args = ap.parse_args()
    for what, path, how in (
            ("strata", args.binary, "cargo build --release --bin strata"),
            ("strata-kafka-load", args.loadgen,
             "cargo build --release --manifest-path bench/kafka-load/Cargo.toml --target-dir target/kafka-load")):
        if not Path(path).exists():
            sys.exit(f"{what} not found at {path}: {how}")
    counts = [int(p) for p in args.partitions.split(",")]
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        p50, p99 = fsync_latency_ms(tmp)
        print(f"disk, unloaded: 4 KiB append + fdatasync p50 {p50:.2f} ms, p99 {p99:.2f} ms")
        rows = []
        for n in counts:
            print(f"\n== {n} partitions, RF=3, {args.rate} msgs/s of 800 B, acks=all, fsync on every replica ==",
                  flush=True)
            rows.append((n, run_one(args, n, tmp)))
        if len(rows) > 1:
            print("\npartitions  ack p99  ack p99.9  e2e p99  broker CPU s / M records (mean)  RSS MiB (mean)  fds (mean)"
                  "  propagation ms  failover commit / seen ms")
            for n, f in rows:
                cpu = sum(b["cpu_s"] for b in f["brokers"]) / len(f["brokers"]) / max(f["ack_ms"]["count"], 1) * 1e6
                print(f"{n:>10}  {f['ack_ms']['p99']:>7.2f}  {f['ack_ms']['p999']:>9.2f}  {f['e2e_ms']['p99']:>7.2f}  "
                      f"{cpu:>33.1f}  {sum(f['rss_mib']) / 3:>14.0f}  {sum(f['fds']) / 3:>10.0f}"
                      f"  {f['propagation_s'] * 1e3:>14.0f}  {f['failover_commit_s'] * 1e3:>8.0f} / "
                      f"{f['failover_seen_s'] * 1e3:.0f}")


if __name__ == "__main__":
    main()
