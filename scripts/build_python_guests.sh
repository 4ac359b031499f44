#!/usr/bin/env bash
# Build the Python example components with componentize-py (pinned; installed into the
# project's .venv, made here if missing) into target/guests/python/, and print the path of
# examples/digits-py's component. The pin is guest-sdk/python/build-requirements.txt, which the
# e2e test `python::` installs too.
# Usage: scripts/build_python_guests.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python3 ] || python3 -m venv .venv
.venv/bin/python3 -m pip install --quiet --disable-pip-version-check -r guest-sdk/python/build-requirements.txt
mkdir -p target/guests/python
.venv/bin/componentize-py -d wit -w sluice:tenant/component componentize app \
  -p examples/digits-py -p guest-sdk/python -o target/guests/python/digits_py.wasm >&2
echo "$PWD/target/guests/python/digits_py.wasm"
