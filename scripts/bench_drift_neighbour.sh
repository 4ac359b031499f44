#!/usr/bin/env bash
# A tenant with the largest drift windows beside a calm tenant. `heavy` keeps 100,000
# reference and 100,000 window rows of the digits MLP's 64 columns (67 features, a report
# sorts every window), fills them, then sends 1,000 rows every 250 ms so its report is always
# due again. `calm` (its own copy of the model, on tract) is measured meanwhile: closed-loop
# throughput (`sluice perf`, concurrency 8, 10 s), then one request every 10 ms for 10 s
# (p50 / p99 / max). The server is on CPU 0, the clients on CPU 1. Each round runs every
# binary given, in turn. Needs `cargo build --release`.
# Usage: scripts/bench_drift_neighbour.sh ROUNDS BINARY...
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=$1
shift
library=$(find target/onnxruntime -name 'libonnxruntime.so.*' 2>/dev/null | sort | tail -1)
[ -n "$library" ] || { echo "no ONNX Runtime in target/onnxruntime: build once (cargo build --release)" >&2; exit 1; }
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
model=$PWD/examples/digits/model/digits.onnx
sha=$(sha256sum "$model" | cut -d' ' -f1)
mkdir -p "$work/tenants"
for tenant in heavy calm; do
  backend=onnxruntime drift=""
  [ "$tenant" = calm ] && backend=tract
  [ "$tenant" = heavy ] && drift=$'[models.digits-mlp.drift]\nmax_samples_per_second = 100000\nreference_rows = 100000\nwindow_rows = 100000'
  cat > "$work/tenants/$tenant.toml" <<TOML
version = 1
id = "$tenant"
api_key_sha256 = ["$(printf '%s-key' "$tenant" | sha256sum | cut -d' ' -f1)"]
[quotas]
max_request_bytes = 16777216
max_concurrent_requests = 64
[models.digits-mlp]
path = "$model"
sha256 = "$sha"
backend = "$backend"
$drift
TOML
done
cat > "$work/feed.py" <<'PY'
import json, random, struct, sys, time, urllib.request
rows = 1000
random.seed(1)
header = json.dumps({"inputs": [{"name": "X", "shape": [rows, 64], "datatype": "FP32",
                                 "parameters": {"binary_data_size": rows * 64 * 4}}]}).encode()
bodies = [header + struct.pack(f"<{rows * 64}f", *[random.random() for _ in range(rows * 64)]) for _ in range(8)]
def send(i):
    request = urllib.request.Request("http://127.0.0.1:18100/v2/models/digits-mlp/infer", data=bodies[i % 8],
                                     headers={"Authorization": "Bearer heavy-key",
                                              "Inference-Header-Content-Length": str(len(header))})
    urllib.request.urlopen(request, timeout=30).read()
for i in range(210):
    send(i)
print("filled", flush=True)
i = 0
while True:
    send(i)
    i += 1
    time.sleep(0.25)
PY
cat > "$work/probe.py" <<'PY'
import http.client, json, time
body = json.dumps({"inputs": [{"name": "X", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]})
connection = http.client.HTTPConnection("127.0.0.1", 18100, timeout=30)
latencies = []
end = time.time() + 10
while time.time() < end:
    began = time.perf_counter()
    connection.request("POST", "/v2/models/digits-mlp/infer", body, {"Authorization": "Bearer calm-key"})
    response = connection.getresponse()
    response.read()
    assert response.status == 200, response.status
    latencies.append((time.perf_counter() - began) * 1000)
    time.sleep(0.01)
latencies.sort()
at = lambda share: latencies[min(len(latencies) - 1, int(len(latencies) * share))]
print(f"{len(latencies)} | {at(0.5):.2f} ms | {at(0.99):.2f} ms | {latencies[-1]:.1f} ms | {sum(l > 100 for l in latencies)}")
PY
echo "| round | binary | calm closed loop (inf/s) | probes | p50 | p99 | max | over 100 ms | heavy's report |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for round in $(seq "$rounds"); do
  for binary in "$@"; do
    rm -rf "$work/data"
    taskset -c 0 "$binary" serve --http 127.0.0.1:18100 --grpc 127.0.0.1:18101 --metrics 127.0.0.1:18102 \
      --tenants "$work/tenants" --data-dir "$work/data" --onnxruntime-lib "$library" >"$work/log" 2>&1 &
    server=$!
    for _ in $(seq 100); do grep -q "grpc listening" "$work/log" && break; sleep 0.2; done
    taskset -c 1 python3 "$work/feed.py" >"$work/feed.log" 2>&1 &
    feeder=$!
    for _ in $(seq 300); do grep -q filled "$work/feed.log" && break; sleep 0.5; done
    sleep 5 # the drift thread takes the rows in; a few exports pass
    throughput=$(taskset -c 1 target/release/sluice perf --address 127.0.0.1:18100 --model digits-mlp --key calm-key \
      --concurrency 8 --warmup-s 1 --duration-s 10 | grep '^| - |' | awk -F'|' '{print $5}' | tr -d ' ')
    probes=$(taskset -c 1 python3 "$work/probe.py")
    report=$(curl -s -m 30 -H 'authorization: Bearer heavy-key' 127.0.0.1:18100/v2/models/digits-mlp/drift |
      python3 -c 'import json, sys; d = json.load(sys.stdin); print(d["status"], d["window_rows"], "rows,", len(d["features"]), "features")')
    echo "| $round | $(basename "$binary") | $throughput | $probes | $report |"
    kill "$feeder" "$server"
    wait "$server" 2>/dev/null || true
  done
done
