#!/usr/bin/env bash
# The throughput cost of metrics and drift sampling: two `sluice serve` on the same CPU, one
# with metrics (and the model's default drift sampling) and one with `--no-metrics`, each
# driven by its own `sluice perf` at concurrency 64 on the digits MLP, both at the same time.
# The kernel splits the CPU evenly between the two saturated servers (the CPU time of each is
# printed), so the ratio of their throughputs is the ratio of their costs per inference, and
# whatever the machine does to its speed meanwhile falls on both alike. ROUNDS rounds of
# SECONDS each; prints each round's cost and their mean with a 95% interval.
# SAME=1 starts both servers without metrics: the method's own noise (an A/A run).
# DRIFT_SAMPLE_RATE overrides the model's drift sampling (default: every call, at most 100 a second).
# Needs `cargo build --release`.
# Usage: scripts/bench_metrics.sh [seconds] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
rounds="${2:-8}"
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
if [ -n "${DRIFT_SAMPLE_RATE:-}" ]; then printf '[models.m.drift]\nsample_rate = %s\n' "$DRIFT_SAMPLE_RATE" >> "$work/bench.toml"; fi
start() { # name port extra...
  local name=$1 port=$2; shift 2
  $server_cpus "$sluice" serve --http "127.0.0.1:$port" --grpc "127.0.0.1:$((port + 1))" --tenants "$work" \
    --data-dir "$work/data-$name" "$@" >"$work/$name.log" 2>&1 &
  echo $! > "$work/$name.pid"
  for _ in $(seq 300); do grep -q "grpc listening" "$work/$name.log" 2>/dev/null && break; sleep 0.1; done
}
drive() { # port seconds output
  $client_cpus "$sluice" perf --address "127.0.0.1:$1" --model m --key bench-key --concurrency 64 \
    --warmup-s 0 --duration-s "$2" > "$3"
}
cpu_ticks() { # pid: user + system clock ticks so far
  awk '{ print $14 + $15 }' "/proc/$1/stat"
}
ok() { # perf output: requests answered in the measured window
  tail -1 "$1" | awk -F'|' '{ gsub(/ /, "", $3); print $3 }'
}
if [ -n "${SAME:-}" ]; then start on 18600 --no-metrics; else start on 18600 --metrics 127.0.0.1:18602; fi
start off 18610 --no-metrics
on_pid=$(cat "$work/on.pid") off_pid=$(cat "$work/off.pid")
echo "| round | on (inf/s) | off (inf/s) | server CPU on / off (s) | cost |"
echo "| --- | --- | --- | --- | --- |"
for round in $(seq "$rounds"); do
  # Warm up apart, so that the CPU time counted covers the measured requests only.
  drive 18600 1 /dev/null & warm_on=$!
  drive 18610 1 /dev/null & warm_off=$!
  wait "$warm_on" "$warm_off"
  on_before=$(cpu_ticks "$on_pid") off_before=$(cpu_ticks "$off_pid")
  drive 18600 "$seconds" "$work/on.out" & load_on=$!
  drive 18610 "$seconds" "$work/off.out" & load_off=$!
  wait "$load_on" "$load_off"
  on_ticks=$(($(cpu_ticks "$on_pid") - on_before)) off_ticks=$(($(cpu_ticks "$off_pid") - off_before))
  awk -v r="$round" -v on="$(ok "$work/on.out")" -v off="$(ok "$work/off.out")" -v s="$seconds" \
    -v con="$on_ticks" -v coff="$off_ticks" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "| %d | %.0f | %.0f | %.2f / %.2f | %.1f%% |\n", r, on / s, off / s, con / hz, coff / hz, 100 * (1 - on / off) }'
done | tee "$work/rows"
awk -F'|' '{ c = $6; gsub(/[ %]/, "", c); n++; total += c; squares += c * c }
  END { mean = total / n;
        printf "\nmetrics cost: mean %.1f%% over %d rounds", mean, n;
        if (n > 1) {
          sd = sqrt((squares - n * mean * mean) / (n - 1));
          split("12.71 4.30 3.18 2.78 2.57 2.45 2.36 2.31 2.26 2.23 2.20 2.18 2.16 2.14 2.13 2.12 2.11 2.10 2.09 2.09", t, " ");
          k = n - 1; if (k > 20) k = 20;
          half = t[k] * sd / sqrt(n);
          printf ", 95%% interval %.1f%% to %.1f%%", mean - half, mean + half
        }
        printf "\n" }' "$work/rows"
if [ -z "${SAME:-}" ]; then
  curl -sf http://127.0.0.1:18602/metrics | grep -c '^sluice_' | xargs -I{} echo "samples exported by the server with metrics: {}"
fi
