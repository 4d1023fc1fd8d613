#!/usr/bin/env bash
# Set up .venv with torch and mamba-kernels (plus test tools), then print the backend report.
# TORCH_SPEC picks the torch to install (default torch==2.14.1, the CUDA 13.0 build).
# The CUDA extensions are compiled for the visible GPUs when a CUDA toolkit is found; with no
# GPU visible the install stays pure Python unless MAMBA_KERNELS_SKIP_CUDA_BUILD=0 (or
# MAMBA_KERNELS_FORCE_BUILD=1) asks for a build (scripts/compile_check.sh compiles for sm_90).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.14.1}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "$TORCH_SPEC" setuptools wheel packaging ninja
if [ -z "${MAMBA_KERNELS_SKIP_CUDA_BUILD:-}${MAMBA_KERNELS_FORCE_BUILD:-}" ] &&
    ! .venv/bin/python -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "setup: no GPU visible: installing without compiling the CUDA extensions"
    export MAMBA_KERNELS_SKIP_CUDA_BUILD=1
fi
.venv/bin/python -m pip install -q --no-build-isolation -e ".[test]"
.venv/bin/python -m mamba_kernels info
