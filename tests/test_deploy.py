"""The container image and the systemd unit in deploy/ (issue 18, item 2).

No container runtime can pull a base image on the test machines (podman installs from
Debian, but no registry is reachable), so the image is not built here. What is checked:
hadolint (from PyPI, tests/requirements.txt) finds nothing in deploy/Dockerfile; its
structure (multi-stage, locked release build of the three binaries, stripped, non-root,
the ports and the volume of the config it ships); that the config the image ships is valid
and runs a node that serves clients and stops cleanly on SIGTERM well inside the unit's
TimeoutStopSec; and the unit through `systemd-analyze verify` and `systemd-analyze security`
(when systemd-analyze exists) plus its limits and hardening.
"""

import fnmatch
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from conftest import free_port, port_accepts, strata_bin

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
UNIT = DEPLOY / "strata.service"
IMAGE_CONFIG = DEPLOY / "strata.toml"


# --- the Dockerfile -------------------------------------------------------------------------


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments out."""
    out, current = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        current += " " + stripped[:-1] if stripped.endswith("\\") else " " + stripped
        if not stripped.endswith("\\"):
            word, _, rest = current.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            current = ""
    return out


def stages(path: Path) -> list[list[tuple[str, str]]]:
    out = []
    for ins in instructions(path):
        if ins[0] == "FROM":
            out.append([])
        assert out, f"{ins} before the first FROM"
        out[-1].append(ins)
    return out


def hadolint() -> str | None:
    here = Path(sys.executable).parent / "hadolint"
    return str(here) if here.exists() else shutil.which("hadolint")


def test_hadolint_finds_nothing_in_the_dockerfile(tmp_path):
    lint = hadolint()
    if lint is None:
        pytest.skip("hadolint is not installed (pip install -r tests/requirements.txt)")
    # The linter is live: a careless Dockerfile gets findings.
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM debian\nRUN apt-get update && apt-get install -y curl\nRUN cd /tmp\n")
    r = subprocess.run([lint, "--no-color", str(careless)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "DL3006" in r.stdout and "DL3008" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([lint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip(), f"hadolint:\n{r.stdout}{r.stderr}"


def test_the_image_is_a_locked_release_build_run_stripped_and_unprivileged():
    s = stages(DOCKERFILE)
    assert len(s) >= 2, "not a multi-stage build"
    builder, runtime = s[0], s[-1]
    base = builder[0][1].split()
    assert base[0].startswith("rust:") and base[-2].upper() == "AS", builder[0]
    builder_name = base[-1]
    # The builder's Rust is at least the workspace's rust-version.
    want = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["rust-version"]
    have = re.match(r"rust:(\d+\.\d+)", base[0]).group(1)
    assert tuple(map(int, have.split("."))) >= tuple(map(int, want.split("."))), (have, want)

    runs = " ".join(a for i, a in builder if i == "RUN")
    build = re.search(r"cargo build ([^&]*)", runs).group(1)
    assert "--release" in build and "--locked" in build, build
    binaries = {"strata", "strata-replay", "strata-compactor"}
    assert set(re.findall(r"--bin (\S+)", build)) == binaries, build
    env = " ".join(a for i, a in builder if i == "ENV")
    assert "CARGO_PROFILE_RELEASE_STRIP=symbols" in env or re.search(r"\bstrip\b", runs), "binaries not stripped"

    # The runtime: a minimal glibc base, the three binaries from the builder, not root.
    image = runtime[0][1].split()[0]
    assert image.startswith(("gcr.io/distroless/cc-debian12", "debian:bookworm-slim")), image
    assert ":" in image and not image.endswith(":latest"), f"unpinned base {image}"
    copied = [a for i, a in runtime if i == "COPY" and f"--from={builder_name}" in a]
    assert any("/usr/local/bin" in a for a in copied), copied
    for b in binaries:
        assert re.search(rf"\bcp\b[^&]*target/release/{b}\b", runs), f"{b} is not copied out of the build"
    users = [a for i, a in runtime if i == "USER"]
    assert users, "the runtime stage runs as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users
    assert [a for i, a in runtime if i == "ENTRYPOINT"] == ['["/usr/local/bin/strata"]']

    # The ports the shipped config listens on are exposed, and its data directory is the
    # volume, owned by the user the process runs as.
    config = tomllib.loads(IMAGE_CONFIG.read_text())
    listens = [config["kafka"]["listen"], config["grpc"]["listen"], config["metrics"]["listen"],
               config["controller"]["listen"]]
    exposed = {p for i, a in runtime if i == "EXPOSE" for p in a.split()}
    assert {l.rsplit(":", 1)[1] for l in listens} <= exposed, (listens, exposed)
    volumes = [a for i, a in runtime if i == "VOLUME"]
    assert volumes and config["data_dir"] in volumes[0], (volumes, config["data_dir"])
    assert any(config["data_dir"] in a and f"--chown={users[-1]}" in a for i, a in runtime if i == "COPY"), \
        "the data directory is not owned by the image's user"
    config_copy = next(a for i, a in runtime if i == "COPY" and "strata.toml" in a).split()
    cmd = [a for i, a in runtime if i == "CMD"][-1]
    assert config_copy[-1] in cmd and "server" in cmd, (config_copy, cmd)


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore's patterns leave `path` (relative) out of the build context."""
    out = False
    for p in patterns:
        neg = p.startswith("!")
        pat = p[1:] if neg else p
        parts = path.split("/")
        hit = any(fnmatch.fnmatch("/".join(parts[:n]), pat) or fnmatch.fnmatch("/".join(parts[:n]), pat.replace("**/", ""))
                  for n in range(1, len(parts) + 1))
        if hit:
            out = not neg
    return out


