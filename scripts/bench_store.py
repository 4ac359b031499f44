#!/usr/bin/env python3
"""Replicas over a shared store: how long a change through one replica takes to serve from
another, and what the store costs on the request path.

Starts moto's S3 server (from `.venv`, where the tests install `moto[server]`) and two replicas
of the demo tenants on it (`--store s3://...`, `--store-poll-ms POLL`), plus one server without
a store. Idle first: CPU per second of a replica and of the server without a store over 10 s.
Then the request path (the three serving the same state): 1,500 sequential one-row
requests to `digits-mlp` per server, in turns of 500: median latency and server CPU per
request (utime + stime from /proc). Convergence: CHANGES traffic changes of the `digits` app through replica A, each timed
from A's answer until replica B's control API shows it (each change at a random point of the
poll interval). Standard library only; run after `cargo build --release` and one test run.

Usage: python3 scripts/bench_store.py [CHANGES] [POLL_MS]
"""

import glob
import json
import random
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "acme-demo-key"
PLAIN = json.dumps({"inputs": [{"name": "X", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}).encode()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, path, body=None, method=None):
    request = urllib.request.Request(
        f"{base}{path}", data=body, method=method, headers={"Authorization": f"Bearer {KEY}"}
    )
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read() or b"null")


def wait_for(url, seconds=60):
    started = time.time()
    while time.time() - started < seconds:
        try:
            urllib.request.urlopen(url).read()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{url} did not answer")


def start_server(library, store, poll_ms, env):
    port = free_port()
    data = tempfile.mkdtemp()
    args = [f"{ROOT}/target/release/sluice", "serve", "--tenants", f"{ROOT}/tenants", "--data-dir", data,
            "--onnxruntime-lib", library, "--http", f"127.0.0.1:{port}", "--grpc", f"127.0.0.1:{free_port()}",
            "--no-metrics"]
    if store:
        args += ["--store", store, "--store-poll-ms", str(poll_ms)]
    server = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    wait_for(f"{base}/v2/health/ready")
    return server, base


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def requests(server, base, count):
    latencies = []
    cpu_before = cpu_seconds(server.pid)
    for _ in range(count):
        started = time.perf_counter()
        call(base, "/v2/models/digits-mlp/infer", PLAIN)
        latencies.append((time.perf_counter() - started) * 1e6)
    return latencies, (cpu_seconds(server.pid) - cpu_before) / count * 1e6


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main():
    changes = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    poll_ms = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    library = sorted(glob.glob(f"{ROOT}/target/onnxruntime/libonnxruntime.so.*"))[-1]
    moto_port = free_port()
    moto = subprocess.Popen([f"{ROOT}/.venv/bin/python", "-m", "moto.server", "-H", "127.0.0.1", "-p", str(moto_port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{moto_port}"
    servers = []
    try:
        wait_for(f"{endpoint}/")
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/bench", method="PUT")).read()
        env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true", AWS_ACCESS_KEY_ID="testing",
                   AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1", SLUICE_LOG="warn")
        store = "s3://bench/sluice"
        a, base_a = start_server(library, store, poll_ms, env)
        b, base_b = start_server(library, store, poll_ms, env)
        alone, base_alone = start_server(library, None, poll_ms, env)
        servers = [a, b, alone]

        # Idle: what following the store costs a replica by itself.
        time.sleep(2)
        before = [cpu_seconds(server.pid) for server in (a, alone)]
        time.sleep(10)
        idle = [(cpu_seconds(server.pid) - was) * 100 for server, was in zip((a, alone), before)]
        print(f"### Idle for 10 s: replica A used {idle[0]:.1f} ms of CPU per second, the server without a store "
              f"{idle[1]:.1f}\n")

        # Measured first, while the three serve the same state.
        results = {"replica A (--store)": ([], []), "replica B (--store)": ([], []), "without a store": ([], [])}
        for _ in range(3):
            for (name, (server, base)) in [("replica A (--store)", (a, base_a)), ("replica B (--store)", (b, base_b)),
                                           ("without a store", (alone, base_alone))]:
                requests(server, base, 50)  # warm
                latencies, cpu = requests(server, base, 500)
                results[name][0].extend(latencies)
                results[name][1].append(cpu)
        print("### Request path: sequential `digits-mlp` requests, 1,500 per server, in turns of 500\n")
        print("| server | median latency | server CPU per request |\n| --- | --- | --- |")
        for name, (latencies, cpus) in results.items():
            print(f"| {name} | {statistics.median(latencies):.0f} µs | {statistics.median(cpus):.0f} µs |")
        print()
        # Version 2 of digits, so the traffic can move between two versions.
        component = open(f"{ROOT}/target/guests/wasm32-wasip2/release/digits.wasm", "rb").read()
        call(base_a, "/control/v1/apps/digits/versions/2", component, "PUT")
        took = []
        for change in range(changes):
            # At a random point of the poll interval, as a client's change would come.
            time.sleep(random.uniform(0, poll_ms / 1000))
            weight = 1 + change % 99
            traffic = {"stable": "1", "canary": {"version": "2", "weight": weight}}
            call(base_a, "/control/v1/apps/digits/traffic", json.dumps(traffic).encode(), "PUT")
            started = time.perf_counter()
            while True:
                canary = call(base_b, "/control/v1/apps/digits").get("canary") or {}
                if canary.get("weight") == weight:
                    break
                time.sleep(0.002)
            took.append((time.perf_counter() - started) * 1000)

        print(f"### Convergence: {changes} traffic changes through replica A until replica B serves them "
              f"(`--store-poll-ms {poll_ms}`, moto)\n")
        print("| p50 | p99 | max |\n| --- | --- | --- |")
        print(f"| {percentile(took, 50):.0f} ms | {percentile(took, 99):.0f} ms | {max(took):.0f} ms |\n")

    finally:
        for server in servers:
            server.terminate()
            server.wait()
        moto.terminate()
        moto.wait()


main()
