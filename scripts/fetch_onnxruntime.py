"""Fetch ONNX Runtime's shared library (MIT) reproducibly from the pinned PyPI wheel, so that
`cargo run --release -- serve` on a fresh clone serves on ONNX Runtime.

Downloads onnxruntime==1.32.0 for this machine's architecture without dependencies, checks
the wheel's sha256, extracts libonnxruntime.so (and its licence files) into
target/onnxruntime/, checks their sha256. The library is the same in every Python version's
wheel; the server loads it at run time. Idempotent: does nothing when the files are present
and intact. Needs only python3 with pip. Run by host/build.rs; a failure there is a build
warning, and the server then says why it serves on tract.

Usage: python3 scripts/fetch_onnxruntime.py
"""

import pathlib
import platform
import sys

import pinned_wheel

VERSION = "1.32.0"
LICENCES = {
    "onnxruntime/LICENSE": "2f07c72751aed99790b8a4869cf2311df85a860b22ded05fa22803587a48922c",
    "onnxruntime/ThirdPartyNotices.txt": "d8696258afcf9df7827a5e01d6b6d55ee9b461b4e82020f5f48242deb9cc2270",
}
# Per architecture: the wheel's sha256 and the library's.
PINS = {
    "x86_64": ("99e1074c4b2197accd5073052a465361be17b89c093b8ffb6e6bd8f986c52df8",
               "6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f"),
    "aarch64": ("e36c187006e7a7c8b8d6d57f1a209dd63f52430dca6c282b177718ad6b841054",
                "49852228a93995158b2a813d4df487d47a1b76b0eaa894507ef49e91b6d7954a"),
}
OUT = pathlib.Path(__file__).resolve().parent.parent / "target" / "onnxruntime"


def main():
    machine = platform.machine()
    if sys.platform != "linux" or machine not in PINS:
        sys.exit(f"no pinned onnxruntime wheel for {sys.platform} {machine}")
    wheel_sha256, library_sha256 = PINS[machine]
    files = {f"onnxruntime/capi/libonnxruntime.so.{VERSION}": library_sha256, **LICENCES}
    if pinned_wheel.intact(OUT, files):
        return
    platform_tag = f"manylinux_2_28_{machine}"
    wheel = f"onnxruntime-{VERSION}-cp312-cp312-{platform_tag}.whl"
    pinned_wheel.extract(f"onnxruntime=={VERSION}", platform_tag, wheel, wheel_sha256, files, OUT)
    print(f"onnxruntime {VERSION} library ready in {OUT}")


if __name__ == "__main__":
    main()
