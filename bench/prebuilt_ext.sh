#!/usr/bin/env bash
# A stable-ABI build of our extensions made on a machine without a GPU, carried to the GPU
# machine so that its calls need not spend a minute compiling. One stable build serves every
# torch from the stable ABI's target on (docs/STABLE_ABI.md), so a build against this machine's
# torch loads under the GPU machine's. The build is tied to the sources it was made from by a
# hash of every file that goes into it; a checkout whose sources differ gets no prebuilt.
#
#   bash bench/prebuilt_ext.sh make DIR   build here (CUDA_HOME, TORCH_CUDA_ARCH_LIST, default 9.0;
#                                         replaces build/ and removes in-place extensions) and put
#                                         the packed .so files and SOURCES.sha256 into DIR
#   bash bench/prebuilt_ext.sh use DIR    when DIR's hash is this checkout's: copy its .so files
#                                         into the packages and exit 0; else say why and exit 1
#   bash bench/prebuilt_ext.sh hash       this checkout's sources hash
set -uo pipefail
cd "$(dirname "$0")/.."
PKGS="causal_conv1d selective_scan"

sources_hash() {  # every file the extensions' build reads, by path and content
  find csrc mamba_kernels/build mamba_kernels/facts mamba_kernels/runtime/buildinfo.py \
    mamba_kernels/runtime/knobs.py build_backend setup.py pyproject.toml -type f \
    \( -name '*.py' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.cpp' -o -name '*.toml' \
       -o -name '*.json' -o -name '*.txt' -o -name '*.cfg' \) -not -path '*/__pycache__/*' -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
}

# (Python's lzma: the GPU machine need not have the xz tool)
xz_pack() {
  python3 - "$1" "$2" <<'PY'
import lzma, shutil, sys
with open(sys.argv[1], "rb") as src, lzma.open(sys.argv[2], "wb", preset=6) as dst:
    shutil.copyfileobj(src, dst)
PY
}
xz_unpack() {
  python3 - "$1" "$2" <<'PY'
import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
}

case "${1:-}" in
  hash) sources_hash ;;
  make)
    dir=${2:?usage: make DIR}
    py=${PYTHON:-python3}
    export MAMBA_KERNELS_BINDING=stable MAMBA_KERNELS_FORCE_BUILD=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
    export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    find $PKGS -name '_cuda*.so' -delete
    rm -rf build
    "$py" setup.py -q build_ext --inplace || exit 1
    rm -rf "$dir" && mkdir -p "$dir"
    for p in $PKGS; do  # xz: a development build's line tables make it 18 MB, 2.3 MB packed
      so=$(ls $p/_cuda*.so) || exit 1
      mkdir -p "$dir/$p" && xz_pack "$so" "$dir/$p/$(basename "$so").xz" || exit 1
    done
    find $PKGS -name '_cuda*.so' -delete
    sources_hash > "$dir/SOURCES.sha256"
    echo "prebuilt: $(cat "$dir/SOURCES.sha256") for TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST in $dir"
    ;;
  use)
    dir=${2:?usage: use DIR}
    [ -f "$dir/SOURCES.sha256" ] || { echo "prebuilt: none in $dir"; exit 1; }
    want=$(cat "$dir/SOURCES.sha256"); have=$(sources_hash)
    [ "$want" = "$have" ] || { echo "prebuilt: made from other sources ($want, this checkout $have): not used"; exit 1; }
    for p in $PKGS; do
      ls "$dir/$p"/_cuda*.so.xz >/dev/null 2>&1 || { echo "prebuilt: $dir/$p has no extension"; exit 1; }
    done
    for p in $PKGS; do
      find $p -name '_cuda*.so' -delete
      for f in "$dir/$p"/_cuda*.so.xz; do
        xz_unpack "$f" "$p/$(basename "$f" .xz)" || { echo "prebuilt: $f does not unpack"; exit 1; }
      done
    done
    echo "prebuilt: used $dir ($have)"
    ;;
  *) echo "usage: bash bench/prebuilt_ext.sh make DIR | use DIR | hash" >&2; exit 2 ;;
esac
