"""The number of release wheels per platform, counted straight from facts/support.json's
records (not through ``support.cells``), so that a test of the matrix, the index or the
preflight checks its count against the table rather than against a number written in the test.

docs/COMPAT.md §11 gives the rules: a release below the stable-ABI floor has a wheel per CUDA
variant and CPython (from ``min_python`` on) on each platform; the releases from the floor on
share the stable wheels, one per platform and CUDA major for each change of the default
architecture list along the CUDA variants they ship."""

from __future__ import annotations

from typing import Dict, List, Tuple

from mamba_kernels.facts import support


def _key(version: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _archs(table: Dict[str, List[str]], cuda: str) -> List[str]:
    # a CUDA minor missing from the table takes the list of the newest older minor of its major
    same = [v for v in table if v.split(".")[0] == cuda.split(".")[0] and _key(v) <= _key(cuda)]
    return table[max(same, key=_key)]


def _per_platform() -> Dict[str, Tuple[int, int]]:
    """Per platform: (classic wheels, stable wheels)."""
    data = support.read_data()
    floor = _key(data["stable_abi"]["min_torch"])
    oldest_python = _key(str(data["min_python"]))
    out = {}
    for plat in data["platforms"]:
        name = plat["name"]
        classic = 0
        stable_cudas = set()
        for rel in data["releases"]:
            if _key(rel["torch"]) >= floor:
                stable_cudas.update(rel["cuda"][name])
                continue
            pythons = rel["platform_pythons"].get(name, rel["pythons"])
            classic += len(rel["cuda"][name]) * len([p for p in pythons if _key(p) >= oldest_python])
        table = data["default_archs"][plat["default_archs"]]
        stable, last = 0, {}
        for cuda in sorted(stable_cudas, key=_key):
            major, archs = cuda.split(".")[0], _archs(table, cuda)
            stable += last.get(major) != archs
            last[major] = archs
        out[name] = (classic, stable)
    return out


def wheel_counts() -> Dict[str, int]:
    """Wheels per platform, in the table's platform order, and ``total``: the shape of
    ``release.matrix.counts`` of the whole matrix."""
    out = {name: classic + stable for name, (classic, stable) in _per_platform().items()}
    out["total"] = sum(out.values())
    return out


def stable_count() -> int:
    """The stable wheels of every platform."""
    return sum(stable for _, stable in _per_platform().values())
