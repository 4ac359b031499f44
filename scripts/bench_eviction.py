#!/usr/bin/env python3
"""Three models over a memory budget for two, against all three resident.

Three copies of the magika model with distinct weights digests (one protobuf field appended,
so each is its own resident copy) are served by one tenant. A first server, with every model
resident, measures their footprints; the budget is then the two largest plus half the
smallest, which holds any two of them and never all three. Each pass starts `sluice serve`
on CPU 0 (clients on the other CPUs) with or without that budget and runs each workload for a
fixed time, the two servers alternating:

- skewed: 4 closed-loop clients, each request to model 0, 1 or 2 with probability 0.6, 0.3,
  0.1 (a hot pair and a cold one, as most repositories are used);
- round robin: 1 client cycling 0, 1, 2 — the worst case for LRU, where every request misses.

Reports requests per second, p50/p99 latency (ms), loads on demand and evictions (from the
server's metrics). Standard library only; run after `cargo build --release` (which fetches
ONNX Runtime into target/onnxruntime/).

Usage: python3 scripts/bench_eviction.py [SECONDS] [PASSES]
"""

import glob
import hashlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import oip_zeros

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "eviction-bench-key"
MODELS = ["m0", "m1", "m2"]
HTTP, GRPC, METRICS = "127.0.0.1:18300", "127.0.0.1:18301", "127.0.0.1:18302"


def call(path, body=None):
    request = urllib.request.Request(f"http://{HTTP}{path}", data=body, headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def metrics():
    with urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=10) as response:
        return response.read().decode()


def metric_sum(text, prefix):
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def zeros_request(model):
    return oip_zeros.zeros_request(call(f"/v2/models/{model}"))


def write_tenant(directory):
    weights = open(f"{ROOT}/examples/magika/model/model.onnx", "rb").read()
    manifest = f'version = 1\nid = "bench"\napi_key_sha256 = ["{hashlib.sha256(KEY.encode()).hexdigest()}"]\n\n'
    manifest += "[quotas]\nmax_concurrent_requests = 64\nguest_deadline_ms = 30000\n\n"
    for index, model in enumerate(MODELS):
        # ModelProto.doc_string (field 6): same graph, different digest.
        variant = weights + bytes([0x32, 1, ord("a") + index])
        path = os.path.join(directory, f"{model}.onnx")
        open(path, "wb").write(variant)
        manifest += f'[models.{model}]\npath = "{path}"\nsha256 = "{hashlib.sha256(variant).hexdigest()}"\n\n'
    open(os.path.join(directory, "bench.toml"), "w").write(manifest)


class Server:
    def __init__(self, tenants, budget):
        library = sorted(glob.glob(f"{ROOT}/target/onnxruntime/libonnxruntime.so.*"))[-1]
        self.data = tempfile.mkdtemp()
        self.log_path = os.path.join(self.data, "server.log")
        command = [
            "taskset", "-c", "0", f"{ROOT}/target/release/sluice", "serve", "--http", HTTP, "--grpc", GRPC,
            "--metrics", METRICS, "--tenants", tenants, "--data-dir", self.data, "--onnxruntime-lib", library,
        ]
        if budget:
            command += ["--model-memory", f"cpu={budget}"]
        with open(self.log_path, "w") as log_file:
            self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        for _ in range(300):
            if "grpc listening" in open(self.log_path).read():
                return
            if self.process.poll() is not None:
                raise SystemExit(open(self.log_path).read())
            time.sleep(0.1)
        raise SystemExit("the server did not start")

    def stop(self):
        self.process.terminate()
        self.process.wait()


def run(workload, bodies, seconds):
    latencies, failures = [], []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client(seed, cycle):
        pick = random.Random(seed)
        turn = 0
        while time.perf_counter() < deadline:
            if cycle:
                model, turn = MODELS[turn % 3], turn + 1
            else:
                model = pick.choices(MODELS, weights=[0.6, 0.3, 0.1])[0]
            started = time.perf_counter()
            try:
                call(f"/v2/models/{model}/infer", bodies[model])
                with lock:
                    latencies.append((time.perf_counter() - started) * 1000)
            except urllib.error.HTTPError as error:  # a failed request, counted with its answer
                with lock:
                    failures.append(f"{error.code} {error.read().decode(errors='replace')}")

    clients = [(seed, False) for seed in range(4)] if workload == "skewed" else [(0, True)]
    threads = [threading.Thread(target=client, args=args) for args in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, failures


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10
    passes = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    tenants = tempfile.mkdtemp()
    write_tenant(tenants)
    # Clients off the server's CPU.
    os.sched_setaffinity(0, set(range(1, os.cpu_count())) or {0})

    server = Server(tenants, None)
    text = metrics()
    footprints = [metric_sum(text, f'sluice_model_memory_bytes{{backend="onnxruntime",model="{m}"}}') for m in MODELS]
    server.stop()
    largest = sorted(footprints)
    budget = int(largest[1] + largest[2] + largest[0] / 2)
    print(f"footprints (MiB): {[round(f / 2**20, 2) for f in footprints]}; budget for two: {budget / 2**20:.2f} MiB")
    print()
    print("| pass | workload | models resident | req/s | p50 (ms) | p99 (ms) | failed | loads on demand | evictions |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for number in range(1, passes + 1):
        for workload in ["skewed", "round robin"]:
            for label, limit in [("all three", None), ("two of three", str(budget))]:
                server = Server(tenants, limit)
                try:
                    bodies = {model: zeros_request(model) for model in MODELS}
                    latencies, failures = run(workload, bodies, seconds)
                    text = metrics()
                    demand = metric_sum(text, 'sluice_model_load_seconds_count{backend="onnxruntime",reason="demand"}')
                    evictions = metric_sum(text, "sluice_model_evictions_total")
                finally:
                    server.stop()
                latencies.sort()
                p99 = latencies[int(len(latencies) * 0.99)] if latencies else float("nan")
                print(
                    f"| {number} | {workload} | {label} | {len(latencies) / seconds:.1f} | "
                    f"{statistics.median(latencies):.2f} | {p99:.1f} | {len(failures)} | {demand:.0f} | {evictions:.0f} |"
                )
                if failures:
                    print(f"first failure: {failures[0]}")


if __name__ == "__main__":
    main()
