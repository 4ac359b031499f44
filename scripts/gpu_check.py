#!/usr/bin/env python3
"""The GPU check, run by scripts/gpu-check.sh on a machine with an NVIDIA GPU and no network,
from what scripts/gpu-pack.sh packed (PACK: bin/sluice, models/, and onnxruntime/, the
`onnxruntime-gpu` Python package whose capi/ holds the library with the CUDA provider).

1. Every packed model on cuda:0 against the CPU, through Sluice, on the same inputs (8 rows):
   the largest relative difference of any output element, the largest difference against the
   largest output, and whether argmax labels agree (goal: every element within 2e-3 of the
   largest output: the CUDA provider computes float matrix products in TF32 by default, a
   10-bit mantissa; `--cuda-option use_tf32=0` gives float32's ~1e-7; near-zero probabilities
   make relative error alone meaningless).
2. Batched throughput on the GPU at batch 1, 8, 32 and 128 rows: Sluice serving the model
   (`sluice perf` over gRPC with binary tensors, 8 clients; the server may join their requests
   into larger batches) against the same engine standalone in this process (onnxruntime-gpu's
   CUDAExecutionProvider, the same library, batches back to back), in rows/s (goal >= 90%).
   Beside them, how long from one of Sluice's batch runs to the next, and how much of it was the
   engine's run (`sluice_compute_seconds`): where the engine's share is small, the instance
   waits on Sluice (hand-offs, the queue) between runs; where it is most, the run itself costs
   more in the server than alone.
   After each batch size, the GPU memory the driver gives the server's process beside what
   Sluice charges the model: a model's footprint is measured at its load and warm-up (one row by
   default), and the engine's memory arena may grow with larger batches afterwards, which
   memory growing from one batch size to the next while the charge stays would show; where it
   grew, a server whose model warms up at 1 and 128 rows, without traffic: whether that charge
   covers it.
3. Three magika copies over a cuda:0 model memory budget for two, against all three resident:
   skewed traffic (0.6/0.3/0.1, 4 clients), requests/s (goal >= 80%).

Runs them in the order 1, 3, 2 (the eviction is short and comes out where a time limit cuts the
throughput). Prints one markdown table per part, for BENCHMARKS.md; a part that fails prints why
and the others still run. Standard library and numpy only.

GPU_CHECK_KIND=cpu runs the same parts with CPU instances, the CPU provider and a `cpu`
budget: a rehearsal on a machine without a GPU (PACK's onnxruntime/ may then be the CPU package).

Usage: python3 scripts/gpu_check.py PACK [SECONDS]
"""

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

import numpy as np

KEY = "gpu-check-key"
ADMIN = "gpu-check-admin"
HTTP, GRPC, METRICS = "127.0.0.1:18400", "127.0.0.1:18401", "127.0.0.1:18402"
BATCHES = [1, 8, 32, 128]
KIND = os.environ.get("GPU_CHECK_KIND", "gpu")
DEVICE, PROVIDER = ("cuda:0", "CUDAExecutionProvider") if KIND == "gpu" else ("cpu", "CPUExecutionProvider")
CLIENTS = 8
STARTED = time.time()
NUMPY = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64, "UINT8": np.uint8}


def progress(what):
    print(f"[{time.time() - STARTED:6.1f} s] {what}", file=sys.stderr, flush=True)


