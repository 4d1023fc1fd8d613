"""The support table: which torch / CUDA / Python / platform / C++ ABI combinations exist, and
the toolchain facts that go with them.

The facts themselves are data, in ``mamba_kernels/facts/support.json`` next to this file; this module
is the one reader of that file, and ``ci/torch_watch.py`` edits the data (never code) through
:func:`read_data` / :func:`write_data`, which keep one canonical formatting so a change shows as
a small diff. setup.py, the build-matrix generator, the resolver, the doctor, CI and the tests
read the facts through the names below. No torch import and only the standard library (setup.py
imports this before torch, or anything else, may be installed; Python 3.9 has no ``tomllib``,
hence JSON).

JSON has no comments: what each fact means and where it was learned (PyTorch's release tooling,
or the torch wheels on PyPI: file names, Requires-Python and torch/version.py of the default
build, read 2026-11-29) is in docs/COMPAT.md, and the data file's ``_about`` maps each key to its
section:

- ``platforms``, ``releases[].cuda``: §1.1 (CUDA variants per release and platform; 2.1-2.3 from
  PyTorch's own index, 2.15 only the confirmed PyPI variant, no 13.4 build for Windows)
- ``min_python``, ``releases[].pythons`` and ``platform_pythons``: §1.2 (PyPI's cp tags win over
  the build-matrix script; torch 2.5 has no Windows cp313 wheel)
- ``releases[].pypi_cuda``: §1.3; ``linux_pre_cxx11``: §2; ``manylinux``: §3; ``cxx_std``: §4
- ``default_archs``: §5.1 and §5.2 (``x86_64`` serves Linux x86_64 and Windows)
- ``pypi_toolkits``, ``pypi_cuobjdump``, ``windows_toolkits``: §6; ``linux_toolkits``: §6.1;
  ``windows_components``: §6.2
- ``msvc``: §7.1; ``gcc``: §7.2 (and the runner images' compilers ci/preflight.py checks against)
- ``wheel_excludes``: §8
- ``stable_abi``: §11 (the stable-ABI target floor and the abi3 Python tag)

A *cell* is one wheel we build: (torch major.minor, CUDA variant, CPython version,
platform, C++ ABI). Cells are exactly the combinations torch itself shipped, intersected
with the Pythons this package supports (>= 3.9).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import versions

DATA_FILE = Path(__file__).resolve().with_name("support.json")
# The keys of one entry of ``releases``, in the order the data file keeps them.
RELEASE_KEYS: Tuple[str, ...] = (
    "torch", "pythons", "platform_pythons", "cuda", "pypi_cuda", "linux_pre_cxx11", "manylinux",
    "cxx_std", "note",
)


def read_data(path: Union[str, Path] = DATA_FILE) -> Dict[str, Any]:
    """The data file as JSON objects (key order kept)."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _dump(value: Any, depth: int) -> str:
    # Lists of scalars on one line, every object key on its own line: a new release or a new
    # CUDA variant is a few added lines, a changed version one changed line.
    if isinstance(value, dict) and value:
        pad = "  " * (depth + 1)
        items = [f"{pad}{json.dumps(k)}: {_dump(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * depth + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        pad = "  " * (depth + 1)
        return "[\n" + ",\n".join(pad + _dump(v, depth + 1) for v in value) + "\n" + "  " * depth + "]"
    return json.dumps(value, ensure_ascii=False)


def dump_data(data: Mapping[str, Any]) -> str:
    """The canonical text of the data file (what :func:`write_data` writes)."""
    return _dump(data, 0) + "\n"


def write_data(data: Mapping[str, Any], path: Union[str, Path] = DATA_FILE) -> Path:
    """Check ``data`` the way this module reads it, then write it canonically to ``path``."""
    _check(data)
    text = dump_data(data)
    Path(path).write_text(text, encoding="utf-8", newline="\n")
    return Path(path)


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
        """The C++ ABI flag of torch's build for (cuda, platform); None where it has no meaning
        (Windows); the platform record's where it has one for every build (every aarch64 CUDA
        build is cxx11: docs/COMPAT.md §2; they start with 2.7), else the release's."""
        abi = PLATFORM_BY_NAME[platform].cxx11_abi
        return self.linux_cxx11_abi[cuda] if abi == "per release" else abi

    @property
    def has_two_abis(self) -> bool:
        """torch 2.6 shipped both ABIs on Linux (docs/COMPAT.md §2): labels must tell them apart."""
        return len(set(self.linux_cxx11_abi.values())) > 1


PLATFORM_KEYS: Tuple[str, ...] = (
    "name", "os", "markers", "machines", "tag_arch", "manylinux", "cibw_platform", "cibw_arch",
    "cibw_identifier", "runner", "redist_arch", "default_archs", "cxx11_abi", "pypi_wheel",
)


@dataclass(frozen=True)
class Platform:
    """One platform we build wheels for: every fact of it that a module needs (docs/COMPAT.md §1).

    ``name`` is our name and the cell's (``linux_x86_64``); ``os`` the matrix's ``--os``
    (``linux``/``windows``); ``markers`` the PEP 508 environment markers of any install there
    (``sys_platform``, ``platform_system``, ``os_name``, ``platform_machine``); ``machines`` what
    ``platform.machine()`` says there, lower case (the first is the matrix's ``--arch``);
    ``tag_arch`` the architecture of its wheel platform tags; ``manylinux`` whether its wheels
    are tagged with the cell's manylinux policy (``manylinux_2_28_<tag_arch>``) or with ``name``;
    ``cibw_*`` cibuildwheel's platform, architecture and build identifier (after ``cpXY-``);
    ``runner`` the GitHub runner label; ``redist_arch`` NVIDIA's name of the architecture in its
    repositories and archives; ``default_archs`` the key of ``default_archs``; ``cxx11_abi``
    torch's C++ ABI there: ``"per release"`` (the release's linux_pre_cxx11), true, or null (no
    meaning); ``pypi_wheel`` whether torch's plain PyPI wheel is for this platform."""

    name: str
    os: str
    markers: Mapping[str, str]
    machines: Tuple[str, ...]
    tag_arch: str
    manylinux: bool
    cibw_platform: str
    cibw_arch: str
    cibw_identifier: str
    runner: str
    redist_arch: str
    default_archs: str
    cxx11_abi: Union[None, bool, str]
    pypi_wheel: bool

    @property
    def is_windows(self) -> bool:
        return self.os == "windows"


class DataError(ValueError):
    """The data file does not hold what this module needs; the message says where."""


def platforms_from_data(data: Mapping[str, Any]) -> Tuple[Platform, ...]:
    """The ``platforms`` records of the data file (checked)."""
    out = []
    for i, entry in enumerate(data["platforms"]):
        where = f"platforms[{entry.get('name', i) if isinstance(entry, dict) else i}]"
        if not isinstance(entry, dict) or tuple(entry) != PLATFORM_KEYS:
            raise DataError(f"{where}: keys must be {', '.join(PLATFORM_KEYS)} in that order")
        if entry["os"] not in ("linux", "windows") or entry["cxx11_abi"] not in ("per release", True, None):
            raise DataError(f"{where}: os must be linux or windows, cxx11_abi 'per release', true or null")
        if entry["default_archs"] not in data["default_archs"]:
            raise DataError(f"{where}.default_archs: no such list {entry['default_archs']!r}")
        out.append(Platform(**{**entry, "markers": dict(entry["markers"]),
                               "machines": tuple(entry["machines"])}))
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise DataError(f"platforms: names must be distinct, got {', '.join(names)}")
    if [p.pypi_wheel for p in out].count(True) != 1 or [p.cxx11_abi for p in out].count("per release") > 1:
        raise DataError("platforms: exactly one has torch's PyPI wheel, at most one a per-release C++ ABI")
    return tuple(out)


def _versions(value: Any, where: str) -> Tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DataError(f"{where}: expected a list of version strings, got {value!r}")
    try:
        keys = [versions.key(v) for v in value]
    except ValueError:
        raise DataError(f"{where}: expected versions like '3.11' or '12.6', got {value!r}") from None
    if keys != sorted(set(keys)):
        raise DataError(f"{where}: versions must be distinct and oldest first, got {value!r}")
    return tuple(value)


def release_from_data(entry: Mapping[str, Any], records: Optional[Sequence[Platform]] = None) -> TorchRelease:
    """One ``releases`` entry of the data file as a :class:`TorchRelease` (checked)."""
    records = PLATFORM_RECORDS if records is None else records
    platforms = tuple(p.name for p in records)
    # the platform of torch's plain PyPI wheel, whose builds name their C++ ABI per release
    pypi_platform = next(p.name for p in records if p.pypi_wheel)
    where = f"releases[{entry.get('torch', '?')}]"
    if tuple(entry) != RELEASE_KEYS:
        raise DataError(
            f"{where}: keys must be {', '.join(RELEASE_KEYS)} in that order, got {', '.join(entry)}"
        )
    if set(entry["cuda"]) != set(platforms):
        raise DataError(f"{where}.cuda: one list per platform ({', '.join(platforms)})")
    cuda = {p: _versions(entry["cuda"][p], f"{where}.cuda.{p}") for p in platforms}
    x86 = cuda[pypi_platform]
    pre = _versions(entry["linux_pre_cxx11"], f"{where}.linux_pre_cxx11")
    if not set(pre) <= set(x86):
        raise DataError(f"{where}.linux_pre_cxx11: {pre!r} not all among the {pypi_platform} variants")
    if entry["pypi_cuda"] not in x86:
        raise DataError(f"{where}.pypi_cuda: {entry['pypi_cuda']!r} is not a {pypi_platform} variant")
    # A PEP 600 glibc floor; the release builds in the cibuildwheel image of that name
    # (manylinux_2_17 or manylinux_2_28, ci/preflight.py checks), the rehearsal on its own glibc.
    if not re.fullmatch(r"manylinux_2_\d+", str(entry["manylinux"])):
        raise DataError(f"{where}.manylinux: {entry['manylinux']!r} is not a manylinux_2_NN tag")
    if entry["cxx_std"] not in (17, 20):
        raise DataError(f"{where}.cxx_std: {entry['cxx_std']!r}")
    per_platform = entry["platform_pythons"]
    if not isinstance(per_platform, dict) or not set(per_platform) <= set(platforms):
        raise DataError(f"{where}.platform_pythons: platform -> Python list, got {per_platform!r}")
    return TorchRelease(
        torch=str(entry["torch"]),
        pythons=_versions(entry["pythons"], f"{where}.pythons"),
        cuda=cuda,
        pypi_cuda=entry["pypi_cuda"],
        linux_cxx11_abi={c: c not in pre for c in x86},
        manylinux=entry["manylinux"],
        cxx_std=entry["cxx_std"],
        note=str(entry["note"]),
        platform_pythons={p: _versions(v, f"{where}.platform_pythons.{p}") for p, v in per_platform.items()},
    )


def _check(data: Mapping[str, Any]) -> None:
    """Everything this module derives from ``data`` can be derived (DataError otherwise)."""
    rels = [release_from_data(e, platforms_from_data(data)) for e in data["releases"]]
    if [versions.key(r.torch) for r in rels] != sorted({versions.key(r.torch) for r in rels}):
        raise DataError("releases: torch versions must be distinct and oldest first")
    for arch, table in data["default_archs"].items():
        for cuda, archs in table.items():
            _versions(archs, f"default_archs.{arch}.{cuda}")
    for cuda, names in data["windows_components"].items():
        bad = [n for n in names if not n.endswith(f"_{cuda}")]
        if bad or not names:
            raise DataError(f"windows_components.{cuda}: every name must end with _{cuda}, got {names!r}")
    tks = data["linux_toolkits"]
    for ml, sources in tks["sources"].items():
        unknown = [s for s in sources if s not in tks or s == "sources"]
        if unknown:
            raise DataError(f"linux_toolkits.sources.{ml}: no such source {', '.join(unknown)}")
    msvc = data["msvc"]
    for cuda, name in msvc["cuda_toolset"].items():
        if name not in msvc["toolsets"]:
            raise DataError(f"msvc.cuda_toolset.{cuda}: no toolset {name!r} in msvc.toolsets")
    order = None
    for cuda, tk in data["pypi_toolkits"].items():
        if order is None:
            order = tuple(tk["components"])
        if tuple(tk["components"]) != order:
            raise DataError(f"pypi_toolkits.{cuda}: components must be {', '.join(order)} in that order")


_DATA = read_data()
_check(_DATA)

PLATFORM_RECORDS: Tuple[Platform, ...] = platforms_from_data(_DATA)
PLATFORM_BY_NAME: Dict[str, Platform] = {p.name: p for p in PLATFORM_RECORDS}
PLATFORMS: Tuple[str, ...] = tuple(PLATFORM_BY_NAME)  # ("linux_x86_64", "linux_aarch64", "win_amd64")
# The oldest CPython this package runs on (pyproject.toml requires-python).
MIN_PYTHON: Tuple[int, ...] = versions.key(_DATA["min_python"])
# PyTorch's stable ABI (docs/COMPAT.md §11): the oldest torch a stable-ABI build may target
# (its TORCH_TARGET_VERSION), and the CPython its abi3 wheels are tagged for (cp310-abi3).
STABLE_ABI_MIN_TORCH: str = _DATA["stable_abi"]["min_torch"]
STABLE_ABI_PYTHON: str = _DATA["stable_abi"]["python"]

RELEASES: Tuple[TorchRelease, ...] = tuple(release_from_data(e) for e in _DATA["releases"])
_BY_TORCH: Dict[str, TorchRelease] = {r.torch: r for r in RELEASES}

# Default SASS targets per CUDA variant, newest last (the newest also gets PTX), per list a
# platform record names: x86_64 for Linux x86_64 and Windows, aarch64 for Linux aarch64
# (docs/COMPAT.md §5.1, §5.2).
_DEFAULT_ARCHS: Dict[str, Dict[str, Tuple[str, ...]]] = {
    key: {k: tuple(v) for k, v in lists.items()} for key, lists in _DATA["default_archs"].items()
}


def platform_of(sys_platform: str, machine: str) -> Optional[str]:
    """Our platform name for ``sys.platform`` and ``platform.machine()`` (any case); None for a
    machine we build no wheels for."""
    plat = "linux" if sys_platform.startswith("linux") else sys_platform
    return next((p.name for p in PLATFORM_RECORDS
                 if p.markers["sys_platform"] == plat and machine.lower() in p.machines), None)


def torch_release(torch: str) -> TorchRelease:
    """The release line for a torch version ("2.6" or "2.6.0+cu126")."""
    try:
        return _BY_TORCH[versions.minor(torch)]
    except (KeyError, ValueError):
        raise ValueError(
            f"torch must be one of the supported releases {', '.join(_BY_TORCH)}, got {torch!r}"
        ) from None


def served_torch(torch: str) -> str:
    """The release line ("2.14") a cell filter on ``torch`` ("2.16" or "2.16.0+cu130") means: a
    release of the table, or one newer than the table's newest, which only the stable cells serve
    (a stable wheel runs on every torch from its target on; a classic wheel exists only for the
    table's releases below the stable-ABI floor). Else a ValueError naming the releases."""
    newest = RELEASES[-1].torch
    try:
        mm = versions.minor(torch)
    except ValueError:
        mm = None
    if mm in _BY_TORCH or (mm is not None and versions.key(mm) > versions.key(newest)
                           and versions.key(newest) >= versions.key(STABLE_ABI_MIN_TORCH)):
        return mm  # type: ignore[return-value]
    raise ValueError(
        f"torch must be one of the supported releases {', '.join(_BY_TORCH)}, or a newer release "
        f"(served by the stable wheels), got {torch!r}"
    )


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
    table = _DEFAULT_ARCHS[PLATFORM_BY_NAME[platform].default_archs]
    if mm in table:
        return table[mm]
    same_major = [v for v in table
                  if v.split(".")[0] == mm.split(".")[0] and versions.key(v) < versions.key(mm)]
    if same_major:
        return table[max(same_major, key=versions.key)]
    raise ValueError(
        f"no default architecture list for CUDA {mm} on {platform}: known CUDA versions are "
        f"{', '.join(table)}; set TORCH_CUDA_ARCH_LIST"
    )


@dataclass(frozen=True)
class Cell:
    """One wheel of the build matrix.

    A classic cell (torch below the stable-ABI floor) is one torch minor, CUDA variant and
    CPython: it builds and tests with that torch. A stable cell (``stable=True``) is one CUDA
    variant and platform for every torch from ``torch`` (its target) on: it builds with
    ``build_torch`` (the newest headers), tests with ``test_torch`` (its target) and is tagged
    cp310-abi3 (docs/COMPAT.md §11).
    """

    torch: str  # "2.14"; stable: the target, the oldest torch the wheel runs on ("2.10")
    cuda: str  # "13.0": the CUDA the binary is compiled with (torch's variant, for classic)
    python: str  # "3.11"; stable: the abi3 floor, "3.10"
    platform: str  # one of PLATFORMS
    cxx11_abi: Optional[bool]  # None on Windows, and for stable cells (a C ABI: no libstdc++ ABI)
    manylinux: Optional[str]  # "manylinux_2_28" on Linux, None on Windows
    cxx_std: int
    stable: bool = False
    # stable only: the (torch release, torch CUDA variant) the build environment installs
    # and the one the smoke test installs; a classic cell uses (torch, cuda) for both.
    build_torch: Optional[Tuple[str, str]] = None
    test_torch: Optional[Tuple[str, str]] = None

    @property
    def archs(self) -> Tuple[str, ...]:
        return default_archs(self.cuda, self.platform)

    @property
    def build_with(self) -> Tuple[str, str]:
        """(torch release, its CUDA variant) installed in the build environment."""
        return self.build_torch or (self.torch, self.cuda)

    @property
    def test_with(self) -> Tuple[str, str]:
        """(torch release, its CUDA variant) installed in the smoke test's environment."""
        return self.test_torch or (self.torch, self.cuda)

    def serves_torch(self, torch: str) -> bool:
        """Whether this cell's wheel is meant for torch release ``torch`` ("2.12")."""
        if self.stable:
            return versions.key(torch) >= versions.key(self.torch)
        return torch == self.torch

    def serves_python(self, python: str) -> bool:
        """Whether this cell's wheel installs on CPython ``python`` ("3.12", not free-threaded)."""
        if self.stable:
            return versions.key(python) >= versions.key(self.python)
        return python == self.python


def _matches(value: str, wanted: Optional[str]) -> bool:
    return wanted is None or value == wanted


def classic_releases() -> Tuple[TorchRelease, ...]:
    """The releases served by per-minor (classic) cells: those below the stable-ABI floor."""
    return tuple(r for r in RELEASES if versions.key(r.torch) < versions.key(STABLE_ABI_MIN_TORCH))


def stable_releases() -> Tuple[TorchRelease, ...]:
    """The releases served by the stable cells: the stable-ABI floor and every newer one."""
    return tuple(r for r in RELEASES if versions.key(r.torch) >= versions.key(STABLE_ABI_MIN_TORCH))


def cells(
    torch: Optional[str] = None,
    cuda: Optional[str] = None,
    python: Optional[str] = None,
    platform: Optional[str] = None,
    cxx11_abi: Optional[bool] = None,
) -> List[Cell]:
    """Every build cell (classic ones oldest torch first, then the stable ones), optionally
    filtered: ``torch`` and ``python`` keep the cells whose wheels serve that torch release /
    CPython (a stable cell serves every torch from its target on, newer than the table's newest
    too (:func:`served_torch`), and every CPython from 3.10 on), the others are exact; a
    ``cxx11_abi`` filter keeps classic cells only."""
    if platform is not None and platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {', '.join(PLATFORMS)}, got {platform!r}")
    if torch is not None:
        torch = served_torch(torch)  # a clear error for an unknown release
    out = list(_iter_cells(torch, cuda, python, platform, cxx11_abi))
    if cxx11_abi is None:
        out += [
            c for c in stable_cells(platform)
            if _matches(c.cuda, cuda)
            and (torch is None or c.serves_torch(torch))
            and (python is None or c.serves_python(python))
        ]
    return out


def _iter_cells(
    torch: Optional[str],
    cuda: Optional[str],
    python: Optional[str],
    platform: Optional[str],
    cxx11_abi: Optional[bool],
) -> Iterator[Cell]:
    for rel in classic_releases():
        if not _matches(rel.torch, torch):
            continue
        for cell in release_cells(rel):
            if (_matches(cell.platform, platform) and _matches(cell.cuda, cuda)
                    and _matches(cell.python, python) and (cxx11_abi is None or cell.cxx11_abi is cxx11_abi)):
                yield cell


def release_cells(rel: TorchRelease) -> List[Cell]:
    """The per-minor (classic) cells of one release: its CUDA variants x CPythons >= ours, per
    platform (for a release below the stable-ABI floor these are its cells in the matrix)."""
    out = []
    for plat in PLATFORMS:
        for cu in rel.cuda[plat]:
            for py in rel.pythons_on(plat):
                if versions.key(py) >= MIN_PYTHON:
                    ml = rel.manylinux if PLATFORM_BY_NAME[plat].manylinux else None
                    out.append(Cell(rel.torch, cu, py, plat, rel.cxx11_abi(cu, plat), ml, rel.cxx_std))
    return out


def _major(cuda: str) -> str:
    return cuda.split(".")[0]


def _closest_variant(variants: Tuple[str, ...], cuda: str) -> Optional[str]:
    """Of ``variants``, the same-major one nearest ``cuda``: the newest not above it, else the
    oldest above it (a build only needs torch's CUDA major to equal nvcc's)."""
    same = [v for v in variants if _major(v) == _major(cuda)]
    below = [v for v in same if versions.key(v) <= versions.key(cuda)]
    if below:
        return max(below, key=versions.key)
    return min(same, key=versions.key) if same else None


def stable_cells(
    platform: Optional[str] = None, releases: Optional[Sequence[TorchRelease]] = None
) -> List[Cell]:
    """The stable cells (docs/COMPAT.md §11): per platform and CUDA major, one cell per
    distinct default architecture list among the CUDA variants the served releases ship, at
    the oldest minor with that list (a build's CUDA minor must not be above torch's, so the
    oldest minor serves every later one; a new list, such as Blackwell's from 12.8, needs its
    own cell). Each builds with the newest served release that has a wheel for the abi3 Python
    and a build for exactly its CUDA (else the nearest of its major), and smoke-tests with the
    oldest served release that ships a variant of its major not below its own (the target,
    while it ships one). ``releases`` replaces the table's (ci/torch_watch.py asks what a new
    release would change)."""
    served = stable_releases() if releases is None else tuple(
        r for r in releases if versions.key(r.torch) >= versions.key(STABLE_ABI_MIN_TORCH))
    out: List[Cell] = []
    for plat in PLATFORMS:
        if not _matches(plat, platform):
            continue
        variants = sorted({c for r in served for c in r.cuda[plat]}, key=versions.key)
        last: Dict[str, Tuple[str, ...]] = {}
        for cu in variants:
            archs = default_archs(cu, plat)
            if last.get(_major(cu)) == archs:
                continue
            last[_major(cu)] = archs
            # The newest release with a build for exactly this CUDA, so that torch's CUDA (which
            # the build writes into the label) is nvcc's; else the nearest of the same major.
            builders = [r for r in served if STABLE_ABI_PYTHON in r.pythons_on(plat) and cu in r.cuda[plat]]
            builders = builders or [r for r in served if STABLE_ABI_PYTHON in r.pythons_on(plat)
                                    and _closest_variant(r.cuda[plat], cu)]
            testers = [r for r in served if STABLE_ABI_PYTHON in r.pythons_on(plat)
                       and any(_major(v) == _major(cu) and versions.key(v) >= versions.key(cu)
                               for v in r.cuda[plat])]
            if not builders or not testers:
                raise DataError(
                    f"stable cell CUDA {cu} on {plat}: no served torch release ships a CUDA {_major(cu)}.x "
                    f"variant with a CPython {STABLE_ABI_PYTHON} wheel to build or test with"
                )
            build = builders[-1]
            test = testers[0]
            test_cuda = min((v for v in test.cuda[plat]
                             if _major(v) == _major(cu) and versions.key(v) >= versions.key(cu)),
                            key=versions.key)
            out.append(Cell(
                torch=STABLE_ABI_MIN_TORCH, cuda=cu, python=STABLE_ABI_PYTHON, platform=plat,
                cxx11_abi=None, manylinux=build.manylinux if PLATFORM_BY_NAME[plat].manylinux else None,
                cxx_std=build.cxx_std, stable=True,
                build_torch=(build.torch, _closest_variant(build.cuda[plat], cu)),
                test_torch=(test.torch, test_cuda),
            ))
    return out


# ----------------------------------------------------------------------------- toolchains


@dataclass(frozen=True)
class PypiToolkit:
    """A CUDA compiler assembled from NVIDIA's PyPI packages: exact component versions."""

    cuda: str  # "13.4"
    release: str  # the cuda-toolkit release whose pins these are, "13.4.3"
    components: Mapping[str, str]  # package -> exact version, in install order

    def requirements(self) -> List[str]:
        return [f"{pkg}=={v}" for pkg, v in self.components.items()]


# The pins of NVIDIA's ``cuda-toolkit`` metapackage for the newest patch of each 13.x minor
# (docs/COMPAT.md §6): cuda -> (cuda-toolkit release, versions in _PYPI_TOOLKIT_ORDER).
_PYPI_TOOLKIT_ORDER: Tuple[str, ...] = tuple(next(iter(_DATA["pypi_toolkits"].values()))["components"])
_PYPI_TOOLKITS: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    cuda: (tk["release"], tuple(tk["components"].values())) for cuda, tk in _DATA["pypi_toolkits"].items()
}
# cuobjdump only lists what a binary holds, so one 13.x build serves every cell (§6).
PYPI_CUOBJDUMP: str = _DATA["pypi_cuobjdump"]
# Full toolkit versions for NVIDIA's Windows network installer, per CUDA minor (§6).
WINDOWS_TOOLKITS: Dict[str, str] = dict(_DATA["windows_toolkits"])
# The installer's subpackage names per CUDA minor, exactly as passed to it (§6.2).
WINDOWS_COMPONENTS: Dict[str, Tuple[str, ...]] = {
    cuda: tuple(names) for cuda, names in _DATA["windows_components"].items()
}


