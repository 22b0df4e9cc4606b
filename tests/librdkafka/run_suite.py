#!/usr/bin/env python3
"""librdkafka's own integration suite against a `strata dev` node.

Fetches librdkafka's source through cargo (the rdkafka-sys crate bundles it, tests/ included),
builds the library and its test runner once (cached under --work-dir; a second build with
OpenSSL and libcurl for the security tests), starts Strata on free ports (with SSL, SASL_SSL
and SASL_PLAINTEXT listeners for the security tests, suite_sets.SECURE), runs the selected
broker tests one test number at a time with a timeout each, and prints a pass/fail/skip
table. Exit status 1 if any selected test failed or timed out, 2 on a setup error (the
message says what to do). Called by scripts/librdkafka-suite.sh; stdlib only: run with the
shim python, tests/librdkafka/secure.py makes the certificates and the SCRAM user, and
tests/librdkafka/oidc_idp.py the identity provider's keys and serves its token endpoints.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
import oidc_idp  # noqa: E402  (its constants; the provider itself runs with the shim python)
import suite_sets  # noqa: E402

CRATE = "rdkafka-sys"
CRATE_VERSION = "4.10.0+2.12.1"
LIBRDKAFKA_VERSION = "2.12.1"
# No SSL, SASL/GSSAPI or libcurl (OIDC): the tests that need SSL or SASL run with the second
# build below (suite_sets.SECURE). --no-download: mklove must not fetch its modules from
# GitHub (they are all in the tarball).
CONFIGURE_FLAGS = ["--no-download", "--disable-ssl", "--disable-gssapi", "--disable-curl",
                   "--enable-zlib", "--enable-zstd"]
# The second build, for the tests with a secure profile (suite_sets.SECURE): OpenSSL (SSL,
# SASL SCRAM) and libcurl (OAUTHBEARER's OIDC token requests, 0126) in a build directory of
# its own (build-secure/), so the plaintext build above and its cache stamp stay as they are.
# GSSAPI (Kerberos) stays off.
SECURE_CONFIGURE_FLAGS = ["--no-download", "--enable-ssl", "--disable-gssapi", "--enable-curl",
                          "--enable-zlib", "--enable-zstd"]
# Debian packages the build needs: (package, file or command that shows it is installed).
APT_PACKAGES = [("gcc", "gcc"), ("g++", "g++"), ("make", "make"), ("pkg-config", "pkg-config"),
                ("zlib1g-dev", "/usr/include/zlib.h"), ("libzstd-dev", "/usr/include/zstd.h"),
                # 0053, 0098, 0101 and 0110 check JSON (statistics, the Java helper's output)
                # with RapidJSON and skip themselves without it
                ("rapidjson-dev", "/usr/include/rapidjson/document.h")]
# and, for the secure build, OpenSSL's and libcurl's headers
SECURE_APT_PACKAGES = APT_PACKAGES + [("libssl-dev", "/usr/include/openssl/ssl.h"),
                                      ("libcurl4-openssl-dev", "curl-config")]
KAFKA_VERSION = "4.0.0"  # TEST_KAFKA_VERSION: Strata serves what Kafka 4.0 serves (Produce v3+, KIP-896)
START_TIMEOUT_S = 30.0

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SUMMARY_ROW = re.compile(
    r"^\|\s*(\S+)\s+\|\s+(PASSED|FAILED|SKIPPED|RUNNING|DNS)\s+\|\s+([0-9.]+)s\s*\|\s?(.*)$")


class SetupError(Exception):
    pass


def say(msg=""):
    print(msg, flush=True)


def run(cmd, log=None, **kw):
    """Run cmd; on failure raise SetupError with the log's tail."""
    if log is None:
        r = subprocess.run(cmd, capture_output=True, text=True, **kw)
        out = r.stdout + r.stderr
    else:
        with open(log, "w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, **kw)
        out = Path(log).read_text(errors="replace")
    if r.returncode != 0:
        tail = "\n".join(out.splitlines()[-25:])
        raise SetupError(f"`{' '.join(map(str, cmd))}` failed (exit {r.returncode})"
                         + (f"; full log: {log}" if log else "") + f"\n{tail}")
    return out


# --- build prerequisites -------------------------------------------------------------------

def ensure_packages(install: bool, packages=APT_PACKAGES):
    missing = [pkg for pkg, probe in packages
               if not (Path(probe).exists() if probe.startswith("/") else shutil.which(probe))]
    if not missing:
        return
    cmd = ["apt-get", "install", "-y", "-qq", *missing]
    if not install:
        raise SetupError(f"missing build packages: {' '.join(missing)}; install them with "
                         f"`sudo apt-get install {' '.join(missing)}` (or run without "
                         f"--no-install)")
    if not shutil.which("apt-get"):
        raise SetupError(f"missing build packages ({' '.join(missing)}) and no apt-get: install "
                         "a C/C++ toolchain, make, pkg-config and the zlib and zstd headers")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    if sudo and not shutil.which("sudo"):
        raise SetupError(f"missing build packages: run `apt-get install {' '.join(missing)}` "
                         "as root")
    say(f"==> installing build packages from Debian: {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        run(sudo + cmd, env=env)
    except SetupError:
        run(sudo + ["apt-get", "update", "-qq"], env=env)
        run(sudo + cmd, env=env)


def fetch_source(work: Path) -> Path:
    """librdkafka's source tree inside the rdkafka-sys crate, brought by `cargo fetch`."""
    if not shutil.which("cargo"):
        raise SetupError("cargo not found on PATH: it fetches librdkafka's source from crates.io "
                         "(install Rust with rustup)")
    man = work / "fetch"
    (man / "src").mkdir(parents=True, exist_ok=True)
    (man / "src" / "lib.rs").write_text("")
    (man / "Cargo.toml").write_text(
        "# Written by tests/librdkafka/run_suite.py: brings librdkafka's source (bundled in\n"
        "# rdkafka-sys, tests/ included) from crates.io. Never built.\n"
        "[package]\nname = \"librdkafka-suite-fetch\"\nversion = \"0.0.0\"\n"
        "edition = \"2021\"\npublish = false\n\n"
        f"[dependencies]\n{CRATE} = \"={CRATE_VERSION}\"\n\n[workspace]\n")
    env = {k: v for k, v in os.environ.items() if k != "CARGO_TARGET_DIR"}
    run(["cargo", "fetch", "--manifest-path", str(man / "Cargo.toml")], env=env)
    meta = json.loads(run(["cargo", "metadata", "--offline", "--format-version", "1",
                           "--manifest-path", str(man / "Cargo.toml")], env=env))
    for pkg in meta["packages"]:
        if pkg["name"] == CRATE and pkg["version"] == CRATE_VERSION:
            src = Path(pkg["manifest_path"]).parent / "librdkafka"
            if not (src / "tests" / "test.c").is_file():
                raise SetupError(f"{src} has no tests/test.c: the crate {CRATE} {CRATE_VERSION} "
                                 "no longer bundles librdkafka's tests")
            return src
    raise SetupError(f"cargo fetched, but `cargo metadata` lists no {CRATE} {CRATE_VERSION}")


def build(work: Path, install: bool, rebuild: bool, secure: bool = False) -> Path:
    """librdkafka and tests/test-runner, built once; returns the tests directory. secure: the
    build with OpenSSL (SECURE_CONFIGURE_FLAGS), in build-secure/."""
    bdir = work / ("build-secure" if secure else "build")
    flags = SECURE_CONFIGURE_FLAGS if secure else CONFIGURE_FLAGS
    packages = SECURE_APT_PACKAGES if secure else APT_PACKAGES
    what = "with OpenSSL and libcurl " if secure else ""
    tree = bdir / f"librdkafka-{LIBRDKAFKA_VERSION}"
    stamp = tree / ".strata-suite-stamp"
    want = json.dumps({"crate": CRATE_VERSION, "configure": flags,
                       "packages": [p for p, _ in packages]})
    runner = tree / "tests" / "test-runner"
    if not rebuild and runner.is_file() and stamp.is_file() and stamp.read_text() == want:
        say(f"==> librdkafka {LIBRDKAFKA_VERSION} {what}and its test runner: cached in {tree}")
        return tree / "tests"
    ensure_packages(install, packages)
    t0 = time.monotonic()
    say(f"==> fetching librdkafka {LIBRDKAFKA_VERSION} ({CRATE} {CRATE_VERSION} from crates.io)")
    src = fetch_source(work)
    say(f"==> building librdkafka {what}and its test runner in {tree} (logs in {bdir})")
    if tree.exists():
        shutil.rmtree(tree)
    bdir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, tree, symlinks=True)
    for p in tree.rglob("*"):  # the registry copy is read-only
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | 0o200)
    jobs = os.environ.get("LRK_JOBS", "2")
    run(["./configure", *flags], log=bdir / "configure.log", cwd=tree)
    if secure and "#define WITH_OAUTHBEARER_OIDC 1" not in (tree / "config.h").read_text():
        raise SetupError(f"librdkafka's configure left OAUTHBEARER OIDC (libcurl) out; see "
                         f"{bdir}/configure.log")
    run(["make", f"-j{jobs}", "libs"], log=bdir / "make-libs.log", cwd=tree)
    run(["make", f"-j{jobs}", "-C", "tests", "build"], log=bdir / "make-tests.log", cwd=tree)
    if not runner.is_file():
        raise SetupError(f"the build finished but {runner} is missing; see {bdir}/make-tests.log")
    stamp.write_text(want)
    say(f"==> built in {time.monotonic() - t0:.0f} s")
    return tree / "tests"