def test_the_build_context_holds_what_the_build_reads():
    patterns = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines()
                if l.strip() and not l.startswith("#")]
    assert ignored("target/release/strata", patterns) and ignored(".git/HEAD", patterns)
    assert ignored("hot/target/x", patterns)
    workspace = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]
    needed = ["Cargo.toml", "Cargo.lock", "third_party/kafka-protocol/Cargo.toml"]
    needed += [f"{m}/Cargo.toml" for m in workspace["members"]]
    needed += [f"{m}/src/lib.rs" for m in workspace["members"] if (ROOT / m / "src" / "lib.rs").exists()]
    needed += ["proto/build.rs", "hot/src/main.rs"]
    needed += [str(f.relative_to(ROOT)) for f in (ROOT / "proto" / "proto").rglob("*.proto")]
    for i, a in instructions(DOCKERFILE):
        if i == "COPY" and "--from=" not in a and a.split()[0] != ".":
            needed.append(a.split()[-2])
    for n in needed:
        assert (ROOT / n).exists(), f"{n} is missing from the repository"
        assert not ignored(n, patterns), f".dockerignore leaves {n} out of the build context"


def test_the_image_config_runs_a_node_that_serves_and_stops_cleanly(tmp_path):
    """The config baked into the image (ports moved off the defaults, data in a temporary
    directory, as `-e STRATA__...` would): `strata config check` accepts it, the node gets
    ready, takes a topic and records, and stops cleanly on SIGTERM inside TimeoutStopSec."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    binary = strata_bin()
    ports = {k: free_port() for k in ("kafka", "grpc", "metrics", "controller")}
    env = dict(os.environ, NO_COLOR="1",
               STRATA__DATA_DIR=str(tmp_path / "data"),
               STRATA__KAFKA__LISTEN=f"127.0.0.1:{ports['kafka']}",
               STRATA__KAFKA__ADVERTISED_HOST="127.0.0.1",
               STRATA__GRPC__LISTEN=f"127.0.0.1:{ports['grpc']}",
               STRATA__METRICS__LISTEN=f"127.0.0.1:{ports['metrics']}",
               STRATA__CONTROLLER__LISTEN=f"127.0.0.1:{ports['controller']}",
               STRATA__CONTROLLER__VOTERS__1=f"127.0.0.1:{ports['controller']}",
               STRATA__CLUSTER__CONTROLLERS=f"127.0.0.1:{ports['controller']}")
    check = subprocess.run([binary, "config", "check", str(IMAGE_CONFIG)], capture_output=True, text=True, env=env, timeout=30)
    assert check.returncode == 0, check.stderr
    assert f'listen = "127.0.0.1:{ports["kafka"]}"' in check.stdout

    log = open(tmp_path / "node.log", "wb")
    proc = subprocess.Popen([binary, "server", "--config", str(IMAGE_CONFIG)], stdout=log, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "node.log").read_text()
            assert time.monotonic() < deadline, "not ready in 30 s:\n" + (tmp_path / "node.log").read_text()[-3000:]
            if port_accepts(ports["metrics"]):
                try:
                    if urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/readyz", timeout=2).status == 200:
                        break
                except OSError:
                    pass
            time.sleep(0.2)
        bootstrap = f"127.0.0.1:{ports['kafka']}"
        r = subprocess.run([binary, "topic", "--bootstrap", bootstrap, "create", "image-check", "-p", "2"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(200):
            p.produce("image-check", value=f"v{i}".encode(), partition=i % 2)
        assert p.flush(30) == 0
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
        got = []
        c.assign([TopicPartition("image-check", part, 0) for part in (0, 1)])
        end = time.monotonic() + 30
        while len(got) < 200 and time.monotonic() < end:
            for m in c.consume(200, timeout=0.5):
                assert m.error() is None, m.error()
                got.append(m.value().decode())
        c.close()
        assert sorted(got) == sorted(f"v{i}" for i in range(200))

        stop_sec = int(unit_settings()["TimeoutStopSec"][-1])
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=stop_sec)
        took = time.monotonic() - started
        print(f"SIGTERM to exit: {took:.2f} s (TimeoutStopSec={stop_sec})")
        assert rc == 0, (rc, (tmp_path / "node.log").read_text()[-3000:])
        assert took < stop_sec / 4
        text = (tmp_path / "node.log").read_text()
        assert "closed cleanly" in text, text[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


# --- the systemd unit -----------------------------------------------------------------------


def unit_settings() -> dict:
    """{key: [values]} of the unit's [Service] section (repeated keys kept in order)."""
    out, section = {}, None
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key}" if section != "Service" else key, []).append(value)
    return out


