#!/usr/bin/env bash
# What users feel beside what it costs the server: throughput, p50 and p99 from `sluice perf`,
# and the server's CPU per request (user + system ticks from /proc/PID/stat over the measured
# window, divided by the requests answered), for
#   floor  the floor server (benches/floor.rs: the same HTTP/gRPC crates and OIP parsing, no
#          Sluice logic, ten values back),
#   hop    the same floor answering from another task (a spawned task, over a oneshot), as
#          Sluice's answers come from a model queue: what an answer that is not ready at
#          once costs the connection,
#   busy   the same floor spending BUSY_US (default 80) µs of CPU on each request before it
#          answers, as slow per request as the `digits` app: what the network costs per request
#          at the app's throughput (a client waiting longer sleeps more, and waking it is paid in
#          the server's writes on the loopback); in process it costs the floor's figure + BUSY_US,
#   listener  the same floor accepting and serving connections through Sluice's own listener
#          (connection caps, header timeout, drain): what that handling adds,
#   plain  Sluice's plain model `digits-mlp` (the demo tenant acme),
#   app    Sluice's `digits` app (component → wasi:nn → the same model),
# over HTTP and gRPC, at concurrency 1 and 64. Servers on CPU 0, the load on CPU 1; each
# round measures every row once, so the machine's changes of speed fall on all alike.
# The load comes from `sluice perf` (closed loop, every request counted) and from NVIDIA's
# perf_analyzer 2.40 (fetched by scripts/fetch_perf_analyzer.py; synchronous C++ clients, one
# thread each; its figures are its last measurement window's, and the requests its whole
# run sent are estimated as throughput x run time for the CPU column).
# CLIENTS="sluice-perf perf_analyzer" (the default) picks the clients, TARGETS="floor hop
# busy listener plain app" (the default) the servers; KEEP=1 keeps the work
# folder (the servers' logs) for a look afterwards.
# Usage: scripts/bench_overhead.sh [seconds] [rounds]    (needs `cargo build --release`)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
rounds="${2:-2}"
sluice=target/release/sluice
clients="${CLIENTS:-sluice-perf perf_analyzer}"
perf_analyzer=""
case " $clients " in *" perf_analyzer "*) perf_analyzer=$(python3 scripts/fetch_perf_analyzer.py | tail -1) ;; esac
floor=$(cargo bench --bench floor --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))/\1/p' | tail -1)
[ -x "$floor" ] || { echo "could not build the floor server" >&2; exit 1; }
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
server_cpus="" client_cpus=""
if [ "$(nproc)" -ge 2 ]; then server_cpus="taskset -c 0"; client_cpus="taskset -c 1"; fi

$server_cpus "$floor" 127.0.0.1:18700 127.0.0.1:18701 >"$work/floor.log" 2>&1 &
floor_pid=$!
$server_cpus "$floor" 127.0.0.1:18730 127.0.0.1:18731 --sluice-listener >"$work/listener.log" 2>&1 &
listener_pid=$!
$server_cpus "$floor" 127.0.0.1:18740 127.0.0.1:18741 --hop >"$work/hop.log" 2>&1 &
hop_pid=$!
$server_cpus "$floor" 127.0.0.1:18750 127.0.0.1:18751 --busy-us="${BUSY_US:-80}" >"$work/busy.log" 2>&1 &
busy_pid=$!
$server_cpus "$sluice" serve --http 127.0.0.1:18710 --grpc 127.0.0.1:18711 --metrics 127.0.0.1:18712 \
  --data-dir "$work/data" >"$work/sluice.log" 2>&1 &
sluice_pid=$!
for _ in $(seq 600); do
  grep -q "grpc listening" "$work/sluice.log" && grep -q "floor listening" "$work/floor.log" \
    && grep -q "floor listening" "$work/listener.log" && grep -q "floor listening" "$work/hop.log" \
    && grep -q "floor listening" "$work/busy.log" && break
  sleep 0.1
done
grep -q "ONNX Runtime loaded" "$work/sluice.log" || echo "note: Sluice is not on ONNX Runtime (see its log)" >&2