# --- the test list -------------------------------------------------------------------------

def parse_tests(test_c: Path):
    """librdkafka's tests[] table in test.c: [{name, num, local, manual, known_issue, scenario}]."""
    text = test_c.read_text()
    start = text.index("struct test tests[] = {")
    end = text.index("{NULL}", start)
    body = text[start:end]
    out = []
    for m in re.finditer(r"_TEST\(\s*(\w+)\s*,", body):
        # the entry runs to its matching parenthesis
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(body[i], 0)
            i += 1
        entry = body[m.end():i - 1]
        name = m.group(1)
        flags = entry.split(",")[0]
        sc = re.search(r'\.scenario\s*=\s*"([^"]*)"', entry)
        out.append({
            "name": name,
            "num": name[:4],
            "local": "TEST_F_LOCAL" in flags,
            "manual": "TEST_F_MANUAL" in flags,
            "known_issue": re.search(r"TEST_F_KNOWN_ISSUE\b(?!_)", flags) is not None,
            "scenario": sc.group(1) if sc else "default",
        })
    return out


def select(tests, args):
    broker = [t for t in tests if not t["local"] and not t["manual"]]
    nums = sorted({t["num"] for t in broker})
    if args.tests:
        want = [w.strip() for w in args.tests.split(",") if w.strip()]
        bad = [w for w in want if w not in nums]
        if bad:
            raise SetupError(f"not broker tests of librdkafka {LIBRDKAFKA_VERSION}: "
                             f"{', '.join(bad)} (see --list)")
        chosen, run_excluded = set(want), True
    elif args.set == "quick":
        chosen, run_excluded = set(suite_sets.QUICK), False
    else:
        chosen, run_excluded = set(nums), args.set == "all"
    picked = [t for t in broker if t["num"] in chosen]
    return picked, run_excluded


def scenario_of(t):
    # default,ak23 etc.: the first listed scenario is the one we serve
    sc = t["scenario"].split(",")
    return "default" if "default" in sc else sc[0]


# --- the Strata node -----------------------------------------------------------------------

def free_port(taken):
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port


