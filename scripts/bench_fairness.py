#!/usr/bin/env python3
"""Weighted fair share of one model's queue, measured on the per-request costs.

Three tenants with compute weights 1, 2 and 4 serve the same magika weights (one resident
copy, one batch queue shared by all three, batches of up to 4 rows). Each runs closed-loop
clients sending 1-row requests, enough that each always has jobs waiting (backlogged) and the
queue, not the clients, is the bottleneck (~90 rows a second on one CPU, so a window holds
enough batches to measure a split in): `sluice serve` runs on CPU 0, the clients on the others. Every
second the script reads `sluice_tenant_compute_seconds_total` (each batch's engine time split
over its requests by rows) and computes Jain's fairness index over the tenants' compute
divided by their weights in that window: 1.0 is a perfectly weighted split, 1/3 one tenant
taking all. Also reports each tenant's share of compute against its weight's share, and
checks that the answers' `sluice_cost_us` add up to `GET /control/v1/usage`.

Standard library only; run after `cargo build --release` (which fetches ONNX Runtime into
target/onnxruntime/).

Usage: python3 scripts/bench_fairness.py [SECONDS] [CLIENTS_PER_TENANT]
"""

import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import oip_zeros

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TENANTS = {"light": 1, "middle": 2, "heavy": 4}
ROWS = 1
HTTP, GRPC, METRICS = "127.0.0.1:18310", "127.0.0.1:18311", "127.0.0.1:18312"


def key(tenant):
    return f"fairness-{tenant}"


def call(tenant, path, body=None):
    request = urllib.request.Request(
        f"http://{HTTP}{path}", data=body, headers={"Authorization": f"Bearer {key(tenant)}"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read() or b"null")


def compute_seconds():
    with urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals = dict.fromkeys(TENANTS, 0.0)
    for line in text.splitlines():
        if line.startswith("sluice_tenant_compute_seconds_total{"):
            for tenant in TENANTS:
                if f'tenant="{tenant}"' in line:
                    totals[tenant] += float(line.rsplit(" ", 1)[1])
    return totals


def write_tenants(directory):
    weights = f"{ROOT}/examples/magika/model/model.onnx"
    digest = hashlib.sha256(open(weights, "rb").read()).hexdigest()
    for tenant, weight in TENANTS.items():
        manifest = f'version = 1\nid = "{tenant}"\napi_key_sha256 = ["{hashlib.sha256(key(tenant).encode()).hexdigest()}"]\n\n'
        manifest += f"[quotas]\ncompute_weight = {weight}\nmax_concurrent_requests = 256\nguest_deadline_ms = 60000\n\n"
        manifest += f'[models.magika]\npath = "{weights}"\nsha256 = "{digest}"\n\n'
        manifest += "[models.magika.batching]\nmax_batch_size = 4\nmax_queue_delay_us = 500\nmax_queue_size = 1024\n"
        open(os.path.join(directory, f"{tenant}.toml"), "w").write(manifest)


def start_server(tenants):
    library = sorted(glob.glob(f"{ROOT}/target/onnxruntime/libonnxruntime.so.*"))[-1]
    data = tempfile.mkdtemp()
    log_path = os.path.join(data, "server.log")
    command = [
        "taskset", "-c", "0", f"{ROOT}/target/release/sluice", "serve", "--http", HTTP, "--grpc", GRPC,
        "--metrics", METRICS, "--tenants", tenants, "--data-dir", data, "--onnxruntime-lib", library,
    ]
    with open(log_path, "w") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    for _ in range(300):
        if "grpc listening" in open(log_path).read():
            return process
        if process.poll() is not None:
            raise SystemExit(open(log_path).read())
        time.sleep(0.1)
    raise SystemExit("the server did not start")


def request_body(tenant):
    body = json.loads(oip_zeros.zeros_request(call(tenant, "/v2/models/magika")))
    for tensor in body["inputs"]:
        per_row = len(tensor["data"]) // tensor["shape"][0]
        tensor["shape"][0] = ROWS
        tensor["data"] = tensor["data"][:per_row] * ROWS
    return json.dumps(body).encode()


def main():
    seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    clients = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    tenants = tempfile.mkdtemp()
    write_tenants(tenants)
    server = start_server(tenants)
    os.sched_setaffinity(0, set(range(1, os.cpu_count())) or {0})
    try:
        bodies = {tenant: request_body(tenant) for tenant in TENANTS}
        stop = threading.Event()
        costs = {tenant: [] for tenant in TENANTS}
        lock = threading.Lock()

        def client(tenant):
            while not stop.is_set():
                answer = call(tenant, "/v2/models/magika/infer", bodies[tenant])
                with lock:
                    costs[tenant].append(answer["parameters"]["sluice_cost_us"])

        threads = [threading.Thread(target=client, args=(t,)) for t in TENANTS for _ in range(clients)]
        for thread in threads:
            thread.start()
        time.sleep(2)  # every tenant backlogged before the first window
        previous = compute_seconds()
        windows = []
        for _ in range(seconds):
            time.sleep(1)
            now = compute_seconds()
            windows.append({t: now[t] - previous[t] for t in TENANTS})
            previous = now
        stop.set()
        for thread in threads:
            thread.join()
        usage = {tenant: call(tenant, "/control/v1/usage") for tenant in TENANTS}
    finally:
        server.terminate()
        server.wait()

    def jain(window):
        normalised = [window[t] / TENANTS[t] for t in TENANTS]
        return sum(normalised) ** 2 / (len(normalised) * sum(x * x for x in normalised))

    indices = [jain(window) for window in windows]
    print(f"{len(windows)} one-second windows, {clients} clients a tenant, {ROWS}-row requests, weights {TENANTS}")
    print(f"Jain's index over weight-normalised compute: min {min(indices):.4f}, mean {sum(indices) / len(indices):.4f}")
    total = {t: sum(w[t] for w in windows) for t in TENANTS}
    weight_sum = sum(TENANTS.values())
    print()
    print("| tenant | weight | weight's share | compute share | compute (s) | requests | answers' costs / usage |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for tenant, weight in TENANTS.items():
        answered = sum(costs[tenant]) / 1e6
        billed = usage[tenant]["cost_seconds"]
        print(
            f"| {tenant} | {weight} | {weight / weight_sum:.3f} | {total[tenant] / sum(total.values()):.3f} | "
            f"{total[tenant]:.2f} | {len(costs[tenant])} | {answered / billed:.4f} |"
        )


if __name__ == "__main__":
    main()
