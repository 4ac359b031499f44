#!/usr/bin/env bash
# Two builds of the server side by side: the demo tenants' `digits` app, closed loop at
# concurrency 64 (`sluice perf`, 2 s warm-up, 10 s measured), the server on CPU 0 and the
# load on CPU 1, alternating the builds each round so both see the same machine noise.
# Prints one line per run with the server's CPU per request (from /proc/PID/stat).
#
# MODEL=digits-mlp measures the plain model instead; CONCURRENCY=1 another concurrency;
# PROTOCOL=grpc speaks gRPC instead of HTTP;
# BEFORE_TENANTS / AFTER_TENANTS serve another tenants folder on that side (the same binary
# twice, two settings: a quota, say).
# Usage: scripts/bench_ab.sh BEFORE_BINARY AFTER_BINARY [ROUNDS]   (after `cargo build --release`)
set -euo pipefail
cd "$(dirname "$0")/.."
before=$1 after=$2 rounds=${3:-3} model=${MODEL:-digits} concurrency=${CONCURRENCY:-64}
address=(--address 127.0.0.1:18100)
[ "${PROTOCOL:-http}" = grpc ] && address=(--grpc --address 127.0.0.1:18101)
perf=target/release/sluice
library=$(ls target/onnxruntime/libonnxruntime.so.* 2>/dev/null | tail -1)
[ -n "$library" ] || { echo "no ONNX Runtime in target/onnxruntime: build once (cargo build --release)" >&2; exit 1; }
log=$(mktemp)
for round in $(seq "$rounds"); do
  for build in before after; do
    binary=$before tenants=${BEFORE_TENANTS:-tenants}
    [ "$build" = after ] && binary=$after tenants=${AFTER_TENANTS:-tenants}
    data=$(mktemp -d)
    taskset -c 0 "$binary" serve --http 127.0.0.1:18100 --grpc 127.0.0.1:18101 --metrics 127.0.0.1:18102 \
      --tenants "$tenants" --data-dir "$data" --onnxruntime-lib "$library" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do grep -q "grpc listening" "$log" && break; sleep 0.2; done
    ticks_before=$(awk '{print $14+$15}' /proc/$pid/stat)
    row=$(taskset -c 1 "$perf" perf "${address[@]}" --model "$model" --key acme-demo-key \
      --concurrency "$concurrency" --warmup-s 2 --duration-s 10 | grep '^| - |')
    ticks_after=$(awk '{print $14+$15}' /proc/$pid/stat)
    requests=$(echo "$row" | awk -F'|' '{print $3}' | tr -d ' ')
    # Clock ticks are 10 ms; the CPU covers warm-up and window (12 s), the count 10 s of it.
    echo "round $round $build: $row server CPU $(( (ticks_after - ticks_before) * 10000 * 10 / 12 / (requests > 0 ? requests : 1) )) us/request"
    kill $pid; wait $pid 2>/dev/null || true; rm -rf "$data"
  done
done
rm -f "$log"
