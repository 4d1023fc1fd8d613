"""Variant labels, wheel file names, and the rules for when a binary fits an environment.

The only place the label grammar is written and parsed, so every writer and reader of a
label agrees on it. No torch import. The grammar (restated in docs/INDEX.md):

    label   := classic | stable
    classic := "cu" CUDA "torch" M "." m [ "cxx11" | "precxx11" ]
    stable  := "cu" CUDA "stable" M "." m
    CUDA    := the CUDA major followed by its one-digit minor ("118", "126", "130")

Classic (per-minor binding): ``cu130torch2.14``, ``cu118torch2.1``: CUDA major and minor of
the torch build (``torch.version.cuda``) and torch's major.minor. torch 2.6 is the one
release that shipped two C++ ABIs on Linux (docs/COMPAT.md §2), so its Linux labels end in
``cxx11`` or ``precxx11``: ``cu126torch2.6cxx11``, ``cu124torch2.6precxx11``.

Stable (PyTorch's stable ABI): ``cu130stable2.10`` reads "stable ABI from torch 2.10,
CUDA 13.0": the binary runs on every torch >= 2.10 built for CUDA 13.x with a minor >= 0
(docs/COMPAT.md §11). It carries no C++ ABI marker: the stable ABI is C, so libstdc++'s ABI
does not cross it. Its wheel is tagged ``cp310-abi3`` (any CPython >= 3.10 that is not
free-threaded).

As a PEP 440 local version a label is letters, digits and dots only, already in normal form
(``0.1.0+cu126torch2.6cxx11``: segments ``cu126torch2`` and ``6cxx11``;
``0.1.0+cu130stable2.10``: ``cu130stable2`` and ``10``), so METADATA and the file name agree
byte for byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from . import support, versions
from .archs import Arch

# The two bindings a wheel is built with (docs/STABLE_ABI.md): PyTorch's C++ API, tied to one
# torch minor, or its stable ABI, one binary for every torch from the target on.
CLASSIC = "classic"
STABLE = "stable"
BINDINGS = (CLASSIC, STABLE)  # indexed by Cell.stable
PROJECT = "mamba-kernels"  # the distribution's name, PEP 503 normalised
DIST_NAME = "mamba_kernels"  # the distribution name as it appears in wheel file names

_LABEL_RE = re.compile(
    r"^cu(?P<cu>\d{3,4})(?P<kind>torch|stable)(?P<tmaj>\d+)\.(?P<tmin>\d+)(?P<abi>cxx11|precxx11)?$"
)
_WHEEL_RE = re.compile(
    r"^(?P<dist>[A-Za-z0-9_]+)-(?P<public>[0-9][0-9A-Za-z.]*)(?:\+(?P<local>[0-9A-Za-z.]+))?"
    r"-(?P<py>cp\d+)-(?P<abi>cp\d+|abi3)-(?P<plat>[A-Za-z0-9_.]+)\.whl$"
)
_LABEL_FORMS = "'cu130torch2.14', 'cu126torch2.6cxx11' or 'cu130stable2.10'"
# The Python of every stable wheel: abi3 from this CPython on (docs/COMPAT.md §11).
STABLE_PYTHON = support.STABLE_ABI_PYTHON


@dataclass(frozen=True)
class Variant:
    """What a binary was built for: torch major.minor, CUDA major.minor, C++ ABI."""

    torch: str  # "2.14"; for a stable binary the oldest torch it runs on (its target), "2.10"
    cuda: str  # "13.0"
    cxx11_abi: Optional[bool] = None  # None: not recorded (Windows, stable, or a label without marker)
    stable: bool = False  # built on PyTorch's stable ABI: runs on every torch >= ``torch``

    def describe(self) -> str:
        """The label in words: "stable ABI from torch 2.10, CUDA 13.0" / "torch 2.14, CUDA 13.0"."""
        if self.stable:
            return f"stable ABI from torch {self.torch}, CUDA {self.cuda}"
        text = f"torch {self.torch}, CUDA {self.cuda}"
        if self.cxx11_abi is not None:
            text += f", C++ ABI {abi_name(self.cxx11_abi)}"
        return text


def check_torch_version(version: str, what: str = "--torch") -> str:
    """``version`` stripped, when it is a torch version as ``torch.__version__`` writes it: a
    PEP 440 version (packaging's parser) of at least major.minor, whose local label, when it
    names a CUDA (``+cu130``), has two or three digits; else a ValueError naming ``what``."""
    text = version.strip()
    versions.minor(text, what)
    version_class = _version_class()
    if version_class is not None:
        try:
            parsed = version_class[0](text)
        except version_class[1]:
            raise ValueError(f"{what} must be a version such as 2.14.1 or 2.14.1+cu130, got {version!r}"
                             ) from None
        local = parsed.local or ""
        head = local.split(".")[0]
        if head.startswith("cu") and head[2:].isdigit() and len(head) not in (4, 5):
            raise ValueError(f"{what}'s CUDA label must be cu plus 2 or 3 digits (cu118, cu130), got "
                             f"{version!r}")
    elif not re.fullmatch(r"[0-9A-Za-z.+_-]+", text):
        raise ValueError(f"{what} must be a version such as 2.14.1 or 2.14.1+cu130, got {version!r}")
    return text


def _version_class() -> Optional[Tuple[Any, Any]]:
    """packaging's (Version, InvalidVersion), or pip's copy of them; None without either."""
    try:
        # optional: packaging, else pip's copy, else no PEP 440 check
        from packaging.version import InvalidVersion, Version
    except ImportError:
        try:
            from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore[no-redef]
        except ImportError:
            return None
    return Version, InvalidVersion


def cuda_tag(cuda: str) -> str:
    """``13.0`` -> ``cu130``: the CUDA part of a label (and PyTorch's index folder for it)."""
    return _cuda_tag(cuda)


def _cuda_tag(cuda: str) -> str:
    major, mi = versions.minor(cuda, "cuda").split(".")
    if int(mi) > 9:
        raise ValueError(f"cuda minor must be a single digit for the cu{{XYZ}} tag, got {cuda!r}")
    return f"cu{major}{mi}"


def needs_abi_marker(torch: str) -> bool:
    """True for torch releases that shipped both C++ ABIs on Linux (only 2.6)."""
    try:
        return support.torch_release(versions.minor(torch, "torch")).has_two_abis
    except ValueError:
        return False


def label(torch: str, cuda: str, cxx11_abi: Optional[bool] = None) -> str:
    """The local version label for a build against ``torch`` (any M.m[.p][+x]) and ``cuda``.

    ``cxx11_abi`` is required for (and only written for) releases with two ABIs, on Linux.
    """
    mm = versions.minor(torch, "torch")
    text = f"{_cuda_tag(cuda)}torch{mm}"
    if needs_abi_marker(mm) and cxx11_abi is not None:
        text += "cxx11" if cxx11_abi else "precxx11"
    return text


def stable_label(cuda: str, target_torch: str) -> str:
    """The label of a stable-ABI build: ``stable_label("13.0", "2.10") == "cu130stable2.10"``.

    ``target_torch`` is the oldest torch the binary runs on (the ``TORCH_TARGET_VERSION`` it
    was compiled with; any M.m[.p][+x]); it must not be older than the stable ABI's first
    usable release (docs/COMPAT.md §11).
    """
    mm = versions.minor(target_torch, "target_torch")
    if versions.key(mm) < versions.key(support.STABLE_ABI_MIN_TORCH):
        raise ValueError(
            f"target_torch must be at least {support.STABLE_ABI_MIN_TORCH} for a stable-ABI build "
            f"(the first release whose stable ABI covers these kernels), got {target_torch!r}"
        )
    return f"{_cuda_tag(cuda)}stable{mm}"


def variant_label(built: Variant) -> str:
    """The label of a :class:`Variant` (inverse of :func:`parse_label`)."""
    if built.stable:
        return stable_label(built.cuda, built.torch)
    return label(built.torch, built.cuda, built.cxx11_abi)


def parse_label(text: str) -> Variant:
    """Inverse of :func:`label` and :func:`stable_label`; accepts a leading '+'."""
    m = _LABEL_RE.match(text[1:] if text.startswith("+") else text)
    if not m:
        raise ValueError(f"label must look like {_LABEL_FORMS}, got {text!r}")
    cu = m.group("cu")
    abi = m.group("abi")
    stable = m.group("kind") == "stable"
    if stable and abi is not None:
        raise ValueError(
            f"label must look like {_LABEL_FORMS}: a stable label has no C++ ABI marker, got {text!r}"
        )
    torch = f"{int(m.group('tmaj'))}.{int(m.group('tmin'))}"
    if stable and versions.key(torch) < versions.key(support.STABLE_ABI_MIN_TORCH):
        raise ValueError(
            f"label {text!r}: a stable label's target_torch must be at least "
            f"{support.STABLE_ABI_MIN_TORCH} (the first release whose stable ABI covers these kernels)"
        )
    return Variant(
        torch=torch,
        cuda=f"{int(cu[:-1])}.{int(cu[-1])}",
        cxx11_abi=None if abi is None else abi == "cxx11",
        stable=stable,
    )


def describe_label(text: str) -> str:
    """A label in words (``cu130stable2.10`` -> "stable ABI from torch 2.10, CUDA 13.0")."""
    return parse_label(text).describe()


def release_version(version: str, torch: str, cuda: str, cxx11_abi: Optional[bool] = None) -> str:
    """The version a release wheel carries in METADATA and its file name."""
    if "+" in version:
        raise ValueError(f"version must be a public version without a local label, got {version!r}")
    return f"{version}+{label(torch, cuda, cxx11_abi)}"


def torch_requirement(torch: str) -> str:
    """The torch pin of a classic release wheel: ``torch==M.m.*``."""
    return f"torch=={versions.minor(torch, 'torch')}.*"


def stable_release_version(version: str, cuda: str, target_torch: str) -> str:
    """The version a stable release wheel carries: ``0.1.0+cu130stable2.10``."""
    if "+" in version:
        raise ValueError(f"version must be a public version without a local label, got {version!r}")
    return f"{version}+{stable_label(cuda, target_torch)}"


def stable_torch_requirement(target_torch: str) -> str:
    """The torch requirement of a stable release wheel: ``torch>=M.m`` (its target)."""
    return f"torch>={versions.minor(target_torch, 'target_torch')}"


def platform_tag(cell: support.Cell) -> str:
    """The wheel platform tag after repair: auditwheel ``--plat manylinux_2_xx_<arch>
    --only-plat`` (which adds the legacy ``manylinux2014`` alias to 2_17) on a manylinux
    platform, else the platform's name (``win_amd64``)."""
    record = support.PLATFORM_BY_NAME[cell.platform]
    if not record.manylinux:
        return record.name
    arch = record.tag_arch
    tag = f"{cell.manylinux}_{arch}"
    if cell.manylinux == "manylinux_2_17":
        tag += f".manylinux2014_{arch}"
    return tag


def python_tag(python: str) -> str:
    return "cp" + versions.minor(python, "python").replace(".", "")


def cell_label(cell: support.Cell) -> str:
    """The label of a cell's wheel (stable or classic)."""
    if cell.stable:
        return stable_label(cell.cuda, cell.torch)
    return label(cell.torch, cell.cuda, cell.cxx11_abi)


def cell_release_version(version: str, cell: support.Cell) -> str:
    """The version a cell's release wheel carries in METADATA and its file name."""
    if cell.stable:
        return stable_release_version(version, cell.cuda, cell.torch)
    return release_version(version, cell.torch, cell.cuda, cell.cxx11_abi)


def cell_torch_requirement(cell: support.Cell) -> str:
    """The torch requirement of a cell's release wheel: ``torch>=2.10`` (stable) or ``torch==M.m.*``."""
    return stable_torch_requirement(cell.torch) if cell.stable else torch_requirement(cell.torch)


def wheel_tags(cell: support.Cell) -> str:
    """The interpreter and ABI tags of a cell's wheel: ``cp311-cp311``, or ``cp310-abi3`` (stable)."""
    py = python_tag(cell.python)
    return f"{py}-abi3" if cell.stable else f"{py}-{py}"


def wheel_name(version: str, cell: support.Cell) -> str:
    """The exact file name of the repaired release wheel CI produces for ``cell``."""
    full = cell_release_version(version, cell)
    return f"{DIST_NAME}-{full}-{wheel_tags(cell)}-{platform_tag(cell)}.whl"


@dataclass(frozen=True)
class WheelInfo:
    """What a wheel file name says."""

    dist: str
    version: str  # public version, "0.1.0"
    variant: Optional[Variant]  # None for an unlabelled wheel
    python: str  # "3.11"; for an abi3 wheel the oldest CPython it installs on
    platform_tag: str  # as in the file name
    platform: Optional[str]  # one of support.PLATFORMS, or None for a tag we do not build
    abi3: bool = False  # tagged cpXY-abi3: any CPython >= python that is not free-threaded


def platform_of_tag(tag: str) -> Optional[str]:
    """Our platform name for a wheel platform tag (``manylinux_2_28_aarch64``, compressed tag sets
    such as ``manylinux_2_17_x86_64.manylinux2014_x86_64`` included); None for any other."""
    for p in support.PLATFORM_RECORDS:
        if tag == p.name:
            return p.name
        if p.manylinux and all(t.endswith("_" + p.tag_arch) and t.startswith(("manylinux", "linux"))
                               for t in tag.split(".")):
            return p.name
    return None


def parse_wheel_name(filename: str) -> WheelInfo:
    """Parse a wheel file name of this project (labelled or not)."""
    m = _WHEEL_RE.match(filename)
    abi3 = bool(m) and m.group("abi") == "abi3"
    if not m or (m.group("py") != m.group("abi") and not abi3):
        raise ValueError(
            f"filename must look like '{DIST_NAME}-0.1.0+cu130torch2.14-cp311-cp311-"
            f"manylinux_2_28_x86_64.whl' or '{DIST_NAME}-0.1.0+cu130stable2.10-cp310-abi3-"
            f"manylinux_2_28_x86_64.whl', got {filename!r}"
        )
    local = m.group("local")
    built = None if local is None else parse_label(local)
    if built is not None and built.stable != abi3:
        raise ValueError(
            f"filename must pair a stable label with the cpXY-abi3 tags and a classic label with "
            f"cpXY-cpXY, got {filename!r}"
        )
    digits = m.group("py")[2:]
    return WheelInfo(
        dist=m.group("dist"),
        version=m.group("public"),
        variant=built,
        python=f"{digits[0]}.{digits[1:]}",
        platform_tag=m.group("plat"),
        platform=platform_of_tag(m.group("plat")),
        abi3=abi3,
    )


def mismatches(
    built: Variant, torch_version: str, torch_cuda: Optional[str], torch_cxx11_abi: Optional[bool],
    who: str = "running torch",
) -> List[str]:
    """Why a binary built for ``built`` cannot run with the given torch; empty when it can.

    Rules (why each holds: docs/COMPAT.md §9, §11): torch major.minor equal (stable: torch at
    least the target); CUDA major equal and the binary's CUDA minor not above torch's; C++ ABI
    equal where both are known (never for stable: its ABI is C).
    """
    problems: List[str] = []
    running_mm = versions.minor(torch_version, "torch_version")
    if built.stable:
        if versions.key(running_mm) < versions.key(built.torch):
            problems.append(
                f"it needs torch >= {built.torch} (stable ABI), the {who} is {running_mm}"
            )
    elif built.torch != running_mm:
        problems.append(f"torch {built.torch} != {who} {running_mm}")
    if torch_cuda is None:
        problems.append(f"it needs a CUDA {built.cuda} build of torch, the {who} has no CUDA")
    else:
        b_major, b_minor = (int(x) for x in built.cuda.split("."))
        r_major, r_minor = (int(x) for x in versions.minor(torch_cuda, "torch_cuda").split("."))
        if b_major != r_major:
            problems.append(f"CUDA {built.cuda} has another major version than torch's CUDA {torch_cuda}")
        elif b_minor > r_minor:
            problems.append(f"CUDA {built.cuda} is newer than torch's CUDA {torch_cuda}")
    if (not built.stable and built.cxx11_abi is not None and torch_cxx11_abi is not None
            and built.cxx11_abi != torch_cxx11_abi):
        problems.append(
            f"C++ ABI {abi_name(built.cxx11_abi)} != {who}'s {abi_name(torch_cxx11_abi)}"
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
    cap = Arch.capability(capability)
    for s in map(Arch.target, sass):
        # Arch-specific (sm_90a) runs only on that exact GPU; family (sm_100f) on its major.
        if s.suffix == "a":
            if (s.major, s.minor) == (cap.major, cap.minor):
                return True
        elif s.major == cap.major and s.minor <= cap.minor:
            return True
    return any((p.major, p.minor) <= (cap.major, cap.minor) for p in map(Arch.target, ptx))
