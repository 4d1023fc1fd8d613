"""GPU architectures of a build: parsing TORCH_CUDA_ARCH_LIST, choosing defaults, -gencode flags.

Pure functions over plain facts (no torch, no subprocess) so tests can feed them any case.
Architectures are :class:`mamba_kernels.facts.archs.Arch`; a list entry may add "+PTX" to also
embed PTX.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

from ..facts import support
from ..facts.archs import ENTRY_RE, Arch
from ..runtime import knobs

ARCH_LIST_VAR = knobs.ARCH_LIST_VAR

# torch's named architectures (torch.utils.cpp_extension docs), for TORCH_CUDA_ARCH_LIST.
_NAMED = {
    "turing": "7.5+PTX",
    "ampere+tegra": "8.7",
    "ampere": "8.0;8.6+PTX",
    "ada": "8.9+PTX",
    "hopper": "9.0+PTX",
    "blackwell+tegra": "11.0",
    "blackwell": "10.0;10.3;12.0;12.1+PTX",
}
@dataclass(frozen=True)
class ArchPlan:
    """What to compile: SASS targets, the ones that also get PTX, and where the list came from."""

    sass: Tuple[Arch, ...]
    ptx: Tuple[Arch, ...]
    source: str

    @property
    def sass_names(self) -> List[str]:
        return [a.sass_name for a in self.sass]

    @property
    def ptx_names(self) -> List[str]:
        return [a.ptx_name for a in self.ptx]

    def describe(self) -> str:
        text = " ".join(self.sass_names)
        if self.ptx:
            text += " + PTX " + " ".join(self.ptx_names)
        return f"{text} ({self.source})"


def parse_arch_list(value: str) -> Tuple[Tuple[Arch, ...], Tuple[Arch, ...]]:
    """Parse a TORCH_CUDA_ARCH_LIST value: entries separated by ';', ',' or spaces, each
    'M.m[a|f][+PTX]' or one of torch's names (Ampere, Hopper, ...). Returns (sass, ptx),
    sorted and without duplicates."""
    entries = [e for e in re.split(r"[;,\s]+", value.strip()) if e]
    if not entries:
        raise ValueError(f"{ARCH_LIST_VAR} is set but empty: give e.g. '8.0;9.0+PTX' or unset it")
    sass: List[Arch] = []
    ptx: List[Arch] = []
    for entry in entries:
        named = _NAMED.get(entry.lower())
        for item in (named.split(";") if named else [entry]):
            m = ENTRY_RE.match(item)
            if not m:
                raise ValueError(
                    f"{ARCH_LIST_VAR}={value!r}: entry {entry!r} is not an architecture; use "
                    "'M.m', 'M.ma', 'M.mf', optionally with '+PTX' (e.g. '8.0;9.0a;12.0+PTX'), "
                    f"or one of {', '.join(n.title() for n in _NAMED)}"
                )
            arch = Arch(int(m.group("major")), int(m.group("minor")), m.group("suffix").lower())
            sass.append(arch)
            if m.group("ptx"):
                ptx.append(arch)
    return _uniq(sass), _uniq(ptx)


def _uniq(archs: Iterable[Arch]) -> Tuple[Arch, ...]:
    return tuple(sorted(set(archs), key=lambda a: a.key))


def choose_archs(
    *,
    arch_list: Optional[str],
    release: bool,
    gpu_capabilities: Sequence[Tuple[int, int]],
    cuda: str,
    platform: str,
) -> ArchPlan:
    """Pick the architectures: TORCH_CUDA_ARCH_LIST when set (the user's explicit choice);
    for a release build the support table's list for (cuda, platform); else the visible GPUs;
    else the support table's list. Defaults add PTX for the newest architecture."""
    if arch_list is not None and arch_list.strip():
        sass, ptx = parse_arch_list(arch_list)
        return ArchPlan(sass, ptx, ARCH_LIST_VAR)
    if not release and gpu_capabilities:
        sass = _uniq(Arch(ma, mi) for ma, mi in gpu_capabilities)
        return ArchPlan(sass, (sass[-1],), "the visible GPUs")
    sass = _uniq(Arch.parse(a) for a in support.default_archs(cuda, platform))
    why = "release build" if release else "no GPU visible"
    source = f"default for CUDA {support.cuda_major_minor(cuda)} on {platform}, {why}"
    return ArchPlan(sass, (sass[-1],), source)


def unsupported(plan: ArchPlan, nvcc_archs: Sequence[str], nvcc_version: str) -> Optional[str]:
    """A sentence naming the architectures nvcc cannot target (from ``nvcc --list-gpu-arch``,
    e.g. ["compute_75", ...]), or None when all can be built."""
    known = {a.replace("compute_", "") for a in nvcc_archs}
    if not known:
        return None
    bad = [a for a in _uniq(plan.sass + plan.ptx) if f"{a.major}{a.minor}" not in known]
    if not bad:
        return None
    have = sorted(known, key=lambda n: int(n))
    return (
        f"nvcc {nvcc_version} cannot compile for {', '.join(str(a) for a in bad)} (asked for by "
        f"{plan.source}); it supports {', '.join(n[:-1] + '.' + n[-1] for n in have)}. Set "
        f"{ARCH_LIST_VAR} to architectures it supports, or use a CUDA toolkit that has them"
    )


def gencode_flags(plan: ArchPlan) -> List[str]:
    """nvcc -gencode flags: one SASS target per architecture, plus PTX where asked."""
    flags = [f"-gencode=arch=compute_{a.number},code=sm_{a.number}" for a in plan.sass]
    flags += [f"-gencode=arch=compute_{a.number},code=compute_{a.number}" for a in plan.ptx]
    return flags