class Strata:
    def __init__(self, binary, rundir: Path, scenario: str, rebalance_delay, ports):
        self.binary, self.scenario, self.ports_taken = binary, scenario, ports
        self.rebalance_delay = rebalance_delay
        self.rundir = rundir
        self.proc = None
        self.starts = 0

    def start(self):
        self.starts += 1
        delay = f"-delay{self.rebalance_delay}" if self.rebalance_delay is not None else ""
        d = self.rundir / f"strata-{self.kind}{self.scenario}{delay}-{self.starts}"
        d.mkdir(parents=True)
        self.port = free_port(self.ports_taken)
        conf = d / "strata.toml"
        lines = ["# librdkafka's test scenarios (tests/scenarios/*.json): auto-creation as the",
                 "# scenario says, 4 partitions per auto-created topic.",
                 "[topics]",
                 f"auto_create = {'false' if self.scenario == 'noautocreate' else 'true'}",
                 "default_partitions = 4"]
        if self.rebalance_delay is not None:
            lines += ["[groups]", f'initial_rebalance_delay = "{self.rebalance_delay}"']
        lines += self.extra_config()
        conf.write_text("\n".join(lines) + "\n")
        self.log = d / "strata.log"
        cmd = [self.binary, "dev", "--data-dir", str(d / "data"),
               "--listen", f"127.0.0.1:{self.port}",
               "--grpc", f"127.0.0.1:{free_port(self.ports_taken)}",
               "--controller-listen", f"127.0.0.1:{free_port(self.ports_taken)}",
               "--metrics", f"127.0.0.1:{free_port(self.ports_taken)}",
               "--config", str(conf)]
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=pin(self.cpus))
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if "strata is ready" in self.log.read_text(errors="replace"):
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                    say(f"==> strata dev ({self.kind}{self.scenario} scenario) on "
                        f"127.0.0.1:{self.port}, data in {d}")
                    return
                except OSError:
                    pass
            time.sleep(0.2)
        tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
        self.stop()
        raise SetupError(f"`{' '.join(cmd)}` did not become ready within {START_TIMEOUT_S:.0f} s "
                         f"(exit code {self.proc.returncode}); its log:\n{tail}")

    kind = ""  # "secure-" for SecureStrata
    cpus = None  # the CPUs the node runs on (SecureStrata), None: any
    runner_cpus = None  # and its tests' runners

    def extra_config(self):
        """More lines for strata.toml (SecureStrata: listeners, TLS, SASL)."""
        return []

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.port}"

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        stop_proc(self.proc)


# The security tests' profiles (suite_sets.SECURE): the listener a test's client bootstraps
# from, what its test.conf says besides metadata.broker.list, and its environment.
SECURE_USER, SECURE_PASSWORD = "librdkafka-suite", "suite-password-1"
SSL_KEY_PASSWORD = "suite-key-password"  # the client key's, and its PKCS#12 file's
OIDC_KEY_PASSWORD = "suite-assertion-key-password"  # the jwt-bearer client's encrypted key
SECURE_REAUTH = "5s"  # [kafka.sasl] connections_max_reauth: 0142 budgets 9 x this + 30 s


def _ssl_conf(c):
    return {"security.protocol": "SSL", "ssl.ca.location": c["ca"],
            "ssl.certificate.location": c["client_cert"], "ssl.key.location": c["client_key"],
            "ssl.key.password": SSL_KEY_PASSWORD}


def _sasl_conf(mechanism):
    return lambda c: {"security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
                      "sasl.username": SECURE_USER, "sasl.password": SECURE_PASSWORD,
                      "ssl.ca.location": c["ca"]}


# OAUTHBEARER with librdkafka's OIDC token requests (0126) against tests/librdkafka/oidc_idp.py,
# on SASL_PLAINTEXT as trivup's: what test.conf says besides the token endpoint's URL (the
# provider's port is known once it runs, SecureFixtures.profile). The scope and the
# extensions are trivup's; Strata ignores extensions, as Kafka's built-in validators do.
OIDC_CONF = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "OAUTHBEARER",
             "sasl.oauthbearer.method": "OIDC",
             "sasl.oauthbearer.client.id": oidc_idp.CLIENT_ID,
             "sasl.oauthbearer.client.secret": oidc_idp.CLIENT_SECRET,
             "sasl.oauthbearer.scope": "test",
             "sasl.oauthbearer.extensions":
                 "ExtensionworkloadIdentity=develC348S,Extensioncluster=lkc123"}

SECURE_PROFILES = {
    # SSL with a client certificate, on the listener with client_auth = "required"
    "ssl": {"listener": "SSL", "conf": _ssl_conf, "env": {"SSL_client_auth": "required"}},
    # the same on the listener with client_auth = "requested" (trivup's ssl_client_auth =
    # requested): a client without a trusted certificate gets in as User:ANONYMOUS
    "ssl-requested": {"listener": "SSL_REQUESTED", "conf": _ssl_conf,
                      "env": {"SSL_client_auth": "requested"}},
    "sasl": {"listener": "SASL_SSL", "conf": _sasl_conf("SCRAM-SHA-256")},
    "sasl-plain": {"listener": "SASL_SSL", "conf": _sasl_conf("PLAIN")},
    # OIDC_CONF, with the identity provider's URLs and the client's keys in the environment
    "oidc": {"listener": "SASL_PLAINTEXT", "conf": lambda c: dict(OIDC_CONF), "idp": True},
}

# The listeners of a secure node: (name, protocol, client_auth). PLAINTEXT is the harness's
# (readiness, the SCRAM user); the tests use the others through their profile.
SECURE_LISTENERS = [("PLAINTEXT", "PLAINTEXT", None), ("SSL", "SSL", "required"),
                    ("SSL_REQUESTED", "SSL", "requested"), ("SASL_SSL", "SASL_SSL", None),
                    ("SASL_PLAINTEXT", "SASL_PLAINTEXT", None)]


