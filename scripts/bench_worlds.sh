#!/usr/bin/env bash
# The same work in each world Sluice serves, end to end: the demo tenant acme's `digits` app (a
# sluice:tenant/component, OIP JSON in) and `digits-http` (the same app as a wasi:http/proxy
# component, the 64 raw bytes of one image POSTed to /classify), both calling `digits-mlp`.
# `sluice perf` (closed loop) at concurrency 1 and 16: throughput, p50, p99, errors, and the
# server's CPU per request (user + system ticks from /proc/PID/stat over the measured window).
# Server on CPU 0, load on CPU 1; each round measures every row once.
# Usage: scripts/bench_worlds.sh [seconds] [rounds]    (needs `cargo build --release`)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
rounds="${2:-2}"
sluice=target/release/sluice
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
server_cpus="" client_cpus=""
if [ "$(nproc)" -ge 2 ]; then server_cpus="taskset -c 0"; client_cpus="taskset -c 1"; fi

$server_cpus "$sluice" serve --http 127.0.0.1:18750 --grpc 127.0.0.1:18751 --metrics 127.0.0.1:18752 \
  --data-dir "$work/data" >"$work/sluice.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "grpc listening" "$work/sluice.log" && break; sleep 0.1; done
grep -q "ONNX Runtime loaded" "$work/sluice.log" || echo "note: Sluice is not on ONNX Runtime (see its log)" >&2

python3 -c 'import sys; sys.stdout.buffer.write(bytes(i * 37 % 256 for i in range(64)))' >"$work/image.u8"
pixels=$(python3 -c 'print(",".join(str(i * 37 % 256) for i in range(64)))')
printf '{"inputs":[{"name":"image","datatype":"UINT8","shape":[1,64],"data":[%s]}]}' "$pixels" >"$work/image.json"

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
measure() { # world concurrency
  local world=$1 concurrency=$2 target
  case $world in
    oip) target=(--model digits --input "$work/image.json") ;;
    http) target=(--model digits-http --http-app /classify --input "$work/image.u8") ;;
  esac
  run() { # seconds output
    $client_cpus "$sluice" perf --address 127.0.0.1:18750 "${target[@]}" --key acme-demo-key \
      --concurrency "$concurrency" --warmup-s 0 --duration-s "$1" >"$2"
  }
  run 1 /dev/null
  local before; before=$(cpu_ticks "$pid")
  run "$seconds" "$work/out"
  local ticks=$(($(cpu_ticks "$pid") - before))
  grep "^| - |" "$work/out" | tail -1 | awk -F'|' -v w="$world" -v c="$concurrency" -v ticks="$ticks" \
    -v hz="$(getconf CLK_TCK)" '{ ok = $3 + 0; gsub(/ /, "", $4);
      printf "| %s | %d | %.0f | %s | %s | %s | %.1f |\n", w, c, $5, $6, $8, $4, (ok > 0 ? ticks / hz * 1e6 / ok : 0) }'
}
echo "| world | concurrency | inf/s | p50 | p99 | errors | server CPU µs/request |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for _ in $(seq "$rounds"); do
  for concurrency in 1 16; do
    for world in oip http; do
      measure "$world" "$concurrency"
    done
  done
done
