#!/usr/bin/env bash
# NVIDIA's perf_analyzer 2.40 (scripts/fetch_perf_analyzer.py) against `sluice serve` started
# as users start it (every CPU, the demo tenants): the plain model `digits-mlp` and the
# `digits` app, over gRPC and HTTP, at concurrency 1, 8 and 64 (synchronous clients). What the
# issue asks of gRPC: throughput never falls as concurrency rises, p99 <= 5 ms at 8.
# Client and server share the machine's CPUs, as they do when both run on one host.
# SLUICE=BINARY measures another build of the server (a before/after pair). PROTOCOLS picks the
# protocols (default "grpc http"; "grpc-stream" is gRPC with perf_analyzer's --streaming, one
# stream carrying each client's requests).
# Usage: scripts/bench_perf_analyzer.sh [seconds per window] [rounds]   (needs `cargo build --release`)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-3}"
rounds="${2:-1}"
perf_analyzer=$(python3 scripts/fetch_perf_analyzer.py | tail -1)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
"${SLUICE:-target/release/sluice}" serve --http 127.0.0.1:18720 --grpc 127.0.0.1:18721 --metrics 127.0.0.1:18722 \
  --data-dir "$work/data" >"$work/sluice.log" 2>&1 &
for _ in $(seq 600); do grep -q "grpc listening" "$work/sluice.log" && break; sleep 0.1; done
grep -q "ONNX Runtime loaded" "$work/sluice.log" || echo "note: Sluice is not on ONNX Runtime (see its log)" >&2

echo "| model | protocol | concurrency | infer/s | p50 | p99 | server: queue / compute infer / overhead µs |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for _ in $(seq "$rounds"); do
  for model in digits-mlp digits; do
    for protocol in ${PROTOCOLS:-grpc http}; do
      port=18720 wire=$protocol streaming=()
      [ "$protocol" != http ] && port=18721 wire=grpc
      [ "$protocol" = grpc-stream ] && streaming=(--streaming)
      for concurrency in 1 8 64; do
        timeout 120 "$perf_analyzer" -m "$model" -i "$wire" "${streaming[@]}" -u "127.0.0.1:$port" \
          -H 'authorization: Bearer acme-demo-key' \
          --shape image:1,64 --concurrency-range "$concurrency" --measurement-interval $((seconds * 1000)) \
          >"$work/out" 2>&1 || { echo "perf_analyzer failed:" >&2; cat "$work/out" >&2; exit 1; }
        awk -v m="$model" -v p="$protocol" -v c="$concurrency" '
          /Throughput:/ && !rate { rate = $2 }
          /p50 latency:/ && !p50 { p50 = $3 / 1000 }
          /p99 latency:/ && !p99 { p99 = $3 / 1000 }
          /Avg request latency:/ { split($0, f, /[(+)]/); server = f[3] " / " f[5] " / " f[2] }
          END { gsub(/ usec|overhead |queue |compute infer /, "", server); gsub(/ +/, " ", server)
                printf "| %s | %s | %d | %.0f | %.2f ms | %.2f ms | %s |\n", m, p, c, rate, p50, p99, server }' "$work/out"
      done
    done
  done
done
