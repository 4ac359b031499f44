#!/usr/bin/env bash
# Pack what the GPU check needs on a machine with an NVIDIA GPU and no network, where at most
# 64 MiB travel at a time: the server binary, tract-cuda-bench (tools/), the example models,
# and the `onnxruntime-gpu` Python package (its capi/ holds the ONNX Runtime library with the
# CUDA provider; Sluice loads that library, and the check's standalone runs import the
# package: one engine for both).
# The CUDA 13 and cuDNN 9 libraries it needs are expected on the GPU machine (its PyTorch's).
#
# Out: target/gpu-pack/pack-NN.tar.xz, each under 60 MiB (one transfer where at most 64 MiB
# go at a time); put them in one folder on the GPU machine and run
# `scripts/gpu-check.sh FOLDER` there. Run after `cargo build --release`.
# xz, not zstd: the GPU machine may have neither program, and Python's standard library
# reads xz (gpu-check.sh unpacks with it).
#
# Usage: scripts/gpu-pack.sh
set -euo pipefail
cd "$(dirname "$0")/.."

ORT_GPU_VERSION=1.31.1
MAGIKA_MODEL=examples/magika/model/model.onnx
out=target/gpu-pack
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

command -v xz >/dev/null || apt-get install -y xz-utils
mkdir -p "$stage/pack/bin" "$stage/pack/models" "$out"
rm -f "$out"/pack-*
(cd tools/tract-cuda-bench && CARGO_TARGET_DIR=../../target cargo build --release --quiet)
cp target/release/sluice target/release/tract-cuda-bench "$stage/pack/bin/"
strip "$stage/pack/bin/sluice" "$stage/pack/bin/tract-cuda-bench"
cp examples/digits/model/digits.onnx examples/digits/model/digits_small.onnx "$stage/pack/models/"
cp "$MAGIKA_MODEL" "$stage/pack/models/magika.onnx"

python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 -d "$stage/wheel" "onnxruntime-gpu==$ORT_GPU_VERSION"
python3 - "$stage/wheel" "$stage/pack" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(f"{sys.argv[1]}/onnxruntime_gpu-*.whl")[0]
with zipfile.ZipFile(wheel) as archive:
    archive.extractall(sys.argv[2], [n for n in archive.namelist() if n.startswith("onnxruntime/")])
PY

# One compressed stream cut into pieces: each piece is one transfer.
tar -C "$stage" -cf - pack | xz -9 -T0 | split -b 60M -d - "$out/pack-"
for piece in "$out"/pack-*; do
    mv "$piece" "$piece.tar.xz"
done
ls -l "$out"