def windows_components(cuda: str) -> Tuple[str, ...]:
    """The subpackages NVIDIA's Windows network installer is asked for, for CUDA ``cuda``."""
    mm = cuda_major_minor(cuda)
    if mm not in WINDOWS_COMPONENTS:
        raise ValueError(f"no Windows installer components are known for CUDA {mm}: known are "
                         f"{', '.join(WINDOWS_COMPONENTS)}; add them to windows_components in "
                         "mamba_kernels/facts/support.json")
    return WINDOWS_COMPONENTS[mm]


@dataclass(frozen=True)
class LinuxToolkit:
    """Where a Linux cell's CUDA 11.8/12.x toolkit comes from (docs/COMPAT.md §6.1).

    ``source`` "rhel7" / "rhel8": NVIDIA's RPM repository for that RHEL release, ``packages``
    the RPMs to install. "redist": NVIDIA's redistributable archives (one tarball per
    component, unpacked into one folder), ``archives`` component -> (version, sha256 of the
    archive for ``arch``), from the manifest of toolkit ``release``."""

    cuda: str
    source: str
    packages: Tuple[str, ...] = ()
    release: str = ""
    archives: Mapping[str, Tuple[str, str]] = field(default_factory=dict)
    arch: str = "linux-x86_64"


_LINUX_TOOLKITS: Dict[str, Any] = _DATA["linux_toolkits"]
# The sources each manylinux image tries, in order: the first that lists the CUDA minor.
LINUX_TOOLKIT_SOURCES: Dict[str, Tuple[str, ...]] = {
    ml: tuple(srcs) for ml, srcs in _LINUX_TOOLKITS["sources"].items()
}
REDIST_URL = "https://developer.download.nvidia.com/compute/cuda/redist"


