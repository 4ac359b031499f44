#!/usr/bin/env bash
# Noisy neighbour: tenant B alone at RATE_B requests/s, then tenant A at 10x B's rate beside
# it, both with equal compute weights on the same model (one shared queue). Prints B's
# latency alone and with A, and each tenant's goodput, measured with `sluice perf` against
# `sluice serve` in one run of this script. Needs `cargo build --release`.
# Usage: scripts/bench_noisy_neighbour.sh [rate_b] [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
rate_b="${1:-300}"
seconds="${2:-10}"
rate_a=$(( rate_b * 10 ))
sluice=target/release/sluice
# The server gets CPU 0 and the load generator CPU 1 (override with SERVER_CPUS/CLIENT_CPUS;
# SERVE_ARGS adds `sluice serve` options).
if [ "$(nproc)" -ge 2 ]; then SERVER_CPUS="${SERVER_CPUS-0}"; CLIENT_CPUS="${CLIENT_CPUS-1}"; fi
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
model=examples/digits/model/digits.onnx
digest=$(sha256sum "$model" | cut -d' ' -f1)
for tenant in a b; do
  cat > "$work/$tenant.toml" <<TOML
version = 1
id = "$tenant"
api_key_sha256 = ["$(printf "key-$tenant" | sha256sum | cut -d' ' -f1)"]
[quotas]
max_concurrent_requests = 1024
compute_weight = 1
[models.m]
path = "$PWD/$model"
sha256 = "$digest"
TOML
done
${SERVER_CPUS:+taskset -c $SERVER_CPUS} "$sluice" serve --http 127.0.0.1:18500 --grpc 127.0.0.1:18501 --tenants "$work" --data-dir "$work/data" ${SERVE_ARGS:-} \
  >"$work/serve.log" 2>&1 &
for _ in $(seq 100); do grep -q "grpc listening" "$work/serve.log" 2>/dev/null && break; sleep 0.1; done
perf() { ${CLIENT_CPUS:+taskset -c $CLIENT_CPUS} "$sluice" perf --address 127.0.0.1:18500 --model m --warmup-s 1 --duration-s "$seconds" "$@" | tail -n +3; }
echo "B alone at ${rate_b}/s:"
perf --tenant "b:key-b:$rate_b"
echo "A at ${rate_a}/s beside B at ${rate_b}/s:"
perf --tenant "a:key-a:$rate_a" --tenant "b:key-b:$rate_b"
