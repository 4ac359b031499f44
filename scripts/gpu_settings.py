#!/usr/bin/env python3
"""Which CUDA provider settings serve Sluice's batches best, on a machine with an NVIDIA GPU:
run by scripts/gpu-check.sh after the check itself (GPU_CHECK_SETTINGS=1), from the same PACK.

Sluice's batches vary in size from one run to the next (as many rows as have come), where a
benchmark of the engine alone runs one size back to back; and Sluice sets the provider up its
own way (one intra-op thread, no CPU arena, the GPU arena grown by what is asked). Three parts:

1. The engine alone (the packed onnxruntime-gpu in this process): milliseconds a run at a fixed
   size and at sizes varying as Sluice's do (1-8 rows, each size warmed up first), with Python's
   default session and with Sluice's, and with each cuDNN convolution algorithm search.
2. TF32 on and off: each model's largest difference from the CPU provider.
3. Sluice itself with each candidate setting (`--cuda-option`, `--backend-threads`): rows/s
   through `sluice perf` (8 clients, gRPC) at the batch sizes where the check found gaps, and
   each model's footprint on the GPU.

Usage: python3 scripts/gpu_settings.py PACK [SECONDS]
"""

import os
import sys
import time

import numpy as np

import gpu_check
from gpu_check import Server, body_of, call, inputs_for, perf, progress

VARYING = [4, 1, 7, 3, 8, 2, 6, 5, 3, 6, 1, 8, 4, 2, 7, 5]


def session(onnxruntime, path, like_sluice, provider_options=None):
    options = onnxruntime.SessionOptions()
    cuda = dict(provider_options or {})
    if like_sluice:
        options.intra_op_num_threads = 1
        options.enable_cpu_mem_arena = False
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        cuda.setdefault("arena_extend_strategy", "kSameAsRequested")
    return onnxruntime.InferenceSession(path, options, providers=[("CUDAExecutionProvider", cuda),
                                                                   "CPUExecutionProvider"])


def milliseconds_a_run(runner, metadata, sizes, seconds):
    feeds = {size: {n: a for n, (_, a) in inputs_for(metadata, size, seed=size).items()} for size in set(sizes)}
    for size in sizes:  # every size once: first-time searches are not what is measured
        runner.run(None, feeds[size])
    runs, stop = 0, time.time() + seconds
    while time.time() < stop:
        runner.run(None, feeds[sizes[runs % len(sizes)]])
        runs += 1
    return seconds * 1e3 / runs


def engine_alone(pack, models, seconds):
    sys.path.insert(0, pack)
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    print("\n| engine alone, ms a run | model | rows | Python's session | Sluice's | Sluice's, HEURISTIC "
          "| Sluice's, DEFAULT |\n| --- | --- | --- | --- | --- | --- | --- |")
    for name, path in models:
        metadata = call(f"/v2/models/{name}-gpu")
        cells = {}
        for label, sizes in [("4", [4]), ("1-8, varying", VARYING), ("128", [128])]:
            row = []
            for like_sluice, search in [(False, None), (True, None), (True, "HEURISTIC"), (True, "DEFAULT")]:
                options = {"cudnn_conv_algo_search": search} if search else {}
                runner = session(onnxruntime, path, like_sluice, options)
                row.append(milliseconds_a_run(runner, metadata, sizes, seconds))
            cells[label] = row
            print(f"| | {name} | {label} | " + " | ".join(f"{ms:.3f}" for ms in row) + " |")
    return True


def tf32(pack, models):
    sys.path.insert(0, pack)
    import onnxruntime

    print("\n| model | largest difference from the CPU / largest output, TF32 on (provider default) "
          "| TF32 off |\n| --- | --- | --- |")
    for name, path in models:
        metadata = call(f"/v2/models/{name}-gpu")
        feeds = {n: a for n, (_, a) in inputs_for(metadata, 8, seed=7).items()}
        cpu = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        row = []
        for options in [{}, {"use_tf32": "0"}]:
            gpu = onnxruntime.InferenceSession(path, providers=[("CUDAExecutionProvider", options)]).run(None, feeds)
            row.append(max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                           / max(float(np.max(np.abs(np.asarray(a, np.float64)))), 1e-12) for a, b in zip(cpu, gpu)))
        print(f"| {name} | {row[0]:.2e} | {row[1]:.2e} |")
    return True


VARIANTS = [
    ("as built", []),
    ("cudnn_conv_algo_search=EXHAUSTIVE", ["--cuda-option", "cudnn_conv_algo_search=EXHAUSTIVE"]),
    ("cudnn_conv_algo_search=DEFAULT", ["--cuda-option", "cudnn_conv_algo_search=DEFAULT"]),
    ("cudnn_conv_use_max_workspace=0", ["--cuda-option", "cudnn_conv_use_max_workspace=0"]),
    ("arena_extend_strategy=kNextPowerOfTwo", ["--cuda-option", "arena_extend_strategy=kNextPowerOfTwo"]),
    ("--backend-threads 0", ["--backend-threads", "0"]),
    ("use_tf32=0", ["--cuda-option", "use_tf32=0"]),
]
POINTS = [("magika", 1), ("magika", 8), ("magika", 32), ("digits", 1), ("digits", 128)]


def served(pack, models, seconds):
    paths = dict(models)
    wanted = [(name, paths[name]) for name in sorted({name for name, _ in POINTS}) if name in paths]
    print("\n| Sluice rows/s (8 clients) | " + " | ".join(f"{m} x{b}" for m, b in POINTS)
          + " | footprints on the GPU |\n| --- |" + " --- |" * (len(POINTS) + 1))
    for label, extra in VARIANTS:
        server = Server(pack, [(f"{name}-gpu", path) for name, path in wanted], extra)
        cells = []
        try:
            for name, batch in POINTS:
                body = body_of(inputs_for(call(f"/v2/models/{name}-gpu"), batch, seed=batch))
                call(f"/v2/models/{name}-gpu/infer", body)
                rate, p50 = perf(pack, f"{name}-gpu", body, seconds)
                cells.append(f"{rate * batch:.0f} ({p50})")
            footprints = {name: call(f"/control/v1/models/{name}-gpu")["footprint_bytes"] / 2**20 for name, _ in wanted}
            cells.append(", ".join(f"{name} {mib:.0f} MiB" for name, mib in footprints.items()))
        except Exception as error:  # noqa: BLE001 - a variant the provider refuses is a finding
            cells.append(f"failed: {str(error).splitlines()[-1][:200]}")
        finally:
            server.stop()
        progress(label)
        print(f"| {label} | " + " | ".join(cells) + " |")
    return True


def main():
    pack = os.path.abspath(sys.argv[1])
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 2
    models = gpu_check.packed_models(pack)
    goals = {}
    # Metadata for the engine-alone parts comes from a server serving every model.
    server = Server(pack, [(f"{name}-gpu", path) for name, path in models])
    try:
        gpu_check.part(goals, "engine alone", engine_alone, pack, [m for m in models if m[0] != "digits-small"],
                       seconds)
        gpu_check.part(goals, "tf32", tf32, pack, models)
    finally:
        server.stop()
    gpu_check.part(goals, "served", served, pack, models, seconds)
    progress("settings done")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
