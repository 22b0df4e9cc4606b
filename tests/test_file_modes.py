"""A node's data is its owner's alone (issue 47, finding 6): against a real `strata dev`
process started with umask 022, every directory under the data directory is mode 700 and
every file mode 600 (segments, indexes, checkpoints, producer snapshots, the transaction
index, the controllers' metadata log with its SCRAM keys, the `file://` cold tier and its
disk cache); a data directory left open to other users is closed at start with a WARN; and
`strata dev --secure` serves /metrics over HTTPS with basic auth only."""

import base64
import http.client
import json
import os
import re
import ssl
import stat
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import Broker, free_port, port_accepts, rdkafka_conf, scrape_metrics, stop_process, strata_bin

SEGMENT = 64 << 10


def umask_022():
    """The child's umask: what most distributions give a login shell or a service."""
    os.umask(0o022)


def open_to_others(root):
    """Every directory (root included) whose mode is not 700 and every regular file whose
    mode is not 600 under `root`, as 'path mode' lines; and how many of each were looked at."""
    bad, seen = [], {"dirs": 0, "files": 0}
    for dirpath, _dirnames, filenames in os.walk(root):
        for path in [dirpath] + [os.path.join(dirpath, f) for f in filenames]:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # a temporary file renamed or removed while we looked
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                seen["dirs"] += 1
                if mode != 0o700:
                    bad.append(f"{path} {mode:o}")
            elif stat.S_ISREG(st.st_mode):
                seen["files"] += 1
                if mode != 0o600:
                    bad.append(f"{path} {mode:o}")
    return bad, seen


def names_under(root):
    return {f for _, _, files in os.walk(root) for f in files}


def assert_private(root):
    bad, seen = open_to_others(root)
    shown = sorted(bad, key=lambda line: ("cold-cache" in line, line))[:80]
    more = f"\n... and {len(bad) - len(shown)} more" if len(bad) > len(shown) else ""
    assert not bad, f"{len(bad)} of {seen} under {root} are open to other users:\n" + "\n".join(shown) + more
    return seen


