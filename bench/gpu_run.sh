#!/usr/bin/env bash
# The one script a GPU-machine call runs (see bench/RESULTS.md for what it recorded):
#   1. the original causal-conv1d 1.7.0: its wheel carried in .device/ (orig_whl.part-*,
#      orig_whl.name) or, if absent, built from .device/causal_conv1d-1.7.0.tar.gz for sm_90
#      only, in the background, and brought back under $OUT in pieces;
#   2. our extension: MAMBA_KERNELS_FORCE_BUILD=1 TORCH_CUDA_ARCH_LIST=9.0 pip install -e .
#      (build time, .so size stripped);
#   3. tests/test_causal_conv1d_cuda.py;
#   4. the original's own tests/test_causal_conv1d.py, unmodified, against our package;
#   5. bench/bench_causal_conv1d.py, ours vs the original vs torch; its records in $OUT/results_conv.json
#      (bench/results.py update them into the results page).
# Usage: bash bench/gpu_run.sh [build] [diag] [test] [origtest] [bench]   (default: all but diag)
# Each phase has a time limit so the whole run ends inside one 10-minute call.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_run_out}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
log() { echo "[$(el)s] $*" | tee -a "$OUT/run.log"; }
PHASES=" ${*:-build test origtest bench} "
has() { [[ "$PHASES" == *" $1 "* ]]; }
left() { echo $((${GPU_RUN_BUDGET:-570} - $(el))); }
export PYTHONUNBUFFERED=1 MAMBA_KERNELS_BACKEND=cuda
NPROC=$(nproc)

log "phases:$PHASES; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader); $NPROC cores"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/run.log"

# 1. the original
SRC=/tmp/ccsrc/causal_conv1d-1.7.0
WHL=/tmp/orig_whl
mkdir -p /tmp/ccsrc "$WHL"
tar xzf .device/causal_conv1d-1.7.0.tar.gz -C /tmp/ccsrc
ORIG_PID=""
if ls .device/orig_whl.part-* >/dev/null 2>&1; then
  cat .device/orig_whl.part-* >"$WHL/$(cat .device/orig_whl.name)"
  log "original: carried wheel $(ls "$WHL")"
elif has bench; then
  python3 - "$SRC/setup.py" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
mark = "    # HACK: The compiler flag"
assert mark in s
s = s.replace(mark, '    cc_flag = ["-gencode", "arch=compute_90,code=sm_90"]  # sm_90 only\n' + mark, 1)
open(p, "w").write(s)
EOF
  (cd "$SRC" && s=$(date +%s) && CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS=$NPROC \
    python3 -m pip wheel --no-build-isolation --no-deps --no-index . -w "$WHL" >/tmp/orig_build.log 2>&1;
    echo "rc=$? seconds=$(($(date +%s) - s))" >>/tmp/orig_build.log) &
  ORIG_PID=$!
  log "original: building from sdist for sm_90 in the background (pid $ORIG_PID)"
fi

# 2. ours
if has build; then
  rm -rf build causal_conv1d/_cuda*.so
  s=$(date +%s)
  MAMBA_KERNELS_FORCE_BUILD=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=$NPROC MAMBA_KERNELS_RELEASE=${MAMBA_KERNELS_RELEASE:-0} \
    python3 -m pip install --no-build-isolation --no-deps --no-index -e . >/tmp/ours_build.log 2>&1
  rc=$?
  log "ours: pip install -e . rc=$rc in $(($(date +%s) - s)) s (concurrent original build: ${ORIG_PID:-none})"
  grep -E "mamba-kernels:|error" /tmp/ours_build.log | tail -20 | tee -a "$OUT/run.log"
  so=$(ls causal_conv1d/_cuda*.so 2>/dev/null | head -1)
  if [ -n "$so" ]; then
    strip -o /tmp/stripped.so "$so"
    log "ours: $so $(stat -c %s "$so") bytes, stripped $(stat -c %s /tmp/stripped.so) bytes"
  else
    tail -40 /tmp/ours_build.log | tee -a "$OUT/run.log"
  fi
fi

# 2b. diagnostics: native backtrace of an op raising its TORCH_CHECK error; hardware counters
if has diag; then
  cat >/tmp/raise.py <<'EOF'
