#!/usr/bin/env bash
# Batched vs unbatched throughput of one example model at concurrency 1, 8 and 64, with the
# mean batch the server formed, then the raw backend's throughput at the batch sizes that
# matter (host overhead) -- all in one run of this script, for BENCHMARKS.md. The server
# gets CPU 0 and the load generator CPU 1 when the machine has two or more CPUs.
# Needs the release build (`cargo build --release`, which also fetches ONNX Runtime);
# SLUICE_BIN runs another build of `sluice` (to compare builds). Usage:
# scripts/bench_batching.sh [digits-mlp|magika-v3] [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
name="${1:-digits-mlp}"
seconds="${2:-5}"
case "$name" in
  digits-mlp) model=examples/digits/model/digits.onnx ;;
  magika-v3) model=examples/magika/model/model.onnx ;;
  *) echo "unknown model '$name': digits-mlp or magika-v3" >&2; exit 2 ;;
esac
sluice="${SLUICE_BIN:-target/release/sluice}"
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
digest=$(sha256sum "$model" | cut -d' ' -f1)
key_digest=$(printf 'bench-key' | sha256sum | cut -d' ' -f1)
server_cpus="" client_cpus=""
if [ "$(nproc)" -ge 2 ]; then server_cpus="taskset -c 0"; client_cpus="taskset -c 1"; fi

# Rows and executions so far, from Triton's statistics extension.
counts() {
  curl -sf -H "Authorization: Bearer bench-key" http://127.0.0.1:18400/v2/models/m/stats |
    jq -r '.model_stats[0] | "\(.inference_count) \(.execution_count)"'
}

echo "| max_batch_size | concurrency | ok | errors | throughput (inf/s) | p50 | p90 | p99 | mean batch |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for max_batch in 32 1; do
  mkdir -p "$work/$max_batch"
  cat > "$work/$max_batch/bench.toml" <<TOML
version = 1
id = "bench"
api_key_sha256 = ["$key_digest"]
[quotas]
max_concurrent_requests = 256
guest_deadline_ms = 60000
[models.m]
path = "$PWD/$model"
sha256 = "$digest"
[models.m.batching]
max_batch_size = $max_batch
TOML
  $server_cpus "$sluice" serve --http 127.0.0.1:18400 --grpc 127.0.0.1:18401 --metrics 127.0.0.1:18402 --tenants "$work/$max_batch" \
    --data-dir "$work/data" >"$work/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 300); do grep -q "grpc listening" "$work/serve.log" 2>/dev/null && break; sleep 0.1; done
  for concurrency in 1 8 64; do
    read -r rows_before runs_before < <(counts)
    row=$($client_cpus "$sluice" perf --address 127.0.0.1:18400 --model m --key bench-key \
      --concurrency "$concurrency" --warmup-s 1 --duration-s "$seconds" | tail -1)
    read -r rows_after runs_after < <(counts)
    mean=$(awk -v r=$((rows_after - rows_before)) -v e=$((runs_after - runs_before)) \
      'BEGIN { if (e > 0) printf "%.1f", r / e; else print "-" }')
    # perf's row starts with "| tenant |"; keep its figures.
    echo "| $max_batch | $concurrency ${row#| - } $mean |"
  done
  kill "$server"; wait "$server" 2>/dev/null || true
done
echo
cargo bench -q --bench serving -- raw "$name" 1 8 32 2>/dev/null
