#!/usr/bin/env bash
# compute-sanitizer's memcheck, racecheck, synccheck and initcheck over every kernel family and
# every kernel kind the launchers can choose (the case list: scripts/sanitize_cases.py; what it
# covers and how to read the results: docs/KERNELS.md, "Sanitizer checks").
#
#   bash scripts/sanitize.sh [--tool T]... [--family F]... [--out DIR] [--jobs N] [--isolate]
#                            [--no-verify] [--prebuilt DIR | --no-build]
#   bash scripts/sanitize.sh --list [--tool T]... [--family F]...     (the cases; no GPU needed)
#
#   --tool      memcheck, racecheck, synccheck, initcheck (repeatable or comma-separated; default all)
#   --family    conv_fwd, conv_bwd, conv_update, scan_fwd, scan_bwd, decode, norm, ssd_fwd, ssd_bwd (likewise; default all)
#   --out       where summary.md, summary.tsv and sanitize-logs.tar.gz go (default $OUT, else
#               ./sanitize-results)
#   --jobs      sanitizer processes at a time (default 4; one GPU serves them all)
#   --isolate   one process per case for every tool (synccheck always runs so)
#   --no-verify skip the first step, which checks with torch.profiler (no sanitizer) that each
#               case launches the kernels of the kinds it is meant to reach
#   --prebuilt  extensions carried from a machine without a GPU (bench/prebuilt_ext.sh make DIR),
#               used when made from these very sources (default .device/prebuilt); otherwise,
#               and with --no-build never, they are built here (sm_90, pip install -e .)
#
# Exit status: 0 when every tool ran every case to its end with no error reported (and every
# case reached its kinds); 1 otherwise; 2 for a setup problem (no compute-sanitizer, no build).
# Each (tool, family) prints one line: tool, family, cases, errors, seconds; each tool its wall
# time. compute-sanitizer: $COMPUTE_SANITIZER, PATH or /usr/local/cuda/bin. SANITIZE_BUDGET:
# seconds for the whole script (build included); processes not started by then are reported as
# not run.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python3}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

LIST=0 VERIFY=1 ISOLATE=0 BUILD=1
OUTDIR=${OUT:-sanitize-results}
JOBS=${SANITIZE_JOBS:-4}
PRE=${PREBUILT:-.device/prebuilt}
SEL=()
add_sel() {  # --tool / --family values, comma-separated or one at a time
  local opt=$1 v
  IFS=',' read -r -a vals <<<"$2"
  for v in "${vals[@]}"; do [ -n "$v" ] && SEL+=("$opt" "$v"); done
}
while [ $# -gt 0 ]; do
  case "$1" in
    --list) LIST=1 ;;
    --tool | --family)
      [ $# -ge 2 ] || { echo "sanitize.sh: $1 needs a value" >&2; exit 2; }
      add_sel "$1" "$2"; shift ;;
    --tool=* | --family=*) add_sel "${1%%=*}" "${1#*=}" ;;
    --out) [ $# -ge 2 ] || { echo "sanitize.sh: --out needs a value" >&2; exit 2; }; OUTDIR=$2; shift ;;
    --out=*) OUTDIR=${1#*=} ;;
    --jobs) [ $# -ge 2 ] || { echo "sanitize.sh: --jobs needs a value" >&2; exit 2; }; JOBS=$2; shift ;;
    --jobs=*) JOBS=${1#*=} ;;
    --prebuilt) [ $# -ge 2 ] || { echo "sanitize.sh: --prebuilt needs a value" >&2; exit 2; }; PRE=$2; shift ;;
    --prebuilt=*) PRE=${1#*=} ;;
    --no-build) BUILD=0 ;;
    --no-verify) VERIFY=0 ;;
    --isolate) ISOLATE=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "sanitize.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ $LIST = 1 ]; then
  exec "$PY" scripts/sanitize_cases.py list ${SEL[@]+"${SEL[@]}"}
fi

T0=$(date +%s)
log() { echo "[$(($(date +%s) - T0))s] $*"; }
export PYTHONUNBUFFERED=1 MAMBA_KERNELS_BACKEND=${MAMBA_KERNELS_BACKEND:-cuda}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
log "sanitize.sh: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

loads() { (cd /tmp && "$PY" -c "import selective_scan._cuda, causal_conv1d._cuda") >/dev/null 2>&1; }
# the sources hash the extensions in the packages were made from (written below, in ignored build/)
STAMP=build/sanitize-sources.sha256
HASH=$(bash bench/prebuilt_ext.sh hash)

# ---- the extensions: built from these sources before, carried (bench/prebuilt_ext.sh), or built here
if loads && { [ $BUILD = 0 ] || [ "$(cat "$STAMP" 2>/dev/null)" = "$HASH" ]; }; then
  log "extensions: this checkout's load ($([ $BUILD = 0 ] && echo "--no-build: as found" || echo "$HASH"))"
elif [ $BUILD = 0 ]; then
  log "extensions: do not load and --no-build was given"; exit 2
else
  built=0
  if [ "$PRE" != none ] && [ -d "$PRE" ]; then
    if bash bench/prebuilt_ext.sh use "$PRE"; then
      MAMBA_KERNELS_SKIP_CUDA_BUILD=1 "$PY" -m pip install -q --no-build-isolation --no-deps --no-index -e . \
        >/tmp/sanitize_install.log 2>&1
      if loads; then built=1; log "extensions: prebuilt from $PRE"; else log "extensions: the prebuilt does not load"; fi
    fi
  fi
  if [ $built = 0 ]; then
    log "extensions: building for sm_90 (pip install -e .)"
    find causal_conv1d selective_scan -name '_cuda*.so' -delete 2>/dev/null
    MAMBA_KERNELS_FORCE_BUILD=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=$(nproc) \
      "$PY" -m pip install -q --no-build-isolation --no-deps --no-index -e . >/tmp/sanitize_build.log 2>&1
    if ! loads; then
      tail -30 /tmp/sanitize_build.log
      log "extensions: the build does not load"; exit 2
    fi
    log "extensions: built"
  fi
  mkdir -p build && echo "$HASH" >"$STAMP"
fi

ARGS=(sanitize --out "$OUTDIR" --jobs "$JOBS" ${SEL[@]+"${SEL[@]}"})
# SANITIZE_BUDGET: seconds for the whole script; the driver gets what the build left
[ -n "${SANITIZE_BUDGET:-}" ] && ARGS+=(--budget "$((SANITIZE_BUDGET - ($(date +%s) - T0)))")
[ $VERIFY = 0 ] && ARGS+=(--no-verify)
[ $ISOLATE = 1 ] && ARGS+=(--isolate)
"$PY" scripts/sanitize_cases.py "${ARGS[@]}"
rc=$?
log "sanitize.sh: rc $rc; $OUTDIR/summary.md:"
[ -f "$OUTDIR/summary.md" ] && cat "$OUTDIR/summary.md"
exit $rc
