#!/usr/bin/env bash
# What users feel beside what it costs the server: throughput, p50 and p99 from `sluice perf`,
# and the server's CPU per request (user + system ticks from /proc/PID/stat over the measured
# window, divided by the requests answered), for
#   floor  the floor server (benches/floor.rs: the same HTTP/gRPC crates and OIP parsing, no
#          Sluice logic, ten values back),
#   plain  Sluice's plain model `digits-mlp` (the demo tenant acme),
#   app    Sluice's `digits` app (component → wasi:nn → the same model),
# over HTTP and gRPC, at concurrency 1 and 64. Servers on CPU 0, the load on CPU 1; each
# round measures every row once, so the machine's changes of speed fall on all alike.
# KEEP=1 keeps the work folder (the servers' logs) for a look afterwards.
# Usage: scripts/bench_overhead.sh [seconds] [rounds]    (needs `cargo build --release`)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
rounds="${2:-2}"
sluice=target/release/sluice
floor=$(cargo bench --bench floor --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))/\1/p' | tail -1)
[ -x "$floor" ] || { echo "could not build the floor server" >&2; exit 1; }
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
server_cpus="" client_cpus=""
if [ "$(nproc)" -ge 2 ]; then server_cpus="taskset -c 0"; client_cpus="taskset -c 1"; fi

$server_cpus "$floor" 127.0.0.1:18700 127.0.0.1:18701 >"$work/floor.log" 2>&1 &
floor_pid=$!
$server_cpus "$sluice" serve --http 127.0.0.1:18710 --grpc 127.0.0.1:18711 --metrics 127.0.0.1:18712 \
  --data-dir "$work/data" >"$work/sluice.log" 2>&1 &
sluice_pid=$!
for _ in $(seq 600); do
  grep -q "grpc listening" "$work/sluice.log" && grep -q "floor listening" "$work/floor.log" && break
  sleep 0.1
done
grep -q "ONNX Runtime loaded" "$work/sluice.log" || echo "note: Sluice is not on ONNX Runtime (see its log)" >&2

pixels=$(python3 -c 'print(",".join(str(i * 37 % 256) for i in range(64)))')
scaled=$(python3 -c 'print(",".join(repr(i * 37 % 256 / 255) for i in range(64)))')
printf '{"inputs":[{"name":"X","datatype":"FP32","shape":[1,64],"data":[%s]}]}' "$scaled" >"$work/plain.json"
printf '{"inputs":[{"name":"image","datatype":"UINT8","shape":[1,64],"data":[%s]}]}' "$pixels" >"$work/app.json"

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
measure() { # target protocol concurrency
  local target=$1 protocol=$2 concurrency=$3 port pid model request
  local grpc=()
  case $target in
    floor) port=18700 pid=$floor_pid model=digits-mlp request=plain ;;
    plain) port=18710 pid=$sluice_pid model=digits-mlp request=plain ;;
    app) port=18710 pid=$sluice_pid model=digits request=app ;;
  esac
  if [ "$protocol" = grpc ]; then port=$((port + 1)) grpc=(--grpc); fi
  run() { # seconds output
    $client_cpus "$sluice" perf --address "127.0.0.1:$port" "${grpc[@]}" --model "$model" --key acme-demo-key \
      --input "$work/$request.json" --concurrency "$concurrency" --warmup-s 0 --duration-s "$1" >"$2"
  }
  run 1 /dev/null
  local before; before=$(cpu_ticks "$pid")
  run "$seconds" "$work/out"
  local ticks=$(($(cpu_ticks "$pid") - before))
  grep "^| - |" "$work/out" | tail -1 | awk -F'|' -v t="$target" -v p="$protocol" -v c="$concurrency" -v ticks="$ticks" \
    -v hz="$(getconf CLK_TCK)" '{ ok = $3 + 0; gsub(/ /, "", $4);
      printf "| %s | %s | %d | %.0f | %s | %s | %s | %.1f |\n", t, p, c, $5, $6, $8, $4,
        (ok > 0 ? ticks / hz * 1e6 / ok : 0) }'
}
echo "| server | protocol | concurrency | inf/s | p50 | p99 | errors | server CPU µs/request |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for _ in $(seq "$rounds"); do
  for protocol in http grpc; do
    for concurrency in 1 64; do
      for target in floor plain app; do
        measure "$target" "$protocol" "$concurrency"
      done
    done
  done
done
