#!/usr/bin/env bash
# Compile check: build the CUDA extensions for ONE architecture (sm_90 unless
# TORCH_CUDA_ARCH_LIST says otherwise) from a copy of the tree in a temp dir, then import
# them and check their build metadata against the running torch. No GPU needed. Release
# flags (stripped, compressed), so the reported size is what a wheel carries per architecture.
# Reports wall time and .so sizes. Uses .venv (torch must be a CUDA build) and the CUDA
# toolkit at CUDA_HOME (default /usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(realpath -s "${PYTHON:-.venv/bin/python}")  # -s: keep the venv's symlink
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
srcs=$(find csrc/causal_conv1d csrc/selective_scan -maxdepth 1 \( -name '*.cu' -o -name '*.cpp' \) 2>/dev/null || true)
if [ -z "$srcs" ]; then
    echo "compile check: no kernel sources in csrc/, nothing to compile"
    exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mamba-kernels-compile.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# Tracked and not-ignored files only: what a clean clone would build.
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$tmp"
start=$(date +%s)
(cd "$tmp" && MAMBA_KERNELS_RELEASE=1 "$PY" setup.py -q build_ext --inplace) \
    > "$tmp/build.log" 2>&1 || { tail -n 60 "$tmp/build.log"; echo "compile check: FAILED"; exit 1; }
end=$(date +%s)
grep '^mamba-kernels:' "$tmp/build.log" || true
(cd "$tmp" && "$PY" - <<'PYEOF'
import glob, importlib, os, sys
sys.path.insert(0, os.getcwd())
import torch  # noqa: F401  (loads libtorch and the CUDA runtime the extension links)
from mamba_kernels import buildinfo
for so in sorted(glob.glob("*/_cuda*.so")) + sorted(glob.glob("*/_cuda*.pyd")):
    name = so.split(os.sep)[0] + "._cuda"
    module = importlib.import_module(name)
    problem = buildinfo.check_module(module)
    if problem:
        sys.exit(f"compile check: {name}: {problem}")
    info = buildinfo.parse(module.BUILD_INFO)
    print(f"compile check: {name} imports; {os.path.getsize(so) / 1e6:.1f} MB; built for {info.describe()}")
PYEOF
)
echo "compile check: OK in $((end - start)) s (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
