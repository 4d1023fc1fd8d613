#!/usr/bin/env bash
# The originals' own operator tests, unmodified, against our packages (run from the repository
# root with our extensions built in place; results to $OUT):
#   conv      causal-conv1d 1.7.0's tests/test_causal_conv1d.py (from its sdist) on our
#             causal_conv1d package; no shim: it imports only causal_conv1d names
#   ours      mamba_ssm's tests/ops/test_selective_scan.py, tests/ops/triton/
#             test_selective_state_update.py and (Mamba-2's gated norm) tests/ops/triton/
#             test_layernorm_gated.py (.device/peer/) through bench/peer_shim: the functions under
#             test are our selective_scan package's, the *_ref functions mamba_ssm's own
#   mamba_ssm the same two files with no shim at all: mamba_ssm 2.3.2.post1's own Python
#             (installed from its sdist, CUDA build skipped, into $MS_OURS) on our
#             selective_scan_cuda and causal_conv1d modules
#   bash bench/peer_tests.sh [conv] [ours] [mamba_ssm]   (default: all three)
# Environment: OUT, PEER_N (pytest workers, default 8), PEER_LIMIT (seconds per file, default 150),
# MS_OURS (default /tmp/ms_ours), PEER_K (a pytest -k selection for the mamba_ssm files),
# PEER_PATH_FIRST (a directory put before everything else on PYTHONPATH, e.g. an installed wheel).
# Before each file, bench/provenance.py checks in that run's environment that the code under test
# is ours (from PEER_PATH_FIRST or this checkout; for "mamba_ssm", that its interface binds our
# selective_scan_cuda.py); a file whose check fails is not run ("PROVENANCE FAILED").
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
OUT=${OUT:-/tmp/peer_out}
mkdir -p "$OUT"
SRC=/tmp/peer_src
MS_OURS=${MS_OURS:-/tmp/ms_ours}
PHASES=" ${*:-conv ours mamba_ssm} "
N=${PEER_N:-8}
LIMIT=${PEER_LIMIT:-150}
log() { echo "[peer $(date +%T)] $*" | tee -a "$OUT/peer_summary.log"; }
mkdir -p "$SRC" /tmp/peer_run
for s in .device/mamba_ssm-2.3.2.post1.tar.gz .device/causal_conv1d-1.7.0.tar.gz; do
  if [ -f "$s" ]; then tar xzf "$s" -C "$SRC"; else log "missing $s"; fi
done
MSRC=$SRC/mamba_ssm-2.3.2.post1
CCSRC=$SRC/causal_conv1d-1.7.0
xd=""
python3 -c "import xdist" 2>/dev/null && xd="-n $N"
counts() { tail -1 "$1" | tr -d '='; }

# Ours come from PEER_PATH_FIRST when given (an installed wheel), else from this checkout.
OURS_ROOT=${PEER_PATH_FIRST:-$REPO}
prove() {  # side dir pythonpath: bench/provenance.py in the run's own environment (exit 1 if wrong)
  (cd "$2" && PYTHONPATH="${PEER_PATH_FIRST:+$PEER_PATH_FIRST:}$3" timeout 120 \
    python3 "$REPO/bench/provenance.py" check "$1" --root "$OURS_ROOT") 2>&1 | tee -a "$OUT/peer_summary.log"
  return "${PIPESTATUS[0]}"
}

run_pytest() {  # name side dir pythonpath files...  (side: what bench/provenance.py must find)
  local name=$1 side=$2 dir=$3 pp=$4
  shift 4
  if ! prove "$side" "$dir" "$pp"; then
    log "$name: PROVENANCE FAILED, not run"
    return
  fi
  local s=$(date +%s)
  (cd "$dir" && PYTHONPATH="${PEER_PATH_FIRST:+$PEER_PATH_FIRST:}$pp" PEER_MAMBA_SRC=$MSRC PEER_CONV_SRC=$CCSRC timeout "$LIMIT" \
    python3 -m pytest "$@" -q -rfE $xd -p no:cacheprovider >"$OUT/peer_$name.log" 2>&1)
  local rc=$?
  log "$name: rc=$rc in $(($(date +%s) - s)) s: $(counts "$OUT/peer_$name.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/peer_$name.log" | head -20 | tee -a "$OUT/peer_summary.log"
}

if [[ "$PHASES" == *" conv "* ]] && [ -f "$CCSRC/tests/test_causal_conv1d.py" ]; then
  rm -rf /tmp/peer_run/conv && mkdir -p /tmp/peer_run/conv
  cp "$CCSRC/tests/test_causal_conv1d.py" /tmp/peer_run/conv/
  run_pytest conv ours /tmp/peer_run/conv "$REPO" test_causal_conv1d.py
fi
copy_mamba_tests() {
  rm -rf "$1" && mkdir -p "$1"
  cp .device/peer/mamba_tests_ops_test_selective_scan.py "$1/test_selective_scan.py"
  cp .device/peer/mamba_tests_ops_triton_test_selective_state_update.py "$1/test_selective_state_update.py"
  cp .device/peer/mamba_tests_ops_triton_test_layernorm_gated.py "$1/test_layernorm_gated.py" 2>/dev/null || true
}
if [[ "$PHASES" == *" ours "* ]]; then
  copy_mamba_tests /tmp/peer_run/ours
  for f in test_selective_scan test_selective_state_update test_layernorm_gated; do
    [ -f "/tmp/peer_run/ours/$f.py" ] || { log "ours_$f: no .device/peer copy, not run"; continue; }
    run_pytest "ours_$f" ours /tmp/peer_run/ours "$REPO/bench/peer_shim:$REPO" "$f.py" ${PEER_K:+-k "$PEER_K"}
  done
fi
if [[ "$PHASES" == *" mamba_ssm "* ]]; then
  if [ ! -d "$MS_OURS/mamba_ssm" ]; then
    MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE python3 -m pip install -q --no-deps --no-build-isolation \
      --no-index --target "$MS_OURS" .device/mamba_ssm-2.3.2.post1.tar.gz >"$OUT/peer_ms_install.log" 2>&1
    log "mamba_ssm sdist installed into $MS_OURS (CUDA build skipped): rc=$?"
  fi
  copy_mamba_tests /tmp/peer_run/ms
  for f in test_selective_scan test_selective_state_update; do
    run_pytest "mamba_ssm_$f" ours-client /tmp/peer_run/ms "$MS_OURS:$REPO" "$f.py" ${PEER_K:+-k "$PEER_K"}
  done
fi
