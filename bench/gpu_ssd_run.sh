#!/usr/bin/env bash
# The Mamba-2 SSD forward and backward on a GPU machine, from the repository root: builds our extensions in
# place unless they are built, then
#
#   bash bench/gpu_ssd_run.sh tests      tests/test_ssd_cuda.py (forward and backward ops; and the ssd_fwd /
#                                        ssd_bwd sanitizer cases' verify), the GPU tests of
#                                        tests/test_ssd_autograd.py and tests/test_ssd_gpu.py
#   bash bench/gpu_ssd_run.sh bench      bench/bench_ssd.py against mamba_ssm's Triton (forward; forward + backward)
#   bash bench/gpu_ssd_run.sh sanitize   the ssd_fwd and ssd_bwd sanitizer cases under compute-sanitizer
#
# bench installs mamba_ssm's Python from .device/mamba_ssm-2.3.2.post1.tar.gz into /tmp/ms_ours
# (CUDA build skipped, as bench/gpu_clients_run.sh does) unless it is there; its Triton kernels
# need einops and triton (the carried wheelhouses under .device/ if the machine lacks einops).
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-tests}
MS=${MS_DIR:-/tmp/ms_ours}
if [ -z "$(find selective_scan -name '_cuda*.so' 2>/dev/null)" ]; then
  MAMBA_KERNELS_FORCE_BUILD=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=$(nproc) \
    python3 setup.py -q build_ext --inplace || exit 1
fi
case "$what" in
  tests)
    # the op tests (forward and backward)
    MAMBA_KERNELS_BACKEND=cuda python3 -m pytest -q tests/test_ssd_cuda.py
    rc=$?
    # the dispatch from ssd_combined (its own backend settings per test), GPU tests only
    python3 -m pytest -q -m gpu tests/test_ssd_autograd.py tests/test_ssd_gpu.py || rc=1
    python3 scripts/sanitize_cases.py verify --family ssd_fwd || rc=1
    python3 scripts/sanitize_cases.py verify --family ssd_bwd || rc=1
    exit $rc
    ;;
  sanitize)
    bash scripts/sanitize.sh --family ssd_fwd "${@:2}"; rc=$?
    bash scripts/sanitize.sh --family ssd_bwd "${@:2}" || rc=1
    exit $rc
    ;;
  bench)
    if [ ! -d "$MS/mamba_ssm" ] && [ -f .device/mamba_ssm-2.3.2.post1.tar.gz ]; then
      MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE python3 -m pip install -q --no-deps --no-build-isolation \
        --no-index --target "$MS" .device/mamba_ssm-2.3.2.post1.tar.gz || exit 1
    fi
    python3 -c "import einops" 2>/dev/null || {
      ls .device/wheels*/einops-*.whl >/dev/null 2>&1 &&
        python3 -m pip install -q --no-deps --no-index --target /tmp/ssd_bench_deps .device/wheels*/einops-*.whl
    }
    PYTHONPATH="$MS:/tmp/ssd_bench_deps:${PYTHONPATH:-}" python3 bench/bench_ssd.py --ms-dir "$MS" "${@:2}"
    ;;
  *) echo "usage: bash bench/gpu_ssd_run.sh tests|bench|sanitize [args]" >&2; exit 2 ;;
esac
