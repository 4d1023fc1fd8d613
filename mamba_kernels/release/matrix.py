"""The build matrix: every release wheel CI builds, and how each one is built.

The facts (which torch / CUDA / Python / platform / ABI combinations exist, arch lists,
labels, wheel names) come from :mod:`support` and :mod:`variant`; this module plans the cells
(ids, filters, what each builds and tests with, the tables the ``matrix`` verb prints). The CI
plumbing of a cell (runner, cibuildwheel identifier and image, torch index, where the CUDA
toolkit comes from, time limits, the GitHub job matrix) is ci/cell_fields.py's, outside the
wheel.

Two kinds of cell (docs/COMPAT.md §11): classic cells, one per torch minor, CUDA variant and
CPython, for the releases below the stable-ABI floor (2.1 to 2.9); and stable cells, one per
CUDA variant with its own architecture list and platform, each a cp310-abi3 wheel serving
every torch from 2.10 on. A new torch release needs a smoke test of the stable wheels
(ci/torch_watch.py), not new cells.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, Iterable, List, Optional

from ..facts import support, variant, versions
from ..facts.version import __version__

# The --os and --arch filters: each platform's OS, and each platform's first machine name, with
# the platforms whose machine names include it (x86_64: Linux x86_64 and Windows).
OS_NAMES = {os: tuple(p.name for p in support.PLATFORM_RECORDS if p.os == os)
            for os in dict.fromkeys(p.os for p in support.PLATFORM_RECORDS)}
ARCH_NAMES = {arch: tuple(p.name for p in support.PLATFORM_RECORDS if arch in p.machines)
              for arch in dict.fromkeys(p.machines[0] for p in support.PLATFORM_RECORDS)}
ABI_NAMES = variant.ABI_NAMES


def cell_id(cell: support.Cell) -> str:
    """A unique, file-name-safe name of a cell: ``cu128torch2.8-cp311-linux_x86_64``, or
    ``cu130stable2.10-cp310-linux_x86_64`` for a stable cell."""
    return f"{variant.cell_label(cell)}-{variant.python_tag(cell.python)}-{cell.platform}"


def binding(cell: support.Cell) -> str:
    """The binding the cell's build uses: ``stable`` or ``classic``."""
    return variant.BINDINGS[cell.stable]


def cuda_tag(cuda: str) -> str:
    """``13.0`` -> ``cu130``: PyTorch's index folder for a CUDA variant."""
    return variant.cuda_tag(cuda)


def arch_list(cell: support.Cell) -> str:
    """``TORCH_CUDA_ARCH_LIST`` for the cell: SASS for each default arch, PTX for the newest."""
    archs = list(cell.archs)
    return ";".join(archs[:-1] + [archs[-1] + "+PTX"])


def cell_fields(cell: support.Cell, version: str = __version__) -> Dict[str, Any]:
    """What the plan says about one cell: its id, target, wheel and the torch it builds and tests
    with (ci/cell_fields.py adds the CI plumbing).

    ``torch`` is the torch the wheel is for (a stable cell's target); ``build_torch`` and
    ``test_torch`` (with their CUDA variants) are the ones the build and the smoke test install:
    the same for a classic cell, the newest headers and the target for a stable one.
    ``torch_requirement`` is the wheel's own requirement on torch."""
    build_torch, build_cuda = cell.build_with
    test_torch, test_cuda = cell.test_with
    return {
        "id": cell_id(cell),
        "torch": cell.torch,
        "cuda": cell.cuda,
        "python": cell.python,
        "platform": cell.platform,
        "cxx11_abi": cell.cxx11_abi,
        "manylinux": cell.manylinux,
        "cxx_std": cell.cxx_std,
        "archs": list(cell.archs),
        "arch_list": arch_list(cell),
        "stable": cell.stable,
        "binding": binding(cell),
        "label": variant.cell_label(cell),
        "describe": variant.parse_label(variant.cell_label(cell)).describe(),
        "wheel": variant.wheel_name(version, cell),
        "wheel_tags": variant.wheel_tags(cell),
        "platform_tag": variant.platform_tag(cell),
        "torch_requirement": variant.cell_torch_requirement(cell),
        "build_torch": build_torch,
        "build_torch_cuda": build_cuda,
        "test_torch": test_torch,
        "test_torch_cuda": test_cuda,
    }