class IdentityProvider:
    """tests/librdkafka/oidc_idp.py serving its token endpoints with the keys in d, started
    when a test of the "oidc" profile first needs it; each start logs to idp-<n>.log in d."""

    def __init__(self, d: Path, shim_python):
        self.dir, self.shim_python = d, shim_python
        self.proc, self.url = None, None

    def start(self):
        """The provider's base URL, starting it if it is not running."""
        if self.proc is not None and self.proc.poll() is None:
            return self.url
        log = self.dir / f"idp-{len(list(self.dir.glob('idp-*.log'))) + 1}.log"
        with open(log, "w") as f:
            self.proc = subprocess.Popen([self.shim_python, str(HERE / "oidc_idp.py"), "serve",
                                          str(self.dir)], stdout=f, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            m = re.search(r"^listening on (http://127\.0\.0\.1:\d+)$",
                          log.read_text(errors="replace"), re.M)
            if m:
                self.url = m.group(1)
                say(f"    identity provider (tests/librdkafka/oidc_idp.py) on {self.url}, "
                    f"log {log}")
                return self.url
            time.sleep(0.1)
        tail = log.read_text(errors="replace")[-2000:]
        self.stop()
        raise SetupError(f"tests/librdkafka/oidc_idp.py did not start within "
                         f"{START_TIMEOUT_S:.0f} s; its log ({log}):\n{tail}")

    def stop(self):
        stop_proc(self.proc)
        self.proc = None


class SecureFixtures:
    """What the secure nodes share: the certificates (tests/librdkafka/secure.py certs, made
    once per run in certs/ of the run directory), the identity provider's keys
    (tests/librdkafka/oidc_idp.py keys, in oidc/), the config lines for the listeners, TLS and
    SASL, and the SCRAM user. Each node's fixtures run its own identity provider (with the
    run's keys), stopped with the node."""

    def __init__(self, rundir: Path, shim_python):
        self.shim_python = shim_python

        def once(d: Path, cmd):
            made_file = d / "made.json"
            if made_file.is_file():
                return json.loads(made_file.read_text())
            made = json.loads(run(cmd).strip().splitlines()[-1])
            made_file.write_text(json.dumps(made))
            return made

        made = once(rundir / "certs", [shim_python, str(HERE / "secure.py"), "certs",
                                       str(rundir / "certs"), SSL_KEY_PASSWORD])
        self.cert_env, self.certs = made["env"], made["files"]
        self.oidc = once(rundir / "oidc", [shim_python, str(HERE / "oidc_idp.py"), "keys",
                                           str(rundir / "oidc"), OIDC_KEY_PASSWORD])["files"]
        self.idp = IdentityProvider(rundir / "oidc", shim_python)

    def config(self, ports):
        """strata.toml lines for a broker whose listeners are on ports ({name: port})."""
        c = self.certs
        lines = ["# librdkafka's security tests (suite_sets.SECURE): ACLs open to everyone (the",
                 "# default turns closed once a listener authenticates)",
                 "[auth]", "allow_everyone_if_no_acl_found = true"]
        for name, protocol, auth in SECURE_LISTENERS:
            lines += ["[[kafka.listeners]]", f'name = "{name}"',
                      f'listen = "127.0.0.1:{ports[name]}"', f'protocol = "{protocol}"']
            lines += [f'client_auth = "{auth}"'] if auth else []
        lines += ["[kafka.tls]", f'cert = "{c["server_cert"]}"', f'key = "{c["server_key"]}"',
                  f'client_ca = "{c["ca"]}"',
                  # as librdkafka's own test clusters (trivup: ssl.enabled.protocols=TLSv1.2,
                  # ...): 0097 expects a refused client certificate to fail the handshake
                  # (ERR__SSL); with TLS 1.3 the client has finished its handshake before the
                  # broker refuses it, and sees a receive failure (ERR__TRANSPORT) instead
                  'protocols = ["TLSv1.2"]',
                  "[kafka.sasl]",
                  'mechanisms = ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "OAUTHBEARER"]',
                  f'connections_max_reauth = "{SECURE_REAUTH}"',
                  # the tokens of tests/librdkafka/oidc_idp.py (clock_skew: Strata's 30 s)
                  "[kafka.sasl.oauthbearer]", f'jwks = "{self.oidc["jwks"]}"',
                  f'issuer = "{oidc_idp.ISSUER}"', f'audience = "{oidc_idp.AUDIENCE}"']
        return lines

    def make_user(self, plaintext_bootstrap, sasl_bootstrap):
        say("    " + run([self.shim_python, str(HERE / "secure.py"), "user",
                          plaintext_bootstrap, sasl_bootstrap, self.certs["ca"],
                          SECURE_USER, SECURE_PASSWORD]).strip().splitlines()[-1])

    def profile(self, name, bootstraps):
        """(bootstrap, test.conf settings, environment) for a test of this profile;
        bootstraps: {listener name: bootstrap list}."""
        prof = SECURE_PROFILES[name]
        conf, env = prof["conf"](self.certs), dict(self.cert_env, **prof.get("env", {}))
        if prof.get("idp"):
            # 0126's environment, as trivup's LibrdkafkaTestApp sets it
            url = self.idp.start()
            conf["sasl.oauthbearer.token.endpoint.url"] = f"{url}/token"
            env.update(VALID_OIDC_URL=f"{url}/token",
                       EXPIRED_TOKEN_OIDC_URL=f"{url}/token/expired",
                       INVALID_OIDC_URL=f"{url}/token/forged",
                       OAUTHBEARER_CLIENT_PRIVATE_KEY=self.oidc["client_key"],
                       OAUTHBEARER_CLIENT_PRIVATE_KEY_ENCRYPTED=self.oidc["client_key_encrypted"],
                       OAUTHBEARER_CLIENT_PRIVATE_KEY_PASSWORD=OIDC_KEY_PASSWORD)
        return bootstraps[prof["listener"]], conf, env


class SecureStrata(Strata):
    """`strata dev` with secure listeners (SecureFixtures): besides the PLAINTEXT listener the
    harness uses, SSL with client_auth "required", SSL with "requested", SASL_SSL and
    SASL_PLAINTEXT (SCRAM-SHA-256, SCRAM-SHA-512, PLAIN, OAUTHBEARER with the identity
    provider's JWKS; sessions of SECURE_REAUTH), and the SCRAM user SECURE_USER made after
    each start."""

    kind = "secure-"

    def __init__(self, binary, rundir: Path, scenario: str, rebalance_delay, ports, shim_python):
        super().__init__(binary, rundir, scenario, rebalance_delay, ports)
        # The node on one CPU, the test runner on the others. 0097 counts on the broker's
        # first TLS flight not arriving while the client is still inside its first
        # SSL_connect() call (which reports a failure there as ERR__TRANSPORT, not ERR__SSL);
        # on a busy machine the broker woken by the ClientHello can preempt the client on its
        # own CPU and answer within that call. Apart, the client reads before the answer.
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) >= 2:
            self.cpus, self.runner_cpus = {cpus[-1]}, set(cpus[:-1])
        self.fixtures = SecureFixtures(rundir, shim_python)

    def extra_config(self):
        self.listener_ports = {name: free_port(self.ports_taken)
                               for name, _, _ in SECURE_LISTENERS[1:]}
        self.listener_ports["PLAINTEXT"] = self.port
        return self.fixtures.config(self.listener_ports)

    def start(self):
        super().start()
        try:
            self.fixtures.make_user(self.bootstrap,
                                    f"127.0.0.1:{self.listener_ports['SASL_SSL']}")
        except SetupError:
            self.stop()
            raise

    def profile(self, name):
        return self.fixtures.profile(name, {n: f"127.0.0.1:{p}"
                                            for n, p in self.listener_ports.items()})

    def stop(self):
        super().stop()
        self.fixtures.idp.stop()


