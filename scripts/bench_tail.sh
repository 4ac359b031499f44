#!/usr/bin/env bash
# The tail at a sustainable load (issue 18: p99 <= 2x p50 at 70% of peak throughput): for the
# demo tenant's plain model `digits-mlp` and its `digits` app, over HTTP and gRPC, the peak
# from a closed loop at concurrency 64, then an open loop (`sluice perf --rate`) at 70% of
# it, with p50, p99, their ratio and the server's CPU per request (from /proc/PID/stat).
# Server on CPU 0, the load on CPU 1, as in scripts/bench_overhead.sh. The open loop sends each
# millisecond's requests together; over HTTP/1 each request in flight needs a connection of
# its own, so a burst can pass the demo tenant's 64 concurrent requests (429s, counted).
# Usage: scripts/bench_tail.sh [seconds] [rounds]    (needs `cargo build --release`)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
rounds="${2:-1}"
sluice=target/release/sluice
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
server_cpus="" client_cpus=""
if [ "$(nproc)" -ge 2 ]; then server_cpus="taskset -c 0"; client_cpus="taskset -c 1"; fi
$server_cpus "$sluice" serve --http 127.0.0.1:18740 --grpc 127.0.0.1:18741 --metrics 127.0.0.1:18742 \
  --data-dir "$work/data" >"$work/sluice.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "grpc listening" "$work/sluice.log" && break; sleep 0.1; done

pixels=$(python3 -c 'print(",".join(str(i * 37 % 256) for i in range(64)))')
scaled=$(python3 -c 'print(",".join(repr(i * 37 % 256 / 255) for i in range(64)))')
printf '{"inputs":[{"name":"X","datatype":"FP32","shape":[1,64],"data":[%s]}]}' "$scaled" >"$work/digits-mlp.json"
printf '{"inputs":[{"name":"image","datatype":"UINT8","shape":[1,64],"data":[%s]}]}' "$pixels" >"$work/digits.json"

# One `sluice perf` run; prints its summary row (| - | ok | errors | inf/s | p50 | p90 | p99 |).
load() { # model protocol load-flags...
  local model=$1 protocol=$2 grpc=()
  shift 2
  local port=18740
  if [ "$protocol" = grpc ]; then port=18741 grpc=(--grpc); fi
  $client_cpus "$sluice" perf --address "127.0.0.1:$port" "${grpc[@]}" --model "$model" --key acme-demo-key \
    --input "$work/$model.json" --warmup-s 2 --duration-s "$seconds" "$@" | grep '^| - |' | tail -1
}
ms() { sed 's/ ms//; s/ //g' <<<"$1"; }

echo "| model | protocol | peak inf/s (c64) | offered inf/s | served inf/s | errors (status: count) | p50 | p99 | p99 / p50 | server CPU µs/request |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for _ in $(seq "$rounds"); do
  for model in digits-mlp digits; do
    for protocol in http grpc; do
      peak=$(load "$model" "$protocol" --concurrency 64 | awk -F'|' '{ print $5 + 0 }')
      rate=$(awk -v p="$peak" 'BEGIN { printf "%d", p * 0.7 }')
      hz=$(getconf CLK_TCK)
      before=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
      row=$(load "$model" "$protocol" --rate "$rate")
      ticks=$(($(awk '{ print $14 + $15 }' "/proc/$pid/stat") - before))
      IFS='|' read -r _ _ ok errors served p50 _ p99 _ <<<"$row"
      p50=$(ms "$p50") p99=$(ms "$p99")
      # The server's CPU over warm-up and measurement, per request answered in both.
      awk -v m="$model" -v p="$protocol" -v peak="$peak" -v rate="$rate" -v served="$served" -v errors="$errors" \
        -v p50="$p50" -v p99="$p99" -v ticks="$ticks" -v hz="$hz" -v s="$seconds" -v ok="$ok" 'BEGIN {
        gsub(/^ +| +$/, "", errors)
        printf "| %s | %s | %.0f | %d | %.0f | %s | %.2f ms | %.2f ms | %.2f | %.1f |\n", m, p, peak, rate, served,
          errors, p50, p99, (p50 > 0 ? p99 / p50 : 0), ticks / hz * 1e6 / (ok * (s + 2) / s) }'
    done
  done
done
