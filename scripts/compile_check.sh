#!/usr/bin/env bash
# Compile check: build the CUDA extensions for ONE architecture (sm_90 unless
# TORCH_CUDA_ARCH_LIST says otherwise) from a copy of the tree in a temp dir, with the binding
# the build picks for this torch (MAMBA_KERNELS_BINDING=auto: the stable-ABI binding on torch
# >= 2.10), import them, check their build metadata against the running torch, and audit a
# stable build's symbols (scripts/abi_audit.py). Then the other binding's own translation units
# (the classic binding's, on torch >= 2.10) are compiled with the flags the build would use, so
# both bindings stay compilable without a second full build of the kernels. No GPU needed.
# Release flags (stripped, compressed), so the reported size is what a wheel carries per
# architecture. Reports wall times and .so sizes. Uses .venv (torch must be a CUDA build) and
# the CUDA toolkit at CUDA_HOME (default /usr/local/cuda).
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
root=$(pwd)
start=$(date +%s)
(cd "$tmp" && MAMBA_KERNELS_RELEASE=1 "$PY" setup.py -q build_ext --inplace) \
    > "$tmp/build.log" 2>&1 || { tail -n 60 "$tmp/build.log"; echo "compile check: FAILED"; exit 1; }
end=$(date +%s)
grep '^mamba-kernels:' "$tmp/build.log" || true
binding=$(cd "$tmp" && "$PY" - <<'PYEOF'
import glob, importlib, os, sys
sys.path.insert(0, os.getcwd())
import torch  # noqa: F401  (loads libtorch and the CUDA runtime the extension links)
from mamba_kernels.runtime import buildinfo
bindings = set()
for so in sorted(glob.glob("*/_cuda*.so")) + sorted(glob.glob("*/_cuda*.pyd")):
    name = so.split(os.sep)[0] + "._cuda"
    module = importlib.import_module(name)
    problem = buildinfo.check_module(module)
    if problem:
        sys.exit(f"compile check: {name}: {problem}")
    info = buildinfo.parse(module.BUILD_INFO)
    bindings.add(info.binding)
    print(f"compile check: {name} imports; {os.path.getsize(so) / 1e6:.1f} MB; built for {info.describe()}",
          file=sys.stderr)
print(" ".join(sorted(bindings)))
PYEOF
)
echo "compile check: $binding binding built and imported in $((end - start)) s (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
if [ "$binding" != stable ]; then  # torch < 2.10: its headers have no stable API to check
    echo "compile check: OK"
    exit 0
fi
"$PY" scripts/abi_audit.py "$tmp"/*/_cuda*.abi3.so
# every op the stable bindings define registers (the same check loads a wheel on an older torch)
"$PY" scripts/stable_load_check.py "$tmp" > "$tmp/load.log" 2>&1 \
    || { cat "$tmp/load.log"; echo "compile check: the stable ops did not all register"; exit 1; }
echo "compile check: $(grep -c 'mamba_kernels::' "$tmp/load.log") ops registered"
start=$(date +%s)
(cd "$tmp" && "$PY" -m mamba_kernels.build.plan --compile-binding classic) \
    || { echo "compile check: the classic binding FAILED to compile"; exit 1; }
end=$(date +%s)
echo "compile check: OK; the classic binding's own translation units compile too ($((end - start)) s)"
