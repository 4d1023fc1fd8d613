"""The runtime guard: read a compiled extension's build metadata and compare it with the
running torch before dispatch trusts the binary: the metadata travels inside the binary, so
a wheel paired with the wrong torch is refused with a reason instead of failing at a symbol
(the rules: docs/COMPAT.md §9).

Each extension exposes ``BUILD_INFO``: the JSON string mamba_kernels/build.py compiled in.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Dict, List, Optional, Tuple

from . import variant
from .version import __version__


@dataclass(frozen=True)
class BuildInfo:
    torch_version: str
    torch_cuda: str
    nvcc_version: str
    cxx11_abi: Optional[bool]
    package_version: str
    sass: Tuple[str, ...]
    ptx: Tuple[str, ...]
    raw: Dict[str, Any]

    @property
    def variant(self) -> variant.Variant:
        return variant.Variant(
            variant.minor(self.torch_version), self.torch_cuda, self.cxx11_abi
        )

    def describe(self) -> str:
        return (
            f"torch {self.torch_version}, CUDA {self.torch_cuda} (nvcc {self.nvcc_version}), "
            f"{variant.abi_name(self.cxx11_abi)} ABI, {' '.join(self.sass + self.ptx)}"
        )


def parse(text: str) -> BuildInfo:
    """Parse a BUILD_INFO string; ValueError naming what is wrong."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as e:
        raise ValueError(f"BUILD_INFO is not JSON ({e}): {str(text)[:120]!r}") from None
    if not isinstance(data, dict):
        raise ValueError(f"BUILD_INFO must be a JSON object, got {type(data).__name__}")
    missing = [k for k in ("torch_version", "torch_cuda", "nvcc_version", "cxx11_abi") if k not in data]
    if missing:
        raise ValueError(f"BUILD_INFO lacks {', '.join(missing)}")
    abi = data["cxx11_abi"]
    if abi is not None and not isinstance(abi, bool):
        raise ValueError(f"BUILD_INFO cxx11_abi must be true, false or null, got {abi!r}")
    return BuildInfo(
        torch_version=str(data["torch_version"]),
        torch_cuda=str(data["torch_cuda"]),
        nvcc_version=str(data["nvcc_version"]),
        cxx11_abi=abi,
        package_version=str(data.get("package_version", "unknown")),
        sass=tuple(data.get("sass", ())),
        ptx=tuple(data.get("ptx", ())),
        raw=data,
    )


# A NUL-terminated string in a binary that holds a JSON object: candidates for BUILD_INFO.
_C_OBJECT = re.compile(rb"\{[^\x00]{0,8192}?\}(?=\x00)")


def find_in_binary(data: bytes) -> Optional[BuildInfo]:
    """BUILD_INFO read from a compiled extension's bytes, without loading it (a wheel's .so or
    .pyd for another platform): the first embedded JSON object that parses as BUILD_INFO."""
    for m in _C_OBJECT.finditer(data):
        try:
            info = parse(m.group(0).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            continue
        if "format" in info.raw:
            return info
    return None


def fix_command(
    torch_version: str, torch_cuda: Optional[str], cxx11_abi: Optional[bool], version: str
) -> str:
    """The commands that get a binary matching the running torch."""
    rebuild = (
        "MAMBA_KERNELS_FORCE_BUILD=1 pip install --no-build-isolation --no-deps --force-reinstall "
        "mamba-kernels"
    )
    if not torch_cuda:
        return f"install a CUDA build of torch, then rebuild: {rebuild}"
    public = version.split("+")[0]
    try:
        wanted = variant.release_version(public, torch_version, torch_cuda, cxx11_abi)
    except ValueError:
        return f"rebuild against the running torch: {rebuild}"
    return (
        f"pip install --no-deps --force-reinstall 'mamba-kernels=={wanted}' (from the mamba-kernels "
        f"wheel index for cu{torch_cuda.replace('.', '')}), or rebuild against the running torch: {rebuild}"
    )


def problems(
    info: BuildInfo, torch_version: str, torch_cuda: Optional[str], cxx11_abi: Optional[bool]
) -> List[str]:
    """Why a binary with ``info`` cannot run under the given torch (empty: it can)."""
    found = variant.mismatches(info.variant, torch_version, torch_cuda, cxx11_abi)
    if torch_cuda and info.nvcc_version.split(".")[0] != torch_cuda.split(".")[0]:
        found.append(
            f"it was compiled by nvcc {info.nvcc_version}, another CUDA major than torch's {torch_cuda}"
        )
    return found


def check_text(
    name: str, text: Optional[str], torch_version: str, torch_cuda: Optional[str], cxx11_abi: Optional[bool]
) -> Optional[str]:
    """None when the extension ``name`` with BUILD_INFO ``text`` fits the running torch, else
    one message: what it was built for, what is running, and the fix."""
    running = f"torch {torch_version}, CUDA {torch_cuda or 'none'}, {variant.abi_name(cxx11_abi)} ABI"
    if text is None:
        return (
            f"{name} carries no build metadata (BUILD_INFO), so it cannot be checked against the "
            f"running {running}. Fix: {fix_command(torch_version, torch_cuda, cxx11_abi, __version__)}"
        )
    try:
        info = parse(text)
    except ValueError as e:
        return f"{name} has unreadable build metadata: {e}. Fix: " + fix_command(
            torch_version, torch_cuda, cxx11_abi, __version__
        )
    found = problems(info, torch_version, torch_cuda, cxx11_abi)
    if not found:
        return None
    fix = fix_command(torch_version, torch_cuda, cxx11_abi, info.package_version)
    return (
        f"{name} was built for {info.describe()}, but the running environment has {running} "
        f"({'; '.join(found)}). Fix: {fix}"
    )


def check_module(module: ModuleType) -> Optional[str]:
    """The dispatch hook: compare an imported extension's BUILD_INFO with the running torch."""
    import torch

    text = getattr(module, "BUILD_INFO", None)
    abi = None if sys.platform == "win32" else bool(torch._C._GLIBCXX_USE_CXX11_ABI)  # no ABI flag on MSVC
    return check_text(
        module.__name__, text if isinstance(text, str) else None, torch.__version__, torch.version.cuda, abi
    )


def matching_build_info() -> str:
    """A BUILD_INFO string that fits the running torch (what a fresh local build records);
    for tests and diagnostics that need a known-good reference."""
    import torch

    abi = None if sys.platform == "win32" else bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    cuda = torch.version.cuda or "none"
    return json.dumps(
        {
            "format": 1,
            "package_version": __version__,
            "torch_version": torch.__version__,
            "torch_cuda": cuda,
            "nvcc_version": cuda,
            "cxx11_abi": abi,
            "sass": [],
            "ptx": [],
        }
    )
