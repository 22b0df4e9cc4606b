#!/usr/bin/env python3
"""Consumer group figures (printed, not asserted) on a local 3-controller + 3-broker cluster:
rebalance time p50/p99 when a member joins and when one dies, for groups of 4 and 32
members, and offset commit throughput and p99 latency (each commit replicated, acks=all, on
an RF=3 __consumer_offsets). The members are simulated by `strata-groupbench` (built next
to the strata binary), each with its own connection, speaking the classic group protocol.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_cluster import Cluster  # noqa: E402

TOPIC = "bench-groups"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", default="4,32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--commit-seconds", type=float, default=5.0)
    args = ap.parse_args()
    binary = os.environ.get("STRATA_BIN", "target/release/strata")
    bench = str(Path(binary).with_name("strata-groupbench"))
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        c = Cluster(binary, Path(d), broker_extra='\n[groups]\nmin_session_timeout = "1s"\n')
        try:
            c.start_all()
            c.cli("topic", "create", TOPIC, "-p", "12", "--replication-factor", "3")
            c.wait_for(lambda m: TOPIC in m["topics"], TOPIC)
            time.sleep(1)
            bootstrap = ",".join(f"127.0.0.1:{c.broker_ports[i]}" for i in (1, 2, 3))
            subprocess.run([bench, "--bootstrap", bootstrap, "--topic", TOPIC, "--members", args.members,
                            "--rounds", str(args.rounds), "--commit-seconds", str(args.commit_seconds)],
                           check=True, timeout=600)
        finally:
            c.stop_all()


if __name__ == "__main__":
    main()
