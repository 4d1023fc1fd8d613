#!/usr/bin/env bash
# The one script a GPU-machine call runs for the selective-scan work. Call it with
# carry [".device"]; everything it reports goes to $OUT (run.log plus one file per phase).
#
#   bash bench/gpu_scan_run.sh [origbuild] [build] [test] [peer] [bench] [origbench]
#   (default: build test peer bench)
#
# Always, first: the original mamba_ssm 2.3.2.post1, from its wheel carried in .device/
# (mamba_whl.part-* and mamba_whl.name), is installed with --target into /tmp/orig.
#   origbuild  no carried wheel: build it from .device/mamba_ssm-2.3.2.post1.tar.gz for sm_90
#              only (its setup.py patched to one -gencode), bring the wheel back in 15 MB
#              parts ($OUT/mamba_whl.part-*, $OUT/mamba_whl.name; put them in .device/) and
#              its compressed build log (ptxas register and spill lines included)
#   build      ours: MAMBA_KERNELS_FORCE_BUILD=1 TORCH_CUDA_ARCH_LIST=9.0 pip install -e .
#              (time, size of each compiled .so stripped); or, for a stable binding, the
#              extensions carried in $PREBUILT (default .device/prebuilt; none: always build)
#              when bench/prebuilt_ext.sh made them from these very sources (saves ~60 s)
#   test       pytest of $GPU_TESTS (the files that exist), -n 4 when pytest-xdist is there; GPU
#              test files only: the run exports MAMBA_KERNELS_BACKEND=cuda, under which a CPU
#              file's CPU-tensor calls are refused by design (they fail there, not the code)
#   peer       mamba_ssm's own tests/ops/test_selective_scan.py and
#              tests/ops/triton/test_selective_state_update.py (copies in .device/peer/),
#              unmodified, against our package through an import shim (see below)
#   bench      bench/bench_selective_scan.py --orig-dir /tmp/orig $BENCH_ARGS > $OUT/bench_scan.md,
#              its records in $OUT/results_scan.json (bench/results.py update, for the results page)
#              (only after bench/provenance.py proved both sides: the original's interface bound
#              to the .so of /tmp/orig, ours this checkout's compiled extensions; the script
#              checks again itself and prints every module's file in its header)
#   origbench  the same for the original alone: --orig-only $ORIG_BENCH_ARGS (default
#              "--only fwd,decode --quick") > $OUT/bench_orig.md
#
# Environment: GPU_RUN_BUDGET (seconds for the whole run, default 570), GPU_TESTS,
# PEER_TESTS (pytest selection inside the peer files), BENCH_ARGS, ORIG_BENCH_ARGS,
# MAMBA_KERNELS_BACKEND (default cuda: a missing kernel is an error, never a silent fallback).
# Each phase has its own time limit, cut to what is left of the budget, so the run ends
# inside one 10-minute call.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
OUT=${OUT:-/tmp/gpu_scan_out}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
log() { echo "[$(el)s] $*" | tee -a "$OUT/run.log"; }
PHASES=" ${*:-build test peer bench} "
has() { [[ "$PHASES" == *" $1 "* ]]; }
BUDGET=${GPU_RUN_BUDGET:-570}
# limit CAP: the smaller of CAP seconds and what is left of the budget (at least 10)
limit() { local l=$((BUDGET - $(el))); l=$((l < $1 ? l : $1)); echo $((l > 10 ? l : 10)); }
export PYTHONUNBUFFERED=1 MAMBA_KERNELS_BACKEND=${MAMBA_KERNELS_BACKEND:-cuda}
NPROC=$(nproc)
MSDIST=.device/mamba_ssm-2.3.2.post1.tar.gz
CCSDIST=.device/causal_conv1d-1.7.0.tar.gz
SRCROOT=/tmp/scan_src
MSRC=$SRCROOT/mamba_ssm-2.3.2.post1
CCSRC=$SRCROOT/causal_conv1d-1.7.0
WHL=/tmp/mamba_whl
ORIG=/tmp/orig
ORIG_OK=0  # set when bench/provenance.py found the original's interface bound to its own .so

log "phases:$PHASES; budget ${BUDGET}s; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader); $NPROC cores"
python3 - <<'EOF' 2>&1 | tee -a "$OUT/run.log"
import importlib, sys
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda)
for name in ("triton", "einops", "pytest", "xdist", "setuptools", "wheel", "ninja", "packaging"):
    try:
        m = importlib.import_module(name)
        print(f"  {name} {getattr(m, '__version__', '?')}")
    except Exception as e:
        print(f"  {name}: not importable ({type(e).__name__})")