def call(path, body=None, timeout=120):
    request = urllib.request.Request(f"http://{HTTP}{path}", data=body, headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def metric_sum(prefix):
    with urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def manifest(models, lines, tenant="gpu", key=KEY):
    """A tenant serving each (name, path, extra TOML lines) model on ONNX Runtime."""
    text = f'version = 1\nid = "{tenant}"\napi_key_sha256 = ["{hashlib.sha256(key.encode()).hexdigest()}"]\n\n'
    text += "[quotas]\nmax_concurrent_requests = 256\nguest_deadline_ms = 60000\nmax_request_bytes = 268435456\n"
    text += "max_response_bytes = 268435456\nmax_tensor_elements = 67108864\nmax_resident_model_mib = 65536\n\n"
    for name, path in models:
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        text += f'[models.{name}]\npath = "{path}"\nsha256 = "{digest}"\nbackend = "onnxruntime"\n{lines(name)}\n'
    return text


def on_gpu(name):
    if name.endswith("-cpu"):
        return ""
    devices = "devices = [0]\n" if KIND == "gpu" else ""
    return (f'on_missing_device = "refuse"\n[models.{name}.batching]\nmax_batch_size = 128\n'
            f'[[models.{name}.instances]]\nkind = "{KIND}"\n{devices}')


def process_gpu_mib(pid):
    """The GPU memory (MiB) the driver reports for process PID, or None (no nvidia-smi, say)."""
    try:
        report = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in report.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid):
            return float(fields[1])
    return None


class Server:
    def __init__(self, pack, models, extra=(), lines=on_gpu, tenants=()):
        """Serves `models` to the tenant "gpu", and `tenants` (manifest file name and text)."""
        self.directory = tempfile.mkdtemp()
        open(os.path.join(self.directory, "gpu.toml"), "w").write(manifest(models, lines))
        for file, text in tenants:
            open(os.path.join(self.directory, file), "w").write(text)
        library = sorted(p for p in os.listdir(f"{pack}/onnxruntime/capi") if p.startswith("libonnxruntime.so."))[-1]
        self.log_path = os.path.join(self.directory, "server.log")
        command = [f"{pack}/bin/sluice", "serve", "--http", HTTP, "--grpc", GRPC, "--metrics", METRICS,
                   "--admin-token", ADMIN, "--tenants", self.directory, "--data-dir", os.path.join(self.directory, "data"),
                   "--onnxruntime-lib", f"{pack}/onnxruntime/capi/{library}", *extra]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 180
        while "grpc listening" not in open(self.log_path).read():
            if self.process.poll() is not None or time.time() > deadline:
                self.process.kill()
                raise RuntimeError("sluice did not start:\n" + open(self.log_path).read()[-4000:])
            time.sleep(0.2)

    def stop(self):
        self.process.terminate()
        self.process.wait()
        if os.environ.get("GPU_CHECK_LOGS"):  # every server's log, for reading afterwards
            with open(os.environ["GPU_CHECK_LOGS"], "a") as logs:
                logs.write(f"==== {' '.join(self.process.args)}\n" + open(self.log_path).read())
        shutil.rmtree(self.directory, ignore_errors=True)


def inputs_for(metadata, rows, seed):
    """Deterministic inputs shaped by the metadata: `rows` rows, other dynamic dimensions 1."""
    generator = np.random.default_rng(seed)
    arrays = {}
    for spec in metadata["inputs"]:
        shape = [rows if axis == 0 and d < 0 else (1 if d < 0 else d) for axis, d in enumerate(spec["shape"])]
        dtype = NUMPY[spec["datatype"]]
        if np.issubdtype(dtype, np.integer):
            arrays[spec["name"]] = (spec["datatype"], generator.integers(0, 256, size=shape).astype(dtype))
        else:
            arrays[spec["name"]] = (spec["datatype"], generator.random(size=shape).astype(dtype))
    return arrays


def body_of(arrays):
    inputs = [{"name": name, "datatype": datatype, "shape": list(array.shape), "data": array.ravel().tolist()}
              for name, (datatype, array) in arrays.items()]
    return json.dumps({"inputs": inputs}).encode()


