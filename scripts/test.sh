#!/usr/bin/env bash
# The test command: lint, the pytest suite (GPU tests skip without a GPU), then the compile
# check (the CUDA extensions built for one architecture, scripts/compile_check.sh).
# Sets up .venv first if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# Free disk first: a full disk otherwise shows up as pytest internal errors half-way through.
# Measured (clean clone): .venv about 6 GB (torch with CUDA), the run's own files under the
# temporary directory and build/ about 2 GB.
tmp=${TMPDIR:-/tmp}
need_repo=$([ -x .venv/bin/python ] && echo 1 || echo 7)
need_tmp=2
free_gb() { df -Pk "$1" | awk 'NR == 2 { print int($4 / 1048576) }'; }
if [ "$(stat -c %d .)" = "$(stat -c %d "$tmp")" ]; then need_repo=$((need_repo + need_tmp)); need_tmp=0; fi
for pair in ".:$need_repo" "$tmp:$need_tmp"; do
  dir=${pair%:*} need=${pair##*:}
  if [ "$need" -gt 0 ] && [ "$(free_gb "$dir")" -lt "$need" ]; then
    echo "scripts/test.sh: only $(free_gb "$dir") GB free on the filesystem of $(cd "$dir" && pwd); the tests need about $need GB there. Free some space (or point TMPDIR elsewhere) and run again." >&2
    exit 1
  fi
done
[ -x .venv/bin/python ] || bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q "$@"
bash scripts/compile_check.sh