EOF
nvcc --version 2>&1 | tail -2 | tee -a "$OUT/run.log"
mkdir -p "$SRCROOT" "$WHL"
[ -f "$MSDIST" ] && tar xzf "$MSDIST" -C "$SRCROOT"
[ -f "$CCSDIST" ] && tar xzf "$CCSDIST" -C "$SRCROOT"

# ---- the original: carried wheel, or built here
if ls .device/mamba_whl.part-* >/dev/null 2>&1 && [ -f .device/mamba_whl.name ]; then
  cat .device/mamba_whl.part-* >"$WHL/$(cat .device/mamba_whl.name)"
  log "original: carried wheel $(ls "$WHL") ($(stat -c %s "$WHL"/*.whl) bytes)"
elif has origbuild; then
  if [ ! -d "$MSRC" ]; then
    log "original: $MSDIST missing; cannot build"
  else
    python3 - "$MSRC/setup.py" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
mark = "    # HACK: The compiler flag"
assert s.count(mark) == 1, "setup.py changed: the sm_90 patch point is gone"
s = s.replace(mark, '    cc_flag = ["-gencode", "arch=compute_90,code=sm_90"]  # sm_90 only\n' + mark, 1)
open(p, "w").write(s)
EOF
    log "original: building the wheel from $MSDIST for sm_90 only, MAX_JOBS=$NPROC"
    s=$(date +%s)
    (cd "$MSRC" && MAMBA_FORCE_BUILD=TRUE MAX_JOBS=$NPROC timeout "$(limit 420)" \
      python3 -m pip wheel --no-build-isolation --no-deps --no-index -v . -w "$WHL" >/tmp/orig_build.log 2>&1)
    rc=$?
    log "original: build rc=$rc in $(($(date +%s) - s)) s"
    gzip -c /tmp/orig_build.log >"$OUT/orig_build.log.gz"
    w=$(ls "$WHL"/*.whl 2>/dev/null | head -1)
    if [ -n "$w" ]; then
      split -b 15M "$w" "$OUT/mamba_whl.part-"
      basename "$w" >"$OUT/mamba_whl.name"
      log "original: wheel $(basename "$w") $(stat -c %s "$w") bytes, in $(ls "$OUT"/mamba_whl.part-* | wc -l) parts under \$OUT"
    else
      tail -40 /tmp/orig_build.log | tee -a "$OUT/run.log"
    fi
  fi
fi
w=$(ls "$WHL"/*.whl 2>/dev/null | head -1)
if [ -n "$w" ]; then
  rm -rf "$ORIG"
  if python3 -m pip install -q --no-deps --no-index --no-compile --target "$ORIG" "$w" >>"$OUT/run.log" 2>&1; then
    so=$(ls "$ORIG"/selective_scan_cuda*.so | head -1)
    strip -o /tmp/orig_stripped.so "$so"
    log "original: installed in $ORIG; $(basename "$so") $(stat -c %s "$so") bytes, stripped $(stat -c %s /tmp/orig_stripped.so) bytes"
    # provenance: its interface must bind this .so (bench/provenance.py loads it from the file)
    if (cd /tmp && timeout 120 python3 "$REPO/bench/provenance.py" check orig --orig-dir "$ORIG") 2>&1 \
      | tee -a "$OUT/run.log"; then ORIG_OK=1; else log "original: PROVENANCE FAILED; it is not compared"; fi
  else
    log "original: pip install --target failed"
  fi
else
  log "original: no wheel (carry .device/mamba_whl.part-* or run the origbuild phase)"
fi

# ---- ours: build
if has build; then
  rm -rf build
  find causal_conv1d selective_scan -name '_cuda*.so' -delete 2>/dev/null
  s=$(date +%s)
  # a stable build made from these very sources elsewhere (bench/prebuilt_ext.sh), when carried
  PRE=${PREBUILT:-.device/prebuilt}
  pre_rc=1
  if [ "$PRE" != none ] && [ "${MAMBA_KERNELS_BINDING:-auto}" != classic ] && [ "${MAMBA_KERNELS_RELEASE:-0}" = 0 ]; then
    bash bench/prebuilt_ext.sh use "$PRE" >/tmp/prebuilt.log 2>&1
    pre_rc=$?
    log "ours: $(cat /tmp/prebuilt.log)"
  fi
  if [ $pre_rc = 0 ]; then
    MAMBA_KERNELS_SKIP_CUDA_BUILD=1 timeout "$(limit 300)" python3 -m pip install --no-build-isolation --no-deps \
      --no-index -e . >/tmp/ours_build.log 2>&1
    rc=$?
    # a prebuilt that does not load here (another torch's stable ABI, a library missing) is built instead
    (cd /tmp && PYTHONPATH="$REPO" timeout 120 python3 -c "import selective_scan._cuda, causal_conv1d._cuda") \
      >>/tmp/ours_build.log 2>&1 || { rc=1; log "ours: the prebuilt extensions do not load here: building"; }
    log "ours: prebuilt extensions from $PRE, pip install -e . rc=$rc in $(($(date +%s) - s)) s"
    [ $rc = 0 ] || pre_rc=1
  fi
  if [ $pre_rc != 0 ]; then
    find causal_conv1d selective_scan -name '_cuda*.so' -delete 2>/dev/null
    MAMBA_KERNELS_FORCE_BUILD=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=$NPROC MAMBA_KERNELS_RELEASE=${MAMBA_KERNELS_RELEASE:-0} \
      timeout "$(limit 300)" python3 -m pip install --no-build-isolation --no-deps --no-index -e . >/tmp/ours_build.log 2>&1
    rc=$?
    log "ours: pip install -e . rc=$rc in $(($(date +%s) - s)) s"
  fi
  grep -E "mamba-kernels:|error" /tmp/ours_build.log | tail -20 | tee -a "$OUT/run.log"
  found=0
  for so in $(find causal_conv1d selective_scan -name '_cuda*.so' 2>/dev/null); do
    strip -o /tmp/stripped.so "$so"
    log "ours: $so $(stat -c %s "$so") bytes, stripped $(stat -c %s /tmp/stripped.so) bytes"
    found=1
  done
  [ $found = 1 ] || tail -40 /tmp/ours_build.log | tee -a "$OUT/run.log"
fi
# provenance of ours: this checkout's packages and compiled extensions (bench/provenance.py)
OURS_OK=0
if (cd /tmp && PYTHONPATH="$REPO" timeout 120 python3 "$REPO/bench/provenance.py" check ours --root "$REPO") 2>&1 \
  | tee -a "$OUT/run.log"; then OURS_OK=1; else log "ours: PROVENANCE FAILED (not built, or not this checkout's)"; fi

# ---- ours: GPU tests
if has test; then
  tests=""
  for t in ${GPU_TESTS:-tests/test_selective_scan_cuda.py tests/test_selective_state_update_cuda.py tests/test_causal_conv1d_cuda.py}; do
    if [ -f "$t" ]; then tests="$tests $t"; else log "test: $t does not exist, skipped"; fi
  done
  if [ -n "$tests" ]; then
    xd=""
    python3 -c "import xdist" 2>/dev/null && xd="-n ${GPU_TEST_N:-4}"
    log "ours: pytest$tests $xd"
    timeout "$(limit 240)" python3 -m pytest $tests -q -rfE $xd -p no:cacheprovider --timeout=200 \
      >"$OUT/ours_tests.log" 2>&1
    log "ours: GPU tests rc=$?: $(tail -1 "$OUT/ours_tests.log")"
  fi
fi

# ---- mamba_ssm's own tests against ours, through a shim package named mamba_ssm: the functions
# under test come from our packages; the *_ref functions are the original's own definitions,
# compiled from its sdist's source, in a namespace where the names they call
# (selective_scan_fn, causal_conv1d_fn) are bound to references too, never to the code under test.
if has peer; then
  SHIM=/tmp/peershim
  rm -rf "$SHIM" /tmp/peer && mkdir -p "$SHIM/mamba_ssm/ops/triton" /tmp/peer
  touch "$SHIM/mamba_ssm/__init__.py" "$SHIM/mamba_ssm/ops/__init__.py" "$SHIM/mamba_ssm/ops/triton/__init__.py"
  cat >"$SHIM/mamba_ssm/_refs.py" <<'EOF'
"""The original's reference functions, taken from its source text, nothing else of it."""
import ast
import math
import os

import torch
import torch.nn.functional as F
from einops import rearrange, repeat

MSRC = os.environ["PEER_MAMBA_SRC"]
CCSRC = os.environ["PEER_CONV_SRC"]
ns = {"torch": torch, "F": F, "math": math, "rearrange": rearrange, "repeat": repeat}


def define(path, names):
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = set(names) - {n.name for n in nodes}
    assert not missing, f"{path} has no {missing}"
    exec(compile(ast.Module(body=nodes, type_ignores=[]), path, "exec"), ns)


define(os.path.join(CCSRC, "causal_conv1d", "causal_conv1d_interface.py"), ["causal_conv1d_ref"])
define(os.path.join(MSRC, "mamba_ssm", "ops", "selective_scan_interface.py"),
       ["selective_scan_ref", "mamba_inner_ref"])
define(os.path.join(MSRC, "mamba_ssm", "ops", "triton", "selective_state_update.py"),
       ["selective_state_update_ref"])
ns["causal_conv1d_fn"] = ns["causal_conv1d_ref"]
ns["selective_scan_fn"] = ns["selective_scan_ref"]
EOF
  cat >"$SHIM/mamba_ssm/ops/selective_scan_interface.py" <<'EOF'
from selective_scan import mamba_inner_fn, selective_scan_fn  # noqa: F401  (under test: ours)
from mamba_ssm._refs import ns as _ns

selective_scan_ref = _ns["selective_scan_ref"]
mamba_inner_ref = _ns["mamba_inner_ref"]
EOF
  cat >"$SHIM/mamba_ssm/ops/triton/selective_state_update.py" <<'EOF'
from selective_scan import selective_state_update  # noqa: F401  (under test: ours)
from mamba_ssm._refs import ns as _ns

selective_state_update_ref = _ns["selective_state_update_ref"]
EOF
  cp .device/peer/mamba_tests_ops_test_selective_scan.py /tmp/peer/test_selective_scan.py
  cp .device/peer/mamba_tests_ops_triton_test_selective_state_update.py /tmp/peer/test_selective_state_update.py
  xd=""
  python3 -c "import xdist" 2>/dev/null && xd="-n ${PEER_N:-8}"
  log "peer: mamba_ssm's tests against ours ($xd${PEER_TESTS:+, -k $PEER_TESTS})"
  (cd /tmp/peer && PEER_MAMBA_SRC=$MSRC PEER_CONV_SRC=$CCSRC PYTHONPATH="$SHIM:$REPO" \
    timeout "$(limit 200)" python3 -m pytest test_selective_scan.py test_selective_state_update.py \
    ${PEER_TESTS:+-k "$PEER_TESTS"} -q -rfE $xd -p no:cacheprovider >"$OUT/peer_tests.log" 2>&1)
  log "peer: rc=$?: $(tail -1 "$OUT/peer_tests.log")"
fi

# ---- benchmarks
if has bench; then
  oa=""
  [ $ORIG_OK = 1 ] && oa="--orig-dir $ORIG"
  if [ $OURS_OK = 1 ] || [ "${MAMBA_KERNELS_BACKEND}" = reference ]; then
    log "bench: bench_selective_scan.py $oa ${BENCH_ARGS:-}"
    timeout "$(limit 600)" python3 bench/bench_selective_scan.py $oa ${BENCH_ARGS:-} --json "$OUT/results_scan.json" \
      >"$OUT/bench_scan.md" 2>"$OUT/bench_scan.err"
    log "bench: rc=$? (2: PROVENANCE FAILED inside the script, nothing timed)"
    tail -5 "$OUT/bench_scan.err" | tee -a "$OUT/run.log"
    grep -E "^- (ours|original):" "$OUT/bench_scan.md" | tee -a "$OUT/run.log"
  else
    log "bench: not run, ours failed its provenance check"
  fi
fi
if has origbench; then
  if [ $ORIG_OK = 1 ]; then
    log "origbench: bench_selective_scan.py --orig-dir $ORIG --orig-only ${ORIG_BENCH_ARGS:---only fwd,decode --quick}"
    timeout "$(limit 300)" python3 bench/bench_selective_scan.py --orig-dir "$ORIG" --orig-only \
      ${ORIG_BENCH_ARGS:---only fwd,decode --quick} >>"$OUT/bench_orig.md" 2>&1
    log "origbench: rc=$?"
  else
    log "origbench: no original installed"
  fi
fi
log "done"
