#!/usr/bin/env bash
# Create .venv in the repository root and install tensor-runner with its test tools, with uv (pip install uv first
# where it is absent) at the versions requirements.lock pins, from where this machine's pip installs (its indexes,
# find-links and constraints: scripts/uv_args.py). SETUP_WITH=pip ./setup.sh installs with pip instead.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if [ "${SETUP_WITH:-uv}" = pip ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[test]' --constraint requirements.lock
    exit 0
fi
if [ ! -x .venv/bin/uv ]; then
    .venv/bin/python -m pip install -q uv
fi
mapfile -t options < <(.venv/bin/python scripts/uv_args.py)
cert=$(.venv/bin/python scripts/uv_args.py cert)
if [ -n "$cert" ]; then
    export SSL_CERT_FILE="$cert"
fi
# --compile-bytecode: as pip does; else each first import compiles (TensorFlow, torch and MLflow: thousands of
# modules), in every process the first run and the first tests start at once, and where PYTHONDONTWRITEBYTECODE is set
# (as on this project's machines) in every process ever: without it the default tests took 8:56 instead of 4:58
.venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python "${options[@]}" -e '.[test]' \
    --constraint requirements.lock
