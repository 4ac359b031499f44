#!/usr/bin/env bash
# Build the Python example components with componentize-py (pinned; installed into the
# project's .venv, made here if missing) into target/guests/python/, and print the path of
# examples/digits-py's component. The e2e test `python::` builds the same with the same pin.
# Usage: scripts/build_python_guests.sh
set -euo pipefail
cd "$(dirname "$0")/.."
componentize_py="componentize-py==0.25.1"
[ -x .venv/bin/python3 ] || python3 -m venv .venv
.venv/bin/python3 -m pip install --quiet --disable-pip-version-check "$componentize_py"
mkdir -p target/guests/python
.venv/bin/componentize-py -d wit -w sluice:tenant/component componentize app \
  -p examples/digits-py -p guest-sdk/python -o target/guests/python/digits_py.wasm >&2
echo "$PWD/target/guests/python/digits_py.wasm"
