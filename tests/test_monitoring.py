"""/metrics read by a real Prometheus parser, and the alert rules and Grafana dashboard in
docs/monitoring/ checked against the names Strata exports (issue 18)."""

import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import yaml
from confluent_kafka import Consumer, Producer
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from conftest import free_port, port_accepts, strata_bin

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "docs" / "monitoring"


def families(port: int) -> dict:
    """{family name: Metric} from /metrics, parsed by prometheus_client's OpenMetrics parser,
    which refuses a family split into several blocks, a sample outside its family, a
    missing `# EOF` and a malformed line."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text"), r.headers
        text = r.read().decode()
    out = {}
    for f in text_string_to_metric_families(text):
        assert f.name not in out, f"family {f.name} appears twice"
        assert f.documentation, f"family {f.name} has no HELP"
        out[f.name] = f
    return out


def samples(f) -> dict:
    return {tuple(sorted(s.labels.items())): s.value for s in f.samples if not s.name.endswith(("_bucket", "_created"))}


def test_a_broker_and_a_controller_expose_metrics_a_prometheus_parser_accepts(broker, tmp_path):
    """Python's prometheus_client read strata_partition_high_watermark as 57 separate
    families (the samples of three families were interleaved), some families had no HELP
    and a controller-only process served no /metrics. Now each family is one block, and a
    broker's and a controller's metrics parse."""
    for topic in ("settlements", "payments"):
        broker.create_topic(topic, 3)
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for i in range(300):
        p.produce("settlements", value=b"x" * 100, partition=i % 3)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "ledger", "auto.offset.reset": "earliest"})
    c.subscribe(["settlements"])
    got, deadline = 0, time.monotonic() + 30
    while got < 300 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got += 1
    c.commit(asynchronous=False)
    c.close()
    assert got == 300

    f = families(broker.metrics_port)
    hw = samples(f["strata_partition_high_watermark"])
    assert sum(v for k, v in hw.items() if ("topic", "settlements") in k) == 300, hw
    assert len([k for k in hw if ("topic", "payments") in k]) == 3, hw
    bytes_in = samples(f["strata_topic_bytes_in"])
    assert bytes_in[(("topic", "settlements"),)] >= 300 * 100, bytes_in
    assert bytes_in[(("topic", "payments"),)] == 0, bytes_in
    assert samples(f["strata_topic_bytes_out"])[(("topic", "settlements"),)] >= 300 * 100
    sizes = samples(f["strata_partition_size_bytes"])
    assert sum(v for k, v in sizes.items() if ("topic", "settlements") in k) >= 300 * 100, sizes
    requests = samples(f["strata_kafka_requests"])
    for api in ("Produce", "Fetch", "Metadata", "ApiVersions", "JoinGroup", "OffsetCommit"):
        assert requests.get((("api", api),), 0) > 0, (api, requests)
    assert f["strata_kafka_request_latency_seconds"].type == "histogram"
    produce = [s for s in f["strata_kafka_request_latency_seconds"].samples
               if s.labels.get("api") == "Produce" and s.name.endswith("_count")]
    assert produce and produce[0].value == requests[(("api", "Produce"),)]
    assert f["strata_build"].type == "info"
    assert f["process_cpu_seconds"].type == "counter"
    assert 1e6 < samples(f["process_resident_memory_bytes"])[()] < 4e9
    assert samples(f["process_open_fds"])[()] > 0 and samples(f["process_max_fds"])[()] > 0
    assert abs(samples(f["process_start_time_seconds"])[()] - time.time()) < 3600
    # A single node runs the controller too: it is active and reports offline partitions once.
    assert samples(f["strata_controller_active"])[()] == 1
    assert samples(f["strata_offline_partitions"])[()] == 0
    assert samples(f["strata_ready"])[()] == 1
    assert samples(f["strata_group_lag_records"])  # the group committed

    # A controller-only process (a one-voter quorum).
    port, metrics_port = free_port(), free_port()
    config = tmp_path / "controller.toml"
    config.write_text(f'roles = ["controller"]\ndata_dir = "{tmp_path / "controller"}"\n'
                      f'[controller]\nnode_id = 1\nlisten = "127.0.0.1:{port}"\n[controller.voters]\n1 = "127.0.0.1:{port}"\n'
                      f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n')
    proc = subprocess.Popen([strata_bin(), "server", "--config", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "NO_COLOR": "1"})
    try:
        deadline = time.monotonic() + 30
        while True:
            if port_accepts(metrics_port):
                f = families(metrics_port)
                if samples(f["strata_controller_active"])[()] == 1:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "the controller did not become active"
            time.sleep(0.2)
        assert samples(f["strata_controller_raft_voters"])[()] == 1
        assert samples(f["strata_controller_raft_term"])[()] >= 1
        assert samples(f["strata_cluster_brokers"])[()] == 0
        assert "strata_produce_requests" not in f  # no broker role here
        assert f["process_cpu_seconds"].type == "counter"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def exported() -> set:
    """Every sample name Strata's /metrics can carry: the names hot/src/metrics.rs declares,
    with a histogram's `_bucket`/`_sum`/`_count` and an info's `_info`."""
    source = (ROOT / "hot" / "src" / "metrics.rs").read_text()
    names = set(re.findall(r'"((?:strata|process)_[a-z0-9_]+)"', source))
    assert len(names) > 60, names
    out = set(names)
    for n in names:
        out |= {f"{n}_bucket", f"{n}_sum", f"{n}_count", f"{n}_info"}
    return out


def metric_names(expr: str) -> set:
    return set(re.findall(r"\b((?:strata|process)_[a-z0-9_]+)", expr))


def test_alert_rules_and_the_dashboard_name_only_exported_metrics():
    names = exported()
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"]]
    assert len(alerts) >= 10
    for r in alerts:
        used = metric_names(r["expr"])
        assert used, f"{r['alert']} names no Strata metric"
        assert used <= names, f"{r['alert']} names {used - names}, which Strata does not export"
        assert r["expr"].count("(") == r["expr"].count(")"), r["alert"]
        assert r["labels"]["severity"] in ("page", "ticket") and r["annotations"]["summary"], r
    by_name = {r["alert"]: r for r in alerts}
    # the seed's scale-out signals
    assert "strata_under_replicated_partitions" in by_name["StrataUnderReplicatedPartitions"]["expr"]
    assert by_name["StrataUnderReplicatedPartitions"]["for"] == "2m"
    assert by_name["StrataControllerQueueRising"]["expr"].count("delta(strata_controller_pending_proposals") == 3

    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 20
    for e in exprs:
        used = metric_names(e)
        assert used and used <= names, (e, used - names)
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