def linux_toolkit(cuda: str, manylinux: str, arch: str = "linux-x86_64") -> LinuxToolkit:
    """The source and packages of CUDA ``cuda`` (11.8/12.x) in the ``manylinux`` image
    ("manylinux_2_17", "manylinux_2_28"); ``arch`` the redistributable archives' name of the
    architecture ("linux-x86_64", "linux-sbsa"). ValueError when none is known."""
    mm = cuda_major_minor(cuda)
    sources = LINUX_TOOLKIT_SOURCES.get(manylinux)
    if sources is None:
        raise ValueError(f"no CUDA toolkit source is known for {manylinux}: known are "
                         f"{', '.join(LINUX_TOOLKIT_SOURCES)}")
    for src in sources:
        entry = _LINUX_TOOLKITS[src].get(mm)
        if entry is None:
            continue
        if src == "redist":
            archives = {name: (a["version"], a[arch]) for name, a in entry["archives"].items() if arch in a}
            if len(archives) != len(entry["archives"]):
                continue
            return LinuxToolkit(mm, src, release=entry["release"], archives=archives, arch=arch)
        return LinuxToolkit(mm, src, packages=tuple(entry), arch=arch)
    raise ValueError(f"no CUDA {mm} toolkit is known for {manylinux} ({arch}): the sources "
                     f"{', '.join(sources)} in linux_toolkits of mamba_kernels/facts/support.json list none")


