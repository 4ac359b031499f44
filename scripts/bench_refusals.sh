#!/usr/bin/env bash
# What a refusal costs the server beside what a whole request costs the floor server
# (benches/floor.rs: the same HTTP crates, OIP JSON parsed, ten values back): open-loop load
# at RATE req/s for SECONDS (`sluice perf --rate`, new requests on the connections the
# client keeps), server CPU per request from /proc/PID/stat, for
#   floor      the floor server answering 200,
#   401        Sluice refusing a wrong key (before the body is read),
#   429        Sluice refusing a tenant over its request rate (after the key, before the body).
# Servers on CPU 0, the load on CPU 1. Overload refusals (503 at a full line) are measured by
# scripts/soak.sh.
# Usage: scripts/bench_refusals.sh [rate] [seconds]    (needs `cargo build --release`)
set -euo pipefail
cd "$(dirname "$0")/.."
rate="${1:-16000}"
seconds="${2:-5}"
sluice=target/release/sluice
floor=$(cargo bench --bench floor --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))/\1/p' | tail -1)
[ -x "$floor" ] || { echo "could not build the floor server" >&2; exit 1; }
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
server_cpus="" client_cpus=""
if [ "$(nproc)" -ge 2 ]; then server_cpus="taskset -c 0"; client_cpus="taskset -c 1"; fi

mkdir -p "$work/tenants"
model="$PWD/examples/digits/model/digits.onnx"
cat >"$work/tenants/limited.toml" <<TOML
version = 1
id = "limited"
api_key_sha256 = ["$(printf %s limited-key | sha256sum | cut -d' ' -f1)"]
[quotas]
max_requests_per_second = 1
[models.digits-mlp]
path = "$model"
sha256 = "$(sha256sum "$model" | cut -d' ' -f1)"
TOML
$server_cpus "$floor" 127.0.0.1:18700 127.0.0.1:18701 >"$work/floor.log" 2>&1 &
floor_pid=$!
$server_cpus "$sluice" serve --http 127.0.0.1:18710 --grpc 127.0.0.1:18711 --metrics 127.0.0.1:18712 \
  --tenants "$work/tenants" --data-dir "$work/data" >"$work/sluice.log" 2>&1 &
sluice_pid=$!
for _ in $(seq 600); do
  grep -q "grpc listening" "$work/sluice.log" && grep -q "floor listening" "$work/floor.log" && break
  sleep 0.1
done
scaled=$(python3 -c 'print(",".join(repr(i * 37 % 256 / 255) for i in range(64)))')
printf '{"inputs":[{"name":"X","datatype":"FP32","shape":[1,64],"data":[%s]}]}' "$scaled" >"$work/plain.json"

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
measure() { # row port pid key
  local row=$1 port=$2 pid=$3 key=$4
  run() { # seconds output
    $client_cpus "$sluice" perf --address "127.0.0.1:$port" --model digits-mlp --key "$key" --input "$work/plain.json" \
      --rate "$rate" --warmup-s 0 --duration-s "$1" --refusals >"$2"
  }
  run 1 /dev/null
  local before; before=$(cpu_ticks "$pid")
  run "$seconds" "$work/out"
  local ticks=$(($(cpu_ticks "$pid") - before))
  # The first row counts the answered requests, the second (with --refusals) the refused ones.
  awk -F'|' -v row="$row" -v ticks="$ticks" -v hz="$(getconf CLK_TCK)" '
    /^\| - \|/ { n++; if (n == 1) { ok = $3 + 0 } else { refused = $3 + 0; p50 = $4; p99 = $5 } }
    END { total = ok + refused; if (n == 1) { p50 = "-"; p99 = "-" }
          printf "| %s | %d | %d | %s | %s | %.1f |\n", row, ok, refused, p50, p99,
            (total > 0 ? ticks / hz * 1e6 / total : 0) }' "$work/out"
}
echo "| row | answered | refused | refusal p50 | refusal p99 | server CPU µs/request |"
echo "| --- | --- | --- | --- | --- | --- |"
measure floor 18700 "$floor_pid" any
measure 401 18710 "$sluice_pid" wrong-key
measure 429 18710 "$sluice_pid" limited-key
