"""A clean build log (issue 17): no ptxas "threads per SM out of range" for a launch bound on the
oldest architecture we build (sm_75 holds 1024 threads per SM), and no GCC -Wmaybe-uninitialized
in the host code. Compiles with the CUDA toolkit and GCC of this machine; no GPU needed."""

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from mamba_kernels.build import plan as build
from mamba_kernels.build import sources as build_sources
from mamba_kernels.build import toolchain as build_toolchain

ROOT = Path(__file__).resolve().parent.parent
NVCC = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
needs_nvcc = pytest.mark.skipif(not NVCC.is_file(), reason=f"{NVCC} is needed")

# Every __launch_bounds__ minimum of the causal_conv1d policies, in a kernel ptxas checks.
BOUNDS = {
    "FwdPolicy": ("kMinBlocksCF", "kMinBlocksCFLean", "kMinBlocksCL"),
    "BwdPolicy": ("kMinBlocksCF", "kMinBlocksCFLean", "kMinBlocksCL", "kMinBlocksCLLean"),
    "UpdatePolicy": ("kMinBlocksShift",),
}


# The decode kernels' register caps (selective_scan UpdatePolicy), at each (kind, state bytes,
# activation bytes) they are instantiated with: the general kernel typed or generic (AnyDtype, 1
# byte), the lean kernel at each pass group kP.
DECODE_BOUNDS = ([f"full_min_blocks({g}, {s}, {t})" for g, t in (("false", 4), ("false", 2), ("true", 1))
                  for s in (4, 2)] +
                 [f"lean_min_blocks({kp}, {s}, {t})" for kp in (1, 2, 4) for s in (4, 2) for t in (4, 2)])


def _compile_bounds(tmp_path, arch, header, namespace, bounds, folder):
    """Compiles one trivial kernel per (policy, launch-bound minimum) for ``arch``; no warning."""
    kernels = "".join(
        f"__global__ void __launch_bounds__({pol}::kThreads, {pol}::{expr}) k{i}(float* x) "
        f"{{ x[threadIdx.x] = 1.f; }}\n"
        for i, (pol, expr) in enumerate(bounds)
    )
    src = tmp_path / "bounds.cu"
    src.write_text(f'#include "{header}"\nusing namespace mamba_kernels::{namespace};\n' + kernels)
    r = subprocess.run(
        [str(NVCC), "-std=c++17", "--expt-relaxed-constexpr", f"-gencode=arch=compute_{arch},code=sm_{arch}",
         "-c", "-o", str(tmp_path / "bounds.o"), f"-I{ROOT / 'csrc' / 'common'}",
         f"-I{ROOT / 'csrc' / folder}", str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr


@needs_nvcc
@pytest.mark.parametrize("arch", ["75", "86", "90"])
def test_conv_launch_bounds_fit_the_architecture(tmp_path, arch):
    bounds = [(pol, name) for pol, names in BOUNDS.items() for name in names]
    _compile_bounds(tmp_path, arch, "conv_common.cuh", "causal_conv1d", bounds, "causal_conv1d")


@needs_nvcc
@pytest.mark.parametrize("arch", ["75", "86", "90"])
def test_decode_launch_bounds_fit_the_architecture(tmp_path, arch):
    bounds = [("UpdatePolicy", expr) for expr in DECODE_BOUNDS]
    _compile_bounds(tmp_path, arch, "scan_policy.cuh", "selective_scan", bounds, "selective_scan")


@needs_nvcc
@pytest.mark.skipif(not shutil.which("g++"), reason="GCC is needed")
def test_host_code_has_no_maybe_uninitialized(monkeypatch):
    """The binding files (where the ops' bodies, with their optional workspaces, are compiled)
    with the build's own flags, -Wall and -O3 as in a build."""
    env = dict(os.environ, MAMBA_KERNELS_FORCE_BUILD="1", TORCH_CUDA_ARCH_LIST="9.0",
               CUDA_HOME=str(NVCC.parent.parent))
    plan = build.make_plan(str(ROOT), env)
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "CUDA_HOME", plan.env["CUDA_HOME"])  # as setup_kwargs does
    cxx, _ = build_toolchain.host_compiler(env)
    includes = plan.include_dirs + cpp_extension.include_paths(device_type="cuda")
    includes.append(sysconfig.get_paths()["include"])
    flags = [*plan.flags["cxx"], "-Wall", "-fPIC", "-DTORCH_API_INCLUDE_EXTENSION_H",
             "-DTORCH_EXTENSION_NAME=_cuda"]
    if plan.binding == build.STABLE:
        flags.append("-DPy_LIMITED_API=0x030A0000")
    files = [f for fs in plan.sources.values() for f in fs if f.endswith("binding.cpp")]
    # one binding file per kernel folder that has one (the Mamba-2 families ship in selective_scan._cuda)
    want = sorted(f"csrc/{folder}/{plan.binding}/binding.cpp" for kernel in build_sources.KERNELS
                  for folder in build_sources.KERNEL_FOLDERS[kernel]
                  if (ROOT / "csrc" / folder / plan.binding / "binding.cpp").exists())
    assert sorted(files) == want and len(files) >= 3, files
    assert f"csrc/ssd/{plan.binding}/binding.cpp" in files
    for src in files:
        r = subprocess.run([cxx, "-c", "-o", os.devnull, *flags, *(f"-I{d}" for d in includes),
                            str(ROOT / src)], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        assert "maybe-uninitialized" not in r.stderr, f"{src}:\n{r.stderr[-3000:]}"
