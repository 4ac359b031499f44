"""Files out of a PyPI wheel, reproducibly: the wheel is downloaded without dependencies
(pip, no install), its sha256 checked, the named files extracted and their sha256 checked.

Used by fetch_magika.py and fetch_onnxruntime.py.
"""

import hashlib
import pathlib
import subprocess
import sys
import tempfile
import zipfile


def sha256(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def intact(out, files):
    """Whether every file of `files` (archive name -> sha256) is in `out`, unchanged."""
    return all(
        (out / pathlib.Path(name).name).is_file() and sha256(out / pathlib.Path(name).name) == digest
        for name, digest in files.items()
    )


def extract(requirement, platform, wheel_name, wheel_sha256, files, out):
    """Download `requirement`'s wheel for `platform` and put `files` into `out`."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--disable-pip-version-check", "--only-binary=:all:", "--platform", platform,
             "--python-version", "3.12", "-d", tmp, requirement],
            check=True,
        )
        wheel = pathlib.Path(tmp) / wheel_name
        if sha256(wheel) != wheel_sha256:
            sys.exit(f"{wheel.name}: sha256 mismatch, refusing to use it")
        out.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as archive:
            for name, digest in files.items():
                target = out / pathlib.Path(name).name
                # Hidden while written: nothing looking for the file finds half of it.
                partial = target.with_name(f".{target.name}.partial")
                partial.write_bytes(archive.read(name))
                if sha256(partial) != digest:
                    partial.unlink()
                    sys.exit(f"{name}: sha256 mismatch inside {wheel.name}")
                partial.replace(target)
