"""The compile of the extensions: how many jobs and nvcc threads the machine's cores and memory
allow, and the cxx, nvcc and link flags of a build."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..facts import support, versions
from ..facts.variant import CLASSIC
from . import archs as build_archs
from .binding import binding_defines

GIB = 1 << 30
NVCC_MEMORY_PER_THREAD = 2 * GIB  # rough peak of one nvcc thread on these kernels, with margin


def available_memory() -> Optional[int]:
    """MemAvailable in bytes (Linux), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def choose_parallelism(
    cpus: int,
    mem_available: Optional[int],
    n_targets: int,
    max_jobs: Optional[int],
    nvcc_threads: Optional[int],
) -> Tuple[int, int]:
    """(compile jobs, nvcc threads per job). nvcc threads parallelise the architectures of one
    file; jobs parallelise files. Memory, not cores, is what runs out: each nvcc thread is
    budgeted NVCC_MEMORY_PER_THREAD."""
    cpus = max(1, cpus)
    threads = nvcc_threads or max(1, min(n_targets, 4, cpus))
    if max_jobs:
        return max_jobs, threads
    jobs = max(1, cpus // threads)
    if mem_available is not None:
        jobs = max(1, min(jobs, mem_available // (NVCC_MEMORY_PER_THREAD * threads)))
    return int(jobs), threads


def compile_flags(
    *,
    platform: str,
    cxx_std: int,
    nvcc_version: str,
    arch_plan: build_archs.ArchPlan,
    nvcc_threads: int,
    release: bool,
    cxx11_abi: Optional[bool],
    binding: str = CLASSIC,
) -> Dict[str, List[str]]:
    """{'cxx': [...], 'nvcc': [...], 'link': [...]} for every extension."""
    nvcc_v = versions.key(nvcc_version)
    nvcc = ["-O3", f"--threads={nvcc_threads}"] + build_archs.gencode_flags(arch_plan)
    if support.PLATFORM_BY_NAME[platform].os == "windows":
        # MSVC: standard-conforming mode and a truthful __cplusplus (torch checks it); CCCL in
        # CUDA >= 13.2 needs the conforming preprocessor (docs/COMPAT.md §6).
        msvc = ["/permissive-", "/Zc:__cplusplus"]
        cxx = ["/O2", f"/std:c++{cxx_std}"] + msvc
        host = msvc + (["/Zc:preprocessor"] if nvcc_v >= (13, 2) else [])
        for flag in host:
            nvcc += ["-Xcompiler", flag]
        link: List[str] = []  # torch adds -std for nvcc on Windows itself
    else:
        # The ABI define explicitly: newer torch no longer adds it, older torch adds the same value.
        abi = [f"-D_GLIBCXX_USE_CXX11_ABI={int(bool(cxx11_abi))}"]
        cxx = ["-O3", f"-std=c++{cxx_std}"] + abi
        nvcc[:0] = [f"-std=c++{cxx_std}"] + abi
        link = []
        if release:
            cxx.append("-g0")  # Python's CFLAGS often carry -g
            link.append("-s")
    if release:
        if nvcc_v >= (12, 8):
            nvcc.append("--compress-mode=size")
    else:
        nvcc.append("-lineinfo")
    cxx += binding_defines(binding)
    nvcc += binding_defines(binding)
    return {"cxx": cxx, "nvcc": nvcc, "link": link}
