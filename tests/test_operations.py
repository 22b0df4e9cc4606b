"""Operating Strata (issue 18): health endpoints on every role, bound before the roles
recover; the gRPC health service; JSON logs; environment overrides and `strata config
check` against the real binary."""

import json
import os
import signal
import subprocess
import time
import tomllib
import urllib.error
import urllib.request

import grpc

from conftest import scrape_metrics, strata_bin
from test_cluster import Cluster, attach_logs_on_failure


def probe(port: int, path: str) -> tuple[int, str]:
    """(HTTP status, body) of GET `path` on 127.0.0.1:`port`; (0, why) when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def wait_probe(port: int, path: str, status: int, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        got, body = probe(port, path)
        if got == status:
            return body
        assert time.monotonic() < deadline, f"{path} on {port}: {got} {body!r}, expected {status}"
        time.sleep(0.1)


def grpc_health(port: int) -> int:
    """The overall status grpc.health.v1.Health/Check gives (1 SERVING, 2 NOT_SERVING)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda _: b"",  # service "": the whole node
                                    response_deserializer=lambda b: b)
        answer = check(None, timeout=5)
    # HealthCheckResponse { status = 1: enum }: tag 0x08, then the value
    assert answer[:1] == b"\x08" and len(answer) == 2, answer
    return answer[1]


