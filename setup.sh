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
# No --compile-bytecode (pip's default): compiling every installed module took 45-90 s of a 100 s set-up here, where
# the first run compiles only what it imports (about 10 s more than a second run; BENCHMARKS.md, Start-up)
.venv/bin/uv pip install -q --python .venv/bin/python "${options[@]}" -e '.[test]' --constraint requirements.lock
