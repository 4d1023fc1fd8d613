"""Finding and probing the CUDA toolkit and host compiler for a source build.

Split into pure parsers (tested with literal inputs) and thin functions that run programs.
No torch import.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Sequence, Tuple


@dataclass(frozen=True)
class CudaHome:
    path: str
    how: str  # where it was found, for messages


def _is_script(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def script_target(text: str) -> Optional[str]:
    """The program a wrapper script runs: the last absolute path ending in 'nvcc' in an
    ``exec`` line (e.g. ``exec /usr/local/cuda-13.0/bin/nvcc "$@"``), or None."""
    found = None
    for line in text.splitlines():
        m = re.match(r"\s*exec\s+[\"']?(/[^\s\"']*/nvcc)[\"']?(\s|$)", line)
        if m:
            found = m.group(1)
    return found


def resolve_nvcc(nvcc: str) -> str:
    """Follow symlinks and shell wrapper scripts to the real nvcc binary, so the toolkit
    root is the one that holds it (not /usr/local for a wrapper in /usr/local/bin)."""
    path = os.path.realpath(nvcc)
    for _ in range(4):
        if not _is_script(path):
            break
        with open(path, errors="replace") as f:
            target = script_target(f.read())
        if not target or not os.path.exists(target):
            break
        path = os.path.realpath(target)
    return path


def _nvcc_name() -> str:
    return "nvcc.exe" if sys.platform == "win32" else "nvcc"


def looks_like_toolkit(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "bin", _nvcc_name())) and os.path.isfile(
        os.path.join(path, "include", "cuda_runtime.h")
    )


def pip_toolkit_roots(search_paths: Sequence[str]) -> List[str]:
    """Toolkit roots assembled by NVIDIA's pip wheels (nvidia-cuda-nvcc and friends): CUDA 13
    puts everything under site-packages/nvidia/cu13; CUDA 12 uses nvidia/cuda_nvcc."""
    roots = []
    for base in search_paths:
        for sub in ("cu13", "cu14", "cuda_nvcc"):
            root = os.path.join(base, "nvidia", sub)
            if os.path.isfile(os.path.join(root, "bin", _nvcc_name())):
                roots.append(root)
    return roots


def find_cuda_home(
    environ: Mapping[str, str],
    which: Callable[[str], Optional[str]] = shutil.which,
    search_paths: Sequence[str] = (),
) -> Optional[CudaHome]:
    """CUDA_HOME, else CUDA_PATH, else the toolkit holding the real nvcc on PATH, else
    /usr/local/cuda, else a pip-assembled toolkit in ``search_paths`` (site-packages)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if environ.get(var):
            return CudaHome(environ[var], var)
    nvcc = which("nvcc")
    if nvcc:
        real = resolve_nvcc(nvcc)
        root = os.path.dirname(os.path.dirname(real))
        how = "nvcc on PATH" if real == os.path.realpath(nvcc) else f"nvcc on PATH ({nvcc} -> {real})"
        return CudaHome(root, how)
    if sys.platform != "win32" and looks_like_toolkit("/usr/local/cuda"):
        return CudaHome("/usr/local/cuda", "/usr/local/cuda")
    for root in pip_toolkit_roots(search_paths):
        return CudaHome(root, "NVIDIA's pip packages")
    return None


def toolkit_problem(home: str, platform: str) -> Optional[str]:
    """What makes ``home`` unusable for building against torch, or None."""
    nvcc = os.path.join(home, "bin", _nvcc_name())
    if not os.path.isfile(nvcc):
        return f"{nvcc} does not exist"
    if not os.path.isfile(os.path.join(home, "include", "cuda_runtime.h")):
        return f"{home}/include has no cuda_runtime.h (install the CUDA runtime headers)"
    if platform.startswith("linux"):
        # torch links extensions with -L$CUDA_HOME/lib64 -lcudart (compat: pip toolkits have lib/).
        lib64 = os.path.join(home, "lib64")
        if not any(os.path.exists(os.path.join(lib64, n)) for n in ("libcudart.so", "libcudart_static.a")):
            return (
                f"{lib64} has no libcudart.so: torch links extensions with -L$CUDA_HOME/lib64 "
                "-lcudart (for a toolkit assembled from pip packages, link lib64 to lib and add "
                "an unversioned libcudart.so)"
            )
    return None


