#!/usr/bin/env bash
# Benchmarks (figures, no assertions): the log engine against the disk, then produce
# throughput and ack latency through the Kafka listener with librdkafka (confluent-kafka),
# replication, cluster, consumer groups and tiered storage.
# Usage: ./scripts/bench.sh [seconds-per-run]   (data goes under $BENCH_DIR, default ./target)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
bench_dir="${BENCH_DIR:-$PWD/target}"
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
python3 -m pip install -q --disable-pip-version-check -r tests/requirements.txt
cargo build --locked --release --bin strata --bin strata-bench --bin strata-loadgen --bin strata-groupbench --bin strata-tierbench
cargo build --locked --release -p strata-replay -p strata-compactor --bin strata-replay --bin strata-compactor

echo "== log engine"
"$target_dir/release/strata-bench" --dir "$bench_dir" --seconds "$seconds"

echo "== Kafka listener (librdkafka via confluent-kafka)"
data="$(mktemp -d "$bench_dir/strata-bench-data.XXXXXX")"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$target_dir/release/strata" dev --data-dir "$data" --listen "127.0.0.1:$port" 2>"$data.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$data" "$data.log"' EXIT
for _ in $(seq 100); do
  if "$target_dir/release/strata" topic --bootstrap "127.0.0.1:$port" create bench -p 1 >/dev/null 2>&1; then break; fi
  sleep 0.1
done
python3 bench/produce_bench.py --bootstrap "127.0.0.1:$port" --topic bench --seconds "$seconds"
kill $pid 2>/dev/null; wait $pid 2>/dev/null || true

echo "== replication: RF=3, acks=all, fsync on every replica (3 controllers + 3 brokers)"
STRATA_BIN="$target_dir/release/strata" python3 bench/replication_bench.py --seconds "$seconds"

echo "== cluster: metadata propagation and fencing (3 controllers + 3 brokers)"
STRATA_BIN="$target_dir/release/strata" python3 bench/cluster_bench.py

echo "== consumer groups: rebalance time and offset commits (3 controllers + 3 brokers)"
STRATA_BIN="$target_dir/release/strata" python3 bench/groups_bench.py

echo "== transactions: a transactional producer vs an idempotent one, read_committed consumers"
STRATA_BIN="$target_dir/release/strata" python3 bench/txn_bench.py --seconds "$seconds"

echo "== tiered storage: upload, cold replay vs plain GET, produce p99 during a cold replay (moto_server)"
STRATA_BIN="$target_dir/release/strata" python3 bench/tiered_bench.py --seconds "$seconds"

echo "== strata-replay and strata-compactor: Parquet export vs pyarrow, cat, compaction (the cluster down, bucket on local disk)"
STRATA_BIN="$target_dir/release/strata" python3 bench/replay_bench.py
