#!/usr/bin/env bash
# Set up .venv with torch and mamba-kernels (plus test tools), then print the backend report.
# TORCH_SPEC picks the torch to install (default torch==2.14.1, the CUDA 13.0 build).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.14.1}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "$TORCH_SPEC" setuptools wheel packaging
.venv/bin/python -m pip install -q --no-build-isolation -e ".[test]" ruff
.venv/bin/python -m mamba_kernels info