def _choice(name: str, value: Optional[str], allowed: Iterable[str]) -> Optional[str]:
    allowed = tuple(allowed)
    if value is not None and value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def select(
    torch: Optional[str] = None,
    cuda: Optional[str] = None,
    python: Optional[str] = None,
    os: Optional[str] = None,
    arch: Optional[str] = None,
    platform: Optional[str] = None,
    abi: Optional[str] = None,
    binding: Optional[str] = None,
) -> List[support.Cell]:
    """The cells matching every given filter (``None`` = any). Values are exact, as printed by
    the ``matrix`` verb: torch ``2.14``, cuda ``13.0``, python ``3.11``, os ``linux``/``windows``,
    arch ``x86_64``/``aarch64``/``amd64``, platform ``linux_x86_64``..., abi ``cxx11``/``pre-cxx11``,
    binding ``classic``/``stable``. torch and python keep the cells whose wheels serve that
    release / CPython: ``--torch 2.14`` gives the stable cells, and so does a torch newer than
    the support table's newest (support.served_torch)."""
    _choice("binding", binding, variant.BINDINGS)
    _choice("os", os, OS_NAMES)
    _choice("arch", arch, ARCH_NAMES)
    _choice("platform", platform, support.PLATFORMS)
    _choice("abi", abi, ABI_NAMES)
    if cuda is not None:
        known = sorted({c for r in support.RELEASES for cs in r.cuda.values() for c in cs},
                       key=versions.key)
        _choice("cuda", cuda, known)
    if python is not None:
        known = sorted({p for r in support.RELEASES for p in r.pythons
                        if versions.key(p) >= support.MIN_PYTHON},
                       key=versions.key)
        _choice("python", python, known)
    if torch is not None:
        support.served_torch(torch)  # the table's releases, or a newer one the stable cells serve
    out = []
    for cell in support.cells(torch=torch, cuda=cuda, python=python, platform=platform,
                              cxx11_abi=None if abi is None else ABI_NAMES[abi]):
        if os is not None and cell.platform not in OS_NAMES[os]:
            continue
        if arch is not None and cell.platform not in ARCH_NAMES[arch]:
            continue
        if binding is not None and cell.stable != (binding == variant.STABLE):
            continue
        out.append(cell)
    return out


def find_cell(cell_id_text: str) -> support.Cell:
    """The cell with this :func:`cell_id`; a ValueError naming the id otherwise."""
    for cell in support.cells():
        if cell_id(cell) == cell_id_text:
            return cell
    raise ValueError(
        f"cell must be a cell id such as 'cu128torch2.8-cp311-linux_x86_64' or "
        f"'cu130stable2.10-cp310-linux_x86_64' "
        f"(see `python -m mamba_kernels matrix`), got {cell_id_text!r}"
    )


def counts(cells: List[support.Cell]) -> Dict[str, int]:
    """Number of cells (= wheels) per platform, in support.PLATFORMS order, plus ``total``."""
    c = Counter(cell.platform for cell in cells)
    out = {p: c.get(p, 0) for p in support.PLATFORMS}
    out["total"] = len(cells)
    return out


def _served(cell: support.Cell) -> str:
    """The torch column of a cell: ``2.8``, or ``2.10 and newer (stable ABI)`` for a stable cell."""
    return f"{cell.torch} and newer (stable ABI)" if cell.stable else cell.torch


def markdown_table(cells: List[support.Cell]) -> str:
    """Wheels per torch release and platform, with the CUDA variants and Pythons: README's table.
    Stable cells are one row per platform, for every torch from their target on."""
    rows = ["| torch | platform | CUDA | Python | C++ ABI | wheels |", "| --- " * 6 + "|"]
    groups: Dict[tuple, List[support.Cell]] = {}
    for cell in cells:
        groups.setdefault((_served(cell), cell.platform), []).append(cell)
    for (torch, plat), group in groups.items():
        cudas = ", ".join(dict.fromkeys(c.cuda for c in group))
        pys = [c.python for c in group]
        if group[0].stable:
            py_range = f"{pys[0]} and newer (abi3)"
        else:
            py_range = f"{pys[0]}–{max(pys, key=lambda v: int(v.split('.')[1]))}"
        abis = ", ".join(dict.fromkeys(variant.abi_name(c.cxx11_abi) for c in group))
        rows.append(f"| {torch} | {plat} | {cudas} | {py_range} | {abis} | {len(group)} |")
    n = counts(cells)
    rows.append("| **total** | " + ", ".join(f"{p} {n[p]}" for p in support.PLATFORMS)
                + " | | | | **" + str(n["total"]) + "** |")
    return "\n".join(rows)


def text_table(cells: List[support.Cell]) -> str:
    lines = [f"{'torch':<6} {'cuda':<5} {'python':<7} {'platform':<14} {'abi':<10} archs"]
    for c in cells:
        torch = f"{c.torch}+" if c.stable else c.torch
        py = f"{c.python}+" if c.stable else c.python
        abi = "stable" if c.stable else variant.abi_name(c.cxx11_abi)
        lines.append(f"{torch:<6} {c.cuda:<5} {py:<7} {c.platform:<14} {abi:<10} {arch_list(c)}")
    n = counts(cells)
    lines.append(f"{n['total']} cells: " + ", ".join(f"{p} {n[p]}" for p in support.PLATFORMS))
    return "\n".join(lines)
