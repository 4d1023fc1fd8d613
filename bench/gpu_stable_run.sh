#!/usr/bin/env bash
# The stable-ABI wheel on the GPU machine: the wheel built on the CPU machine against the newest
# torch headers (carried as .device/stable/*.whl) is installed into $SITE and tested under the GPU
# machine's torch; the classic binding is built from this tree for the side-by-side timing.
#
#   bash bench/gpu_stable_run.sh [install] [classic] [tests] [peer] [bench] [classic_tests]
#
#   install        pip install --no-deps --target $SITE the carried wheel; prints its BUILD_INFO
#   classic        MAMBA_KERNELS_BINDING=classic build in place in a copy of the tree ($CLASSIC),
#                  in the background while the next phases run
#   tests          our GPU tests (pytest -m gpu over the files that have them) against $SITE only:
#                  they run from a copy of tests/ so the tree's packages cannot shadow the wheel
#   peer           bench/peer_tests.sh conv ours, with the wheel first on the path
#   bench          bench/compare_bindings.py measure for both, then compare ($OUT/bindings.md)
#   overhead       bench/experiments/op_overhead.py (host cost per call of every op) under each binding, twice
#   classic_tests  the same GPU suites against the classic build
# Environment: OUT (logs), SITE (/tmp/stable_site), CLASSIC (/tmp/classic), GPU_TEST_N (8).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
OUT=${OUT:-/tmp/stable_out}
SITE=${SITE:-/tmp/stable_site}
CLASSIC=${CLASSIC:-/tmp/classic}
N=${GPU_TEST_N:-8}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/stable_run.log"; }
PHASES=" ${*:-install classic tests peer bench} "
has() { [[ "$PHASES" == *" $1 "* ]]; }
log "phases:$PHASES; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"

if has install; then
  whl=$(ls .device/stable/*.whl 2>/dev/null | head -1)
  if [ -z "$whl" ]; then
    log "install: no wheel in .device/stable/"
  else
    rm -rf "$SITE"
    python3 -m pip install -q --no-deps --no-index --target "$SITE" "$whl" >"$OUT/stable_install.log" 2>&1
    log "install $(basename "$whl") into $SITE: rc=$?"
    (cd /tmp && PYTHONPATH="$SITE" python3 -c "
import torch, causal_conv1d._cuda as c, selective_scan._cuda as s
from mamba_kernels.runtime import buildinfo
print('torch', torch.__version__, '| loaded', c.__file__)
for m in (c, s):
    print(m.__name__, buildinfo.check_module(m) or 'ok', m.BUILD_INFO)
") 2>&1 | tee -a "$OUT/stable_run.log"
  fi
fi

if has classic; then
  if [ -z "$(find "$CLASSIC" -name '_cuda*.so' 2>/dev/null)" ]; then
    rm -rf "$CLASSIC" && mkdir -p "$CLASSIC"
    tar --exclude=./.device --exclude=./.git -cf - . | tar -xf - -C "$CLASSIC"
    (cd "$CLASSIC" && MAMBA_KERNELS_BINDING=classic MAMBA_KERNELS_FORCE_BUILD=1 TORCH_CUDA_ARCH_LIST=9.0 \
      MAX_JOBS=10 python3 setup.py -q build_ext --inplace >"$OUT/classic_build.log" 2>&1; \
      echo "classic build rc=$?" >>"$OUT/classic_build.log") &
    CLASSIC_PID=$!
    log "classic: building in the background in $CLASSIC"
  fi
fi

gpu_tests() {  # name pythonpath
  local d=/tmp/gputests_$1
  rm -rf "$d" && mkdir -p "$d/tests"
  # the files with GPU tests and the test modules they import; only the GPU tests run
  cp tests/conftest.py $(grep -l "mark.gpu" tests/test_*.py) tests/scan_standin.py tests/test_compat_modules.py \
    tests/test_selective_scan_inner.py tests/test_selective_scan_loops.py "$d/tests/"
  cp pyproject.toml "$d/"
  local s=$(date +%s)
  (cd "$d" && PYTHONPATH="$2" timeout 240 python3 -m pytest tests -m gpu -q -rfE -n "$N" -p no:cacheprovider \
    >"$OUT/gputests_$1.log" 2>&1)
  log "GPU tests ($1): rc=$? in $(($(date +%s) - s)) s: $(tail -1 "$OUT/gputests_$1.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/gputests_$1.log" | head -20 | tee -a "$OUT/stable_run.log"
}
has tests && gpu_tests stable "$SITE"

if has peer; then
  # the wheel goes first on the path; BACKEND=cuda: a fallback to PyTorch would fail, not pass
  OUT=$OUT PEER_PATH_FIRST="$SITE" MAMBA_KERNELS_BACKEND=cuda timeout 300 bash bench/peer_tests.sh conv ours >"$OUT/peer_stdout.log" 2>&1
  log "peer (stable): rc=$?"
  cat "$OUT/peer_summary.log" | tee -a "$OUT/stable_run.log"
fi

wait_classic() {
  [ -n "${CLASSIC_PID:-}" ] && { wait "$CLASSIC_PID"; CLASSIC_PID=""; }
  tail -1 "$OUT/classic_build.log" 2>/dev/null | tee -a "$OUT/stable_run.log"
}
if has bench; then
  (cd /tmp && PYTHONPATH="$SITE" timeout 150 python3 "$REPO/bench/compare_bindings.py" measure \
    --out "$OUT/bind_stable.json" >"$OUT/bench_stable.log" 2>&1)
  log "bench stable: rc=$?"
  wait_classic
  (cd /tmp && PYTHONPATH="$CLASSIC" timeout 150 python3 "$REPO/bench/compare_bindings.py" measure \
    --out "$OUT/bind_classic.json" >"$OUT/bench_classic.log" 2>&1)
  log "bench classic: rc=$?"
  python3 bench/compare_bindings.py compare "$OUT/bind_stable.json" "$OUT/bind_classic.json" \
    >"$OUT/bindings.md" 2>&1
  cat "$OUT/bindings.md" | tee -a "$OUT/stable_run.log"
fi
if has overhead; then  # bench/experiments/op_overhead.py under each binding, twice, alternating
  wait_classic
  for i in 1 2; do
    for b in "stable:$SITE" "classic:$CLASSIC"; do
      (cd /tmp && PYTHONPATH="${b#*:}" timeout 90 python3 "$REPO/bench/experiments/op_overhead.py" \
        >"$OUT/overhead_${b%%:*}_$i.log" 2>&1)
      log "overhead ${b%%:*} run $i: rc=$?"
      grep -E " us$" "$OUT/overhead_${b%%:*}_$i.log" | tee -a "$OUT/stable_run.log"
    done
  done
fi
if has classic_tests; then
  wait_classic
  gpu_tests classic "$CLASSIC"
fi
wait_classic
log "done"