def correctness(pack, models):
    pairs = [(f"{name}-cpu", path) for name, path in models] + [(f"{name}-gpu", path) for name, path in models]
    server = Server(pack, pairs)
    rows = []
    try:
        for name, _ in models:
            metadata = call(f"/v2/models/{name}-gpu")
            body = body_of(inputs_for(metadata, 8, seed=7))
            cpu, gpu = call(f"/v2/models/{name}-cpu/infer", body), call(f"/v2/models/{name}-gpu/infer", body)
            worst, largest, within, labels = 0.0, 0.0, True, []
            for expected, got in zip(cpu["outputs"], gpu["outputs"]):
                a, b = np.asarray(expected["data"], dtype=np.float64), np.asarray(got["data"], dtype=np.float64)
                difference, scale = np.abs(a - b), max(float(np.max(np.abs(a))), 1e-12)
                worst = max(worst, float(np.max(difference / np.maximum(np.abs(a), 1e-6))))
                largest = max(largest, float(np.max(difference)) / scale)
                within &= bool(np.all(difference <= 2e-3 * scale))
                if len(expected["shape"]) == 2 and expected["shape"][1] > 1:
                    rows_of = lambda x: x.reshape(expected["shape"]).argmax(axis=1)  # noqa: E731
                    labels.append(float(np.mean(rows_of(a) == rows_of(b))))
            groups = call(f"/v2/models/{name}-gpu/config")["instance_group"]
            rows.append((name, worst, largest, within, min(labels, default=1.0), groups))
        devices = urllib.request.Request(f"http://{HTTP}/admin/v1/devices", headers={"Authorization": f"Bearer {ADMIN}"})
        with urllib.request.urlopen(devices, timeout=30) as response:
            progress("devices: " + response.read().decode())
        with urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=10) as response:
            memory = [line for line in response.read().decode().splitlines() if line.startswith("sluice_device_")]
        progress("device metrics:\n" + "\n".join(memory))
    finally:
        server.stop()
    print(f"| model | {DEVICE} vs cpu: max relative error | max error / largest output | within 2e-3 "
          "of the largest | same argmax | instance group |\n| --- | --- | --- | --- | --- | --- |")
    for name, worst, largest, within, labels, groups in rows:
        print(f"| {name} | {worst:.2e} | {largest:.2e} | {'yes' if within else 'NO'} | {labels:.0%} | {json.dumps(groups)} |")
    return all(row[3] for row in rows)


def closed_loop(paths_and_bodies, clients, seconds, pick):
    """`clients` threads sending requests for `seconds`; requests answered."""
    done = [0] * clients
    stop = time.time() + seconds

    def client(index):
        generator = random.Random(index)
        while time.time() < stop:
            path, body = pick(generator, paths_and_bodies)
            call(path, body)
            done[index] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done)


def perf(pack, model, body, seconds):
    """Requests/s and p50 that `sluice perf` (gRPC, binary tensors, CLIENTS clients) measures."""
    with tempfile.NamedTemporaryFile("wb", suffix=".json", delete=False) as request:
        request.write(body)
    command = [f"{pack}/bin/sluice", "perf", "--grpc", "--address", GRPC, "--model", model, "--key", KEY,
               "--input", request.name, "--concurrency", str(CLIENTS), "--warmup-s", "1",
               "--duration-s", str(seconds)]
    try:
        report = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60).stdout
    finally:
        os.unlink(request.name)
    rows = [line for line in report.splitlines() if line.startswith("| ") and not line.startswith(("| tenant", "| ---"))]
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")] if rows else []
    if len(cells) < 5 or cells[2] != "0":
        raise RuntimeError(f"sluice perf failed or saw errors:\n{report}")
    return float(cells[3]), cells[4]


def standalone(pack, path, arrays, seconds):
    """Rows/s of the packed onnxruntime's PROVIDER alone on these inputs, batches back to back."""
    sys.path.insert(0, pack)
    import onnxruntime  # the packed onnxruntime-gpu, ahead of any installed one

    session = onnxruntime.InferenceSession(path, providers=[PROVIDER])
    assert session.get_providers()[0] == PROVIDER, session.get_providers()
    feeds = {name: array for name, (_, array) in arrays.items()}
    for _ in range(3):
        session.run(None, feeds)
    runs, stop = 0, time.time() + seconds
    while time.time() < stop:
        session.run(None, feeds)
        runs += 1
    return runs / seconds


