#!/usr/bin/env bash
# Real clients on the GPU machine: the originals' operator tests, mamba_ssm and transformers end
# to end, torch.compile of a Mamba block. Run from the repository root; logs and the markdown
# report ($OUT/clients.md) go to $OUT. Every step logs and the run goes on; a summary ends it.
#
#   bash bench/gpu_clients_run.sh [build] [peer] [e2e] [ab] [host] [lmhost] [compile] [mamba2] [tf]
#   (default: build peer e2e ab compile)
#
#   build    our extensions in place, unless both are built already:
#            MAMBA_KERNELS_FORCE_BUILD=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 python3 setup.py -q build_ext --inplace
#   peer     bench/peer_tests.sh (causal-conv1d 1.7.0's and mamba_ssm's operator tests, unmodified)
#   e2e      mamba_ssm 2.3.2.post1's Mamba block and MambaLMHeadModel: "ours" = its Python from the
#            sdist (CUDA build skipped) on our selective_scan_cuda/causal_conv1d, "orig" = its own
#            sm_90 wheel (.device/mamba_whl.part-*, its compiled selective_scan_cuda first on the
#            path; the conv is our causal_conv1d in both, so the comparison isolates the scan);
#            ours again with MAMBA_KERNELS_SCAN_STATES=keep (the default, auto, recomputes under mamba_ssm)
#            Every e2e process first proves what it runs on (bench/provenance.py, via e2e_mamba.py):
#            "orig" its interface bound to the .so under $ORIG, "ours" our compatibility modules
#            from this checkout; otherwise it exits 2 before measuring ("PROVENANCE FAILED" in
#            run.log), and the compare table says which modules each side was checked on
#   ab       bench/e2e_ab.py: the same mamba_ssm rows with ours and the original in one process,
#            their calls interleaved round by round (the host-bound rows drift between processes
#            by more than the differences measured); needs the original wheel, like e2e
#   host     bench/experiments/compat_host_ab.py: the host time of each selective_scan_cuda.fwd / bwd call at
#            the small block's scan, ours, the original and our op alone, interleaved (what the
#            host-bound rows of ab wait on); needs the original wheel, like e2e
#   lmhost   bench/experiments/lm_host_sides.py: the LM forward with the scan's fwd of each side, our op alone,
#            and the original behind 10 and 20 us of busy wait (what host time per call costs in
#            place); needs the original wheel, like e2e
#   compile  torch.compile of a Mamba block on our ops (graph breaks, compiled vs eager)
#   mamba2   bench/e2e_mamba2.py: mamba_ssm's Mamba2 layer and a 4-layer Mamba-2 LM, its Triton
#            modules against ours with `import triton` failing (selective_scan.for_mamba_ssm),
#            each side in its own process, then compared (E2E_ARGS adds e.g. --dtypes float32)
#   tf       transformers' MambaForCausalLM (wheels from .device/wheels*): its fast path on ours,
#            against its own PyTorch path, and against the original kernels when the original
#            wheel was carried too
# Carried files (.device/): mamba_ssm-2.3.2.post1.tar.gz, causal_conv1d-1.7.0.tar.gz, peer/,
# mamba_whl.part-* + mamba_whl.name (e2e orig), wheels_hub/ (huggingface_hub, which mamba_ssm's
# package import needs), wheels/ + wheels_np/ (tf; numpy only if the machine lacks it).
# Environment: OUT, GPU_RUN_BUDGET (seconds, default 570), E2E_ARGS (extra args to e2e_mamba.py run),
# AB_ARGS (extra args to e2e_ab.py; default E2E_ARGS), PIN_CPU (the core the interleaved
# timings of ab, host and lmhost run on, default 5; empty: unpinned. On the H200's VM a pinned
# LM forward spread less between rounds, docs/notes/bench-passes.md fifteenth pass).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
OUT=${OUT:-/tmp/gpu_clients_out}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
log() { echo "[$(el)s] $*" | tee -a "$OUT/run.log"; }
BUDGET=${GPU_RUN_BUDGET:-570}
limit() { local l=$((BUDGET - $(el))); l=$((l < $1 ? l : $1)); echo $((l > 10 ? l : 10)); }
PHASES=" ${*:-build peer e2e ab compile} "
has() { [[ "$PHASES" == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
MS_OURS=/tmp/ms_ours
ORIG=/tmp/orig_ms
DEPS=/tmp/client_deps
E2E=$OUT/e2e
REPORT=$OUT/clients.md
mkdir -p "$E2E"
: >"$REPORT"
SUMMARY=()
note() { SUMMARY+=("$*"); log "$*"; }

log "phases:$PHASES; budget ${BUDGET}s; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
python3 -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__)" 2>&1 | tee -a "$OUT/run.log"

built() { [ -n "$(find causal_conv1d -name '_cuda*.so' 2>/dev/null)" ] && [ -n "$(find selective_scan -name '_cuda*.so' 2>/dev/null)" ]; }
if has build; then
  if built; then
    log "build: extensions already built in place"
  else
    s=$(date +%s)
    MAMBA_KERNELS_FORCE_BUILD=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=$(nproc) timeout "$(limit 300)" \
      python3 setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1
    note "build: rc=$? in $(($(date +%s) - s)) s"
  fi
fi
built || note "build: our extensions are NOT built; the kernel phases will fail (MAMBA_KERNELS_BACKEND=cuda)"

# ---- installs (each once per machine): mamba_ssm's Python from its sdist, the original wheel,
# the Python-only dependencies from the carried wheelhouses
if [ ! -d "$MS_OURS/mamba_ssm" ] && [ -f .device/mamba_ssm-2.3.2.post1.tar.gz ]; then
  # SKIP_CUDA_BUILD leaves the extensions out; FORCE_BUILD stops its setup.py fetching a prebuilt wheel
  MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE timeout 120 python3 -m pip install -q --no-deps \
    --no-build-isolation --no-index --target "$MS_OURS" .device/mamba_ssm-2.3.2.post1.tar.gz >"$OUT/install_ms.log" 2>&1
  log "mamba_ssm 2.3.2.post1 from its sdist, CUDA build skipped, into $MS_OURS: rc=$?"
fi
if [ ! -d "$ORIG/mamba_ssm" ] && ls .device/mamba_whl.part-* >/dev/null 2>&1 && [ -f .device/mamba_whl.name ]; then
  mkdir -p /tmp/mamba_whl && cat .device/mamba_whl.part-* >"/tmp/mamba_whl/$(cat .device/mamba_whl.name)"
  timeout 120 python3 -m pip install -q --no-deps --no-index --no-compile --target "$ORIG" /tmp/mamba_whl/*.whl \
    >"$OUT/install_orig.log" 2>&1
  log "original mamba_ssm wheel into $ORIG: rc=$?"
fi
# only what the machine lacks: a carried huggingface_hub newer than the installed transformers
# accepts would break `import transformers` (and mamba_ssm, which imports it)
wheels=""
add_wheels() { ls .device/$1/*.whl >/dev/null 2>&1 && wheels="$wheels $(ls .device/$1/*.whl | tr '\n' ' ')"; }
python3 -c "import huggingface_hub" 2>/dev/null || add_wheels wheels_hub
python3 -c "import transformers" 2>/dev/null || add_wheels wheels
python3 -c "import transformers, huggingface_hub; print('machine has transformers', transformers.__version__, \
  '| huggingface_hub', huggingface_hub.__version__)" 2>&1 | tail -1 | tee -a "$OUT/run.log"
python3 -c "import numpy" 2>/dev/null || { ls .device/wheels_np/*.whl >/dev/null 2>&1 && wheels="$wheels $(ls .device/wheels_np/*.whl)"; }
if [ -n "$wheels" ] && [ ! -f "$DEPS/.done$(echo $wheels | md5sum | cut -c1-8)" ]; then
  timeout 120 python3 -m pip install -q --no-deps --no-index --target "$DEPS" $wheels >"$OUT/install_deps.log" 2>&1
  rc=$?
  [ $rc = 0 ] && touch "$DEPS/.done$(echo $wheels | md5sum | cut -c1-8)"
  log "Python-only dependencies ($(echo $wheels | wc -w) wheels) into $DEPS: rc=$rc"
fi
P_OURS="$MS_OURS:$REPO:$DEPS"
PIN_CPU=${PIN_CPU-5}
PIN=()
if [ -n "$PIN_CPU" ] && command -v taskset >/dev/null; then PIN=(taskset -c "$PIN_CPU"); fi
log "interleaved timings pinned: ${PIN[*]:-no}"
P_ORIG="$ORIG:$REPO:$DEPS"

if has peer; then
  OUT=$OUT MS_OURS=$MS_OURS timeout "$(limit 420)" bash bench/peer_tests.sh
  note "peer: rc=$?"
  { echo "## The originals' operator tests against ours"; echo; echo '```'; cat "$OUT/peer_summary.log"; echo '```'; echo; } >>"$REPORT"
fi

e2e_run() {  # stack label pythonpath [extra args]
  local stack=$1 label=$2 pp=$3
  shift 3
  local s=$(date +%s)
  (cd /tmp && PYTHONPATH="$pp" timeout "$(limit 240)" python3 "$REPO/bench/e2e_mamba.py" run --stack "$stack" \
    --label "$label" --dir "$E2E" ${E2E_ARGS:-} "$@" >"$OUT/e2e_${stack}_$label.log" 2>&1)
  note "e2e $stack $label: rc=$? in $(($(date +%s) - s)) s (2: PROVENANCE FAILED, nothing measured)"
  grep -E "^provenance|PROVENANCE FAILED" "$OUT/e2e_${stack}_$label.log" | tee -a "$OUT/run.log"
  grep -E "PROBLEM|fast path NOT|Error" "$OUT/e2e_${stack}_$label.log" | head -5 | tee -a "$OUT/run.log"
}
e2e_compare() {  # stack base label
  python3 bench/e2e_mamba.py compare --stack "$1" --base "$2" --label "$3" --dir "$E2E" >>"$REPORT" 2>>"$OUT/run.log"
  note "compare $1 $3 vs $2: rc=$? (1: a difference above its tolerance, or a problem)"
}
if has e2e; then
  MAMBA_KERNELS_BACKEND=cuda e2e_run mamba_ssm ours "$P_OURS"
  if [ -d "$ORIG/mamba_ssm" ]; then
    e2e_run mamba_ssm orig "$P_ORIG" --orig-dir "$ORIG"
    echo "## mamba_ssm end to end: ours against the original" >>"$REPORT"
    e2e_compare mamba_ssm orig ours
    # the states kept between the scan's passes (the default, auto, recomputes them under mamba_ssm):
    # more memory per layer, no second forward scan in the backward
    MAMBA_KERNELS_SCAN_STATES=keep MAMBA_KERNELS_BACKEND=cuda e2e_run mamba_ssm ours-keep "$P_OURS"
    echo "## mamba_ssm end to end: ours with MAMBA_KERNELS_SCAN_STATES=keep against the original" >>"$REPORT"
    e2e_compare mamba_ssm orig ours-keep
  else
    note "e2e: no original wheel carried; ours ran alone"
  fi
fi
if has ab; then
  if [ -d "$ORIG/mamba_ssm" ]; then
    s=$(date +%s)
    (cd /tmp && MAMBA_KERNELS_BACKEND=cuda PYTHONPATH="$P_OURS" timeout "$(limit 300)" ${PIN[@]+"${PIN[@]}"} python3 "$REPO/bench/e2e_ab.py" \
      --orig-dir "$ORIG" --dir "$E2E" ${AB_ARGS:-${E2E_ARGS:-}} >"$OUT/e2e_ab.md" 2>"$OUT/e2e_ab.err")
    note "ab: rc=$? in $(($(date +%s) - s)) s (1: a problem in the report, 2: PROVENANCE FAILED)"
    cat "$OUT/e2e_ab.md" >>"$REPORT"
  else
    note "ab: no original wheel carried"
  fi
fi
if has host; then
  if [ -d "$ORIG/mamba_ssm" ]; then
    (cd /tmp && MAMBA_KERNELS_BACKEND=cuda PYTHONPATH="$REPO" timeout "$(limit 120)" ${PIN[@]+"${PIN[@]}"} python3 "$REPO/bench/experiments/compat_host_ab.py" \
      --orig-dir "$ORIG" >"$OUT/compat_host.md" 2>"$OUT/compat_host.err")
    note "host: rc=$?"
    { echo "## selective_scan_cuda host time per call"; echo; sed -n '1,/^## ours: fwd/p' "$OUT/compat_host.md" | head -n -1; } >>"$REPORT"
  else
    note "host: no original wheel carried"
  fi
fi
if has lmhost; then
  if [ -d "$ORIG/mamba_ssm" ]; then
    (cd /tmp && MAMBA_KERNELS_BACKEND=cuda PYTHONPATH="$P_OURS" timeout "$(limit 200)" ${PIN[@]+"${PIN[@]}"} python3 "$REPO/bench/experiments/lm_host_sides.py" \
      --orig-dir "$ORIG" >"$OUT/lm_host_sides.md" 2>"$OUT/lm_host_sides.err")
    note "lmhost: rc=$?"
    cat "$OUT/lm_host_sides.md" >>"$REPORT"
  else
    note "lmhost: no original wheel carried"
  fi
fi
if has compile; then
  (cd /tmp && MAMBA_KERNELS_BACKEND=cuda PYTHONPATH="$P_OURS" timeout "$(limit 240)" \
    python3 "$REPO/bench/e2e_mamba.py" compile --dir "$E2E" >"$OUT/compile.md" 2>"$OUT/compile.err")
  note "compile: rc=$?"
  cat "$OUT/compile.md" >>"$REPORT"
fi
if has mamba2; then  # Mamba-2 on mamba_ssm: its Triton modules against ours with no Triton importable
  for side in triton ours; do
    s=$(date +%s)
    (cd /tmp && PYTHONPATH="$REPO:$DEPS" timeout "$(limit 260)" python3 "$REPO/bench/e2e_mamba2.py" run --label $side \
      --dir "$E2E" --ms-dir "$MS_OURS" ${E2E_ARGS:-} >"$OUT/e2e_mamba2_$side.log" 2>&1)
    note "e2e mamba2 $side: rc=$? in $(($(date +%s) - s)) s (2: PROVENANCE FAILED, nothing measured)"
    grep -E "^provenance|PROVENANCE FAILED|fast path NOT" "$OUT/e2e_mamba2_$side.log" | tee -a "$OUT/run.log"
  done
  echo "## mamba_ssm Mamba-2 end to end: ours (no Triton) against its Triton kernels" >>"$REPORT"
  e2e_compare mamba2 triton ours
fi
if has tf; then
  if PYTHONPATH="$DEPS" python3 -c "import transformers" 2>/dev/null; then
    MAMBA_KERNELS_BACKEND=cuda e2e_run transformers ours "$P_OURS"
    e2e_run transformers torch "$DEPS"
    echo "## transformers MambaForCausalLM: fast path on ours against its PyTorch path" >>"$REPORT"
    e2e_compare transformers torch ours
    if [ -d "$ORIG/mamba_ssm" ]; then
      e2e_run transformers orig "$P_ORIG" --orig-dir "$ORIG"
      echo "## transformers MambaForCausalLM: fast path on ours against the original kernels" >>"$REPORT"
      e2e_compare transformers orig ours
    fi
  else
    note "tf: transformers is not importable (carry .device/wheels, wheels_hub, wheels_np)"
  fi
fi
log "summary:"
for s in "${SUMMARY[@]}"; do echo "  $s" | tee -a "$OUT/run.log"; done
log "done; report in \$OUT/clients.md"