def test_every_directory_is_700_and_every_file_600_under_a_umask_of_022(tmp_path):
    """Segments, indexes, checkpoints, producer snapshots, the aborted-transaction index,
    the consumer offsets, the metadata log holding a SCRAM user's keys, the `file://` cold
    tier and the cold cache: none readable by another local user, while running and after a
    clean stop, though the process umask would allow 755 and 644."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    b = Broker(strata_bin(), tmp_path)
    b.data_dir.rmdir()  # the node makes it
    b.preexec = umask_022
    b.start()
    try:
        # A SCRAM user: its stored and server keys go into the controllers' metadata log.
        pw = tmp_path / "bob.pw"
        pw.write_text("bob-password\n")
        pw.chmod(0o600)
        r = subprocess.run([b.binary, "user", "create", "bob", "--password-file", str(pw),
                            "--controller", f"127.0.0.1:{b.controller_port}"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr + b.stderr_tail()

        # Records in small segments, tiered to the cold tier; a committed offset; an
        # aborted transaction.
        b.create_topic("ledger", 1, {"segment.bytes": SEGMENT, "remote.storage.enable": "true"})
        p = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "acks": "all",
                                   "enable.idempotence": True, "linger.ms": 5, "batch.size": 16384}))
        for i in range(3000):
            p.produce("ledger", key=f"k-{i % 50}".encode(), value=(f"settlement-{i}-" + "x" * 200).encode())
            if i % 500 == 0:
                p.poll(0)
        assert p.flush(30) == 0
        tx = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "transactional.id": "file-modes"}))
        tx.init_transactions(30)
        tx.begin_transaction()
        tx.produce("ledger", b"never committed")
        tx.flush(30)
        tx.abort_transaction(30)
        c = Consumer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "group.id": "auditors",
                                   "enable.auto.commit": False}))
        c.assign([TopicPartition("ledger", 0, 0)])
        assert c.consume(10, timeout=30), "nothing consumed"
        c.commit(offsets=[TopicPartition("ledger", 0, 10)], asynchronous=False)
        c.close()
        deadline = time.monotonic() + 60
        while scrape_metrics(b.metrics_port).get("strata_tiered_segments_total", 0) < 2:
            assert time.monotonic() < deadline, "nothing tiered\n" + b.stderr_tail()
            time.sleep(0.2)

        running = assert_private(b.data_dir)
        assert b.stop() == 0
        stopped = assert_private(b.data_dir)
        print(f"running: {running}, stopped: {stopped}")

        # The walk saw what matters: the metadata log, segments with their indexes and
        # checkpoints, the transaction index, tiered objects.
        names = names_under(b.data_dir)
        for wanted in ("raft-log", "vote", "leader-epoch-checkpoint", "recovery-point",
                       "clean-shutdown", "aborted-transactions", "topics.json"):
            assert wanted in names, f"no {wanted} under {b.data_dir}: {sorted(names)}"
        for suffix in (".log", ".index", ".timeindex", ".snapshot"):
            assert any(n.endswith(suffix) for n in names), f"no *{suffix} under {b.data_dir}"
        assert any(n.endswith(".log") for n in names_under(b.data_dir / "cold")), "nothing in the cold tier"
        assert (b.data_dir / "cold-cache").is_dir()
    finally:
        b.close()


def test_a_data_directory_open_to_others_is_closed_at_start_with_a_warning(tmp_path):
    """A data directory an older version (or an operator's mkdir) left at 755: the node
    makes it 700 before it opens anything, says so at WARN, and what it writes there from
    then on is 700 / 600."""
    from confluent_kafka import Producer

    b = Broker(strata_bin(), tmp_path)
    b.data_dir.chmod(0o755)
    (b.data_dir / "left-by-an-operator").write_text("notes\n")
    (b.data_dir / "left-by-an-operator").chmod(0o644)
    b.preexec = umask_022
    b.start()
    try:
        assert stat.S_IMODE(b.data_dir.stat().st_mode) == 0o700, b.stderr_tail()
        log = b.stderr_path.read_text(errors="replace")
        warned = [line for line in log.splitlines() if "the data directory was open to other users" in line]
        assert len(warned) == 1 and "WARN" in warned[0] and "755" in warned[0], log[-3000:]
        p = Producer(rdkafka_conf({"bootstrap.servers": b.bootstrap, "acks": "all"}))
        b.create_topic("orders", 1)
        p.produce("orders", b"one")
        assert p.flush(30) == 0
        assert b.stop() == 0
        # Only what the node did not create keeps its mode (nobody else can reach it now).
        bad, _ = open_to_others(b.data_dir)
        assert bad == [f"{b.data_dir / 'left-by-an-operator'} 644"], "\n".join(bad)
        # A second start finds nothing to close.
        b.start()
        b.create_topic("payments", 1)  # up, its signal handlers in place
        assert b.stop() == 0
        log = b.stderr_path.read_text(errors="replace")
        assert log.count("the data directory was open to other users") == 1, log[-3000:]
    finally:
        b.close()


def test_strata_dev_secure_serves_metrics_over_https_with_basic_auth_only(tmp_path):
    """`strata dev --secure --metrics ...`: plain HTTP gets nothing, HTTPS without the
    password or with a wrong one gets 401, the credentials the start-up message names get
    the metrics; the generated password and every other file it makes (certificates, keys,
    the admin password) are 600 in 700 directories."""
    binary = strata_bin()
    kafka, controller, grpc_port, metrics = free_port(), free_port(), free_port(), free_port()
    data = tmp_path / "data"
    out = open(tmp_path / "dev.log", "ab")
    proc = subprocess.Popen(
        [binary, "dev", "--secure", "--data-dir", str(data), "--listen", f"127.0.0.1:{kafka}",
         "--controller-listen", f"127.0.0.1:{controller}", "--grpc", f"127.0.0.1:{grpc_port}",
         "--metrics", f"127.0.0.1:{metrics}"],
        stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=dict(os.environ, NO_COLOR="1"),
        preexec_fn=umask_022)
    certs = data / "certs"
    admin_tls = dict(os.environ, RUST_BACKTRACE="0", STRATA_TLS_CA=str(certs / "ca.pem"),
                     STRATA_TLS_CERT=str(certs / "client-admin.pem"), STRATA_TLS_KEY=str(certs / "client-admin.key"))
    log = lambda: (tmp_path / "dev.log").read_text(errors="replace")
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log()[-4000:]
            assert time.monotonic() < deadline, "never ready:\n" + log()[-4000:]
            if port_accepts(controller) and port_accepts(metrics):
                r = subprocess.run([binary, "quorum", "metadata", "--controller", f"127.0.0.1:{controller}"],
                                   capture_output=True, text=True, timeout=30, env=admin_tls)
                if r.returncode == 0 and "admin" in json.loads(r.stdout)["scram_credentials"]:
                    break
            time.sleep(0.2)

        # Plain HTTP: no answer at all (the port speaks TLS only).
        for path in ("/metrics", "/readyz"):
            with pytest.raises((OSError, http.client.HTTPException)):
                urllib.request.urlopen(f"http://127.0.0.1:{metrics}{path}", timeout=10).read()

        # The start-up message says how to scrape.
        said = re.search(r'curl --cacert (\S+) -u "([^:"]+):\$\(cat (\S+)\)" (https://\S+/metrics)', log())
        assert said, "the start-up message does not say how to scrape /metrics:\n" + log()[-4000:]
        ca, user, password_file, url = said.groups()
        assert url == f"https://127.0.0.1:{metrics}/metrics" and ca == str(certs / "ca.pem"), said.group(0)
        password = open(password_file).read().strip()
        assert password and password not in log(), "the metrics password is printed or logged"
        assert stat.S_IMODE(os.stat(password_file).st_mode) == 0o600
        ctx = ssl.create_default_context(cafile=ca)

        def scrape(credentials):
            req = urllib.request.Request(url)
            if credentials is not None:
                req.add_header("Authorization", "Basic " + base64.b64encode(credentials.encode()).decode())
            return urllib.request.urlopen(req, timeout=10, context=ctx)

        admin_password = (data / "admin.password").read_text().strip()
        for credentials in (None, f"{user}:wrong", f"admin:{admin_password}"):
            with pytest.raises(urllib.error.HTTPError) as e:
                scrape(credentials)
            assert e.value.code == 401, credentials
        text = scrape(f"{user}:{password}").read().decode()
        assert "strata_build_info" in text and password not in text and admin_password not in text
        # Probes stay open to kubelets (over TLS), and name no data.
        assert urllib.request.urlopen(f"https://127.0.0.1:{metrics}/livez", timeout=10, context=ctx).status == 200
        assert proc.poll() is None

        seen = assert_private(data)
        assert {"admin.password", "metrics.password", "ca.pem", "ca.key", "node-broker-1.pem",
                "client-admin.pem", "raft-log"} <= names_under(data), seen
    finally:
        stop_process(proc)
        out.close()
