#!/usr/bin/env python3
"""What TLS and SASL cost: produce throughput and ack latency over a PLAINTEXT listener and
over a SASL_SSL (SCRAM-SHA-512) listener of the same `strata dev` node, same client
(librdkafka via confluent-kafka), same topic, runs interleaved so machine noise hits both.
Prints figures and ratios; asserts nothing about speed. Client and broker share the
machine's cores, so it also prints CPU seconds per GB acknowledged, for the broker (from
/proc) and for the client process: the broker's own TLS cost, apart from the client's.

    cargo build --release --bin strata
    STRATA_BIN=target/release/strata python3 bench/security_bench.py [--seconds 10] [--rounds 2]
        [--cipher-suites TLS_AES_128_GCM_SHA256]

With `--client rust` the load comes from `target/release/examples/produce_load` instead (build
it with `cargo build --release -p strata-hot --example produce_load`): one connection sending
the same prebuilt 1,000-record batch in pipelined Produce requests. The broker runs pinned to
CPU 0 and the client to CPU 1. Over loopback the client's core also does the receiving side's
TCP work, so the client, not the broker, is what saturates: the throughput ratio is bound by
the client, and the broker's CPU per byte ratio is its own TLS cost per core. Only the
saturated phase runs in this mode.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from produce_bench import run  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid=None):
    """User + system CPU seconds of process `pid` (its threads included), or of this one
    (the client: librdkafka's threads run inside it)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid):
    """Voluntary + involuntary context switches of all of process `pid`'s threads."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.endswith("ctxt_switches:") or "ctxt_switches:" in line:
                    total += int(line.split()[1])
        except (OSError, ValueError):
            pass  # a thread that ended meanwhile
    return total


def start_broker(args, cpus=None):
    """A `strata dev` node with a PLAINTEXT and a SASL_SSL listener, user `bench` and topic
    `bench`; `cpus`: the CPUs it may run on. Returns (work dir, certs dir, process, log file,
    PLAINTEXT port, SASL_SSL port)."""
    work = Path(tempfile.mkdtemp(prefix="strata-security-bench-"))
    certs = work / "certs"
    subprocess.run([args.binary, "certs", "--out", str(certs), "--node", "bench"], check=True,
                   capture_output=True)
    plain, secure, controller = free_port(), free_port(), free_port()
    config = work / "bench.toml"
    config.write_text(
        f'[[kafka.listeners]]\nname = "PLAIN"\nlisten = "127.0.0.1:{plain}"\nprotocol = "PLAINTEXT"\n'
        f'[[kafka.listeners]]\nname = "SECURE"\nlisten = "127.0.0.1:{secure}"\nprotocol = "SASL_SSL"\n'
        f'[kafka.tls]\ncert = "{certs}/node-bench.pem"\nkey = "{certs}/node-bench.key"\n'
        + (f'cipher_suites = {json.dumps(args.cipher_suites.split(","))}\n' if args.cipher_suites else '')
        # the cost of authentication and encryption, not of ACL look-ups on an open cluster
        + '[auth]\nallow_everyone_if_no_acl_found = true\n')
    log = open(work / "strata.log", "wb")
    env = dict(os.environ, STRATA__TOPICS__RETENTION_CHECK_INTERVAL="1s")
    proc = subprocess.Popen([args.binary, "dev", "--config", str(config), "--data-dir", str(work / "data"),
                             "--listen", f"127.0.0.1:{plain}", "--controller-listen", f"127.0.0.1:{controller}"],
                            stdout=log, stderr=log, env=env,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", secure), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit("strata did not start; see " + str(work / "strata.log"))
            time.sleep(0.2)
    (work / "pw").write_text("bench-password\n")
    (work / "pw").chmod(0o600)
    admin = ["--controller", f"127.0.0.1:{controller}"]
    for cmd in (["user", "create", "bench", "--password-file", str(work / "pw"), *admin],
                # a bounded log: deleted segments give their page cache back to the next
                # writes (on a VM, page cache that only grows costs every run a host page
                # fault per fresh page, and more in later phases than in earlier ones)
                ["topic", "create", "bench", "-p", "1", "--config", "segment.bytes=67108864",
                 "--config", "retention.bytes=268435456", *admin]):
        # the broker registers a moment after its listeners accept
        for _ in range(100):
            r = subprocess.run([args.binary, *cmd], capture_output=True, text=True)
            if r.returncode == 0:
                break
            time.sleep(0.2)
        else:
            sys.exit(f"strata {' '.join(cmd)} failed: {r.stderr}")
    return work, certs, proc, log, plain, secure


def stop_broker(work, proc, log):
    """Stops what `start_broker` started and removes its data (a saturated run writes
    gigabytes)."""
    proc.terminate()
    proc.wait(10)
    log.close()
    shutil.rmtree(work, ignore_errors=True)


def main_rust(args):
    """The saturated phase with the Rust load generator, broker and client on their own CPUs."""
    loadgen = Path(args.binary).parent / "examples" / "produce_load"
    if not loadgen.exists():
        sys.exit(f"{loadgen} is missing: cargo build --release -p strata-hot --example produce_load")
    two = (os.cpu_count() or 1) >= 2
    work, certs, proc, log, plain, secure = start_broker(args, cpus={0} if two else None)
    try:
        variants = {
            "PLAINTEXT": ["--bootstrap", f"127.0.0.1:{plain}"],
            "SASL_SSL": ["--bootstrap", f"127.0.0.1:{secure}", "--tls-ca", str(certs / "ca.pem"),
                         "--sasl-user", "bench", "--sasl-password", "bench-password"],
        }
        results = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, flags in variants.items():
                broker0 = cpu_seconds(proc.pid)
                child = subprocess.Popen(
                    [str(loadgen), "--topic", "bench", "--seconds", str(args.seconds),
                     "--record-bytes", str(args.record_bytes), *flags],
                    stdout=subprocess.PIPE, text=True,
                    preexec_fn=(lambda: os.sched_setaffinity(0, {1})) if two else None)
                out = child.stdout.read()
                _, status, usage = os.wait4(child.pid, 0)
                if status != 0:
                    sys.exit(f"{name}: produce_load failed (status {status})")
                child.returncode = 0
                r = json.loads(out)
                gb = r["acked"] * args.record_bytes / 1e9
                r["broker_cpu_s_per_gb"] = (cpu_seconds(proc.pid) - broker0) / gb
                r["client_cpu_s_per_gb"] = (usage.ru_utime + usage.ru_stime) / gb
                results[name].append(r)
        for name in variants:
            best = max(results[name], key=lambda r: r["msgs_per_s"])
            print(f"{name:>9}: max {best['msgs_per_s']:>8.0f} msgs/s {best['mb_per_s']:>6.1f} MB/s; CPU per GB "
                  f"acknowledged: broker {min(r['broker_cpu_s_per_gb'] for r in results[name]):.2f} s, client "
                  f"{min(r['client_cpu_s_per_gb'] for r in results[name]):.2f} s (best of {args.rounds}, "
                  f"{args.record_bytes} B records, acks=all, broker on CPU 0 and client on CPU 1: {two})")
        ratio = (max(r["msgs_per_s"] for r in results["SASL_SSL"])
                 / max(r["msgs_per_s"] for r in results["PLAINTEXT"]))
        cpu = (min(r["broker_cpu_s_per_gb"] for r in results["SASL_SSL"])
               / min(r["broker_cpu_s_per_gb"] for r in results["PLAINTEXT"]))
        print(f"SASL_SSL / PLAINTEXT (Rust client): throughput {ratio:.2f}x (cost {100 * (1 - ratio):.0f}%), "
              f"broker CPU per byte {cpu:.2f}x")
    finally:
        stop_broker(work, proc, log)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--binary", default=os.environ.get("STRATA_BIN", "target/release/strata"))
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rate", type=int, default=10_500)
    ap.add_argument("--record-bytes", type=int, default=800)
    ap.add_argument("--fixed-rate", type=int, default=50_000,
                    help="a rate both listeners sustain, with the same linger: the broker's CPU "
                         "per GB there compares equal batches")
    ap.add_argument("--cipher-suites", default="",
                    help="the SASL_SSL listener's kafka.tls.cipher_suites, comma-separated "
                         "(e.g. TLS_AES_128_GCM_SHA256); default: rustls's, the client's order")
    ap.add_argument("--client", choices=("librdkafka", "rust"), default="librdkafka")
    args = ap.parse_args()
    if args.client == "rust":
        return main_rust(args)
    work, certs, proc, log, plain, secure = start_broker(args)
    try:
        variants = {
            "PLAINTEXT": (f"127.0.0.1:{plain}", {}),
            "SASL_SSL": (f"127.0.0.1:{secure}", {
                "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
                "sasl.username": "bench", "sasl.password": "bench-password",
                "ssl.ca.location": str(certs / "ca.pem")}),
        }
        results = {name: {"max": [], "rate": [], "fixed": []} for name in variants}
        for _ in range(args.rounds):
            for name, (bootstrap, extra) in variants.items():
                for kind, rate, linger in (("max", 0, 5), ("rate", args.rate, 0), ("fixed", args.fixed_rate, 5)):
                    broker0, client0 = cpu_seconds(proc.pid), cpu_seconds()
                    switches0 = context_switches(proc.pid)
                    r = run(bootstrap, "bench", args.seconds, rate, args.record_bytes, linger, extra)
                    gb = r["acked"] * args.record_bytes / 1e9
                    r["broker_cpu_s_per_gb"] = (cpu_seconds(proc.pid) - broker0) / gb
                    r["client_cpu_s_per_gb"] = (cpu_seconds() - client0) / gb
                    r["broker_switches_per_mb"] = (context_switches(proc.pid) - switches0) / (gb * 1000)
                    if r["errors"]:
                        sys.exit(f"{name} {kind}: {r['errors']} messages failed")
                    results[name][kind].append(r)
        best = lambda name, kind, key, f: f(r[key] for r in results[name][kind])  # noqa: E731
        for name in variants:
            print(f"{name:>9}: max {best(name, 'max', 'msgs_per_s', max):>8.0f} msgs/s "
                  f"{best(name, 'max', 'mb_per_s', max):>6.1f} MB/s; at {args.rate} msgs/s ack p50 "
                  f"{best(name, 'rate', 'p50_ms', min):.2f} ms p99 {best(name, 'rate', 'p99_ms', min):.2f} ms "
                  f"(best of {args.rounds}, {args.record_bytes} B records, acks=all, idempotent)")
        for name in variants:
            print(f"{name:>9}: at max throughput, CPU per GB acknowledged: broker "
                  f"{best(name, 'max', 'broker_cpu_s_per_gb', min):.2f} s, client (librdkafka + Python) "
                  f"{best(name, 'max', 'client_cpu_s_per_gb', min):.2f} s; broker context switches per MB "
                  f"{best(name, 'max', 'broker_switches_per_mb', min):.0f}")
        for name in variants:
            print(f"{name:>9}: at {args.fixed_rate} msgs/s (linger 5 ms), CPU per GB acknowledged: broker "
                  f"{best(name, 'fixed', 'broker_cpu_s_per_gb', min):.2f} s, client "
                  f"{best(name, 'fixed', 'client_cpu_s_per_gb', min):.2f} s; broker context switches per MB "
                  f"{best(name, 'fixed', 'broker_switches_per_mb', min):.0f}")
        broker = best("SASL_SSL", "max", "broker_cpu_s_per_gb", min) / best("PLAINTEXT", "max", "broker_cpu_s_per_gb", min)
        fixed = best("SASL_SSL", "fixed", "broker_cpu_s_per_gb", min) / best("PLAINTEXT", "fixed", "broker_cpu_s_per_gb", min)
        print(f"SASL_SSL / PLAINTEXT: broker CPU per byte {broker:.2f}x at max throughput, {fixed:.2f}x at "
              f"{args.fixed_rate} msgs/s (the broker's share of the TLS cost)")
        ratio = best("SASL_SSL", "max", "msgs_per_s", max) / best("PLAINTEXT", "max", "msgs_per_s", max)
        p99 = best("SASL_SSL", "rate", "p99_ms", min) / best("PLAINTEXT", "rate", "p99_ms", min)
        print(f"SASL_SSL / PLAINTEXT: throughput {ratio:.2f}x (cost {100 * (1 - ratio):.0f}%), p99 ack {p99:.2f}x")
    finally:
        stop_broker(work, proc, log)


if __name__ == "__main__":
    main()
