#!/usr/bin/env bash
# The test command: lint, then the pytest suite (GPU tests skip without a GPU).
# Sets up .venv first if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q "$@"