def redist_url(name: str, version: str, arch: str) -> str:
    """The URL of one of NVIDIA's redistributable archives."""
    return f"{REDIST_URL}/{name}/{arch}/{name}-{arch}-{version}-archive.tar.xz"


def pypi_toolkit(cuda: str) -> PypiToolkit:
    """The pinned PyPI components of CUDA ``cuda`` (major.minor)."""
    mm = cuda_major_minor(cuda)
    if mm not in _PYPI_TOOLKITS:
        raise ValueError(
            f"no PyPI CUDA toolkit is pinned for CUDA {mm}: known are {', '.join(_PYPI_TOOLKITS)}"
        )
    release, versions = _PYPI_TOOLKITS[mm]
    return PypiToolkit(mm, release, dict(zip(_PYPI_TOOLKIT_ORDER, versions)))


# MSVC (docs/COMPAT.md §7.1). nvcc accepts _MSC_VER from NVCC_MSVC_OLDEST (known for the releases
# that build with an older toolset) up to, not including, NVCC_MSVC_REFUSES; each Windows runner
# image's default MSVC, and the oldest CUDA that MSVC's STL accepts (error STL1002 below it).
NVCC_MSVC_REFUSES: Dict[str, int] = dict(_DATA["msvc"]["nvcc_refuses"])
NVCC_MSVC_OLDEST: Dict[str, int] = dict(_DATA["msvc"]["nvcc_oldest"])
RUNNER_MSVC: Dict[str, int] = dict(_DATA["msvc"]["runner_msvc"])
RUNNER_STL_MIN_CUDA: Dict[str, str] = dict(_DATA["msvc"]["runner_stl_min_cuda"])


