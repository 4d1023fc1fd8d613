"""The support table: which torch / CUDA / Python / platform / C++ ABI combinations exist.

This is the one place those facts live, so a fact changes in one edit: setup.py, the
build-matrix generator, the resolver, the doctor and the tests read it. Data only plus
small lookups; no torch import (setup.py imports it before torch may be installed). What
each fact means and where it was learned (PyTorch's release tooling, or the torch wheels
on PyPI: file names, Requires-Python and torch/version.py of the default build, read
2026-11-29) is in docs/COMPAT.md, section named at each item.

A *cell* is one wheel we build: (torch major.minor, CUDA variant, CPython version,
platform, C++ ABI). Cells are exactly the combinations torch itself shipped, intersected
with the Pythons this package supports (>= 3.9).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

PLATFORMS: Tuple[str, ...] = ("linux_x86_64", "linux_aarch64", "win_amd64")
# The oldest CPython this package runs on (pyproject.toml requires-python).
MIN_PYTHON = (3, 9)


def _vkey(v: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def _pythons(lo: str, hi: str) -> Tuple[str, ...]:
    major, a = _vkey(lo)
    _, b = _vkey(hi)
    return tuple(f"{major}.{m}" for m in range(a, b + 1))


@dataclass(frozen=True)
class TorchRelease:
    """One torch major.minor release line and what it shipped."""

    torch: str  # "2.6"
    pythons: Tuple[str, ...]  # CPython versions with Linux wheels (free-threaded builds excluded)
    cuda: Mapping[str, Tuple[str, ...]]  # platform -> CUDA variants ("12.6"), oldest first
    pypi_cuda: str  # the CUDA variant of the plain PyPI wheel on Linux x86_64
    linux_cxx11_abi: Mapping[str, bool]  # CUDA variant -> _GLIBCXX_USE_CXX11_ABI on Linux
    manylinux: str  # glibc baseline of torch's Linux wheels: "manylinux_2_17" / "manylinux_2_28"
    cxx_std: int  # the C++ standard extensions are compiled with (17 or 20)
    note: str = ""
    # Platforms whose CPython range differs from ``pythons`` (platform -> versions).
    platform_pythons: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)

    def pythons_on(self, platform: str) -> Tuple[str, ...]:
        """The CPython versions torch shipped wheels for on ``platform``."""
        return self.platform_pythons.get(platform, self.pythons)

    def cxx11_abi(self, cuda: str, platform: str) -> Optional[bool]:
        """The C++ ABI flag of torch's build for (cuda, platform); None where it has no meaning."""
        if platform == "win_amd64":
            return None
        if platform == "linux_aarch64":
            return True  # every aarch64 CUDA build is cxx11 (docs/COMPAT.md §2; they start with 2.7)
        return self.linux_cxx11_abi[cuda]

    @property
    def has_two_abis(self) -> bool:
        """torch 2.6 shipped both ABIs on Linux (docs/COMPAT.md §2): labels must tell them apart."""
        return len(set(self.linux_cxx11_abi.values())) > 1


def _release(
    torch: str,
    pythons: Tuple[str, str],
    x86: Sequence[str],
    *,
    pypi: str,
    aarch64: Sequence[str] = (),
    windows: Optional[Sequence[str]] = None,
    win_pythons: Optional[Tuple[str, str]] = None,
    pre_cxx11: Sequence[str] = (),
    manylinux: str = "manylinux_2_28",
    cxx_std: int = 17,
    note: str = "",
) -> TorchRelease:
    cuda = {
        "linux_x86_64": tuple(x86),
        "linux_aarch64": tuple(aarch64),
        "win_amd64": tuple(x86 if windows is None else windows),
    }
    abi = {c: c not in pre_cxx11 for c in x86}
    per_platform = {"win_amd64": _pythons(*win_pythons)} if win_pythons else {}
    return TorchRelease(torch, _pythons(*pythons), cuda, pypi, abi, manylinux, cxx_std, note, per_platform)


_ALL_PRE = ("11.8", "12.1", "12.4")  # for torch <= 2.5 every Linux build is pre-cxx11