def test_the_unit_keeps_descriptors_restarts_and_allows_a_controlled_shutdown():
    s = unit_settings()
    one = lambda k: s[k][-1]  # noqa: E731
    assert one("Restart") == "on-failure"
    assert one("User") not in ("root", "0") and one("User") == one("Group")
    # Descriptors: one per segment, connection and cold-cache file; the default
    # kafka.max_connections alone is 4,096 (a limit that small warns at start).
    assert int(one("LimitNOFILE")) >= 65536
    # The controlled shutdown's own bound, from the code, must fit well inside the stop
    # timeout, with room to close every partition after it.
    server = (ROOT / "hot" / "src" / "server.rs").read_text()
    bound = int(re.search(r"timeout\(std::time::Duration::from_secs\((\d+)\),\s*membership\)", server).group(1))
    assert int(one("TimeoutStopSec")) >= bound + 60, (bound, one("TimeoutStopSec"))
    assert one("KillSignal") == "SIGTERM"
    # Hardening.
    assert one("NoNewPrivileges") == "yes"
    assert one("ProtectSystem") == "strict"
    assert one("CapabilityBoundingSet") == ""
    config = tomllib.loads(IMAGE_CONFIG.read_text())
    assert config["data_dir"] in one("ReadWritePaths").split()
    exec_start = one("ExecStart").split()
    assert exec_start[:2] == ["/usr/local/bin/strata", "server"] and "--config" in exec_start
    assert "/etc/strata/strata.toml" in exec_start
    # The descriptor limit is raised at start (setrlimit), so @resources must stay allowed.
    assert all("@resources" not in f for f in s.get("SystemCallFilter", []))


def unit_for_this_machine(tmp_path) -> Path:
    """The unit with its binary path pointed at the built `strata` (verify checks it)."""
    path = tmp_path / "strata.service"
    path.write_text(UNIT.read_text().replace("/usr/local/bin/strata", str(Path(strata_bin()).resolve())))
    return path


def systemd_analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    return tool


def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    tool = systemd_analyze()
    unit = unit_for_this_machine(tmp_path)
    r = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "strata.service" not in r.stdout + r.stderr, r.stdout + r.stderr
    # verify is live: an unknown key and a bad limit are reported.
    bad = tmp_path / "bad" / "strata.service"
    bad.parent.mkdir()
    bad.write_text(unit.read_text().replace("LimitNOFILE=1048576", "LimitNOFILE=lots\nRestartEvery=1"))
    r = subprocess.run([tool, "verify", str(bad)], capture_output=True, text=True, timeout=60)
    assert "lots" in r.stderr and "RestartEvery" in r.stderr, r.stderr


def test_systemd_analyze_security_rates_the_unit_ok(tmp_path):
    tool = systemd_analyze()
    unit = unit_for_this_machine(tmp_path)
    r = subprocess.run([tool, "security", "--offline=true", "--no-pager", str(unit)],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0 and "offline" in r.stderr:
        pytest.skip(f"this systemd-analyze has no offline security check: {r.stderr.strip()}")
    m = re.search(r"Overall exposure level for strata.service: (\d+\.\d+)", r.stdout)
    assert m, r.stdout[-2000:] + r.stderr
    print(f"systemd-analyze security: exposure {m.group(1)}")
    # 0 is locked down, 10 is fully exposed; systemd calls up to 2.0 "OK".
    assert float(m.group(1)) <= 2.0, r.stdout
