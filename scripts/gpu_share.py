#!/usr/bin/env python3
"""Tenants' share of one GPU, on a machine with an NVIDIA GPU: run by scripts/gpu-check.sh
(part `share`) from the same PACK as scripts/gpu_check.py.

One tenant (the hog) keeps four models busy on cuda:0, each a copy of the largest packed model
(its own digest, so its own copy and queue), two clients each sending batches of 128 rows; another
tenant (the victim) calls its own copy with one row, one call at a time, 5 ms apart. The victim's
latency alone, then beside the hog with the GPU's runs shared by tenant (`--gpu-runs 2`, the
default: a tenant over its share waits while two runs go on) and unchecked (`--gpu-runs 64`:
every instance's run goes to the GPU at once, as before the share), with the hog's rows/s in each.
Goal: the shared p99 below the unchecked one, at a hog's throughput within 10% of it.

GPU_CHECK_KIND=cpu rehearses it on the CPU (where the cores are shared whatever `--gpu-runs`).

Usage: python3 scripts/gpu_share.py PACK [SECONDS]
"""

import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request

import gpu_check
from gpu_check import HTTP, Server, body_of, inputs_for, manifest, on_gpu, packed_models, progress

VICTIM_KEY = "gpu-check-victim"
HOGS, CLIENTS_EACH, HOG_ROWS, VICTIM_CALLS = 4, 2, 128, 200


def infer(key, model, body, timeout=120):
    request = urllib.request.Request(f"http://{HTTP}/v2/models/{model}/infer", data=body,
                                     headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def victim_calls(body):
    """The victim's calls one at a time, 5 ms apart: p50 and p99 in ms."""
    times = []
    for _ in range(VICTIM_CALLS):
        started = time.perf_counter()
        infer(VICTIM_KEY, "own", body)
        times.append((time.perf_counter() - started) * 1000)
        time.sleep(0.005)
    times.sort()
    return times[len(times) // 2], times[len(times) * 99 // 100]


def measure(pack, copies, gpu_runs, seconds):
    hogs, own = copies[:HOGS], copies[HOGS]
    victim = ("victim.toml", manifest([own], on_gpu, "victim", VICTIM_KEY))
    server = Server(pack, hogs, ("--gpu-runs", str(gpu_runs)), tenants=[victim])
    try:
        metadata = gpu_check.call(f"/v2/models/{hogs[0][0]}")
        hog_body, victim_body = body_of(inputs_for(metadata, HOG_ROWS, seed=1)), body_of(inputs_for(metadata, 1, seed=2))
        for name, _ in hogs:
            infer(gpu_check.KEY, name, hog_body)
        alone = victim_calls(victim_body)
        stop, rows = threading.Event(), [0]

        def hog(name):
            while not stop.is_set():
                infer(gpu_check.KEY, name, hog_body)
                rows[0] += HOG_ROWS

        threads = [threading.Thread(target=hog, args=(name,)) for name, _ in hogs for _ in range(CLIENTS_EACH)]
        for thread in threads:
            thread.start()
        time.sleep(min(seconds, 2))
        before, started = rows[0], time.perf_counter()
        beside = victim_calls(victim_body)
        rate = (rows[0] - before) / (time.perf_counter() - started)
        stop.set()
        for thread in threads:
            thread.join()
        return alone, beside, rate
    finally:
        server.stop()


def main():
    pack = os.path.abspath(sys.argv[1])
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 5
    name, path = max(packed_models(pack), key=lambda model: os.path.getsize(model[1]))
    directory = tempfile.mkdtemp()
    weights = open(path, "rb").read()
    copies = []
    for index in range(HOGS + 1):
        # ModelProto.doc_string (field 6): the same graph under another digest.
        copy = os.path.join(directory, f"{name}-{index}.onnx")
        open(copy, "wb").write(weights + bytes([0x32, 1, ord("a") + index]))
        copies.append((f"hog{index}" if index < HOGS else "own", copy))
    print(f"\n| {name} on {gpu_check.DEVICE}: the victim's 1-row calls | victim alone p50 / p99 "
          f"| beside the hog's {HOGS} busy models p50 / p99 | hog's rows/s |\n| --- | --- | --- | --- |")
    results = {}
    try:
        for label, gpu_runs in [("shared (`--gpu-runs 2`)", 2), ("unchecked (`--gpu-runs 64`)", 64)]:
            progress(f"share: {label}")
            alone, beside, rate = measure(pack, copies, gpu_runs, seconds)
            results[gpu_runs] = (beside[1], rate)
            print(f"| {label} | {alone[0]:.2f} / {alone[1]:.2f} ms | {beside[0]:.2f} / {beside[1]:.2f} ms | {rate:.0f} |")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    (shared_p99, shared_rate), (unchecked_p99, unchecked_rate) = results[2], results[64]
    met = shared_p99 < unchecked_p99 and shared_rate >= 0.9 * unchecked_rate
    print(f"\nshare: victim p99 {shared_p99:.2f} against {unchecked_p99:.2f} ms unchecked, hog's rows/s "
          f"{shared_rate / unchecked_rate:.2f} of unchecked: goal {'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
