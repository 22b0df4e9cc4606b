#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need (kcat from Debian,
# the Python Kafka clients from PyPI), builds, runs the Rust unit, property and integration
# tests, then the real-client and crash tests against a real `strata` process.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi

step() { printf '\n==> [%s, %ss in] %s\n' "$(date +%T)" "$SECONDS" "$*"; }

if ! command -v kcat >/dev/null 2>&1; then
  step "installing kcat (Debian package)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq kcat >/dev/null
fi

if ! command -v ip >/dev/null 2>&1; then
  step "installing iproute2 (the fault suite's network namespaces)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq iproute2 >/dev/null
fi

if ! command -v systemd-analyze >/dev/null 2>&1; then
  step "installing systemd-analyze (tests/test_deploy.py checks the service unit)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq systemd >/dev/null
fi

if ! dpkg -s g++ make pkg-config zlib1g-dev libzstd-dev rapidjson-dev >/dev/null 2>&1; then
  step "installing librdkafka's build packages (tests/test_librdkafka_suite.py builds its test runner)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq g++ make pkg-config zlib1g-dev libzstd-dev rapidjson-dev >/dev/null
fi

# librdkafka's test runner (tests/test_librdkafka_suite.py) builds in the background while
# the Python clients install and the Rust build starts: the installs mostly wait on the
# network and leave the cores free. Its test finds it cached, or builds it again and says why.
lrk_log="$(mktemp -t strata-librdkafka-build.XXXXXX)"
step "building librdkafka's test runner in the background (log: $lrk_log)"
python3 tests/librdkafka/run_suite.py --set quick --build-only --no-install >"$lrk_log" 2>&1 &
lrk_build=$!
trap 'kill "$lrk_build" 2>/dev/null || true' EXIT

# The Python clients go into a virtual environment of their own: a stock Debian python3
# refuses a system-wide pip install (externally-managed-environment).
venv="${STRATA_TEST_VENV:-$PWD/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  step "making the test virtualenv in $venv"
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    # Debian ships venv's pip bootstrap separately.
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null
    rm -rf "$venv"
    python3 -m venv "$venv"
  fi
fi
python="$venv/bin/python"

step "installing Python test clients (tests/requirements.txt)"
"$python" -m pip install -q --disable-pip-version-check -r tests/requirements.txt

# checkov scans terraform/ in tests/test_terraform.py. It pins boto3 and packaging below what
# the clients above need, so it gets a virtualenv of its own.
checkov_version=3.3.30
checkov_venv="${STRATA_CHECKOV_VENV:-$PWD/.venv-checkov}"
if [ "$("$checkov_venv/bin/checkov" --version 2>/dev/null)" != "$checkov_version" ]; then
  step "installing checkov $checkov_version into $checkov_venv"
  rm -rf "$checkov_venv"
  python3 -m venv "$checkov_venv"
  "$checkov_venv/bin/python" -m pip install -q --disable-pip-version-check "checkov==$checkov_version"
fi

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"

# Binaries and tests in one build: the tests' dev-dependencies turn on features (tokio's
# test-util) that every crate above them sees, so building the binaries alone first would
# compile tokio and all that sits on it twice. The pytest suites below run these binaries.
step "building the binaries (strata, strata-replay, strata-compactor) and the Rust tests"
cargo build --locked --workspace --all-targets

step "Rust tests: unit, property, integration"
cargo test --locked --workspace

if wait "$lrk_build"; then
  step "librdkafka's test runner: $(tail -1 "$lrk_log")"
else
  step "the background build of librdkafka's test runner failed; its test builds it again (log: $lrk_log)"
  tail -20 "$lrk_log"
fi

step "real clients and crash recovery (pytest)"
STRATA_BIN="$target_dir/debug/strata" STRATA_CHECKOV="$checkov_venv/bin/checkov" "$python" -m pytest tests -q -p no:cacheprovider --durations=25
step "all passed"
