#!/usr/bin/env bash
# Fuzz the boundaries where outside bytes enter Sluice (OIP JSON and binary tensors, gRPC
# ModelInfer messages, tenant manifests, the wasi:nn tensor boundary, uploaded ONNX weights)
# with cargo-fuzz on the nightly toolchain, each target for a bounded time, from the seeds in
# tests/fuzz/corpus/. Installs cargo-fuzz when it is missing. Prints one line per target (runs,
# corpus size, crashes) for BENCHMARKS.md; exits non-zero when a target crashed (the input
# is kept under tests/fuzz/artifacts/). Usage: scripts/fuzz.sh [seconds per target] [target...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(oip_json oip_binary grpc_request manifest wasi_nn_tensor onnx_references)
fi
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
cargo +nightly fuzz --version >/dev/null 2>&1 || cargo +nightly install cargo-fuzz --locked
fuzz="cargo +nightly fuzz"
dir=tests/fuzz
$fuzz build --fuzz-dir "$dir" --release
failed=0
echo "| target | seconds | runs | runs/s | corpus | crashes |"
echo "| --- | --- | --- | --- | --- | --- |"
for target in "${targets[@]}"; do
  mkdir -p "$dir/corpus/$target" "$dir/artifacts/$target"
  # The seeds stay as committed; what the run finds goes to a scratch corpus beside them.
  scratch=$(mktemp -d)
  log=$(mktemp)
  status=0
  $fuzz run --fuzz-dir "$dir" --release "$target" "$scratch" "$dir/corpus/$target" -- \
    -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1 || status=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  corpus=$(ls "$scratch" | wc -l)
  crashes=$(ls "$dir/artifacts/$target" 2>/dev/null | wc -l)
  rate=$(( runs / (seconds > 0 ? seconds : 1) ))
  echo "| $target | $seconds | $runs | $rate | $corpus | $crashes |"
  if [ "$status" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    failed=1
    tail -40 "$log" >&2
  fi
  rm -rf "$scratch" "$log"
done
exit "$failed"