import torch
from causal_conv1d import _ops
x = torch.randn(2, 8, 16, device="cuda")
try:
    _ops.fwd(x, torch.randn(8, 5, device="cuda"), None, None, None, None, False)
except RuntimeError as e:
    print("raised:", str(e).splitlines()[0])
EOF
  timeout 60 python3 /tmp/raise.py >"$OUT/diag.txt" 2>&1
  echo "raise.py rc=$?" >>"$OUT/diag.txt"
  timeout 90 cuda-gdb -q -batch -ex run -ex bt --args python3 /tmp/raise.py 2>&1 | grep -v "^\[New Thread\|^\[Thread" | tail -40 >>"$OUT/diag.txt"
  cat >/tmp/prof.py <<'EOF'
import torch
from causal_conv1d import _ops
w = torch.randn(5120, 4, device="cuda"); b = torch.randn(5120, device="cuda")
for cl in (False, True):
    x = torch.randn(8, 2048, 5120, device="cuda", dtype=torch.bfloat16).transpose(1, 2) if cl else \
        torch.randn(8, 5120, 2048, device="cuda", dtype=torch.bfloat16)
    g = torch.randn_like(x)
    _ops.fwd(x, w, b, None, None, None, True)
    _ops.bwd(x, w, b, g, None, None, None, None, False, True)
torch.cuda.synchronize()
EOF
  timeout 120 ncu --clock-control none -k regex:channel_ --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats python3 /tmp/prof.py >"$OUT/ncu.txt" 2>&1
  log "diag: ncu rc=$?"
  grep -E "raised|rc=|#[0-9]" "$OUT/diag.txt" | head -24 | tee -a "$OUT/run.log"
fi

# 3. our GPU tests
if has test; then
  log "ours: GPU tests"
  timeout $(($(left) < 200 ? $(left) : 200)) python3 -m pytest tests/test_causal_conv1d_cuda.py -q -rfE -n 4 \
    -p no:cacheprovider --timeout=180 >"$OUT/ours_tests.log" 2>&1
  log "ours: GPU tests rc=$?: $(tail -1 "$OUT/ours_tests.log")"
fi

# 4. the original's tests, unmodified, against our package
if has origtest; then
  mkdir -p /tmp/origtests && cp "$SRC/tests/test_causal_conv1d.py" /tmp/origtests/
  log "original's tests against ours"
  (cd /tmp/origtests && timeout $(($(left) < 170 ? $(left) : 170)) python3 -m pytest ${ORIG_TEST_SEL:-test_causal_conv1d.py} -q -rfE \
    -n ${ORIG_TEST_N:-8} -p no:cacheprovider >"$OUT/orig_tests.log" 2>&1)
  log "original's tests rc=$?: $(tail -1 "$OUT/orig_tests.log")"
fi

# 5. benchmark
if has bench; then
  if [ -n "$ORIG_PID" ]; then
    log "waiting for the original's build"
    wait "$ORIG_PID"
    tail -3 /tmp/orig_build.log | tee -a "$OUT/run.log"
    w=$(ls "$WHL"/*.whl 2>/dev/null | head -1)
    if [ -n "$w" ]; then
      split -b 15M "$w" "$OUT/orig_whl.part-"
      basename "$w" >"$OUT/orig_whl.name"
      log "original: wheel $(basename "$w") $(stat -c %s "$w") bytes saved to \$OUT in parts"
    else
      tail -30 /tmp/orig_build.log | tee -a "$OUT/run.log"
    fi
  fi
  w=$(ls "$WHL"/*.whl 2>/dev/null | head -1)
  ORIG_ARG=""
  if [ -n "$w" ]; then
    python3 -m pip install -q --no-deps --no-index --target /tmp/orig "$w" && ORIG_ARG="--orig-dir /tmp/orig"
  fi
  log "benchmark ($ORIG_ARG)"
  timeout $(($(left) > 30 ? $(left) : 30)) python3 bench/bench_causal_conv1d.py $ORIG_ARG --json "$OUT/results_conv.json" >"$OUT/bench.md" 2>&1
  log "benchmark rc=$?"
  cat "$OUT/bench.md"
fi
log "done"
