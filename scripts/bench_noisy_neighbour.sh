#!/usr/bin/env bash
# Noisy neighbour: tenant B at RATE_B requests/s throughout, tenant A at 10x B's rate in every
# other second, both with equal compute weights on the same model (one shared queue). One run
# of `sluice perf` against `sluice serve` reports B for the seconds without A and the seconds
# beside A, interleaved so that the machine's background load falls on both alike, and each
# tenant's goodput. Needs `cargo build --release`.
# Usage: scripts/bench_noisy_neighbour.sh [rate_b] [seconds]
# A_LOAD replaces A's rate with any `sluice perf --tenant` load (`c64`: 64 requests in flight,
# a flood that saturates the server); SLUICE_BIN runs another build of `sluice`.
set -euo pipefail
cd "$(dirname "$0")/.."
rate_b="${1:-300}"
seconds="${2:-10}"
rate_a="${A_LOAD:-$(( rate_b * 10 ))}"
sluice="${SLUICE_BIN:-target/release/sluice}"
# The server gets CPU 0 and the load generator CPU 1 (override with SERVER_CPUS/CLIENT_CPUS;
# SERVE_ARGS adds `sluice serve` options; PROTOCOL=grpc drives the gRPC port).
# IDLE_POLL=1 keeps the CPUs polling when idle for the run (a PM QoS request of 0 µs wake-up
# latency, which stands while /dev/cpu_dma_latency is held open; needs root): on a VM, a
# halted vCPU pays the hypervisor's wake-up on every request that finds it idle.
if [ "${IDLE_POLL:-0}" = 1 ]; then
  exec 3>/dev/cpu_dma_latency
  printf '\x00\x00\x00\x00' >&3
fi
if [ "$(nproc)" -ge 2 ]; then SERVER_CPUS="${SERVER_CPUS-0}"; CLIENT_CPUS="${CLIENT_CPUS-1}"; fi
target="--address 127.0.0.1:18500"
if [ "${PROTOCOL:-http}" = grpc ]; then target="--address 127.0.0.1:18501 --grpc"; fi
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
${SERVER_CPUS:+taskset -c $SERVER_CPUS} "$sluice" serve --http 127.0.0.1:18500 --grpc 127.0.0.1:18501 --metrics 127.0.0.1:18502 --tenants "$work" --data-dir "$work/data" ${SERVE_ARGS:-} \
  >"$work/serve.log" 2>&1 &
for _ in $(seq 100); do grep -q "grpc listening" "$work/serve.log" 2>/dev/null && break; sleep 0.1; done
${CLIENT_CPUS:+taskset -c $CLIENT_CPUS} "$sluice" perf $target --model m --warmup-s 1 \
  --duration-s "$seconds" --tenant "a:key-a:$rate_a" --tenant "b:key-b:$rate_b" --alternate a
