"""The build environment's torch and machine, as the plan reads them: the torch facts a build
follows (version, CUDA, C++ ABI, headers, visible GPUs), the platform, the C++ standard, and why
a torch or an nvcc cannot build the extensions."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..facts import support, versions

MIN_TORCH = (2, 1)


@dataclass(frozen=True)
class TorchFacts:
    version: str  # "2.14.1+cu130"
    cuda: Optional[str]  # torch.version.cuda
    cxx11_abi: bool
    include_dir: str
    gpu_capabilities: Tuple[Tuple[int, int], ...] = ()


def gather_torch_facts() -> Tuple[Optional[TorchFacts], Optional[str]]:
    """(facts, None) or (None, why torch cannot be used)."""
    try:
        # Not torch.utils.cpp_extension yet: it fixes CUDA_HOME on import (see setup_kwargs).
        import torch
    except ImportError as e:
        return None, (
            f"torch is not importable in the build environment ({e}); with pip, build with "
            "--no-build-isolation against the torch you have installed"
        )
    caps: List[Tuple[int, int]] = []
    try:
        if torch.version.cuda and torch.cuda.is_available():
            caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no driver, broken driver: build for the default list instead
        caps = []
    include = os.path.join(os.path.dirname(torch.__file__), "include")
    facts = TorchFacts(
        torch.__version__, torch.version.cuda, bool(torch._C._GLIBCXX_USE_CXX11_ABI), include, tuple(caps)
    )
    return facts, None


def current_platform() -> str:
    """This machine's platform name; on a machine we build no wheels for, the first platform of
    its OS (else the first platform), so a local build still has flags and a BUILD_INFO."""
    name = support.platform_of(sys.platform, platform.machine())
    if name is not None:
        return name
    same_os = [p.name for p in support.PLATFORM_RECORDS if p.markers["sys_platform"] == sys.platform]
    return (same_os or support.PLATFORMS)[0]


def required_cxx_std(torch_version: str) -> int:
    """The C++ standard to compile against this torch with (support table; newer than the
    table: 20, older: 17)."""
    try:
        return support.torch_release(torch_version).cxx_std
    except ValueError:
        newest = support.RELEASES[-1]
        return newest.cxx_std if versions.minor_key(torch_version) > versions.key(newest.torch) else 17


def torch_problem(facts: TorchFacts) -> Optional[str]:
    """Why this torch cannot get a CUDA build, or None."""
    if versions.minor_key(facts.version) < MIN_TORCH:
        return f"torch {facts.version} is older than {MIN_TORCH[0]}.{MIN_TORCH[1]}, the oldest supported"
    if not facts.cuda:
        return (
            f"the installed torch {facts.version} is a CPU-only build (torch.version.cuda is None); "
            "install a CUDA build of torch to build the CUDA extensions"
        )
    return None


def cuda_major_problem(nvcc_version: str, torch_cuda: str, home: str) -> Optional[str]:
    if nvcc_version.split(".")[0] != torch_cuda.split(".")[0]:
        return (
            f"nvcc in {home} is CUDA {nvcc_version} but torch was built with CUDA {torch_cuda}: "
            f"the major versions must match. Point CUDA_HOME at a CUDA {torch_cuda.split('.')[0]}.x "
            "toolkit, or install the torch build for your toolkit"
        )
    return None