# fmt: off
RELEASES: Tuple[TorchRelease, ...] = (
    # 2.1-2.3 predate PyTorch's release lists. PyPI: Requires-Python >=3.8, cp38-cp311 (2.1) and
    # cp38-cp312 (2.2, 2.3); the PyPI Linux wheel needs nvidia-*-cu12==12.1.*; PyTorch's own
    # index carries cu118 and cu121 for all three (Linux x86_64 and Windows). aarch64 PyPI
    # wheels of these are CPU builds. ABI and glibc as 2.4/2.5 (docs/COMPAT.md §1, §2, §3).
    _release("2.1", ("3.8", "3.11"), ("11.8", "12.1"), pypi="12.1", pre_cxx11=_ALL_PRE,
             manylinux="manylinux_2_17"),
    _release("2.2", ("3.8", "3.12"), ("11.8", "12.1"), pypi="12.1", pre_cxx11=_ALL_PRE,
             manylinux="manylinux_2_17"),
    _release("2.3", ("3.8", "3.12"), ("11.8", "12.1"), pypi="12.1", pre_cxx11=_ALL_PRE,
             manylinux="manylinux_2_17"),
    # docs/COMPAT.md §1 (2.4-2.14), §2 (ABI), §3 (glibc), §4 (C++ standard). Python ranges as
    # the PyPI file lists show (2.5 has cp39-cp313, where PyTorch's release list says 3.9-3.12).
    _release("2.4", ("3.8", "3.12"), ("11.8", "12.1", "12.4"), pypi="12.1", pre_cxx11=_ALL_PRE,
             manylinux="manylinux_2_17"),
    # torch 2.5.x on PyPI: Linux x86_64 cp39-cp313, but Windows only cp39-cp312 (the first
    # Windows cp313 wheel is 2.6.0). PyTorch's CUDA wheels for Windows live on its own index,
    # which cannot be read from here; they are taken to cover the same Pythons as the PyPI
    # Windows wheels of the same release, as they do for every release that can be compared.
    _release("2.5", ("3.9", "3.13"), ("11.8", "12.1", "12.4"), pypi="12.4", pre_cxx11=_ALL_PRE,
             manylinux="manylinux_2_17", win_pythons=("3.9", "3.12")),
    _release("2.6", ("3.9", "3.13"), ("11.8", "12.4", "12.6"), pypi="12.4", pre_cxx11=("11.8", "12.4"),
             note="two C++ ABIs on Linux: cu118 and cu124 pre-cxx11, cu126 cxx11"),
    _release("2.7", ("3.9", "3.13"), ("11.8", "12.6", "12.8"), aarch64=("12.8",), pypi="12.6"),
    _release("2.8", ("3.9", "3.13"), ("12.6", "12.8", "12.9"), aarch64=("12.9",), pypi="12.8"),
    _release("2.9", ("3.10", "3.14"), ("12.6", "12.8", "13.0"), aarch64=("12.6", "12.8", "13.0"),
             pypi="12.8"),
    _release("2.10", ("3.10", "3.14"), ("12.6", "12.8", "13.0"), aarch64=("12.6", "12.8", "13.0"),
             pypi="12.8"),
    _release("2.11", ("3.10", "3.14"), ("12.6", "12.8", "13.0"), aarch64=("12.6", "12.8", "13.0"),
             pypi="13.0"),
    _release("2.12", ("3.10", "3.14"), ("12.6", "13.0", "13.2"), aarch64=("12.6", "13.0", "13.2"),
             pypi="13.0"),
    _release("2.13", ("3.10", "3.14"), ("12.6", "13.0", "13.2"), aarch64=("12.6", "13.0", "13.2"),
             pypi="13.0", cxx_std=20),
    # docs/COMPAT.md §1.1: 13.4 is not built for Windows. PyPI 2.14.x has cp310-cp314 (the test
    # channel's 3.15 did not ship on PyPI). Its headers reject C++17 (ATen/ATen.h #error).
    _release("2.14", ("3.10", "3.14"), ("12.6", "13.0", "13.2", "13.4"),
             aarch64=("12.6", "13.0", "13.2", "13.4"), windows=("12.6", "13.0", "13.2"),
             pypi="13.0", cxx_std=20),
    # Newer than PyTorch's release lists (docs/COMPAT.md §1.1). PyPI 2.15.0 (2026-10-28):
    # Requires-Python >=3.11, cp311-cp315, and its Linux x86_64 and aarch64 wheels are the
    # CUDA 13.2 build (version.py: cuda = '13.2').
    # The other variants live on PyTorch's own index, which cannot be read from here: only
    # the confirmed 13.2 Linux variant is listed until they are.
    _release("2.15", ("3.11", "3.15"), ("13.2",), aarch64=("13.2",), windows=(), pypi="13.2",
             cxx_std=20, note="only the PyPI CUDA variant (13.2, Linux) is confirmed"),
)
# fmt: on

