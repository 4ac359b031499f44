#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU and no network (under 8 minutes): unpack what
# scripts/gpu-pack.sh made, find the machine's CUDA 13 and cuDNN 9 libraries (its PyTorch's
# nvidia-* packages), and run the parts named in GPU_CHECK_PARTS (default all four), each
# printing markdown tables for BENCHMARKS.md:
#   check     scripts/gpu_check.py: every example model on CUDA against the CPU, Sluice's
#             batched throughput against the engine alone, eviction under a GPU memory budget;
#   share     scripts/gpu_share.py: one tenant's busy models beside another's on the GPU, its
#             runs shared by tenant (--gpu-runs 2) against unchecked;
#   settings  scripts/gpu_settings.py: the CUDA provider's settings against Sluice's batches;
#   tract     tract-cuda-bench: tract's CUDA backend on the same models (the other engine).
#
# Usage: scripts/gpu-check.sh [PIECES_DIR] [SECONDS]   (default target/gpu-pack, 5 s a run)
set -euo pipefail
cd "$(dirname "$0")/.."

pieces=${1:-target/gpu-pack}
seconds=${2:-5}
parts=,${GPU_CHECK_PARTS:-check,share,settings,tract},
unpacked=target/gpu-check

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python=${PYTHON:-python3}
if [ ! -x "$unpacked/pack/bin/sluice" ]; then
    mkdir -p "$unpacked"
    # Python's tarfile reads xz where the machine has no xz program.
    cat "$pieces"/pack-*.tar.xz | "$python" -c \
        'import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz").extractall(sys.argv[1], filter="data")' "$unpacked"
fi

cuda_libraries=$("$python" - <<'PY'
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
found = {os.path.dirname(p) for r in roots for p in glob.glob(f"{r}/nvidia/**/lib*.so*", recursive=True)}
print(":".join(sorted(found)))
PY
)
if [ -z "$cuda_libraries" ]; then
    echo "no CUDA libraries (nvidia-* Python packages) found beside $python" >&2
    exit 1
fi
export LD_LIBRARY_PATH="$cuda_libraries${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# What ONNX Runtime's CUDA provider links or opens, so a missing one is named before any run.
for library in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcufft.so.12 libcudnn.so.9; do
    found=no
    IFS=: read -ra folders <<<"$cuda_libraries"
    for folder in "${folders[@]}"; do
        [ -e "$folder/$library" ] && found=$folder
    done
    echo "$library: $found"
done
"$unpacked/pack/bin/sluice" --version
status=0
if [[ $parts == *,check,* ]]; then
    "$python" scripts/gpu_check.py "$unpacked/pack" "$seconds" || status=1
fi
if [[ $parts == *,share,* ]]; then
    "$python" scripts/gpu_share.py "$unpacked/pack" "$seconds" || status=1
fi
if [[ $parts == *,settings,* ]]; then
    "$python" scripts/gpu_settings.py "$unpacked/pack" 2 || status=1
fi
if [[ $parts == *,tract,* ]]; then
    "$unpacked/pack/bin/tract-cuda-bench" "$seconds" "$unpacked"/pack/models/*.onnx || status=1
fi
exit "$status"
