#!/usr/bin/env bash
# The throughput cost of metrics and drift sampling: two `sluice serve` on the same CPU, one
# with metrics (and the model's default drift sampling) and one with `--no-metrics`, driven in
# turn by `sluice perf` at concurrency 64 on the digits MLP (ROUNDS rounds of SECONDS each,
# interleaved so that the machine's background load falls on both alike). Prints each run and
# the ratio of the means. Needs `cargo build --release`.
# Usage: scripts/bench_metrics.sh [seconds] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
rounds="${2:-3}"
sluice=target/release/sluice
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
model=examples/digits/model/digits.onnx
server_cpus="" client_cpus=""
if [ "$(nproc)" -ge 2 ]; then server_cpus="taskset -c 0"; client_cpus="taskset -c 1"; fi
cat > "$work/bench.toml" <<TOML
version = 1
id = "bench"
api_key_sha256 = ["$(printf 'bench-key' | sha256sum | cut -d' ' -f1)"]
[quotas]
max_concurrent_requests = 256
[models.m]
path = "$PWD/$model"
sha256 = "$(sha256sum "$model" | cut -d' ' -f1)"
TOML
# DRIFT_SAMPLE_RATE overrides the model's drift sampling (default: every call, at most 100 a second).
if [ -n "${DRIFT_SAMPLE_RATE:-}" ]; then printf '[models.m.drift]\nsample_rate = %s\n' "$DRIFT_SAMPLE_RATE" >> "$work/bench.toml"; fi
start() { # name port extra...
  local name=$1 port=$2; shift 2
  $server_cpus "$sluice" serve --http "127.0.0.1:$port" --grpc "127.0.0.1:$((port + 1))" --tenants "$work" \
    --data-dir "$work/data-$name" "$@" >"$work/$name.log" 2>&1 &
  for _ in $(seq 300); do grep -q "grpc listening" "$work/$name.log" 2>/dev/null && break; sleep 0.1; done
}
start on 18600 --metrics 127.0.0.1:18602
start off 18610 --no-metrics
echo "| metrics | round | ok | errors | throughput (inf/s) | p50 | p90 | p99 |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for round in $(seq "$rounds"); do
  for setting in on:18600 off:18610; do
    row=$($client_cpus "$sluice" perf --address "127.0.0.1:${setting#*:}" --model m --key bench-key \
      --concurrency 64 --warmup-s 1 --duration-s "$seconds" | tail -1)
    echo "| ${setting%:*} | $round ${row#| - }"
  done
done | tee "$work/rows"
awk -F'|' '{ gsub(/ /, "", $2); sum[$2] += $6; n[$2]++ }
  END { on = sum["on"] / n["on"]; off = sum["off"] / n["off"];
        printf "\nmean throughput: on %.0f, off %.0f inf/s; metrics cost %.1f%%\n", on, off, 100 * (1 - on / off) }' "$work/rows"
curl -sf http://127.0.0.1:18602/metrics | grep -c '^sluice_' | xargs -I{} echo "samples exported by the server with metrics: {}"
