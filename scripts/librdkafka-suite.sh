#!/usr/bin/env bash
# librdkafka's own integration suite (its tests/0nnn-*.c broker tests) against a `strata dev`
# node. The source comes from crates.io (the rdkafka-sys crate bundles librdkafka with its
# tests) through `cargo fetch`; the library and test runner are built once and cached under
# target/librdkafka-suite/. Build packages: gcc g++ make pkg-config zlib1g-dev libzstd-dev
# rapidjson-dev, and libssl-dev libcurl4-openssl-dev for the security tests' build (installed
# with apt-get when missing, unless --no-install).
#
#   scripts/librdkafka-suite.sh                 # --set quick: the fast, reliable subset
#   scripts/librdkafka-suite.sh --set full      # every broker test that applies (20-40 min)
#   scripts/librdkafka-suite.sh --tests 0001,0045 --keep
#   scripts/librdkafka-suite.sh --help
#
# STRATA_BIN (default target/debug/strata) is the binary under test; the kafka-topics.sh and
# kafka-acls.sh shims use confluent_kafka from .venv (STRATA_TEST_VENV, LRK_SHIM_PYTHON).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v python3 >/dev/null 2>&1; then
  echo "librdkafka-suite: python3 is needed (apt-get install python3)" >&2
  exit 2
fi
exec python3 tests/librdkafka/run_suite.py "$@"
