#!/usr/bin/env bash
# Nsight Compute profiles of the scan kernels, ours beside the original's, for a GPU-machine
# call made after `bash bench/gpu_scan_run.sh build` (ours built in place, the original in
# /tmp/orig). For each case: one launch, warm (the earlier calls skipped), with the sections
# that say where the time goes (speed of light, occupancy, warp states, scheduler) and the
# per-instruction stall samples, exported as CSV of the SASS (`--page source`).
#
#   bash bench/ncu_scan.sh CASE...     CASE: side:case:size:kernel-regex, e.g.
#     ours:decode:1:state_update  original:decode:1:selective_scan_update
#     ours:fwd:2x2048x8192x16:bf16:fwd_lanes
#
# Writes $OUT/ncu_<n>_details.csv and $OUT/ncu_<n>_source.csv per case (n: its position).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ncu_out}
mkdir -p "$OUT"
NCU=${NCU:-$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)}
[ -n "$NCU" ] || { echo "ncu_scan: no ncu on this machine"; exit 1; }
n=0
for spec in "$@"; do
  n=$((n + 1))
  side=${spec%%:*} rest=${spec#*:}
  case_=${rest%%:*} rest=${rest#*:}
  regex=${rest##*:} size=${rest%:*}
  rep=/tmp/ncu_$n
  rm -f "$rep.ncu-rep"
  echo "ncu_scan: $n: $side $case_ $size (kernel ~ $regex)"
  PYTHONPATH=$(pwd) timeout 240 "$NCU" -f -o "$rep" -k "regex:$regex" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section SourceCounters --section MemoryWorkloadAnalysis \
    python3 bench/ncu_cases.py "$side" "$case_" "$size" --calls 4 >"$OUT/ncu_${n}_run.log" 2>&1
  echo "ncu_scan: $n: ncu rc=$?"
  tail -3 "$OUT/ncu_${n}_run.log"
  [ -f "$rep.ncu-rep" ] || continue
  "$NCU" -i "$rep.ncu-rep" --page details --csv >"$OUT/ncu_${n}_details.csv" 2>&1
  "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_${n}_source.csv" 2>&1
done
