#!/usr/bin/env python3
"""Cluster figures (printed, not asserted) on a local 3-controller + 3-broker cluster:

- metadata propagation: from a topic creation being committed by the controllers to every
  broker describing it in Kafka Metadata (p50/p99 over repeated creations);
- fencing: from a broker's SIGKILL to the controllers fencing it and moving its leaderships
  (p50/p99 over repeated kills), with the broker lease the cluster runs with.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from confluent_kafka.admin import AdminClient  # noqa: E402

from test_cluster import LEASE_S, Cluster  # noqa: E402


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round((len(s) - 1) * p)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--binary", default=os.environ.get("STRATA_BIN", "target/release/strata"))
    ap.add_argument("--topics", type=int, default=20)
    ap.add_argument("--kills", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        c = Cluster(args.binary, Path(tmp))
        try:
            c.start_all()
            admins = {i: AdminClient({"bootstrap.servers": f"127.0.0.1:{c.broker_ports[i]}"}) for i in (1, 2, 3)}
            for a in admins.values():
                a.list_topics(timeout=10)

            delays = []
            for k in range(args.topics):
                name = f"bench-{k}"
                c.cli("topic", "create", name, "-p", "3", "--replication-factor", "1")
                committed = time.monotonic()
                pending = set(admins)
                while pending:
                    for i in list(pending):
                        md = admins[i].list_topics(topic=name, timeout=5)
                        t = md.topics.get(name)
                        if t is not None and t.error is None and len(t.partitions) == 3:
                            pending.discard(i)
                    assert time.monotonic() - committed < 30, "metadata never reached every broker"
                delays.append(time.monotonic() - committed)
            print(f"metadata propagation, topic commit -> all 3 brokers' Kafka Metadata, {len(delays)} topics: "
                  f"p50 {pct(delays, .5) * 1e3:.0f} ms p99 {pct(delays, .99) * 1e3:.0f} ms "
                  f"(includes the Metadata request round trips)")

            fence = []
            for k in range(args.kills):
                victim = 1 + k % 3
                c.kill(f"broker-{victim}")
                killed = time.monotonic()
                c.wait_for(lambda m: m["brokers"][str(victim)]["fenced"]
                           and all(p["leader"] != victim for t in m["topics"].values() for p in t["partitions"]),
                           f"broker {victim} fenced", timeout=LEASE_S * 5)
                fence.append(time.monotonic() - killed)
                c.start(f"broker-{victim}")
                c.wait_for(lambda m: not m["brokers"][str(victim)]["fenced"], f"broker {victim} back")
            print(f"fencing, broker SIGKILL -> fenced with leaderships moved, lease {LEASE_S} s, {len(fence)} kills: "
                  f"p50 {pct(fence, .5):.2f} s p99 {pct(fence, .99):.2f} s (mean {statistics.mean(fence):.2f} s)")
        finally:
            c.stop_all()


if __name__ == "__main__":
    main()