pixels=$(python3 -c 'print(",".join(str(i * 37 % 256) for i in range(64)))')
scaled=$(python3 -c 'print(",".join(repr(i * 37 % 256 / 255) for i in range(64)))')
printf '{"inputs":[{"name":"X","datatype":"FP32","shape":[1,64],"data":[%s]}]}' "$scaled" >"$work/plain.json"
printf '{"inputs":[{"name":"image","datatype":"UINT8","shape":[1,64],"data":[%s]}]}' "$pixels" >"$work/app.json"

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# Sluice's batches so far (rows, batches: `sluice_batch_rows`' sum and count over every series).
# The rows per batch of a Sluice row are printed beside its server's name: the operating point
# the layers bench's in-process rows are compared at (its `TASKS` with the same batches).
batches() {
  curl -sf http://127.0.0.1:18712/metrics \
    | awk '/^sluice_batch_rows_sum/ { rows += $NF } /^sluice_batch_rows_count/ { n += $NF } END { print rows + 0, n + 0 }'
}
server_label() { # target, batches before the run
  local after; after=$(batches)
  case $1 in
    plain | app) awk -v t="$1" -v before="$2" -v after="$after" 'BEGIN { split(before, b, " "); split(after, a, " ")
      n = a[2] - b[2]; if (n > 0) printf "%s (%.1f rows a batch)", t, (a[1] - b[1]) / n; else print t }' ;;
    *) echo "$1" ;;
  esac
}
measure() { # client target protocol concurrency
  local client=$1 target=$2 protocol=$3 concurrency=$4 port pid model request
  local grpc=()
  case $target in
    floor) port=18700 pid=$floor_pid model=digits-mlp request=plain ;;
    listener) port=18730 pid=$listener_pid model=digits-mlp request=plain ;;
    hop) port=18740 pid=$hop_pid model=digits-mlp request=plain ;;
    busy) port=18750 pid=$busy_pid model=digits-mlp request=plain ;;
    plain) port=18710 pid=$sluice_pid model=digits-mlp request=plain ;;
    app) port=18710 pid=$sluice_pid model=digits request=app ;;
  esac
  if [ "$protocol" = grpc ]; then port=$((port + 1)) grpc=(--grpc); fi
  if [ "$client" = perf_analyzer ]; then
    # Three windows of a third of the time each; stability is not what is measured here.
    local started ended before ticks batched label
    batched=$(batches) before=$(cpu_ticks "$pid") started=$(date +%s.%N)
    # Bounded: once (against the floor over HTTP at 64) it kept running without a result.
    $client_cpus timeout 120 "$perf_analyzer" -m "$model" -i "$protocol" -u "127.0.0.1:$port" \
      -H 'authorization: Bearer acme-demo-key' --shape image:1,64 --concurrency-range "$concurrency" \
      --measurement-interval $((seconds * 1000 / 3)) --stability-percentage 100 >"$work/out" 2>&1 || true
    ticks=$(($(cpu_ticks "$pid") - before)) ended=$(date +%s.%N) label=$(server_label "$target" "$batched")
    awk -v c="$client" -v t="$label" -v p="$protocol" -v n="$concurrency" -v ticks="$ticks" \
      -v hz="$(getconf CLK_TCK)" -v started="$started" -v ended="$ended" '
      /Throughput:/ && !rate { rate = $2 }
      /p50 latency:/ && !p50 { p50 = $3 / 1000 }
      /p99 latency:/ && !p99 { p99 = $3 / 1000 }
      /error|Failed/ { failed = 1 }
      END { printf "| %s | %s | %s | %d | %.0f | %.2f ms | %.2f ms | %s | %.1f |\n", c, t, p, n, rate, p50, p99,
              (failed || !rate ? "failed" : 0), (rate > 0 ? ticks / hz * 1e6 / (rate * (ended - started)) : 0) }' "$work/out"
    return
  fi
  run() { # seconds output
    $client_cpus "$sluice" perf --address "127.0.0.1:$port" "${grpc[@]}" --model "$model" --key acme-demo-key \
      --input "$work/$request.json" --concurrency "$concurrency" --warmup-s 0 --duration-s "$1" >"$2"
  }
  run 1 /dev/null
  local before batched; batched=$(batches) before=$(cpu_ticks "$pid")
  run "$seconds" "$work/out"
  local ticks=$(($(cpu_ticks "$pid") - before)) label; label=$(server_label "$target" "$batched")
  grep "^| - |" "$work/out" | tail -1 | awk -F'|' -v t="$label" -v p="$protocol" -v c="$concurrency" -v ticks="$ticks" \
    -v hz="$(getconf CLK_TCK)" '{ ok = $3 + 0; gsub(/ /, "", $4);
      printf "| sluice perf | %s | %s | %d | %.0f | %s | %s | %s | %.1f |\n", t, p, c, $5, $6, $8, $4,
        (ok > 0 ? ticks / hz * 1e6 / ok : 0) }'
}
echo "| client | server | protocol | concurrency | inf/s | p50 | p99 | errors | server CPU µs/request |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for _ in $(seq "$rounds"); do
  for client in $clients; do
    for protocol in http grpc; do
      for concurrency in 1 64; do
        for target in ${TARGETS:-floor hop busy listener plain app}; do
          measure "$client" "$target" "$protocol" "$concurrency"
        done
      done
    done
  done
done
