#!/usr/bin/env bash
# The test command: lint, the pytest suite (GPU tests skip without a GPU), then the compile
# check (the CUDA extensions built for one architecture, scripts/compile_check.sh).
# Sets up .venv first if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q "$@"
bash scripts/compile_check.sh
