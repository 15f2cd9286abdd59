#!/bin/sh
# Build {{name}}.wasm: componentize-py (pinned in requirements.txt) in a venv of its own.
set -e
cd "$(dirname "$0")"
if [ ! -x .venv/bin/componentize-py ]; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
fi
.venv/bin/componentize-py -d wit/handler.wit -w handler componentize app -o {{name}}.wasm