def parse_nvcc_version(text: str) -> Optional[str]:
    """'13.0' from ``nvcc --version`` output ('... release 13.0, V13.0.88')."""
    m = re.search(r"release (\d+)\.(\d+)", text)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def parse_compiler_version(text: str) -> Optional[Tuple[str, str]]:
    """(family, version) from a compiler's ``--version`` first lines: ('gcc', '12.2.0'),
    ('clang', '17.0.6'); None when unrecognised."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    m = re.search(r"clang version (\d+(?:\.\d+)*)", text)
    if m:
        return ("clang", m.group(1))
    if re.match(r"\S*(g\+\+|gcc|c\+\+|cc)(-\d+)?\s", first) or "Free Software Foundation" in text:
        m = re.search(r"(\d+\.\d+(?:\.\d+)?)\s*$", first) or re.search(r"\) (\d+\.\d+(?:\.\d+)?)", first)
        if m:
            return ("gcc", m.group(1))
    m = re.search(r"Compiler Version (\d+(?:\.\d+)*)", text)  # cl.exe banner
    if m:
        return ("msvc", m.group(1))
    return None


def run(cmd: Sequence[str], timeout: float = 120) -> Tuple[int, str]:
    """Run a command; (exit status, stdout+stderr). A missing program is status 127, one that
    cannot be run (an empty file, no execute permission) 126, as shells report them."""
    try:
        p = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    except FileNotFoundError:
        return 127, f"{cmd[0]}: not found"
    except OSError as e:  # on PATH but not runnable: no permission, not an executable format
        return 126, f"{cmd[0]}: cannot be run: {e.strerror or e}"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(cmd)}: timed out after {timeout:.0f} s"
    return p.returncode, p.stdout.decode(errors="replace")


def nvcc_facts(home: str) -> Tuple[Optional[str], List[str]]:
    """(CUDA version of nvcc, the compute_XX targets it supports)."""
    nvcc = os.path.join(home, "bin", _nvcc_name())
    _, out = run([nvcc, "--version"])
    version = parse_nvcc_version(out)
    rc, archs = run([nvcc, "--list-gpu-arch"])
    return version, (archs.split() if rc == 0 else [])


def host_compiler(environ: Mapping[str, str]) -> Tuple[str, Optional[Tuple[str, str]]]:
    """The C++ compiler setuptools uses (CXX, else the one Python was built with) and its
    (family, version)."""
    if sys.platform == "win32":
        return "cl", ("msvc", environ.get("VCToolsVersion", "unknown"))

    cxx = (environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++").split()[0]
    _, out = run([cxx, "--version"], timeout=30)
    return cxx, parse_compiler_version(out)


def nvcc_probe_problem(returncode: int, output: str, cxx_std: int, nvcc_version: str) -> Optional[str]:
    """Explain a failed ``nvcc -std=c++NN -E`` probe in one sentence (None on success)."""
    if returncode == 0:
        return None
    tail = " ".join(output.strip().splitlines()[-3:])[:400]
    if re.search(r"unsupported (GNU|clang|Microsoft Visual Studio) version", output, re.I):
        return (
            f"nvcc {nvcc_version} refuses the host compiler ({tail}). Install a compiler it "
            "supports and point CC/CXX at it (or NVCC_CCBIN), or use a newer CUDA toolkit"
        )
    if re.search(r"c\+\+" + str(cxx_std), output, re.I) or "-std" in output:
        return (
            f"nvcc {nvcc_version} with its host compiler cannot compile C++{cxx_std}, which this "
            f"torch requires ({tail}); C++20 needs CUDA >= 12.0 and GCC >= 10, Clang >= 10 or "
            "MSVC 2019 16.11+"
        )
    return f"the nvcc {nvcc_version} probe compile failed: {tail}"


def nvcc_probe_command(
    nvcc: str, src: str, cxx_std: int, environ: Mapping[str, str], windows: bool = sys.platform == "win32"
) -> List[str]:
    """The command line of the nvcc probe (ci/preflight.py checks it for repeated options)."""
    cmd = [nvcc, f"-std=c++{cxx_std}", "-E", src, "-o", os.devnull]
    ccbin = environ.get("NVCC_CCBIN") or environ.get("CC")
    if ccbin and not windows:
        cmd += ["-ccbin", ccbin]
    return cmd


def probe_nvcc(home: str, cxx_std: int, environ: Mapping[str, str], nvcc_version: str) -> Optional[str]:
    """Preprocess a tiny .cu file with nvcc and the host compiler it will use; a problem or None."""
    nvcc = os.path.join(home, "bin", _nvcc_name())
    with tempfile.TemporaryDirectory(prefix="mamba-kernels-probe-") as tmp:
        src = os.path.join(tmp, "probe.cu")
        with open(src, "w") as f:
            f.write("#include <cuda_runtime.h>\n__global__ void probe_kernel() {}\n")
        rc, out = run(nvcc_probe_command(nvcc, src, cxx_std, environ))
    return nvcc_probe_problem(rc, out, cxx_std, nvcc_version)


def probe_torch_headers(cxx: str, cxx_std: int, torch_include: str) -> Optional[str]:
    """Preprocess ``#include <ATen/ATen.h>`` with the host compiler at the chosen standard:
    catches a compiler too old for the C++ standard the installed torch requires."""
    if sys.platform == "win32":
        return None  # MSVC: flags come from the table (/std:c++NN /permissive- /Zc:__cplusplus)
    with tempfile.TemporaryDirectory(prefix="mamba-kernels-probe-") as tmp:
        src = os.path.join(tmp, "probe.cpp")
        with open(src, "w") as f:
            f.write("#include <ATen/ATen.h>\n")
        rc, out = run([cxx, f"-std=c++{cxx_std}", "-E", "-I", torch_include, src, "-o", os.devnull])
    if rc == 0:
        return None
    tail = " ".join(out.strip().splitlines()[-3:])[:400]
    return f"{cxx} cannot preprocess torch's headers as C++{cxx_std}, which this torch requires: {tail}"