def pin(cpus):
    """A preexec_fn that keeps the child (and its threads) on cpus; None when cpus is None."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def stop_proc(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class StrataCluster:
    """3 controllers + 3 brokers (`strata server`), for the tests that need three brokers.

    Broker i is in rack RACK<i> with the rack-aware replica selector (0101 aligns
    `client.rack` with a follower's `broker.rack` in that form and expects to read from it);
    auto-creation and the rebalance delay as for the single node."""

    def __init__(self, binary, rundir: Path, scenario: str, rebalance_delay, ports):
        self.binary, self.scenario, self.ports_taken = binary, scenario, ports
        self.rebalance_delay = rebalance_delay
        self.rundir = rundir
        self.procs = {}
        self.starts = 0

    def _conf(self, d: Path, name: str, i: int) -> Path:
        voters = "\n".join(f'{n} = "127.0.0.1:{p}"' for n, p in self.controller_ports.items())
        controllers = ", ".join(f'"127.0.0.1:{p}"' for p in self.controller_ports.values())
        if name.startswith("controller"):
            text = (f'roles = ["controller"]\ndata_dir = "{d / name}"\n'
                    f"[controller]\nnode_id = {i}\n"
                    f'listen = "127.0.0.1:{self.controller_ports[i]}"\n'
                    f"[controller.voters]\n{voters}\n"
                    f'[metrics]\nlisten = "127.0.0.1:{free_port(self.ports_taken)}"\n')
        else:
            text = (f'roles = ["broker"]\nnode_id = {i}\ndata_dir = "{d / name}"\n'
                    f'[kafka]\nlisten = "127.0.0.1:{self.broker_ports[i]}"\n'
                    f'[grpc]\nlisten = "127.0.0.1:{free_port(self.ports_taken)}"\n'
                    f'[metrics]\nlisten = "127.0.0.1:{free_port(self.ports_taken)}"\n'
                    f'[cluster]\ncontrollers = [{controllers}]\nrack = "RACK{i}"\n'
                    'replica_selector = "rack-aware"\n'
                    "[topics]\n"
                    f"auto_create = {'false' if self.scenario == 'noautocreate' else 'true'}\n"
                    "default_partitions = 4\n")
            if self.rebalance_delay is not None:
                text += f'[groups]\ninitial_rebalance_delay = "{self.rebalance_delay}"\n'
            text += "".join(f"{line}\n" for line in self.extra_broker_config(i))
        conf = d / f"{name}.toml"
        conf.write_text(text)
        return conf

    def start(self):
        self.stop()
        self.starts += 1
        d = self.rundir / f"cluster-{self.kind}{self.scenario}-{self.starts}"
        d.mkdir(parents=True)
        self.dir = d
        self.controller_ports = {i: free_port(self.ports_taken) for i in (1, 2, 3)}
        self.broker_ports = {i: free_port(self.ports_taken) for i in (1, 2, 3)}
        names = [f"controller-{i}" for i in (1, 2, 3)] + [f"broker-{i}" for i in (1, 2, 3)]
        env = dict(os.environ, NO_COLOR="1")
        for name in names:
            i = int(name.split("-")[1])
            with open(d / f"{name}.log", "w") as f:
                self.procs[name] = subprocess.Popen(
                    [self.binary, "server", "--config", str(self._conf(d, name, i))],
                    stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                    start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S * 2
        last = ""
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                break
            r = subprocess.run([self.binary, "quorum", "metadata", "--controller",
                                f"127.0.0.1:{self.controller_ports[1]}"],
                               capture_output=True, text=True, env=env)
            if r.returncode == 0:
                try:
                    brokers = json.loads(r.stdout).get("brokers", {})
                except ValueError:
                    brokers = {}
                live = [b for b in brokers.values() if not b.get("fenced")]
                if len(live) == 3 and all(self._accepts(p) for p in self.broker_ports.values()):
                    say(f"==> a 3 + 3 strata cluster ({self.kind}{self.scenario} scenario), brokers "
                        f"{self.bootstrap}, data in {d}")
                    return
                last = f"{len(live)} of 3 brokers registered and unfenced"
            else:
                last = (r.stderr or r.stdout).strip()[-300:]
            time.sleep(0.3)
        logs = "\n".join(f"--- {n} (exit {p.poll()}):\n" + "\n".join(
            (d / f"{n}.log").read_text(errors="replace").splitlines()[-10:])
            for n, p in self.procs.items())
        self.stop()
        raise SetupError(f"the 3 + 3 cluster in {d} was not ready within "
                         f"{START_TIMEOUT_S * 2:.0f} s ({last}); its logs:\n{logs}")

    kind = ""  # "secure-" for SecureStrataCluster

    def extra_broker_config(self, i):
        """More lines for broker i's config (SecureStrataCluster: listeners, TLS, SASL)."""
        return []

    @staticmethod
    def _accepts(port):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    @property
    def bootstrap(self):
        return ",".join(f"127.0.0.1:{p}" for p in self.broker_ports.values())

    @property
    def proc(self):
        """The first process that exited (for its code), else any."""
        dead = [p for p in self.procs.values() if p.poll() is not None]
        return dead[0] if dead else next(iter(self.procs.values()), None)

    def alive(self):
        return bool(self.procs) and all(p.poll() is None for p in self.procs.values())

    def stop(self):
        # brokers first, while the controllers can still take their goodbyes
        for name in sorted(self.procs, key=lambda n: not n.startswith("broker")):
            stop_proc(self.procs[name])
        self.procs = {}


class SecureStrataCluster(StrataCluster):
    """The 3 + 3 cluster with SecureStrata's listeners on every broker (the same names, so a
    client that bootstraps from one is told the other brokers' endpoints of that listener),
    for the security tests that create topics with replication factor 3 (0126, 0142)."""

    kind = "secure-"

    def __init__(self, binary, rundir: Path, scenario: str, rebalance_delay, ports, shim_python):
        super().__init__(binary, rundir, scenario, rebalance_delay, ports)
        self.fixtures = SecureFixtures(rundir, shim_python)
        self.listener_ports = {}

    def extra_broker_config(self, i):
        ports = {name: free_port(self.ports_taken) for name, _, _ in SECURE_LISTENERS[1:]}
        ports["PLAINTEXT"] = self.broker_ports[i]
        self.listener_ports[i] = ports
        return self.fixtures.config(ports)

    def listener_bootstraps(self):
        return {name: ",".join(f"127.0.0.1:{self.listener_ports[i][name]}"
                               for i in sorted(self.listener_ports))
                for name, _, _ in SECURE_LISTENERS}

    def start(self):
        super().start()
        try:
            self.fixtures.make_user(self.bootstrap, self.listener_bootstraps()["SASL_SSL"])
        except SetupError:
            self.stop()
            raise

    def profile(self, name):
        return self.fixtures.profile(name, self.listener_bootstraps())

    def stop(self):
        super().stop()
        self.fixtures.idp.stop()


# --- running the tests ---------------------------------------------------------------------

def run_number(num, scenario, names, tdir: Path, logdir: Path, strata: Strata, args,
               profile=None):
    """One test-runner invocation for test number num; returns {name: result}. profile: the
    test's secure profile (SECURE_PROFILES; strata is then a SecureStrata)."""
    tag = num if scenario == "default" else f"{num}-{scenario}"
    log = logdir / f"{tag}.log"
    conf = logdir / f"{tag}.test.conf"
    brokers, settings, extra_env = strata.bootstrap, {}, {}
    if profile:
        brokers, settings, extra_env = strata.profile(profile)
    if num in suite_sets.TIMEOUT_MULTIPLIERS:
        settings["test.timeout.multiplier"] = suite_sets.TIMEOUT_MULTIPLIERS[num]
    conf.write_text(f"metadata.broker.list={brokers}\n"
                    + "".join(f"{k}={v}\n" for k, v in settings.items()))
    env = dict(os.environ, **extra_env,
               TESTS=num, TEST_KAFKA_VERSION=KAFKA_VERSION, TEST_SCENARIO=scenario,
               RDKAFKA_TEST_CONF=str(conf), KAFKA_PATH=str(HERE), BROKERS=brokers,
               LRK_SHIM_PYTHON=args.shim_python,
               LD_LIBRARY_PATH=":".join(filter(None, [str(tdir.parent / "src"),
                                                      str(tdir.parent / "src-cpp"),
                                                      os.environ.get("LD_LIBRARY_PATH")])))
    env.pop("CI", None)
    # -L: broker tests only; -p1: one at a time. Never -Q (the runner's quick mode skips every
    # sub-test not marked quick, so a test can pass having done nothing).
    cmd = ["./test-runner", "-L", "-p1", "-s", scenario]
    timeout = max(args.timeout, suite_sets.TIMEOUTS.get(num, 0))
    t0 = time.monotonic()
    timed_out = False
    with open(log, "w") as f:
        f.write(f"# {' '.join(cmd)} with TESTS={num} TEST_KAFKA_VERSION={KAFKA_VERSION} "
                f"KAFKA_PATH={HERE} BROKERS={brokers}"
                + (f" (secure profile {profile}, test.conf {conf.name})" if profile else "")
                + "\n")
        f.flush()
        p = subprocess.Popen(cmd, cwd=tdir, env=env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True, preexec_fn=pin(getattr(strata, "runner_cpus", None)))
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    elapsed = time.monotonic() - t0
    text = ANSI.sub("", log.read_text(errors="replace"))
    rows = {}
    for line in text.splitlines():
        m = SUMMARY_ROW.match(line.strip())
        if m and m.group(1) in names:
            rows[m.group(1)] = (m.group(2), float(m.group(3)), m.group(4).strip())
    out = {}
    for name in names:
        state, secs, why = rows.get(name, (None, None, ""))
        if timed_out:
            res = ("TIMEOUT", elapsed, f"killed after {timeout} s (no summary)")
        elif state == "PASSED" and any(w in text for w in suite_sets.FAILS_IF_LOGGED.get(num, [])):
            said = next(l for l in text.splitlines()
                        if any(w in l for w in suite_sets.FAILS_IF_LOGGED[num]))
            res = ("FAIL", secs, "passed by the runner, but its test_assert said: "
                   + said.split("] ", 1)[-1].strip())
        elif state == "PASSED":
            res = ("PASS", secs, "")
        elif state == "SKIPPED":
            res = ("SKIP", secs, why)
        elif state in ("FAILED", "RUNNING"):
            res = ("FAIL", secs, first_failure(text, name) or why)
        elif p.returncode not in (0, None):
            res = ("FAIL", elapsed, f"test-runner exited {p.returncode} before its summary: "
                                    + first_failure(text, name))
        else:
            res = ("SKIP", 0.0, "not run by test-runner (filtered)")
        out[name] = {"status": res[0], "secs": res[1], "why": res[2][:300], "log": log.name}
    if not strata.alive():
        for r in out.values():
            r["why"] = (r["why"] + f"; strata exited with code {strata.proc.returncode} "
                        "during this test").lstrip("; ")
            if r["status"] == "PASS":
                r["status"] = "FAIL"
    return out


def first_failure(text, name=None):
    """The runner's own words: the line after '### Test "NAME" failed at ...: ###'."""
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith('### Test "') and " failed at " in line and (
                name is None or line.startswith(f'### Test "{name}')):
            test = line[len('### Test "'):].split('" failed at ', 1)[0]
            sub = test[len(name):].strip(" ()") if name else ""
            msg = lines[i + 1].strip()
            shim = [l for l in lines[:i] if "KafkaError{" in l]
            if "kafka-topics.sh" in msg or "kafka-acls.sh" in msg:
                msg = "shim: " + (shim[-1].split(": ", 1)[-1] if shim else msg)
            return (f"{sub}: " if sub else "") + msg[:300]
    for line in lines:
        if "TEST FAILURE" in line or "FAILED:" in line or "Test timed out" in line:
            return line.strip()[:300]
    return ""


def fmt_secs(secs):
    return "" if secs is None else f"{secs:.1f}s"


def table(results, excluded_rows):
    rows = sorted(list(results.items()) + excluded_rows, key=lambda kv: kv[0])
    w = max([len(n) for n, _ in rows] + [4])
    lines = [f"{'test':<{w}}  {'result':<8} {'time':>8}  note", "-" * (w + 30)]
    for name, r in rows:
        lines.append(f"{name:<{w}}  {r['status']:<8} {fmt_secs(r['secs']):>8}  {r['why']}")
    return "\n".join(lines)


def markdown(results, excluded_rows):
    rows = sorted(list(results.items()) + excluded_rows, key=lambda kv: kv[0])
    out = ["| test | result | time | note |", "| --- | --- | --- | --- |"]
    for name, r in rows:
        why = r["why"].replace("|", "\\|")
        out.append(f"| {name} | {r['status'].lower()} | {fmt_secs(r['secs'])} | {why} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(
        prog="scripts/librdkafka-suite.sh",
        description="Run librdkafka's broker test suite against a `strata dev` node.")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--tests", help="comma-separated test numbers, e.g. 0001,0012,0045 (excluded "
                   "tests run too when named)")
    g.add_argument("--set", choices=["quick", "full", "all"], default="quick",
                   help="quick: the fast reliable subset (default); full: every broker test "
                   "that applies to Strata; all: full plus the excluded ones")
    ap.add_argument("--timeout", type=int, default=600,
                    help="seconds per test number before its runner is killed (default 600; "
                    "longer for the tests in suite_sets.TIMEOUTS)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the run directory (per-test logs, strata's logs and data)")
    ap.add_argument("--list", action="store_true", help="print the selected tests and exit")
    ap.add_argument("--build-only", action="store_true",
                    help="build (or find cached) what the selected tests need and exit; "
                    "scripts/test.sh runs this in the background while it installs the clients")
    ap.add_argument("--work-dir", default=os.environ.get(
        "LRK_WORK_DIR", str(Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
                            / "librdkafka-suite")),
        help="build cache and runs (default target/librdkafka-suite)")
    ap.add_argument("--strata-bin", default=os.environ.get(
        "STRATA_BIN", str(REPO / "target" / "debug" / "strata")),
        help="the strata binary under test (default $STRATA_BIN, else target/debug/strata)")
    ap.add_argument("--rebalance-delay", default=None,
                    help="[groups] initial_rebalance_delay for the node, e.g. 0s (default: "
                    "Strata's, 3 s as Kafka's group.initial.rebalance.delay.ms)")
    ap.add_argument("--secure-profile", action="append", default=[], metavar="NUM=PROFILE",
                    help="run test NUM with this secure profile instead of suite_sets.SECURE's "
                    f"({', '.join(SECURE_PROFILES)}), e.g. 0097=ssl; repeatable")
    ap.add_argument("--rebuild", action="store_true", help="rebuild librdkafka even if cached")
    ap.add_argument("--no-install", action="store_true",
                    help="never apt-get install missing build packages; fail instead")
    ap.add_argument("--json", help="also write the results as JSON to this file")
    ap.add_argument("--markdown", help="also write the table as Markdown to this file")
    args = ap.parse_args()

    for spec in args.secure_profile:
        num, _, prof = spec.partition("=")
        if prof not in SECURE_PROFILES:
            ap.error(f"--secure-profile {spec}: the profiles are {', '.join(SECURE_PROFILES)}")
        suite_sets.SECURE[num.strip()] = prof
        suite_sets.EXCLUDED.pop(num.strip(), None)
    venv = Path(os.environ.get("STRATA_TEST_VENV", REPO / ".venv"))
    args.shim_python = os.environ.get("LRK_SHIM_PYTHON", str(venv / "bin" / "python"))
    work = Path(args.work_dir).resolve()
    t_all = time.monotonic()
    strata_nodes = []
    rundir = None
    try:
        if not (args.list or args.build_only) and not (os.path.isfile(args.strata_bin)
                                  and os.access(args.strata_bin, os.X_OK)):
            raise SetupError(f"strata binary not found or not executable at {args.strata_bin}; "
                             "build it with `cargo build -p strata-hot --bin strata` or set "
                             "STRATA_BIN")
        work.mkdir(parents=True, exist_ok=True)
        tdir = build(work, install=not args.no_install, rebuild=args.rebuild)
        t_build = time.monotonic() - t_all
        tests = parse_tests(tdir / "test.c")
        picked, run_excluded = select(tests, args)
        to_run, excluded_rows = [], []
        for t in picked:
            why = suite_sets.EXCLUDED.get(t["num"]) or suite_sets.EXCLUDED.get(t["name"])
            if t["known_issue"]:
                excluded_rows.append((t["name"], {
                    "status": "SKIP", "secs": None, "why": "librdkafka flags it a known issue "
                    "(TEST_F_KNOWN_ISSUE); its runner skips it", "log": None}))
            elif why and not run_excluded:
                excluded_rows.append((t["name"], {"status": "EXCLUDED", "secs": None,
                                                  "why": why, "log": None}))
            else:
                to_run.append(t)
        if args.list:
            say(table({t["name"]: {"status": "selected", "secs": None,
                                   "why": f"scenario {scenario_of(t)}" + (
                                       f", secure profile {suite_sets.SECURE[t['num']]}"
                                       if t["num"] in suite_sets.SECURE else "")}
                   for t in to_run},
                      excluded_rows))
            return 0
        secure_nums = sorted({t["num"] for t in to_run} & set(suite_sets.SECURE))
        secure_tdir = None
        if secure_nums:
            # the tests with a secure profile run with the OpenSSL build's runner
            secure_tdir = build(work, install=not args.no_install, rebuild=args.rebuild,
                                secure=True)
            t_build = time.monotonic() - t_all
        if args.build_only:
            say(f"==> built or found cached in {t_build:.0f} s: the runner for {len(to_run)} tests")
            return 0
        needs_shim = sorted({t["num"] for t in to_run} & set(suite_sets.NEEDS_SHIM))
        if secure_nums and subprocess.run(
                [args.shim_python, "-c", "import confluent_kafka, cryptography, jwt"],
                capture_output=True).returncode != 0:
            raise SetupError(
                f"tests {', '.join(secure_nums)} need certificates, a SCRAM user and an "
                f"identity provider, made by tests/librdkafka/secure.py and oidc_idp.py with "
                f"cryptography, PyJWT and confluent_kafka from {args.shim_python}; run "
                "scripts/test.sh once (it makes .venv) or set LRK_SHIM_PYTHON/STRATA_TEST_VENV")
        if needs_shim and subprocess.run(
                [args.shim_python, "-c", "import confluent_kafka"],
                capture_output=True).returncode != 0:
            raise SetupError(
                f"tests {', '.join(needs_shim)} shell out to kafka-topics.sh/kafka-acls.sh, "
                f"whose shims (tests/librdkafka/bin) need confluent_kafka in {args.shim_python}; "
                "run scripts/test.sh once (it makes .venv) or set LRK_SHIM_PYTHON/STRATA_TEST_VENV")

        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        rundir = work / "runs" / stamp
        logdir = rundir / "logs"
        logdir.mkdir(parents=True)
        say(f"==> {len(to_run)} tests to run, "
            f"{len(excluded_rows)} excluded; logs in {logdir}")
        ports = set()
        results = {}
        # one single node per scenario (and initial rebalance delay, suite_sets.
        # REBALANCE_DELAYS), a 3 + 3 cluster for the tests that need three brokers
        # (suite_sets.CLUSTER), and a node with secure listeners for the tests with a secure
        # profile (suite_sets.SECURE), run last with the OpenSSL build
        by_target = {}
        for t in to_run:
            delay = suite_sets.REBALANCE_DELAYS.get(t["num"], args.rebalance_delay)
            secure = t["num"] in suite_sets.SECURE
            key = (secure, t["num"] in suite_sets.CLUSTER, scenario_of(t), delay or "")
            by_target.setdefault(key, []).append(t)
        for target in sorted(by_target, key=lambda k: (k[0], k[1], k[2] != "default", k[3])):
            secure, cluster, scenario, delay = target
            binary = os.path.abspath(args.strata_bin)
            if secure:
                kind = SecureStrataCluster if cluster else SecureStrata
                node = kind(binary, rundir, scenario, delay or None, ports, args.shim_python)
            else:
                kind = StrataCluster if cluster else Strata
                node = kind(binary, rundir, scenario, delay or None, ports)
            strata_nodes.append(node)
            node.start()
            nums = {}
            for t in by_target[target]:
                nums.setdefault(t["num"], []).append(t["name"])
            for num in sorted(nums):
                if not node.alive():
                    say(f"    strata exited (code {node.proc.returncode}); starting anew")
                    node.start()
                profile = suite_sets.SECURE.get(num) if secure else None
                if (os.environ.get("TEST_CONSUMER_GROUP_PROTOCOL") == "consumer"
                        and all(n in suite_sets.CLASSIC_ONLY for n in nums[num])):
                    for name in nums[num]:
                        results[name] = {"status": "SKIP", "secs": 0.0, "log": "",
                                         "why": "classic protocol only: "
                                                + suite_sets.CLASSIC_ONLY[name]}
                        say(f"    {name:<48} SKIP             {results[name]['why'][:100]}")
                    continue
                res = run_number(num, scenario, nums[num], secure_tdir if secure else tdir,
                                 logdir, node, args, profile)
                for name, r in res.items():
                    say(f"    {name:<48} {r['status']:<8} {fmt_secs(r['secs']):>8}  "
                        f"{r['why'][:100]}")
                results.update(res)
            node.stop()
        say("")
        say(f"librdkafka {LIBRDKAFKA_VERSION} broker suite against {args.strata_bin} "
            f"(TEST_KAFKA_VERSION={KAFKA_VERSION})")
        say(table(results, excluded_rows))
        counts = {}
        for r in list(results.values()) + [r for _, r in excluded_rows]:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        failed = [n for n, r in results.items() if r["status"] in ("FAIL", "TIMEOUT")]
        say("")
        say("totals: " + ", ".join(f"{k.lower()} {v}" for k, v in sorted(counts.items()))
            + f"; build/cache {t_build:.0f} s, whole run {time.monotonic() - t_all:.0f} s")
        if args.json:
            Path(args.json).write_text(json.dumps({
                "librdkafka": LIBRDKAFKA_VERSION, "date": stamp, "results": results,
                "excluded": dict(excluded_rows), "counts": counts}, indent=1))
        if args.markdown:
            Path(args.markdown).write_text(markdown(results, excluded_rows))
        if failed:
            say(f"FAILED: {', '.join(failed)}")
            for n in failed:
                say(f"\n--- {n}: last lines of {logdir / results[n]['log']}")
                lines = ANSI.sub("", (logdir / results[n]["log"]).read_text(
                    errors="replace")).splitlines()
                hits = [l for l in lines if "FAIL" in l or "rror" in l][:8]
                say("\n".join(hits + ["..."] + lines[-12:]))
        return 1 if failed else 0
    except SetupError as e:
        say(f"librdkafka-suite: {e}")
        return 2
    finally:
        for node in strata_nodes:
            node.stop()
        if rundir is not None:
            if args.keep:
                say(f"run directory kept: {rundir}")
            else:
                shutil.rmtree(rundir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