_BY_TORCH: Dict[str, TorchRelease] = {r.torch: r for r in RELEASES}

# Default SASS targets per CUDA variant and platform, newest last; the newest also gets
# PTX. PyTorch's own lists (docs/COMPAT.md §5.1), from sm_75 up like upstream causal-conv1d
# and mamba (Pascal and Volta dropped; nvcc 13 has nothing below sm_75, docs/COMPAT.md §5.2):
# older GPUs run the PyTorch path. aarch64 drops 7.5 and 8.6 (PyTorch's aarch64 filter)
# and CUDA 13 adds 11.0 there. 13.2 and 13.4 are not in the lists read: they keep 13.0's.
_X86_12 = ("7.5", "8.0", "8.6", "9.0")
_X86_128 = ("7.5", "8.0", "8.6", "9.0", "10.0", "12.0")
_ARCHS_X86: Dict[str, Tuple[str, ...]] = {
    "11.8": _X86_12,
    "12.1": _X86_12,
    "12.4": _X86_12,
    "12.6": _X86_12,
    "12.8": _X86_128,
    "12.9": _X86_128,
    "13.0": _X86_128,
    "13.2": _X86_128,
    "13.4": _X86_128,
}
_ARCHS_AARCH64: Dict[str, Tuple[str, ...]] = {
    "12.6": ("8.0", "9.0"),
    "12.8": ("8.0", "9.0", "10.0", "12.0"),
    "12.9": ("8.0", "9.0", "10.0", "12.0"),
    "13.0": ("8.0", "9.0", "10.0", "11.0", "12.0"),
    "13.2": ("8.0", "9.0", "10.0", "11.0", "12.0"),
    "13.4": ("8.0", "9.0", "10.0", "11.0", "12.0"),
}


def torch_release(torch: str) -> TorchRelease:
    """The release line for a torch version ("2.6" or "2.6.0+cu126")."""
    from . import variant  # not at import time: variant imports this module

    try:
        return _BY_TORCH[variant.minor(torch)]
    except (KeyError, ValueError):
        raise ValueError(
            f"torch must be one of the supported releases {', '.join(_BY_TORCH)}, got {torch!r}"
        ) from None


def cuda_major_minor(cuda: str) -> str:
    parts = cuda.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise ValueError(f"cuda must look like '12.6', got {cuda!r}")
    return f"{int(parts[0])}.{int(parts[1])}"


def default_archs(cuda: str, platform: str) -> Tuple[str, ...]:
    """Default SASS targets (e.g. ("8.0", "9.0")) for a CUDA version and platform; PTX goes
    with the last one. CUDA versions newer than the table get the newest list of the same
    major; older or unknown ones are an error."""
    if platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {', '.join(PLATFORMS)}, got {platform!r}")
    mm = cuda_major_minor(cuda)
    table = _ARCHS_AARCH64 if platform == "linux_aarch64" else _ARCHS_X86
    if mm in table:
        return table[mm]
    same_major = [v for v in table if v.split(".")[0] == mm.split(".")[0] and _vkey(v) < _vkey(mm)]
    if same_major:
        return table[max(same_major, key=_vkey)]
    raise ValueError(
        f"no default architecture list for CUDA {mm} on {platform}: known CUDA versions are "
        f"{', '.join(table)}; set TORCH_CUDA_ARCH_LIST"
    )


@dataclass(frozen=True)
class Cell:
    """One wheel of the build matrix."""

    torch: str  # "2.14"
    cuda: str  # "13.0"
    python: str  # "3.11"
    platform: str  # one of PLATFORMS
    cxx11_abi: Optional[bool]  # None on Windows
    manylinux: Optional[str]  # "manylinux_2_28" on Linux, None on Windows
    cxx_std: int

    @property
    def archs(self) -> Tuple[str, ...]:
        return default_archs(self.cuda, self.platform)


def _matches(value: str, wanted: Optional[str]) -> bool:
    return wanted is None or value == wanted


def cells(
    torch: Optional[str] = None,
    cuda: Optional[str] = None,
    python: Optional[str] = None,
    platform: Optional[str] = None,
    cxx11_abi: Optional[bool] = None,
) -> List[Cell]:
    """Every build cell, oldest torch first, optionally filtered (exact matches)."""
    if platform is not None and platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {', '.join(PLATFORMS)}, got {platform!r}")
    if torch is not None:
        torch_release(torch)  # a clear error for an unknown release
    return list(_iter_cells(torch, cuda, python, platform, cxx11_abi))


