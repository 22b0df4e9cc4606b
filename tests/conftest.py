"""Shared fixtures for the real-client and process tests.

The `broker` fixture runs the `strata` binary (``STRATA_BIN``, default
``target/debug/strata``) as a separate process on a free port with a temporary data dir.
"""

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_BIN = REPO / "target" / "debug" / "strata"

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
STDERR_TAIL_LINES = 80


def strata_bin() -> str:
    path = Path(os.environ.get("STRATA_BIN", str(DEFAULT_BIN)))
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"strata binary not found or not executable at {path}; build it with "
            f"`cargo build -p strata-hot` or set STRATA_BIN",
            pytrace=False,
        )
    return str(path)


_handed_out: set[int] = set()


def free_port() -> int:
    """A port free now and never handed out before in this test run: the kernel may give
    a just-released port again, and two listeners of one cluster must not get the same."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def port_accepts(port: int) -> bool:
    return port_accepts_at("127.0.0.1", port)


def port_accepts_at(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def stop_process(proc: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def scrape_metrics(port: int, timeout: float = 10) -> dict:
    """{metric line without its value: value} from a /metrics endpoint on 127.0.0.1."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


class Broker:
    """A strata broker process that can be killed and restarted on the same dir and port."""

    def __init__(self, binary: str, workdir: Path):
        self.binary = binary
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.stderr_path = workdir / "broker.stderr"
        self.port = free_port()
        self.controller_port = free_port()
        self.metrics_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc = None
        # Run in the child before exec (e.g. resource limits for disk-full tests).
        self.preexec = None
        self.starts = 0
        # Extra environment (e.g. STRATA__COLD__URL) for the broker process.
        self.extra_env = {}
        self._stderr_file = None

    # --- process control -------------------------------------------------------------

    def start(self):
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        self.starts += 1
        if self._stderr_file is not None:
            self._stderr_file.close()
        self._stderr_file = open(self.stderr_path, "ab")
        self._stderr_file.write(f"\n===== strata start #{self.starts} =====\n".encode())
        self._stderr_file.flush()
        env = dict(os.environ)
        env.update(self.extra_env)
        env.setdefault("RUST_BACKTRACE", "1")
        env.setdefault("NO_COLOR", "1")  # plain log lines in the stderr file
        self.proc = subprocess.Popen(
            [
                self.binary,
                "dev",
                "--data-dir",
                str(self.data_dir),
                "--listen",
                self.bootstrap,
                "--controller-listen",
                f"127.0.0.1:{self.controller_port}",
                "--metrics",
                f"127.0.0.1:{self.metrics_port}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._stderr_file,
            stderr=self._stderr_file,
            env=env,
            preexec_fn=self.preexec,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"strata exited with status {self.proc.returncode} during startup\n"
                    + self.stderr_tail(),
                    pytrace=False,
                )
            if port_accepts(self.port):
                return
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        pytest.fail(
            f"strata did not accept on {self.bootstrap} within {START_TIMEOUT_S}s\n"
            + self.stderr_tail(),
            pytrace=False,
        )

    def kill(self):
        """SIGKILL: a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S. Returns the exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(
                    f"strata did not exit within {STOP_TIMEOUT_S}s of SIGTERM\n"
                    + self.stderr_tail()
                )
        return self.proc.returncode

    def restart(self):
        """Start again on the same data dir and port (after kill() or stop())."""
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
        self.start()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # --- helpers -----------------------------------------------------------------------

    def cli(self, *args, timeout=30, check=True) -> subprocess.CompletedProcess:
        cmd = [self.binary, "topic", "--bootstrap", self.bootstrap, *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} exited {res.returncode}\nstdout:\n{res.stdout}\n"
                f"stderr:\n{res.stderr}\n" + self.stderr_tail()
            )
        return res

    def create_topic(self, name: str, partitions: int, configs: dict | None = None):
        args = ["create", name, "-p", str(partitions)]
        for k, v in (configs or {}).items():
            args += ["--config", f"{k}={v}"]
        return self.cli(*args)

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        try:
            if self._stderr_file is not None:
                self._stderr_file.flush()
            text = self.stderr_path.read_text(errors="replace").splitlines()
        except OSError as e:
            return f"(no broker stderr: {e})"
        return (
            f"--- last {min(lines, len(text))} lines of broker stderr ({self.stderr_path}) ---\n"
            + "\n".join(text[-lines:])
        )

    def close(self):
        try:
            self.stop()
        finally:
            if self._stderr_file is not None:
                self._stderr_file.close()
                self._stderr_file = None


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture
def broker(request, tmp_path):
    b = Broker(strata_bin(), tmp_path)
    b.start()
    try:
        yield b
    finally:
        failed = any(
            getattr(request.node, "rep_" + when, None) is not None
            and getattr(request.node, "rep_" + when).failed
            for when in ("setup", "call")
        )
        try:
            b.close()
        finally:
            if failed:
                request.node.add_report_section("teardown", "broker stderr", b.stderr_tail())


def kcat_bin() -> str:
    path = os.environ.get("KCAT", shutil.which("kcat") or shutil.which("kafkacat") or "")
    if not path:
        pytest.fail("kcat not found on PATH (set KCAT)", pytrace=False)
    return path


# --- shared verification helpers ----------------------------------------------------------

N_RECORDS = 100_000
N_KEYS = 1000


def record_key(i: int) -> str:
    return f"key-{i % N_KEYS}"


def rdkafka_conf(conf: dict) -> dict:
    """librdkafka config, with STRATA_TEST_RDKAFKA_DEBUG (e.g. protocol,broker,msg,fetch) applied."""
    debug = os.environ.get("STRATA_TEST_RDKAFKA_DEBUG")
    if debug:
        conf["debug"] = debug
    return conf


def record_value(i: int) -> str:
    return f"value-{i}"


def parse_value(v) -> int:
    if isinstance(v, (bytes, bytearray)):
        v = v.decode()
    assert v.startswith("value-"), f"unexpected value {v!r}"
    return int(v[len("value-"):])


def check_partitions(per_partition: dict, n_expected: int | None, n_partitions: int):
    """per_partition: {partition: [(offset, key, value_int), ...]} in consumed order.

    Asserts offsets are contiguous from 0, values increase within each partition, every
    value in range(n_expected) appears exactly once (if n_expected is given), and each key
    maps to one partition.
    """
    assert set(per_partition) <= set(range(n_partitions)), sorted(per_partition)
    seen = {}
    key_partition = {}
    for p, recs in sorted(per_partition.items()):
        offsets = [r[0] for r in recs]
        assert offsets == list(range(len(recs))), (
            f"partition {p}: offsets not contiguous from 0; first bad index "
            f"{next(i for i, o in enumerate(offsets) if o != i)}"
        )
        prev = -1
        for off, key, v in recs:
            assert v > prev, f"partition {p} offset {off}: value {v} after {prev}"
            prev = v
            if v in seen:
                raise AssertionError(f"value {v} seen twice: {seen[v]} and {(p, off)}")
            seen[v] = (p, off)
            if key is not None:
                kp = key_partition.setdefault(key, p)
                assert kp == p, f"key {key} in partitions {kp} and {p}"
                assert key == record_key(v), f"value {v} has key {key}"
    if n_expected is not None:
        missing = n_expected - len(seen)
        assert len(seen) == n_expected and set(seen) == set(range(n_expected)), (
            f"expected values 0..{n_expected}, got {len(seen)} distinct "
            f"({missing} missing, e.g. {sorted(set(range(n_expected)) - set(seen))[:10]})"
        )
    return seen


def consume_partitions(bootstrap: str, topic: str, partitions: int, deadline: float, extra: dict | None = None):
    """Reads every partition of `topic` from offset 0 up to its high watermark with
    confluent-kafka (assign(), no group). Returns ({partition: [(offset, key, value_int)]},
    {partition: high_watermark}); fails the test if `deadline` (monotonic) passes first."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": "strata-test-unused",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
    }
    conf.update(extra or {})
    consumer = Consumer(rdkafka_conf(conf))
    try:
        hwm = {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            assert low == 0, f"partition {p}: log start {low}"
            hwm[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out = {p: [] for p in range(partitions)}
        done = {p for p in range(partitions) if hwm[p] == 0}
        while len(done) < partitions:
            assert time.monotonic() < deadline, (
                f"consuming ran out of time: {[len(out[p]) for p in out]} of {hwm}"
            )
            for msg in consumer.consume(num_messages=10000, timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= hwm[msg.partition()]:
                            done.add(msg.partition())
                        continue
                    raise KafkaException(err)
                p = msg.partition()
                key = msg.key().decode() if msg.key() is not None else None
                out[p].append((msg.offset(), key, parse_value(msg.value())))
                if msg.offset() + 1 >= hwm[p]:
                    done.add(p)
        return out, hwm
    finally:
        consumer.close()
