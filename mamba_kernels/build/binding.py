"""Which torch binding a build compiles (docs/STABLE_ABI.md): ``classic`` (torch's C++ API, tied
to the build torch's minor) or ``stable`` (PyTorch's stable ABI, one cp310-abi3 binary for every
torch from the target on), and the defines that make a compile the stable one."""

from __future__ import annotations

from typing import List

from ..facts import support, variant, versions
from ..facts.variant import CLASSIC, STABLE
from ..runtime import knobs

# The torch release a stable-ABI build targets: the binary runs on it and every later torch.
STABLE_TARGET = support.STABLE_ABI_MIN_TORCH


def choose_binding(knob: str, torch_version: str) -> str:
    """The binding to compile: ``stable`` (PyTorch's stable ABI, one binary for every torch from
    STABLE_TARGET on) or ``classic`` (the C++ API, tied to the build torch's minor). ``auto``
    takes stable whenever the build torch has the target's stable API; forcing stable with an
    older torch is a ValueError (its headers lack that API)."""
    has_stable = versions.minor_key(torch_version) >= versions.minor_key(STABLE_TARGET)
    if knob == CLASSIC or (knob == "auto" and not has_stable):
        return CLASSIC
    if not has_stable:
        raise ValueError(
            f"{knobs.BINDING_VAR}=stable needs torch >= {STABLE_TARGET} to build against (the first release "
            f"whose stable ABI covers these kernels), the build torch is {torch_version}: install a newer "
            f"torch or set {knobs.BINDING_VAR}=classic"
        )
    return STABLE


def target_version_macro(target: str) -> str:
    """TORCH_TARGET_VERSION for torch ``target`` ("2.10" -> 0x020a000000000000): major in the top
    byte, minor in the next, patch and ABI tag zero (torch/csrc/stable/version.h's encoding)."""
    major, minor_ = versions.minor_key(target)
    return f"0x{major:02x}{minor_:02x}000000000000"


def limited_api_macro(python: str) -> str:
    """Py_LIMITED_API for the oldest CPython ``python`` an abi3 module serves ("3.10" ->
    0x030A0000): PY_VERSION_HEX's layout, major and minor in the top two bytes, the rest zero."""
    major, minor_ = versions.minor_key(python, "Python")
    return f"0x{major:02X}{minor_:02X}0000"


# The stable wheel's abi3 floor (tagged cp310-abi3, support.STABLE_ABI_PYTHON) as the define that
# makes Python.h show only the limited API of that CPython.
LIMITED_API = limited_api_macro(support.STABLE_ABI_PYTHON)


def binding_defines(binding: str) -> List[str]:
    """Defines of a binding's compile (cxx and nvcc alike, every translation unit). Stable: the
    target version, so every stable API newer than STABLE_TARGET is compiled out (and the
    non-stable torch headers refuse to compile); USE_CUDA, under which the stable shim declares
    its CUDA entry points (the current stream); and Py_LIMITED_API at the wheel's abi3 floor, so
    whatever includes Python.h (the module object, the error hook) sees only the limited API
    the cp310-abi3 tag promises (docs/COMPAT.md §11). torch >= 2.7 adds the same define to a
    ``py_limited_api`` extension itself; ours does not depend on that (setup_kwargs makes
    torch's value ours)."""
    if binding != STABLE:
        return []
    return [f"-DTORCH_TARGET_VERSION={target_version_macro(STABLE_TARGET)}", "-DUSE_CUDA",
            f"-DPy_LIMITED_API={LIMITED_API}"]


def binding_text(binding: str) -> str:
    if binding == STABLE:
        tag = variant.python_tag(support.STABLE_ABI_PYTHON)
        return f"stable-ABI binding for torch >= {STABLE_TARGET} ({tag}-abi3 module)"
    return "classic binding for this torch minor"
