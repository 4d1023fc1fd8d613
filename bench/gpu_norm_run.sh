#!/usr/bin/env bash
# The gated norm (csrc/layernorm_gated, selective_scan.layernorm_gated) on the GPU machine, in
# one call: logs and reports go to $OUT.
#
#   bash bench/gpu_norm_run.sh [build] [test] [verify] [bench]   (default: all four)
#
#   build   our extensions in place, unless built already (MAMBA_KERNELS_BINDING picks the
#           binding as for any build: stable on torch >= 2.10, classic below):
#           MAMBA_KERNELS_FORCE_BUILD=1 TORCH_CUDA_ARCH_LIST=9.0 python3 setup.py -q build_ext --inplace
#   test    tests/test_layernorm_gated_cuda.py and the CPU tests (tests/test_layernorm_gated.py)
#   verify  scripts/sanitize_cases.py verify for the norm family: each case launches the kernels
#           its kinds name (torch.profiler; the sanitizer run itself: scripts/sanitize.sh --family norm)
#   bench   bench/bench_layernorm_gated.py against mamba_ssm's Triton rmsnorm_fn, from $MS_DIR
#           (default /tmp/ms_ours, installed there from .device/mamba_ssm-2.3.2.post1.tar.gz with
#           its CUDA build skipped when missing; the norm is Triton, so its Python is the original);
#           its records in $OUT/results_norm.json (bench/results.py update, for the results page)
# Environment: OUT (default /tmp/gpu_norm_out), MS_DIR, BENCH_ARGS (extra args to the bench).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_norm_out}
MS_DIR=${MS_DIR:-/tmp/ms_ours}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/run.log"; }
PHASES=" ${*:-build test verify bench} "
has() { [[ "$PHASES" == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1

log "phases:$PHASES; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
if has build; then
  if [ -n "$(find selective_scan -name '_cuda*.so' 2>/dev/null)" ] && [ -n "$(find causal_conv1d -name '_cuda*.so' 2>/dev/null)" ]; then
    log "build: extensions already built in place"
  else
    MAMBA_KERNELS_FORCE_BUILD=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=$(nproc) timeout 420 \
      python3 setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1
    log "build: rc=$? (log: $OUT/build.log)"
  fi
fi
if has test; then
  timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_layernorm_gated_cuda.py tests/test_layernorm_gated.py \
    >"$OUT/tests.log" 2>&1
  log "tests: rc=$? $(tail -n 1 "$OUT/tests.log")"
fi
if has verify; then
  cases=$(python3 scripts/sanitize_cases.py list --family norm --json 2>/dev/null \
    | python3 -c "import json, sys; print(' '.join(sorted({c['name'] for c in json.load(sys.stdin)})))" 2>/dev/null)
  timeout 120 python3 scripts/sanitize_cases.py verify $cases >"$OUT/verify.log" 2>&1
  log "verify ($cases): rc=$?"
  cat "$OUT/verify.log" | tee -a "$OUT/run.log"
fi
if has bench; then
  if [ ! -d "$MS_DIR/mamba_ssm" ] && [ -f .device/mamba_ssm-2.3.2.post1.tar.gz ]; then
    MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE timeout 120 python3 -m pip install -q --no-deps \
      --no-build-isolation --no-index --target "$MS_DIR" .device/mamba_ssm-2.3.2.post1.tar.gz >"$OUT/install_ms.log" 2>&1
    log "mamba_ssm from its sdist into $MS_DIR: rc=$?"
  fi
  orig=()
  [ -d "$MS_DIR/mamba_ssm" ] && orig=(--orig-dir "$MS_DIR")
  timeout 400 python3 bench/bench_layernorm_gated.py "${orig[@]}" ${BENCH_ARGS:-} --json "$OUT/results_norm.json" >"$OUT/bench.md" 2>"$OUT/bench.err"
  log "bench: rc=$?"
  cat "$OUT/bench.md" | tee -a "$OUT/run.log"
fi