def wait_grpc_health(port: int, status: int, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while (got := grpc_health(port)) != status:
        assert time.monotonic() < deadline, f"gRPC health on {port} stayed {got}, expected {status}"
        time.sleep(0.2)


def test_every_role_answers_health_probes_before_it_is_ready_and_says_why(request, tmp_path):
    """`/healthz` and `/ready` answered 404, /metrics was bound only after a broker had
    registered, and a controller-only process served nothing over HTTP. Now every role binds
    /livez, /readyz and /metrics first: a broker waiting for its controllers is alive and
    not ready (and says why), a lone controller of three is not ready until a quorum forms,
    and offline partitions are reported once, by the active controller."""
    c = Cluster(strata_bin(), tmp_path)
    try:
        c.start("broker-1")
        b1 = c.metrics_ports[1]
        assert probe(b1, "/livez") == (200, "alive\n")
        status, why = probe(b1, "/readyz")
        assert status == 503 and "not registered" in why, (status, why)
        c.start("controller-1")
        m1 = c.controller_metrics_ports[1]
        assert probe(m1, "/livez")[0] == 200
        status, why = probe(m1, "/readyz")
        assert status == 503 and "quorum" in why, (status, why)
        assert grpc_health(c.controller_ports[1]) == 2
        lone = scrape_metrics(m1)
        assert lone["strata_controller_active"] == 0 and lone["strata_controller_raft_voters"] == 3
        assert "strata_offline_partitions" not in lone
        c.start("controller-2")
        c.start("controller-3")
        for i in (1, 2, 3):
            wait_probe(c.controller_metrics_ports[i], "/readyz", 200)
            wait_grpc_health(c.controller_ports[i], 1)
        assert wait_probe(b1, "/readyz", 200) == "ready\n"
        wait_grpc_health(c.grpc_ports[1], 1)
        c.start("broker-2")
        c.start("broker-3")
        for i in (2, 3):
            wait_probe(c.metrics_ports[i], "/readyz", 200)
        c.cli("topic", "create", "settlements", "-p", "3", "--replication-factor", "3")
        controllers = {i: scrape_metrics(c.controller_metrics_ports[i]) for i in (1, 2, 3)}
        active = [i for i, m in controllers.items() if m["strata_controller_active"] == 1]
        assert len(active) == 1, controllers
        assert all(("strata_offline_partitions" in m) == (i in active) for i, m in controllers.items())
        assert controllers[active[0]]["strata_offline_partitions"] == 0
        assert controllers[active[0]]["strata_cluster_brokers"] == 3
        for i in (1, 2, 3):
            assert "strata_offline_partitions" not in scrape_metrics(c.metrics_ports[i])
        # Two brokers die: the active controller counts them fenced once their lease lapses.
        c.kill("broker-2")
        c.kill("broker-3")
        deadline = time.monotonic() + 20
        while scrape_metrics(c.controller_metrics_ports[c.leader()])["strata_cluster_fenced_brokers"] != 2:
            assert time.monotonic() < deadline, "two dead brokers were not counted as fenced"
            time.sleep(0.2)
        # The controller majority is lost: the survivor is alive and not ready.
        leader = c.leader()
        others = [i for i in (1, 2, 3) if i != leader]
        c.kill(f"controller-{others[0]}")
        c.kill(f"controller-{others[1]}")
        why = wait_probe(c.controller_metrics_ports[leader], "/readyz", 503, timeout=15)
        assert "quorum" in why, why
        assert probe(c.controller_metrics_ports[leader], "/livez")[0] == 200
        wait_grpc_health(c.controller_ports[leader], 2)
        # A stopping broker says so while its controlled shutdown waits for the controllers.
        c.procs["broker-1"].send_signal(signal.SIGTERM)
        seen = []
        while c.procs["broker-1"].poll() is None and "shutting down" not in (seen or [""])[-1]:
            seen.append(probe(b1, "/readyz")[1])
            time.sleep(0.05)
        assert seen and "not ready: shutting down" in seen[-1], seen[-5:]
        c.procs.pop("broker-1").wait(timeout=30)
    finally:
        c.stop_all()
        attach_logs_on_failure(request, c)


def test_json_logs_are_one_object_a_line(tmp_path):
    """`--log-format json` (and STRATA_LOG_FORMAT=json): a log shipper reads every line."""
    from conftest import Broker

    b = Broker(strata_bin(), tmp_path)
    b.extra_env = {"STRATA_LOG_FORMAT": "json"}
    b.start()
    try:
        b.create_topic("settlements", 1)
    finally:
        b.stop()
    lines = [line for line in b.stderr_path.read_text().splitlines() if line and not line.startswith("=====")]
    records = [json.loads(line) for line in lines]  # each line must be a JSON object
    assert any(r["fields"].get("message") == "strata is ready" for r in records), lines[:20]
    assert all({"timestamp", "level", "target", "fields"} <= r.keys() for r in records), records[:3]
    r = subprocess.run([strata_bin(), "--log-format", "yaml", "config", "check", "x.toml"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "possible values: text, json" in r.stderr, r.stderr


def config_check(path, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([strata_bin(), "config", "check", str(path)], capture_output=True, text=True, timeout=30,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("STRATA__")}, **(env or {})})


def test_config_check_prints_the_effective_config_with_env_overrides(tmp_path):
    """STRATA__TOPICS__DEFAULTS__RETENTION_MS=3600000 ("integer, expected a string"),
    STRATA__ROLES=broker and STRATA__CLUSTER__CONTROLLERS=... ("expected a sequence") were
    refused. Now a value is read as TOML, then as text, then as a comma-separated list, and
    `strata config check` shows what a server would run with."""
    path = tmp_path / "strata.toml"
    path.write_text('node_id = 4\n[kafka]\nlisten = "0.0.0.0:9092"\n')
    r = config_check(path, {
        "STRATA__TOPICS__DEFAULTS__RETENTION_MS": "3600000",
        "STRATA__ROLES": "broker",
        "STRATA__CLUSTER__CONTROLLERS": "10.0.1.1:9093,10.0.2.1:9093,10.0.3.1:9093",
        "STRATA__CLUSTER__RACK": "eu-west-1a",
        "STRATA__KAFKA__IDLE_TIMEOUT": "5m",
    })
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"# {path} is valid."), r.stdout
    effective = tomllib.loads(r.stdout)
    assert effective["node_id"] == 4 and effective["roles"] == ["broker"]
    assert effective["topics"]["defaults"]["retention.ms"] == "3600000"
    assert effective["cluster"]["controllers"] == ["10.0.1.1:9093", "10.0.2.1:9093", "10.0.3.1:9093"]
    assert effective["cluster"]["rack"] == "eu-west-1a"
    assert effective["kafka"]["idle_timeout"] == "5m"
    # defaults filled in
    assert effective["kafka"]["max_connections"] == 4096 and effective["groups"]["max_size"] == 1000
    # The printed config is itself a valid config file.
    again = tmp_path / "effective.toml"
    again.write_text(r.stdout)
    assert config_check(again).returncode == 0

    for text, env, says in [
        ('[kafka]\nmax_connections = "many"\n', {}, "kafka.max_connections: invalid type"),
        ("[kafka]\nlistn = 1\n", {}, "unknown field `listn`"),
        ("", {"STRATA__KAFKA__MAX_CONNECTIONS": "lots"}, "STRATA__KAFKA__MAX_CONNECTIONS=lots"),
        ("", {"STRATA__ROLES": "broker,brokr"}, "unknown variant `brokr`"),
        ("[kafka\n", {}, "parsing config file"),
        ("", {"STRATA__KAFKA__MAX_REQUEST_BYTES": "10"}, "max_request_bytes must be between"),
        ("", {"STRATA__TOPICS__COMPACTION_CHECK_INTERVAL": "0s"}, "compaction_check_interval must be more than 0s"),
        ("", {"STRATA__TOPICS__COMPACTION_MAP_BYTES": "1000"}, "compaction_map_bytes must be at least"),
    ]:
        path.write_text(text)
        r = config_check(path, env)
        assert r.returncode != 0 and says in r.stderr, (text, env, r.stderr)
    r = config_check(tmp_path / "missing.toml")
    assert r.returncode != 0 and "reading config file" in r.stderr, r.stderr
