"""Variant labels, wheel file names, and the rules for when a binary fits an environment.

The only place the label format is written and parsed, so every writer and reader of a
label agrees on it. No torch import.

Label: ``cu{XYZ}torch{M.m}``, e.g. ``cu130torch2.14``, ``cu118torch2.1``: CUDA major and
minor of the torch build (``torch.version.cuda``) and torch's major.minor. torch 2.6 is
the one release that shipped two C++ ABIs on Linux (docs/COMPAT.md §2), so its Linux labels
end in ``cxx11`` or ``precxx11``: ``cu126torch2.6cxx11``, ``cu124torch2.6precxx11``.
As a PEP 440 local version that is ``0.1.0+cu126torch2.6cxx11`` (segments
``cu126torch2`` and ``6cxx11``: letters and digits only, already in normal form, so
METADATA and the file name agree byte for byte).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence

from . import support

DIST_NAME = "mamba_kernels"  # the distribution name as it appears in wheel file names

_LABEL_RE = re.compile(r"^cu(?P<cu>\d{3,4})torch(?P<tmaj>\d+)\.(?P<tmin>\d+)(?P<abi>cxx11|precxx11)?$")
_WHEEL_RE = re.compile(
    r"^(?P<dist>[A-Za-z0-9_]+)-(?P<public>[0-9][0-9A-Za-z.]*)(?:\+(?P<local>[0-9A-Za-z.]+))?"
    r"-(?P<py>cp\d+)-(?P<abi>cp\d+)-(?P<plat>[A-Za-z0-9_.]+)\.whl$"
)
_ARCH_OF_PLATFORM = {"linux_x86_64": "x86_64", "linux_aarch64": "aarch64"}


@dataclass(frozen=True)
class Variant:
    """What a binary was built for: torch major.minor, CUDA major.minor, C++ ABI."""

    torch: str  # "2.14"
    cuda: str  # "13.0"
    cxx11_abi: Optional[bool] = None  # None: not recorded (Windows, or a label without marker)


def minor(version: str, what: str = "torch") -> str:
    """The release line "M.m" of a version ("2.14.1+cu130", "2.8.0a0+5228986c.nv25.06", "13.0")."""
    parts = version.split("+")[0].split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(f"{what} must look like 'M.m' or 'M.m.p', got {version!r}")
    return f"{int(parts[0])}.{int(parts[1])}"


def cuda_tag(cuda: str) -> str:
    """``13.0`` -> ``cu130``: the CUDA part of a label (and PyTorch's index folder for it)."""
    return _cuda_tag(cuda)


def _cuda_tag(cuda: str) -> str:
    major, mi = minor(cuda, "cuda").split(".")
    if int(mi) > 9:
        raise ValueError(f"cuda minor must be a single digit for the cu{{XYZ}} tag, got {cuda!r}")
    return f"cu{major}{mi}"


def needs_abi_marker(torch: str) -> bool:
    """True for torch releases that shipped both C++ ABIs on Linux (only 2.6)."""
    try:
        return support.torch_release(minor(torch, "torch")).has_two_abis
    except ValueError:
        return False


def label(torch: str, cuda: str, cxx11_abi: Optional[bool] = None) -> str:
    """The local version label for a build against ``torch`` (any M.m[.p][+x]) and ``cuda``.

    ``cxx11_abi`` is required for (and only written for) releases with two ABIs, on Linux.
    """
    mm = minor(torch, "torch")
    text = f"{_cuda_tag(cuda)}torch{mm}"
    if needs_abi_marker(mm) and cxx11_abi is not None:
        text += "cxx11" if cxx11_abi else "precxx11"
    return text


def parse_label(text: str) -> Variant:
    """Inverse of :func:`label`; accepts the label with or without a leading '+'."""
    m = _LABEL_RE.match(text[1:] if text.startswith("+") else text)
    if not m:
        raise ValueError(f"label must look like 'cu130torch2.14' (or 'cu126torch2.6cxx11'), got {text!r}")
    cu = m.group("cu")
    abi = m.group("abi")
    return Variant(
        torch=f"{int(m.group('tmaj'))}.{int(m.group('tmin'))}",
        cuda=f"{int(cu[:-1])}.{int(cu[-1])}",
        cxx11_abi=None if abi is None else abi == "cxx11",
    )


def release_version(version: str, torch: str, cuda: str, cxx11_abi: Optional[bool] = None) -> str:
    """The version a release wheel carries in METADATA and its file name."""
    if "+" in version:
        raise ValueError(f"version must be a public version without a local label, got {version!r}")
    return f"{version}+{label(torch, cuda, cxx11_abi)}"


def torch_requirement(torch: str) -> str:
    """The torch pin of a release wheel: ``torch==M.m.*``."""
    return f"torch=={minor(torch, 'torch')}.*"


def platform_tag(cell: support.Cell) -> str:
    """The wheel platform tag after repair: auditwheel ``--plat manylinux_2_xx_<arch>
    --only-plat`` (which adds the legacy ``manylinux2014`` alias to 2_17), or ``win_amd64``."""
    if cell.platform == "win_amd64":
        return "win_amd64"
    arch = _ARCH_OF_PLATFORM[cell.platform]
    tag = f"{cell.manylinux}_{arch}"
    if cell.manylinux == "manylinux_2_17":
        tag += f".manylinux2014_{arch}"
    return tag


def python_tag(python: str) -> str:
    return "cp" + minor(python, "python").replace(".", "")


def wheel_name(version: str, cell: support.Cell) -> str:
    """The exact file name of the repaired release wheel CI produces for ``cell``."""
    full = release_version(version, cell.torch, cell.cuda, cell.cxx11_abi)
    py = python_tag(cell.python)
    return f"{DIST_NAME}-{full}-{py}-{py}-{platform_tag(cell)}.whl"


@dataclass(frozen=True)
class WheelInfo:
    """What a wheel file name says."""

    dist: str
    version: str  # public version, "0.1.0"
    variant: Optional[Variant]  # None for an unlabelled wheel
    python: str  # "3.11"
    platform_tag: str  # as in the file name
    platform: Optional[str]  # one of support.PLATFORMS, or None for a tag we do not build


def _platform_of_tag(tag: str) -> Optional[str]:
    if tag == "win_amd64":
        return "win_amd64"
    for plat, arch in _ARCH_OF_PLATFORM.items():
        if all(t.endswith("_" + arch) and t.startswith(("manylinux", "linux")) for t in tag.split(".")):
            return plat
    return None


def parse_wheel_name(filename: str) -> WheelInfo:
    """Parse a wheel file name of this project (labelled or not)."""
    m = _WHEEL_RE.match(filename)
    if not m or m.group("py") != m.group("abi"):
        raise ValueError(
            f"filename must look like '{DIST_NAME}-0.1.0+cu130torch2.14-cp311-cp311-"
            f"manylinux_2_28_x86_64.whl', got {filename!r}"
        )
    local = m.group("local")
    digits = m.group("py")[2:]
    return WheelInfo(
        dist=m.group("dist"),
        version=m.group("public"),
        variant=None if local is None else parse_label(local),
        python=f"{digits[0]}.{digits[1:]}",
        platform_tag=m.group("plat"),
        platform=_platform_of_tag(m.group("plat")),
    )


def mismatches(
    built: Variant, torch_version: str, torch_cuda: Optional[str], torch_cxx11_abi: Optional[bool]
) -> List[str]:
    """Why a binary built for ``built`` cannot run with the given torch; empty when it can.

    Rules (why each holds: docs/COMPAT.md §9): torch major.minor equal; CUDA major equal and
    the binary's CUDA minor not above torch's; C++ ABI equal (where both are known).
    """
    problems: List[str] = []
    running_mm = minor(torch_version, "torch_version")
    if built.torch != running_mm:
        problems.append(f"torch {built.torch} != running torch {running_mm}")
    if torch_cuda is None:
        problems.append(f"it needs a CUDA {built.cuda} build of torch, the running torch has no CUDA")
    else:
        b_major, b_minor = (int(x) for x in built.cuda.split("."))
        r_major, r_minor = (int(x) for x in minor(torch_cuda, "torch_cuda").split("."))
        if b_major != r_major:
            problems.append(f"CUDA {built.cuda} has another major version than torch's CUDA {torch_cuda}")
        elif b_minor > r_minor:
            problems.append(f"CUDA {built.cuda} is newer than torch's CUDA {torch_cuda}")
    if built.cxx11_abi is not None and torch_cxx11_abi is not None and built.cxx11_abi != torch_cxx11_abi:
        problems.append(
            f"C++ ABI {abi_name(built.cxx11_abi)} != running torch's {abi_name(torch_cxx11_abi)}"
        )
    return problems


# The names of the two C++ ABIs, as labels and command lines write them.
ABI_NAMES = {"cxx11": True, "pre-cxx11": False}


def abi_name(cxx11_abi: Optional[bool]) -> str:
    if cxx11_abi is None:
        return "n/a"
    return next(name for name, value in ABI_NAMES.items() if value == bool(cxx11_abi))


def arch_runs(sass: Sequence[str], ptx: Sequence[str], capability: str) -> bool:
    """Whether a GPU of compute ``capability`` ("9.0") can run a binary with these SASS
    targets ("sm_90", "sm_90a") and PTX ("compute_90"): an exact SASS match of the plain
    target, a SASS of the same major and not higher minor (binary compatibility within a
    major), or PTX for an architecture not above the GPU's (JIT)."""
    cap = _cc(capability)
    for s in sass:
        if s.endswith(("a", "f")):
            # Arch-specific (sm_90a) runs only on that exact GPU; family (sm_100f) on its major.
            c = _cc(s[3:-1])
            if (s.endswith("a") and c == cap) or (s.endswith("f") and c[0] == cap[0] and c[1] <= cap[1]):
                return True
            continue
        c = _cc(s[3:])
        if c[0] == cap[0] and c[1] <= cap[1]:
            return True
    return any(_cc(p.rstrip("af")[8:]) <= cap for p in ptx)


def _cc(text: str) -> tuple:
    text = text.replace(".", "")
    if not text.isdigit() or len(text) < 2:
        raise ValueError(f"compute capability must look like '9.0' or '90', got {text!r}")
    return (int(text[:-1]), int(text[-1]))
