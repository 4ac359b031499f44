#!/usr/bin/env bash
# Batched vs unbatched throughput of the digits model at concurrency 1, 8 and 64, measured
# with `sluice perf` against `sluice serve` in one run of this script (for BENCHMARKS.md).
# Needs the release build (`cargo build --release`) and, for ONNX Runtime, ./.venv from
# the tests. Usage: scripts/bench_batching.sh [model-subpath] [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-examples/digits/model/digits.onnx}"
seconds="${2:-5}"
sluice=target/release/sluice
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
digest=$(sha256sum "$model" | cut -d' ' -f1)
key_digest=$(printf 'bench-key' | sha256sum | cut -d' ' -f1)

for max_batch in 32 1; do
  mkdir -p "$work/$max_batch"
  cat > "$work/$max_batch/bench.toml" <<TOML
version = 1
id = "bench"
api_key_sha256 = ["$key_digest"]
[quotas]
max_concurrent_requests = 256
[models.m]
path = "$PWD/$model"
sha256 = "$digest"
[models.m.batching]
max_batch_size = $max_batch
TOML
  "$sluice" serve --http 127.0.0.1:18400 --grpc 127.0.0.1:18401 --tenants "$work/$max_batch" \
    --data-dir "$work/data" >"$work/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 100); do grep -q "grpc listening" "$work/serve.log" 2>/dev/null && break; sleep 0.1; done
  for concurrency in 1 8 64; do
    row=$("$sluice" perf --address 127.0.0.1:18400 --model m --key bench-key --concurrency "$concurrency" \
      --warmup-s 1 --duration-s "$seconds" | tail -1)
    echo "| max_batch_size $max_batch | concurrency $concurrency $row"
  done
  kill "$server"; wait "$server" 2>/dev/null || true
done