@dataclass(frozen=True)
class MsvcToolset:
    """An MSVC toolset older than the runner's default, which the runner's Visual Studio
    installer adds (``component``) and ``vcvars64.bat -vcvars_ver=<version>`` selects."""

    version: str  # "14.29": the vcvars_ver, and the start of VCToolsVersion ("14.29.30133")
    msc_ver: int  # its _MSC_VER, 1929
    visual_studio: str  # the release it shipped with, "2019 16.11"
    component: str  # the installer's component id
    stl_min_cuda: str  # the oldest nvcc its STL accepts

    @property
    def vcvars_arg(self) -> str:
        return f"-vcvars_ver={self.version}"


MSVC_TOOLSETS: Dict[str, MsvcToolset] = {
    v: MsvcToolset(v, t["msc_ver"], t["visual_studio"], t["component"], t["stl_min_cuda"])
    for v, t in _DATA["msvc"]["toolsets"].items()
}
# The CUDA releases whose nvcc refuses the runner's MSVC (and whose nvcc the runner's STL
# refuses), and the toolset each builds with instead.
CUDA_MSVC_TOOLSET: Dict[str, str] = dict(_DATA["msvc"]["cuda_toolset"])


def msvc_toolset(cuda: str) -> Optional[MsvcToolset]:
    """The older MSVC toolset a Windows build with CUDA ``cuda`` selects, None for the runner's
    default one."""
    name = CUDA_MSVC_TOOLSET.get(cuda_major_minor(cuda))
    return None if name is None else MSVC_TOOLSETS[name]

