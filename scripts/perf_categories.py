#!/usr/bin/env python3
"""Where a path's CPU per request goes, by the code each profile sample fell in, in process
against end to end (BENCHMARKS.md, "The layers add up, once the network is measured at the
path's own throughput").

Each input is `perf script -F comm,tid,ip,sym,dso` output of a `perf record -F N` (no call
graphs: the sample's own code counts) with the run's CPU µs per request after a colon:

    scripts/perf_categories.py FLOOR_IN:US PATH_IN:US FLOOR_E2E:US PATH_E2E:US

FLOOR_IN / PATH_IN: the layers bench running only that row (`ROWS=... OPS=...`, `perf record
-D` past its warm-up); FLOOR_E2E / PATH_E2E: the server under load (`perf record -p`). Prints
µs per request per category, the path in process plus the floor's network (end to end less
in process), and what the end-to-end figure has beyond that.
"""
import collections
import re
import sys

SAMPLE = re.compile(r"\s*(\S.*?)\s+(\d+)\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$")
MALLOC = re.compile(r"(^|_)(malloc|free|_int_|consolidate|unlink_chunk|tcache|realloc|calloc|cfree|arena)")
MEMORY = re.compile(r"mem(move|cpy|set|cmp)")
CRATES = {
    "wasmtime": ["wasmtime", "wasmtime_environ", "wasmtime_internal_fiber", "wasmtime_slab", "wasmtime_internal_core"],
    "WASI": ["wasmtime_wasi"],
    "tokio": ["tokio", "tokio_util"],
    "hyper, h2, axum, tower, http": ["hyper", "hyper_util", "h2", "http", "http_body", "http_body_util", "axum",
                                     "axum_core", "tower", "tower_http", "tower_layer", "tower_service", "matchit"],
    "tonic, prost": ["tonic", "prost"],
    "serde_json": ["serde_json", "serde"],
    "Sluice": ["sluice"],
    "core, alloc, std": ["core", "alloc", "std", "hashbrown"],
    "tracing": ["tracing", "tracing_core", "tracing_subscriber", "sharded_slab"],
    "the bench's and the floor's own code": ["layers", "floor", "floor_server"],
}
CRATE_CATEGORY = {crate: category for category, crates in CRATES.items() for crate in crates}


def category(symbol: str, dso: str) -> str:
    library = dso.rsplit("/", 1)[-1]
    if library.startswith("[kernel"):
        return "kernel"
    if library.startswith("libc.so"):
        return "glibc malloc and free" if MALLOC.search(symbol) else "glibc memmove, memset" if MEMORY.search(symbol) else "glibc, other"
    if "onnxruntime" in library:
        return "ONNX Runtime"
    if library in ("[unknown]", "") or library.startswith("perf-"):
        return "compiled guest code (no symbols)"
    crate = re.match(r"[<&_ ]*(?:dyn |mut )?([A-Za-z0-9_]+)", symbol)
    return CRATE_CATEGORY.get(crate.group(1) if crate else symbol, "other")


def per_request(argument: str) -> dict:
    path, us = argument.rsplit(":", 1)
    counts = collections.Counter()
    for line in open(path, errors="replace"):
        sample = SAMPLE.match(line)
        if sample:
            counts[category(re.sub(r"\+0x[0-9a-f]+$", "", sample.group(4)), sample.group(5))] += 1
    total = sum(counts.values()) or 1
    return {name: count / total * float(us) for name, count in counts.items()}


def main() -> None:
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    floor_in, path_in, floor_e2e, path_e2e = (per_request(a) for a in sys.argv[1:])
    print("| µs per request | in process, floor | in process, path | end to end, floor | end to end, path "
          "| path in process + the floor's network | end to end less that |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    names = sorted(set(floor_in) | set(path_in) | set(floor_e2e) | set(path_e2e), key=lambda n: -path_e2e.get(n, 0))
    totals = [0.0] * 6
    for name in names:
        row = [column.get(name, 0.0) for column in (floor_in, path_in, floor_e2e, path_e2e)]
        explained = row[1] + row[2] - row[0]
        row += [explained, row[3] - explained]
        totals = [a + b for a, b in zip(totals, row)]
        print(f"| {name} | " + " | ".join(f"{value:.1f}" for value in row) + " |")
    print("| total | " + " | ".join(f"{value:.1f}" for value in totals) + " |")


if __name__ == "__main__":
    main()