def throughput(pack, name, path, seconds):
    server = Server(pack, [(f"{name}-gpu", path)])
    # Each row: its label, its rows a request, and what Sluice served.
    served, held, alone = [], {}, {}
    try:
        metadata = call(f"/v2/models/{name}-gpu")
        for batch in BATCHES:
            body = body_of(inputs_for(metadata, batch, seed=batch))
            call(f"/v2/models/{name}-gpu/infer", body)
            counters = ("sluice_batch_rows_sum", "sluice_batch_rows_count", "sluice_compute_seconds_sum")
            before = [metric_sum(counter) for counter in counters]
            rate, p50 = perf(pack, f"{name}-gpu", body, seconds)
            rows, batches, computing = (metric_sum(counter) - b for counter, b in zip(counters, before))
            joined = rows / max(batches, 1)
            # A batch run every `period` ms, `engine` ms of it inside the engine's run: where the
            # two part, the instance waits on Sluice between runs, not on the device.
            period, engine = joined / (rate * batch) * 1000, computing / max(batches, 1) * 1000
            served.append((batch, batch, rate * batch, p50, joined, period, engine))
            busy = metric_sum("sluice_device_utilisation_ratio")  # NVML's, sampled every 2 s
            progress(f"{name} batch {batch}: Sluice {rate * batch:.0f} rows/s, device utilisation {busy:.2f}")
            charged = metric_sum(f'sluice_device_memory_used_bytes{{device="{DEVICE}"}}') / 2**20
            driver = process_gpu_mib(server.process.pid)
            held[batch] = ("n/a" if driver is None else f"{driver:.0f}", charged)
    finally:
        server.stop()
    largest = BATCHES[-1]
    first, last = held[BATCHES[0]][0], held[largest][0]
    # Only where the process grew with the batches (and in the CPU rehearsal): a server start more.
    if KIND == "cpu" or (last != "n/a" and float(last) > float(first)):
        warmed = Server(pack, [(f"{name}-gpu", path)],
                        lines=lambda model: on_gpu(model) + f"[models.{model}.warmup]\nbatch_sizes = [1, {largest}]\n")
        try:
            driver = process_gpu_mib(warmed.process.pid)
            held[f"none, warmed up at 1 and {largest} rows"] = (
                "n/a" if driver is None else f"{driver:.0f}",
                metric_sum(f'sluice_device_memory_used_bytes{{device="{DEVICE}"}}') / 2**20)
        finally:
            warmed.stop()
    # The same largest batch on two instances of the model on the one device: where Sluice's time
    # between runs is the gap, a second instance runs while the first waits on it.
    doubled = Server(pack, [(f"{name}-gpu", path)], lines=lambda model: on_gpu(model) + "count = 2\n")
    try:
        body = body_of(inputs_for(metadata, largest, seed=largest))
        call(f"/v2/models/{name}-gpu/infer", body)
        rate, p50 = perf(pack, f"{name}-gpu", body, seconds)
        served.append((f"{largest}, two instances", largest, rate * largest, p50, float(largest), None, None))
    finally:
        doubled.stop()
    print(f"\n| {name} on {DEVICE}, after the batch size's run | batch | GPU memory of the process (driver), MiB "
          f"| charged to the model, MiB |\n| --- | --- | --- | --- |")
    for batch, (driver, charged) in held.items():
        print(f"| | {batch} | {driver} | {charged:.0f} |")
    print(f"\n| {name} rows/s on {DEVICE} | batch | Sluice ({CLIENTS} clients) | p50 | rows a batch run "
          f"| ms from one batch run to the next | ms of it in the engine's run | engine alone "
          f"| engine alone, ms a run | ratio |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    ratios = []
    for label, rows, rows_per_second, p50, joined, period, engine in served:
        if rows not in alone:
            alone[rows] = standalone(pack, path, inputs_for(metadata, rows, seed=rows), seconds)
        ratio = rows_per_second / (alone[rows] * rows)
        if label in BATCHES:  # the goal is the server as configured; the second instance is a lead
            ratios.append(ratio)
        period, engine = ("–" if ms is None else f"{ms:.3f}" for ms in (period, engine))
        print(f"| | {label} | {rows_per_second:.0f} | {p50} | {joined:.1f} | {period} | {engine} "
              f"| {alone[rows] * rows:.0f} | {1000 / alone[rows]:.3f} | {ratio:.2f} |")
    return min(ratios) >= 0.9


def eviction(pack, magika, seconds):
    directory = tempfile.mkdtemp()
    weights = open(magika, "rb").read()
    models = []
    for index in range(3):
        # ModelProto.doc_string (field 6): the same graph under another digest.
        path = os.path.join(directory, f"m{index}.onnx")
        open(path, "wb").write(weights + bytes([0x32, 1, ord("a") + index]))
        models.append((f"m{index}", path))
    skewed = lambda generator, choices: choices[generator.choices([0, 1, 2], weights=[0.6, 0.3, 0.1])[0]]
    results = {}
    for label in ["all resident", "budget for two"]:
        extra = ()
        if label == "budget for two":
            footprints = sorted(results["footprints"])
            budget = footprints[-1] + footprints[-2] + footprints[0] // 2
            if budget <= 0:
                raise RuntimeError(f"the models' measured footprints are {footprints}: no budget for two")
            extra = ("--model-memory", f"{DEVICE}={budget}")
        server = Server(pack, [(f"{n}-gpu", p) for n, p in models], extra)
        try:
            bodies = [(f"/v2/models/{n}-gpu/infer", body_of(inputs_for(call(f"/v2/models/{n}-gpu"), 1, seed=1)))
                      for n, _ in models]
            for path, body in bodies:
                call(path, body)
            if label == "all resident":
                results["footprints"] = [call(f"/control/v1/models/{n}-gpu")["footprint_bytes"] for n, _ in models]
            results[label] = closed_loop(bodies, 4, seconds, skewed) / seconds
            results[label + " evictions"] = metric_sum("sluice_model_evictions_total")
        finally:
            server.stop()
    shutil.rmtree(directory, ignore_errors=True)
    ratio = results["budget for two"] / results["all resident"]
    print("\n| magika x3, skewed 0.6/0.3/0.1 | requests/s | evictions |\n| --- | --- | --- |")
    print(f"| all resident | {results['all resident']:.0f} | {results['all resident evictions']:.0f} |")
    print(f"| {DEVICE} budget for two | {results['budget for two']:.0f} | {results['budget for two evictions']:.0f} |")
    print(f"| ratio | {ratio:.2f} | |")
    print(f"\nFootprints measured, all resident: {[round(f / 2**20, 1) for f in results['footprints']]} MiB; "
          f"budget for two: {round(budget / 2**20, 1)} MiB")
    return ratio >= 0.8


def part(goals, goal, run, *args):
    """Runs one part; a part that fails records why and lets the others run."""
    progress(goal)
    try:
        goals[goal] = run(*args)
    except Exception:  # noqa: BLE001 - the check reports every part's outcome
        traceback.print_exc()
        print(f"\n{goal}: failed (above)")
        goals[goal] = False


def packed_models(pack):
    """Each packed model's name (its file's, `-` for `_`) and path."""
    return [(os.path.splitext(f)[0].replace("_", "-"), os.path.join(pack, "models", f))
            for f in sorted(os.listdir(os.path.join(pack, "models")))]


def main():
    pack = os.path.abspath(sys.argv[1])
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10
    models = packed_models(pack)
    goals = {}
    part(goals, "outputs", correctness, pack, models)
    # Eviction before throughput: the shorter part, and the one still to be seen on a GPU with
    # its fixes, comes out even where a time limit cuts the run.
    magika = [path for name, path in models if name.startswith("magika")]
    if magika:
        part(goals, "eviction", eviction, pack, magika[0], seconds)
    for name, path in models:
        part(goals, f"throughput {name}", throughput, pack, name, path, seconds)
    print("\ngoals met: " + ", ".join(f"{goal} {'yes' if met else 'NO'}" for goal, met in goals.items()))
    progress("done")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
