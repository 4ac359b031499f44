#!/usr/bin/env bash
# Soak and chaos: 2x and 5x the digits app's capacity for SECONDS each (default 60), with
# requests of IMAGES images each (default 128; why in scripts/soak.py), 1,000
# trapping requests, SIGKILL during 20 uploads and traffic changes; the bounds it checks and
# what it measures are in scripts/soak.py. Needs `cargo build --release` (server and test
# guests; it also fetches ONNX Runtime); SOAK_SERVER_ARGS adds serve options.
# Usage: scripts/soak.sh [seconds] [images]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/soak.py "$@"
