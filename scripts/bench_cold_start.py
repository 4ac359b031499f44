#!/usr/bin/env python3
"""Cold start and scale to zero, per plain model of the demo tenant `acme`.

Starts `sluice serve` on CPU 0 with `--idle-unload-s 2`, reads each model's load at start
(parse, plan and warm-up) from the log, then per model: the warm median of 200 sequential
one-row requests, and the latency of the first request after the model left memory (and the
load it paid for, from the log). Standard library only; run after `cargo build --release`
(which fetches ONNX Runtime into target/onnxruntime/).

Usage: python3 scripts/bench_cold_start.py [ROUNDS]
"""

import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import oip_zeros

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "acme-demo-key"
MODELS = ["digits-mlp", "digits-mlp-small", "magika-v3"]
HTTP = "127.0.0.1:18200"


def call(path, body=None):
    request = urllib.request.Request(f"http://{HTTP}{path}", data=body, headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read() or b"null")


def zeros_request(model):
    return oip_zeros.zeros_request(call(f"/v2/models/{model}"))


def timed(model, body):
    started = time.perf_counter()
    call(f"/v2/models/{model}/infer", body)
    return (time.perf_counter() - started) * 1000


def plain(text):
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def loads(log, model, marker):
    pattern = re.compile(rf"{marker}.*model={re.escape(model)}\s.*load_ms=(\d+)")
    return [int(m.group(1)) for m in pattern.finditer(plain(log))]


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    library = sorted(glob.glob(f"{ROOT}/target/onnxruntime/libonnxruntime.so.*"))[-1]
    data = tempfile.mkdtemp()
    log_path = os.path.join(data, "server.log")
    command = [
        "taskset", "-c", "0", f"{ROOT}/target/release/sluice", "serve", "--http", HTTP,
        "--grpc", "127.0.0.1:18201", "--metrics", "127.0.0.1:18202", "--tenants", f"{ROOT}/tenants",
        "--data-dir", data, "--onnxruntime-lib", library, "--idle-unload-s", "2",
    ]
    with open(log_path, "w") as log_file:
        server = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        for _ in range(200):
            if "grpc listening" in plain(open(log_path).read()):
                break
            time.sleep(0.1)
        print("| model | load at start (ms, with warm-up) | warm p50 (ms) | first request after scale to zero (ms) | its load (ms) |")
        print("| --- | --- | --- | --- | --- |")
        for model in MODELS:
            body = zeros_request(model)
            at_start = loads(open(log_path).read(), model, "model resident")
            for _ in range(rounds):
                warm = statistics.median(timed(model, body) for _ in range(200))
                while True:
                    index = call("/v2/repository/index", b"")
                    row = next(r for r in index if r["name"] == model)
                    if "not resident" in row["reason"]:
                        break
                    time.sleep(0.05)
                cold = timed(model, body)
                demand = loads(open(log_path).read(), model, "model loaded")
                print(f"| {model} | {at_start[0] if at_start else '?'} | {warm:.2f} | {cold:.1f} | {demand[-1] if demand else '?'} |")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
