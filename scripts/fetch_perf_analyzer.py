"""Fetch NVIDIA's perf_analyzer 2.40 (BSD-3-Clause) and the two libraries it loads,
reproducibly, into target/tools/perf_analyzer/, and print the path of a launcher that runs it.

PyPI's `perf-analyzer` is a placeholder; perf_analyzer 2.40 ships inside the
tritonclient==2.40.0 manylinux wheel. It links libcudart.so.12 (taken from the pinned
nvidia-cuda-runtime-cu12 wheel; no GPU is needed to drive a server) and Debian's libb64
(`apt-get download libb64-0d`, unpacked, not installed). Wheels and files are checked
against their sha256. Idempotent: does nothing when the files are present and intact.
Needs python3 with pip, and apt-get with dpkg-deb. x86_64 Linux only (the wheel's only build).

Usage: python3 scripts/fetch_perf_analyzer.py      (prints target/tools/perf_analyzer/run)
"""

import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile

import pinned_wheel

OUT = pathlib.Path(__file__).resolve().parent.parent / "target" / "tools" / "perf_analyzer"
TRITONCLIENT = (
    "tritonclient==2.40.0",
    "tritonclient-2.40.0-py3-none-manylinux1_x86_64.whl",
    "f270fdb61560894c20b6e7fcd4fc1bf837e51022092692b63a38692042fa18b8",
    {"tritonclient-2.40.0.data/data/bin/perf_analyzer":
     "21b409a95fad7f0b504cdff6678df781443b45eaf61daeed2f9f073518391f3b"},
    "manylinux1_x86_64",
)
CUDA_RUNTIME = (
    "nvidia-cuda-runtime-cu12==12.9.79",
    "nvidia_cuda_runtime_cu12-12.9.79-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    "25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3",
    {"nvidia/cuda_runtime/lib/libcudart.so.12":
     "256e6409e4f06f618e1fb53d4844a6b81cdded1013afa8ade40c22f99eb133b7"},
    "manylinux2014_x86_64",
)
LIBB64 = "libb64.so.0d"
# The launcher: the binary with its libraries found beside it.
LAUNCHER = """#!/bin/sh
here=$(dirname "$0")
LD_LIBRARY_PATH="$here${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/perf_analyzer" "$@"
"""


def debian_library(package, library, out):
    """Copy `library` out of Debian's `package` (downloaded, unpacked, never installed)."""
    with tempfile.TemporaryDirectory() as tmp:
        fetch = ["apt-get", "download", package]
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        if subprocess.run(fetch, cwd=tmp, **quiet).returncode != 0:
            # Package lists may be missing on a fresh machine.
            subprocess.run(["apt-get", "update"], stdout=subprocess.DEVNULL, check=False)
            if subprocess.run(fetch, cwd=tmp, stdout=subprocess.DEVNULL).returncode != 0:
                sys.exit(f"perf_analyzer needs Debian's {package}: `apt-get download {package}` failed")
        deb = next(pathlib.Path(tmp).glob("*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(pathlib.Path(tmp) / "root")], check=True)
        found = list((pathlib.Path(tmp) / "root").rglob(library))
        if not found:
            sys.exit(f"{library} is not in Debian's {package}")
        shutil.copy(found[0], out / library)


def main():
    if sys.platform != "linux" or platform.machine() != "x86_64":
        sys.exit(f"perf_analyzer 2.40 is built for x86_64 Linux only, not {sys.platform} {platform.machine()}")
    for requirement, wheel, wheel_sha256, files, platform_tag in (TRITONCLIENT, CUDA_RUNTIME):
        if not pinned_wheel.intact(OUT, files):
            pinned_wheel.extract(requirement, platform_tag, wheel, wheel_sha256, files, OUT)
    if not (OUT / LIBB64).is_file():
        debian_library("libb64-0d", LIBB64, OUT)
    (OUT / "perf_analyzer").chmod(0o755)
    launcher = OUT / "run"
    if not launcher.is_file() or launcher.read_text() != LAUNCHER:
        launcher.write_text(LAUNCHER)
        launcher.chmod(0o755)
    print(launcher)


if __name__ == "__main__":
    main()