# GCC (docs/COMPAT.md §7.2). The newest GCC each nvcc accepts; the oldest GCC that compiles
# torch's C++20 headers with nvcc; the default GCC of each manylinux image cibuildwheel pins.
NVCC_MAX_GCC: Dict[str, int] = dict(_DATA["gcc"]["nvcc_max"])
CXX20_MIN_GCC: int = _DATA["gcc"]["cxx20_min"]
IMAGE_GCC: Dict[str, int] = dict(_DATA["gcc"]["image_gcc"])
# The gcc-toolset a CUDA release needs in the manylinux_2_28 image: where the image's GCC is
# newer than that nvcc accepts, the newest one it does accept.
HOST_GCC: Dict[str, int] = {
    cuda: gcc for cuda, gcc in NVCC_MAX_GCC.items() if gcc < IMAGE_GCC["manylinux_2_28"]
}

# torch's extension builder (docs/COMPAT.md §7.3): the first release that adds ``-ccbin $CC`` to
# every nvcc command on Linux whose flags name no host compiler; the nvcc options that take one
# value (short/long), which may appear at most once on a command line.
TORCH_CCBIN_FROM_CC_SINCE: str = _DATA["torch_extension"]["ccbin_from_cc_since"]
NVCC_SINGLE_VALUED: Tuple[Tuple[str, ...], ...] = tuple(
    tuple(spec.split("/")) for spec in _DATA["torch_extension"]["nvcc_single_valued"]
)

