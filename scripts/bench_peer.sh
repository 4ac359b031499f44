#!/usr/bin/env bash
# Sluice beside a peer, measured by the same client: NVIDIA's perf_analyzer 2.40
# (scripts/fetch_perf_analyzer.py) against Sluice's plain `digits-mlp` and against PyTriton
# (Triton Inference Server with a Python model: scripts/peer_pytriton.py, the same ONNX model
# on ONNX Runtime, dynamic batching up to 32), over HTTP and gRPC at concurrency 1 and 16.
# Servers on CPU 0, the client on CPU 1; server CPU per request from /proc (for PyTriton, its
# Triton server and Python processes together), requests estimated as throughput x run time.
# PyTriton is installed into target/peer-venv (pinned), not into the project's .venv.
# Usage: scripts/bench_peer.sh [seconds per window] [rounds]     (needs `cargo build --release`)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-3}"
rounds="${2:-1}"
perf_analyzer=$(python3 scripts/fetch_perf_analyzer.py | tail -1)
venv=target/peer-venv
# Debian's python3.11: Triton's Python backend stub fails with newer 3.11 patch releases.
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check nvidia-pytriton==0.7.0 onnxruntime==1.32.0
work=$(mktemp -d)
trap 'pkill -P $$ 2>/dev/null || true; pkill -f "peer_pytriton.py 18730" 2>/dev/null || true; rm -rf "$work"' EXIT
server_cpus="" client_cpus=""
if [ "$(nproc)" -ge 2 ]; then server_cpus="taskset -c 0"; client_cpus="taskset -c 1"; fi

$server_cpus target/release/sluice serve --http 127.0.0.1:18720 --grpc 127.0.0.1:18721 --metrics 127.0.0.1:18722 \
  --data-dir "$work/data" >"$work/sluice.log" 2>&1 &
sluice_pid=$!
$server_cpus "$venv/bin/python" scripts/peer_pytriton.py 18730 18731 18732 >"$work/peer.log" 2>&1 &
peer_pid=$!
for _ in $(seq 1200); do
  grep -q "grpc listening" "$work/sluice.log" && grep -q "peer listening" "$work/peer.log" && break
  sleep 0.1
done
grep -q "peer listening" "$work/peer.log" || { echo "PyTriton did not start:" >&2; cat "$work/peer.log" >&2; exit 1; }
sleep 2

# CPU ticks of a process and all its descendants.
tree_ticks() {
  local total=0 pid
  for pid in $1 $(pgrep -P "$1" 2>/dev/null) $(for child in $(pgrep -P "$1" 2>/dev/null); do pgrep -P "$child"; done); do
    [ -r "/proc/$pid/stat" ] && total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
  done
  echo "$total"
}
echo "| server | protocol | concurrency | infer/s | p50 | p99 | server CPU µs/request |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for _ in $(seq "$rounds"); do
  for protocol in http grpc; do
    for concurrency in 1 16; do
      for server in sluice pytriton; do
        port=18720 pid=$sluice_pid
        [ "$server" = pytriton ] && port=18730 pid=$peer_pid
        [ "$protocol" = grpc ] && port=$((port + 1))
        before=$(tree_ticks "$pid") started=$(date +%s.%N)
        $client_cpus timeout 120 "$perf_analyzer" -m digits-mlp -i "$protocol" -u "127.0.0.1:$port" \
          -H 'authorization: Bearer acme-demo-key' --concurrency-range "$concurrency" \
          --measurement-interval $((seconds * 1000)) --stability-percentage 100 >"$work/out" 2>&1 || true
        ticks=$(($(tree_ticks "$pid") - before)) ended=$(date +%s.%N)
        awk -v s="$server" -v p="$protocol" -v n="$concurrency" -v ticks="$ticks" -v hz="$(getconf CLK_TCK)" \
          -v started="$started" -v ended="$ended" '
          /Throughput:/ && !rate { rate = $2 }
          /p50 latency:/ && !p50 { p50 = $3 / 1000 }
          /p99 latency:/ && !p99 { p99 = $3 / 1000 }
          END { if (!rate) { printf "| %s | %s | %d | failed | | | |\n", s, p, n; exit }
                printf "| %s | %s | %d | %.0f | %.2f ms | %.2f ms | %.1f |\n", s, p, n, rate, p50, p99,
                  ticks / hz * 1e6 / (rate * (ended - started)) }' "$work/out"
      done
    done
  done
done