def _iter_cells(
    torch: Optional[str],
    cuda: Optional[str],
    python: Optional[str],
    platform: Optional[str],
    cxx11_abi: Optional[bool],
) -> Iterator[Cell]:
    for rel in RELEASES:
        if not _matches(rel.torch, torch):
            continue
        for plat in PLATFORMS:
            if not _matches(plat, platform):
                continue
            for cu in rel.cuda[plat]:
                if not _matches(cu, cuda):
                    continue
                abi = rel.cxx11_abi(cu, plat)
                if cxx11_abi is not None and abi is not cxx11_abi:
                    continue
                for py in rel.pythons_on(plat):
                    if _vkey(py) < MIN_PYTHON or not _matches(py, python):
                        continue
                    ml = None if plat == "win_amd64" else rel.manylinux
                    yield Cell(rel.torch, cu, py, plat, abi, ml, rel.cxx_std)


# ----------------------------------------------------------------------------- toolchains


@dataclass(frozen=True)
class PypiToolkit:
    """A CUDA compiler assembled from NVIDIA's PyPI packages: exact component versions."""

    cuda: str  # "13.4"
    release: str  # the cuda-toolkit release whose pins these are, "13.4.3"
    components: Mapping[str, str]  # package -> exact version, in install order

    def requirements(self) -> List[str]:
        return [f"{pkg}=={v}" for pkg, v in self.components.items()]


# NVIDIA publishes, for each CUDA release, a ``cuda-toolkit`` metapackage on PyPI whose
# Requires-Dist pins every component to one build; these are those pins, restated, for the
# newest patch release of each minor (each version below was checked to have wheels for
# Linux x86_64, Linux aarch64 and Windows). The components are what a complete 13.x compiler
# needs: nvcc, nvvm, the crt headers, CCCL and the runtime. CCCL left the toolkit's numbering
# after 13.2: toolkit 13.4 pins CCCL 13.3.4.3.1, and PyPI has no CCCL 13.4.x at all. (PyPI's
# 11.8/12.x "nvcc" wheels hold only ptxas and libnvvm, so no 12.x compiler is listed.)
_PYPI_TOOLKIT_ORDER = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-cccl",
                       "nvidia-cuda-runtime")
_PYPI_TOOLKITS: Dict[str, Tuple[str, Tuple[str, str, str, str, str]]] = {
    # cuda: (cuda-toolkit release, (nvcc, nvvm, crt, cccl, runtime))
    "13.0": ("13.0.2", ("13.0.88", "13.0.88", "13.0.88", "13.0.85", "13.0.96")),
    "13.2": ("13.2.2", ("13.2.86", "13.2.86", "13.2.86", "13.2.86", "13.2.86")),
    "13.4": ("13.4.3", ("13.4.92", "13.4.92", "13.4.92", "13.3.4.3.1", "13.4.92")),
}
# cuobjdump only lists what a binary holds, so one build serves every 13.x cell; PyPI has it
# from 13.2 on. This is the one of cuda-toolkit 13.4.3.
PYPI_CUOBJDUMP = "nvidia-cuda-cuobjdump==13.4.92"


def pypi_toolkit(cuda: str) -> PypiToolkit:
    """The pinned PyPI components of CUDA ``cuda`` (major.minor)."""
    mm = cuda_major_minor(cuda)
    if mm not in _PYPI_TOOLKITS:
        raise ValueError(
            f"no PyPI CUDA toolkit is pinned for CUDA {mm}: known are {', '.join(_PYPI_TOOLKITS)}"
        )
    release, versions = _PYPI_TOOLKITS[mm]
    return PypiToolkit(mm, release, dict(zip(_PYPI_TOOLKIT_ORDER, versions)))


# The Windows runners (windows-2022) carry MSVC 19.4x (Visual Studio 2022 17.10 and later).
# nvcc before CUDA 12.4 accepts MSVC only up to 19.3x (its host_config.h stops with "unsupported
# Microsoft Visual Studio version"), and MSVC 19.4x's own STL refuses nvcc older than 12.4
# (error STL1002) unless _ALLOW_COMPILER_AND_STL_VERSION_MISMATCH is defined.
NVCC_FIRST_ACCEPTING_MSVC_19_4 = "12.4"


def nvcc_needs_msvc_override(cuda: str) -> bool:
    """True when nvcc of CUDA ``cuda`` must be told to accept the runners' MSVC 19.4x."""
    return _vkey(cuda_major_minor(cuda)) < _vkey(NVCC_FIRST_ACCEPTING_MSVC_19_4)