# Libraries wheel repair leaves out: torch's and CUDA's come from the installed torch, the
# MSVC C++ runtime from the system (docs/COMPAT.md §8).
LINUX_EXCLUDES: Tuple[str, ...] = tuple(_DATA["wheel_excludes"]["linux"])
WINDOWS_TORCH_CUDA_EXCLUDES: Tuple[str, ...] = tuple(_DATA["wheel_excludes"]["windows_torch_cuda"])
MSVC_RUNTIME_EXCLUDES: Tuple[str, ...] = tuple(_DATA["wheel_excludes"]["msvc_runtime"])


def nvcc_needs_msvc_override(cuda: str) -> bool:
    """True when nvcc of CUDA ``cuda`` cannot build with the runners' default MSVC 19.4x (nvcc
    refuses it, its STL refuses that nvcc): the build selects an older toolset instead
    (:func:`msvc_toolset`), no flag overrides either check."""
    return msvc_toolset(cuda) is not None


# The oldest NVIDIA driver that runs code built with each CUDA major, through CUDA's minor
# version compatibility (docs/COMPAT.md §10): {"12": {"linux": "525.60.13", "win": "528.33"}}.
CUDA_DRIVERS: Dict[str, Dict[str, str]] = {k: dict(v) for k, v in _DATA["cuda_drivers"].items()}


def min_driver(cuda: str, windows: bool = False) -> Optional[str]:
    """The oldest driver that runs binaries of CUDA ``cuda`` ("12.6"), None for an unknown major."""
    row = CUDA_DRIVERS.get(cuda.split(".")[0])
    return None if row is None else row["win" if windows else "linux"]


def driver_runs(driver: str, cuda: str, windows: bool = False) -> Optional[bool]:
    """Whether NVIDIA driver ``driver`` ("550.54.14") runs CUDA ``cuda`` binaries (None: unknown)."""
    need = min_driver(cuda, windows)
    if need is None:
        return None
    try:
        return versions.key(driver) >= versions.key(need)
    except ValueError:
        return None
