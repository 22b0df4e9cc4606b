#!/usr/bin/env bash
# Runs every fuzz target for N seconds (default 60) with cargo-fuzz (libFuzzer).
# cargo-fuzz wants nightly for sanitizers; on the stable toolchain we run without a
# sanitizer (RUSTC_BOOTSTRAP=1 lets stable accept libFuzzer's -Z flags). Panics, aborts,
# a process over 2 GiB (-rss_limit_mb) and any single allocation over 128 MiB are all
# failures: every target runs on fuzz_targets/bounded_alloc.rs, which aborts on such an
# allocation (libFuzzer's -malloc_limit_mb needs a sanitizer's malloc hooks), so nothing a
# decoder reads may size an allocation past its bound.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-60}"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1
for target in request_decoder segment_recovery batch_header sasl_exchange oauthbearer_message \
  produced_records fetched_batches; do
  echo "== $target ($seconds s)"
  cargo fuzz run "$target" --sanitizer none -- -max_total_time="$seconds" -rss_limit_mb=2048
done
