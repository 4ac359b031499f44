#!/usr/bin/env bash
# Clients that never read their answers. One tenant (default quotas: 64 requests in flight)
# has the hostile test guest, whose `big-output` mode answers MIB MiB. A client opens
# CONNECTIONS connections, sends one such request on each and reads nothing; the server's
# resident memory is printed as they come and while they are held. Each binary given runs in
# turn. Needs `cargo build --release` (it builds the test guests).
# Usage: scripts/bench_unread_answers.sh CONNECTIONS MIB BINARY...
set -euo pipefail
cd "$(dirname "$0")/.."
connections=$1 mib=$2
shift 2
guest=$PWD/target/guests/wasm32-wasip2/release/hostile_guest.wasm
[ -f "$guest" ] || { echo "no $guest: build once (cargo build --release)" >&2; exit 1; }
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/tenants"
cat > "$work/tenants/reader.toml" <<TOML
version = 1
id = "reader"
api_key_sha256 = ["$(printf 'reader-key' | sha256sum | cut -d' ' -f1)"]
[quotas]
guest_memory_mib = 160
[apps.hostile]
stable = "1"
versions."1".component = "$guest"
TOML
for binary in "$@"; do
  rm -rf "$work/data"
  "$binary" serve --http 127.0.0.1:18110 --grpc 127.0.0.1:18111 --metrics 127.0.0.1:18112 \
    --tenants "$work/tenants" --data-dir "$work/data" >"$work/log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do grep -q "grpc listening" "$work/log" && break; sleep 0.2; done
  echo "== $binary"
  python3 - "$pid" "$connections" "$mib" <<'PY'
import json, socket, sys, time
pid, connections, mib = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def rss_mib():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
body = json.dumps({"inputs": [], "parameters": {"mode": "big-output", "mib": mib, "binary_data_output": True}})
request = ("POST /v2/models/hostile/infer HTTP/1.1\r\nhost: sluice\r\nauthorization: Bearer reader-key\r\n"
           f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n{body}").encode()
print(f"before: {rss_mib()} MiB", flush=True)
held = []
for i in range(connections):
    connection = socket.create_connection(("127.0.0.1", 18110))
    connection.sendall(request)
    held.append(connection)
    if (i + 1) % 50 == 0 or i + 1 == connections:
        time.sleep(0.5)
        print(f"{i + 1} connections: {rss_mib()} MiB", flush=True)
time.sleep(5)
print(f"held 5 s: {rss_mib()} MiB", flush=True)
PY
  kill "$pid"; wait "$pid" 2>/dev/null || true
done
