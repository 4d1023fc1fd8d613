"""Preflight: check every cell of the release matrix for what can be known without a GPU or a
runner, before a tag spends hours of runner time finding out.

  python -m ci.preflight            every check, the registries (PyPI, PyTorch's index) included
  python -m ci.preflight --offline  every check but the registries'
  python -m ci.preflight --no-torch-index  every check but PyTorch's index
  python -m ci.preflight -v         also one line per cell with its disk estimate

Output: one line per failing cell (``FAIL <cell id>: <check>: <reason>; ...``), one line per
failing job matrix, then one summary line. Exit status 0 only when every cell passes.

Checks, per cell:

- ``environment``: the CIBW_ENVIRONMENT_* value build_cell.py generates, evaluated by
  cibuildwheel's own parser, gives the intended CUDA_HOME, PATH, CUDA_PATH, PYTORCH_NVCC...;
  the cell's build identifier is one cibuildwheel builds (its own platform list and build
  selector, with ci/cibuildwheel.toml's skip list) and its manylinux image is one it pins.
- ``python``: the cell's Python is in the support table's range for its platform (a stable
  cell: CPython 3.10, which its build torch and its test torch both ship for the platform).
- ``stable`` (stable cells, docs/COMPAT.md §11): the cell targets the stable-ABI floor; its
  build torch is a release that ships a CUDA variant of the cell's major on the platform; its
  test torch ships a variant of that major with a minor not below the cell's.
- ``compiler``: the host compiler nvcc will meet is one that CUDA release accepts: on Windows
  the runner's MSVC, or the older toolset the cell's environment names (the prompt build_cell
  loads), within the _MSC_VER range of that nvcc, and an MSVC whose STL accepts that nvcc; on
  Linux the image's GCC, or the gcc-toolset CC/CXX/-ccbin name.
- ``registry`` (online): every pinned package of the cell (the PyPI CUDA toolkit components
  and cuobjdump) exists on PyPI with a wheel for the cell's platform and Python; the cell's
  torch release has a wheel for that Python and platform on PyPI.
- ``torch-index`` (online): the exact build of the cell's build torch and of its test torch
  (``torch==X.Y.Z+cuXYZ``, the newest patch: build_cell.newest_torch_build, the rule the cell
  drivers pin by) is on PyTorch's index of its CUDA variant, with a wheel for the cell's Python
  and platform. Where that index cannot be read (the development machine), the summary says so,
  and the ``registry`` check of PyPI's wheel stands in (the very build only for the Linux x86_64
  cells of a release's PyPI variant).
- ``disk``: an estimate of the disk a cell uses at its peak, against the runner's free disk.

and per job matrix (release.yml runs one build job, with one matrix, per platform): at most
256 jobs, GitHub's limit for one matrix, with the headroom reported. Over the stable cells of
each platform: every CUDA variant every release from 2.10 on ships there is served by one of
them (same CUDA major, the cell's minor not above the variant's).

This module holds the checks and the run; what they read is in modules of its own: the
registries (ci/registries.py), the nvcc command lines of a build (ci/nvcc_lines.py) and the
disk estimate (ci/disk.py).
"""

from __future__ import annotations

import argparse
import configparser
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

# plan: the plan step's matrices, whose size GitHub limits
from ci import build_cell, cell_fields, disk, nvcc_lines, plan, platforms, registries
from mamba_kernels.facts import support, versions
from mamba_kernels.release import matrix
from mamba_kernels.runtime import knobs

ROOT = Path(__file__).resolve().parent.parent

# ----------------------------------------------------------------------------- facts

# GitHub's limit on the jobs one matrix may generate.
MATRIX_LIMIT = cell_fields.GITHUB_MATRIX_LIMIT
# release.yml's plan step splits the cells into one matrix per platform, each run by its own
# build job (build-linux-x86_64, build-linux-aarch64, build-windows via build-cells.yml).
RELEASE_WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"

# PATH of the runner before CIBW_ENVIRONMENT prepends to it (any value will do: the check is
# that ours comes first and the runner's is kept).
RUNNER_PATH = {
    "linux": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "windows": r"C:\Windows\system32;C:\hostedtoolcache\windows\Python\3.12.10\x64;C:\Program Files\Git\bin",
}

# Host compilers nvcc accepts (docs/COMPAT.md §7; the facts are data in mamba_kernels/facts/support.json,
# copied here so a test can vary them). nvcc's crt/host_config.h stops the compile ("unsupported
# GNU version" / "unsupported Microsoft Visual Studio version") when the host compiler is newer
# than the CUDA release knows.
# Newest GCC per CUDA release: NVIDIA's installation guides for 11.8 to 12.9; the 13.x figures are
# read from the host_config.h of the PyPI nvidia-cuda-crt wheels this project pins (13.0 and 13.2
# stop above GCC 15, 13.4 above GCC 16). The oldest GCC that compiles torch's C++20 headers with
# nvcc (build_toolchain: GCC >= 10).
NVCC_MAX_GCC: Dict[str, int] = dict(support.NVCC_MAX_GCC)
CXX20_MIN_GCC = support.CXX20_MIN_GCC
# MSVC (docs/COMPAT.md §7.1): the first _MSC_VER each nvcc refuses (before 12.4: 1940, Visual
# Studio 2022 17.10 and later; 12.4 to 13.0: 1950; 13.2 and 13.4: 1960), and the oldest it accepts
# (11.8, 12.1: 1910). The _MSC_VER of each Windows runner image (windows-2022: Visual Studio 2022
# 17.14, 19.44) and the oldest nvcc its STL accepts (12.4; error STL1002 below). The older
# toolsets a cell may select instead (support.msvc_toolset: 14.29 for CUDA 11.8 and 12.1), each
# with its _MSC_VER and its STL's oldest nvcc. No flag overrides either check.
NVCC_MSVC_REFUSES: Dict[str, int] = dict(support.NVCC_MSVC_REFUSES)
NVCC_MSVC_OLDEST: Dict[str, int] = dict(support.NVCC_MSVC_OLDEST)
RUNNER_MSVC: Dict[str, int] = dict(support.RUNNER_MSVC)
RUNNER_STL_MIN_CUDA: Dict[str, str] = dict(support.RUNNER_STL_MIN_CUDA)
MSVC_TOOLSETS: Dict[str, support.MsvcToolset] = dict(support.MSVC_TOOLSETS)
# The variable of a Windows cell's environment naming the toolset its prompt is loaded with.
MSVC_TOOLSET_VAR = platforms.windows.MSVC_TOOLSET_VAR
# The GCC on PATH in each manylinux image that cibuildwheel 4.3.5 pins (its 2026.10.26 images):
# manylinux2014 has devtoolset-10, manylinux_2_28 gcc-toolset-14 (pypa/manylinux moved it to 15 on
# 2026-01-03 and reverted that the same day; docs/COMPAT.md §7.2).
IMAGE_GCC: Dict[str, int] = dict(support.IMAGE_GCC)

cell_glibc = build_cell.cell_glibc


# ----------------------------------------------------------------------------- per cell


@dataclass
class CellReport:
    cell_id: str
    problems: List[str] = field(default_factory=list)
    disk_gb: float = 0.0
    disk_parts: Dict[str, float] = field(default_factory=dict)
    # Whether PyTorch's index pages of the cell's torches were read (the torch-index check made).
    exact_torch_checked: bool = False

    def fail(self, check: str, reason: str) -> None:
        self.problems.append(f"{check}: {reason}")


def cibw_environment(cell: support.Cell, env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The cell's environment as cibuildwheel itself evaluates CIBW_ENVIRONMENT_<OS>."""
    # cibuildwheel: the test extra and the release jobs have it, the other checks run without it
    from cibuildwheel.environment import parse_environment

    env = build_cell.cibuildwheel_env(cell) if env is None else env
    kind = platforms.for_cell(cell).name
    key = f"CIBW_ENVIRONMENT_{kind.upper()}"
    if key not in env:
        raise ValueError(f"{key} is not set")
    return parse_environment(env[key]).as_dictionary({"PATH": RUNNER_PATH[kind]})


def _cibuildwheel_identifiers(kind: str) -> Set[str]:
    import cibuildwheel  # the test extra and the release jobs have it (see cibw_environment)

    path = Path(cibuildwheel.__file__).parent / "resources" / "build-platforms.toml"
    data = tomllib.loads(path.read_text())
    return {c["identifier"] for c in data[kind]["python_configurations"]}


def _cibuildwheel_images() -> Dict[str, Set[str]]:
    import cibuildwheel  # the test extra and the release jobs have it (see cibw_environment)

    cfg = configparser.ConfigParser()
    cfg.read(Path(cibuildwheel.__file__).parent / "resources" / "pinned_docker_images.cfg")
    return {arch: set(cfg[arch]) for arch in cfg.sections()}


def _skip_config() -> str:
    skip = tomllib.loads(build_cell.CIBW_CONFIG.read_text())["tool"]["cibuildwheel"].get("skip", [])
    return " ".join(skip) if isinstance(skip, list) else str(skip)


def _requires_python() -> SpecifierSet:
    return SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])


def check_environment(cell: support.Cell, report: CellReport, env: Optional[Mapping[str, str]] = None
                      ) -> Optional[Dict[str, str]]:
    """cibuildwheel's view of the cell's environment and identifier; returns the parsed environment."""
    from cibuildwheel.selector import BuildSelector  # the test extra and the release jobs have it

    env = build_cell.cibuildwheel_env(cell) if env is None else env
    try:
        got = cibw_environment(cell, env)
    except Exception as e:  # cibuildwheel's parse errors, a missing key
        report.fail("environment", f"cibuildwheel cannot parse it: {e}")
        return None
    plat = platforms.for_cell(cell)
    kind = plat.name
    home = build_cell.toolkit_home(cell)
    want = {"CUDA_HOME": home, knobs.RELEASE_VAR: "1", knobs.BINDING_VAR: matrix.binding(cell)}
    want.update(plat.intended_environment(cell, home))
    want["PATH"] = plat.bin_dir(home) + plat.path_sep + RUNNER_PATH[kind]
    for k, v in want.items():
        if got.get(k) != v:
            report.fail("environment", f"cibuildwheel reads {k}={got.get(k)!r}, intended {v!r}")
    ident = cell_fields.cibuildwheel_identifier(cell)
    if env.get("CIBW_BUILD") != ident:
        report.fail("environment", f"CIBW_BUILD={env.get('CIBW_BUILD')!r}, the cell is {ident!r}")
    if ident not in _cibuildwheel_identifiers(kind):
        report.fail("environment", f"cibuildwheel has no build {ident!r}")
    selector = BuildSelector(build_config=env.get("CIBW_BUILD", ""), skip_config=_skip_config(),
                             requires_python=_requires_python())
    if not selector(ident):
        report.fail("environment", f"cibuildwheel's selector (CIBW_BUILD, ci/cibuildwheel.toml skip, "
                                   f"requires-python) does not select {ident!r}")
    arch = plat.container_arch(cell)
    if arch is not None:
        image = env.get(f"CIBW_MANYLINUX_{arch.upper()}_IMAGE")
        if image not in _cibuildwheel_images().get(arch, set()):
            report.fail("environment", f"CIBW_MANYLINUX_{arch.upper()}_IMAGE={image!r} is not an image "
                                       f"cibuildwheel pins for {arch}")
        elif image != cell_fields.cibw_image(cell):
            report.fail("environment", f"image {image!r} is not the cell's {cell.manylinux}")
    return got


def check_python(cell: support.Cell, report: CellReport) -> None:
    if cell.stable and cell.python != support.STABLE_ABI_PYTHON:
        report.fail("python", f"a stable cell is CPython {support.STABLE_ABI_PYTHON} (cp"
                              f"{support.STABLE_ABI_PYTHON.replace('.', '')}-abi3), not {cell.python}")
    # A classic cell builds and tests with its own torch; a stable one with two others.
    torches = {"torch": cell.torch} if not cell.stable else {
        "build torch": cell.build_with[0], "test torch": cell.test_with[0]}
    for what, torch in torches.items():
        allowed = support.torch_release(torch).pythons_on(cell.platform)
        if cell.python not in allowed:
            report.fail("python", f"{what} {torch} on {cell.platform} covers Python "
                                  f"{', '.join(allowed) or 'none'}, not {cell.python}")
    if versions.key(cell.python) < support.MIN_PYTHON:
        report.fail("python", f"{cell.python} is older than this package's minimum "
                              f"{'.'.join(map(str, support.MIN_PYTHON))}")


def _major(cuda: str) -> str:
    return cuda.split(".")[0]


def check_stable(cell: support.Cell, report: CellReport) -> None:
    """A stable cell's target, build torch and test torch fit its CUDA (nothing for a classic one)."""
    if not cell.stable:
        return
    if cell.torch != support.STABLE_ABI_MIN_TORCH:
        report.fail("stable", f"targets torch {cell.torch}, the stable-ABI floor is "
                              f"{support.STABLE_ABI_MIN_TORCH}")
    build, build_cuda = cell.build_with
    if build_cuda not in support.torch_release(build).cuda[cell.platform]:
        report.fail("stable", f"build torch {build} has no CUDA {build_cuda} build for {cell.platform}")
    elif _major(build_cuda) != _major(cell.cuda):
        report.fail("stable", f"build torch {build}'s CUDA {build_cuda} is not nvcc {cell.cuda}'s major "
                              "(torch's extension builder refuses another major)")
    test, test_cuda = cell.test_with
    if test_cuda not in support.torch_release(test).cuda[cell.platform]:
        report.fail("stable", f"test torch {test} has no CUDA {test_cuda} build for {cell.platform}")
    elif _major(test_cuda) != _major(cell.cuda) or versions.key(test_cuda) < versions.key(cell.cuda):
        report.fail("stable", f"test torch {test}'s CUDA {test_cuda} cannot run a CUDA {cell.cuda} binary "
                              "(same major, minor not below the binary's)")
    if versions.key(test) < versions.key(cell.torch):
        report.fail("stable", f"test torch {test} is older than the target {cell.torch}")


def check_stable_coverage(cells: Sequence[support.Cell]) -> List[str]:
    """One line per CUDA variant of a release from the stable-ABI floor on that no stable cell
    in ``cells`` serves, on each platform that has stable cells there."""
    problems = []
    for plat in support.PLATFORMS:
        stable = [c for c in cells if c.stable and c.platform == plat]
        if not stable:
            continue
        for rel in support.stable_releases():
            for cuda in rel.cuda[plat]:
                if not any(_major(c.cuda) == _major(cuda) and versions.key(c.cuda) <= versions.key(cuda)
                           for c in stable):
                    problems.append(f"FAIL stable {plat}: torch {rel.torch} with CUDA {cuda} has no stable "
                                    f"cell (CUDA {_major(cuda)}.x with a minor not above {cuda})")
    return problems


_TOOLSET = re.compile(r"/opt/rh/(?:gcc-toolset|devtoolset)-(\d+)/root/usr/bin/(?:gcc|g\+\+|cc|c\+\+)$")


def _gcc_of(path: str) -> Optional[int]:
    m = _TOOLSET.search(path)
    return int(m.group(1)) if m else None


# ----------------------------------------------------------------------------- nvcc command lines

def check_nvcc(cell: support.Cell, report: CellReport, env: Mapping[str, str]) -> Dict[str, List[str]]:
    """No nvcc command the build runs gives a single-valued option twice; returns the lines."""
    lines = nvcc_lines.nvcc_command_lines(cell, env)
    from_env = nvcc_lines.option_values(shlex.split(env.get("NVCC_PREPEND_FLAGS", ""))
                             + shlex.split(env.get("NVCC_APPEND_FLAGS", "")))
    for which, args in lines.items():
        for option, values in nvcc_lines.repeated_options(args).items():
            why = (" (one from NVCC_PREPEND_FLAGS/NVCC_APPEND_FLAGS, which torch's check for an "
                   "existing host compiler and our probe cannot see)" if option in from_env else "")
            report.fail("nvcc", f"the {which} command gives nvcc {option} {len(values)} times "
                                f"({', '.join(values)}){why}")
    return lines


def _msc(ver: int) -> str:
    return f"{ver // 100}.{ver % 100}"


def check_msvc(cell: support.Cell, report: CellReport, env: Mapping[str, str]) -> None:
    """The MSVC of a Windows cell's build (the older toolset its environment names, which
    build_cell loads the prompt with, else the runner's default) is in its nvcc's _MSC_VER range,
    and that MSVC's STL accepts the nvcc (error STL1002 otherwise). No flag overrides either."""
    cuda = cell.cuda
    runner = cell_fields.RUNNERS[cell.platform]
    chosen = env.get(MSVC_TOOLSET_VAR, "")
    if chosen:
        toolset = MSVC_TOOLSETS.get(chosen)
        if toolset is None:
            report.fail("compiler", f"{MSVC_TOOLSET_VAR}={chosen!r} is no toolset of msvc.toolsets "
                                    "in mamba_kernels/facts/support.json")
            return
        msvc, stl_min = toolset.msc_ver, toolset.stl_min_cuda
        where = f"MSVC {_msc(msvc)} (toolset {chosen}, Visual Studio {toolset.visual_studio})"
    else:
        msvc, stl_min = RUNNER_MSVC.get(runner), RUNNER_STL_MIN_CUDA.get(runner)
        where = f"{runner}'s MSVC {_msc(msvc)}" if msvc else runner
    refuses = NVCC_MSVC_REFUSES.get(cuda)
    oldest = NVCC_MSVC_OLDEST.get(cuda)
    if msvc is None or stl_min is None or refuses is None or (chosen and oldest is None):
        report.fail("compiler", f"no MSVC fact for {where} or nvcc {cuda}: add it to msvc in "
                                "mamba_kernels/facts/support.json")
        return
    problems = []
    if msvc >= refuses:
        problems.append(f"nvcc {cuda} refuses {where} (it accepts MSVC below {_msc(refuses)})")
    elif oldest is not None and msvc < oldest:
        problems.append(f"nvcc {cuda} refuses {where} (it accepts MSVC {_msc(oldest)} and newer)")
    if versions.key(cuda) < versions.key(stl_min):
        problems.append(f"the STL of {where} refuses nvcc {cuda} (it needs CUDA {stl_min} or newer)")
    if problems:
        need = support.msvc_toolset(cuda)
        hint = (f": the cell must build with toolset {need.version} ({MSVC_TOOLSET_VAR})"
                if need is not None and need.version != chosen else "")
        report.fail("compiler", "; ".join(problems) + hint)


def check_compiler(cell: support.Cell, report: CellReport, env: Mapping[str, str]) -> None:
    """The host compiler nvcc meets is one it accepts (check_msvc on Windows)."""
    cuda = cell.cuda
    if nvcc_lines.host_is_msvc(cell):
        check_msvc(cell, report, env)
        return
    max_gcc = NVCC_MAX_GCC.get(cuda)
    if max_gcc is None:
        report.fail("compiler", f"no GCC fact for nvcc {cuda}: add it to ci/preflight.py")
        return
    image = cell_fields.cibw_image(cell)
    # The host compiler of the C++ files (CXX) and of nvcc (the -ccbin of the compile command as
    # nvcc sees it, torch's and ours included: nvcc_lines.nvcc_command_lines).
    names: Dict[str, str] = {}
    if env.get("CXX"):
        names["CXX"] = env["CXX"]
    ccbin = nvcc_lines.host_compiler_of(nvcc_lines.nvcc_command_lines(cell, env)["build"])
    if ccbin:
        names["nvcc -ccbin"] = ccbin
    chosen: Dict[str, Optional[int]] = {k: _gcc_of(v) for k, v in names.items()}
    unknown = [k for k, v in chosen.items() if v is None]
    if unknown:
        report.fail("compiler", f"cannot tell the GCC version of {', '.join(unknown)} "
                                f"({', '.join(names[k] for k in unknown)})")
        return
    gccs = set(chosen.values())
    if len(gccs) > 1:
        report.fail("compiler", "CXX and nvcc's -ccbin name different GCCs: "
                                + ", ".join(f"{k} {v}" for k, v in chosen.items()))
        return
    gcc = gccs.pop() if gccs else IMAGE_GCC.get(image)
    if gcc is None:
        report.fail("compiler", f"no GCC fact for image {image}: add it to ci/preflight.py")
        return
    where = "gcc-toolset" if chosen else f"{image}'s default"
    if gcc > max_gcc:
        report.fail("compiler", f"nvcc {cuda} accepts GCC up to {max_gcc}, the build uses GCC {gcc} "
                                f"({where})")
    if cell.cxx_std >= 20 and gcc < CXX20_MIN_GCC:
        report.fail("compiler", f"torch {cell.torch} needs C++20, GCC {gcc} ({where}) is older than "
                                f"{CXX20_MIN_GCC}")


def toolkit_pins(cell: support.Cell) -> List[Requirement]:
    """The exact packages the cell installs from PyPI for its CUDA toolkit (none when the toolkit
    comes from NVIDIA's RPM repository or Windows installer)."""
    if cell_fields.toolkit_source(cell) != "pypi":
        return []
    return [Requirement(r) for r in support.pypi_toolkit(cell.cuda).requirements()
            + [support.PYPI_CUOBJDUMP]]


def torch_from_pypi(cell: support.Cell) -> bool:
    """Whether build_cell installs the cell's torch from PyPI itself (no --index-url): it does
    so only when told ``--torch-index pypi``; CI takes every torch from download.pytorch.org."""
    return "--index-url" not in build_cell.torch_install_args(cell, None)


def torch_on_pypi_is_same_build(cell: support.Cell) -> bool:
    """PyPI's torch for the cell's platform is the build of the release's default CUDA variant
    (Linux x86_64's is)."""
    torch, cuda = cell.build_with
    return (platforms.for_cell(cell).pypi_torch_is_cuda(cell)
            and cuda == support.torch_release(torch).pypi_cuda)


def _exact_version(req: Requirement) -> Optional[str]:
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version:
        return specs[0].version
    return None


def check_registry(cell: support.Cell, report: CellReport, registry: registries.Registry) -> None:
    tags = registries.supported_tags(cell.python, cell.platform, cell_glibc(cell))
    where = f"{cell.platform} cp{cell.python.replace('.', '')}"
    unreadable: List[str] = []
    for req in toolkit_pins(cell):
        version = _exact_version(req)
        if version is None:
            report.fail("registry", f"{req} is not an exact pin")
            continue
        try:
            releases = registry.releases(req.name)
        except registries.RegistryError as e:
            unreadable.append(str(e))
            continue
        if releases is None:
            report.fail("registry", f"PyPI has no project {req.name}")
        elif version not in releases:
            report.fail("registry", f"PyPI has no {req.name} {version}")
        elif not registries.wheel_fits(releases[version], tags):
            report.fail("registry", f"PyPI's {req.name} {version} has no wheel for {where}")
    try:
        releases = registry.releases("torch")
    except registries.RegistryError as e:
        unreadable.append(str(e))
        releases = None
    else:
        # The torch the build installs and the one the test installs (one for a classic cell).
        for torch in dict.fromkeys([cell.build_with[0], cell.test_with[0]]):
            spec = SpecifierSet(f"=={torch}.*")
            found = False
            for v, files in (releases or {}).items():
                try:
                    ver = Version(v)
                except InvalidVersion:
                    continue
                if not ver.is_prerelease and ver in spec and registries.wheel_fits(files, tags):
                    found = True
                    break
            if not found:
                report.fail("registry", f"PyPI has no torch {torch}.* wheel for {where}")
    if unreadable:
        more = f" (and {len(unreadable) - 1} more projects)" if len(unreadable) > 1 else ""
        report.fail("registry", unreadable[0] + more)


def torch_index_urls(cell: support.Cell) -> List[str]:
    """PyTorch's indexes the cell's torches come from (its build torch's and its test torch's)."""
    return list(dict.fromkeys(build_cell.torch_index_url(cell, None, which)
                              for which in (build_cell.BUILD, build_cell.TEST)))


def check_torch_index(cell: support.Cell, report: CellReport, index: registries.Registry) -> bool:
    """The exact build of each of the cell's torches is on PyTorch's index of its CUDA variant;
    True when every page it needs was read (else that torch is left to check_registry)."""
    checked = True
    where = f"{cell.platform} cp{cell.python.replace('.', '')}"
    for which in (build_cell.BUILD, build_cell.TEST):
        torch, cuda = build_cell.torch_of(cell, which)
        if which == build_cell.TEST and (torch, cuda) == build_cell.torch_of(cell, build_cell.BUILD):
            continue
        url = build_cell.torch_index_url(cell, None, which)
        try:
            files = index.doc(url)
        except registries.RegistryError:
            checked = False
            continue
        want = f"torch {torch}.*+{matrix.cuda_tag(cuda)}"
        if files is None:
            report.fail("torch-index", f"PyTorch has no index {url} (HTTP 404), so no {want} for {where}")
        elif build_cell.newest_torch_build(cell, which, files) is None:  # type: ignore[arg-type]
            report.fail("torch-index", f"{url} has no {want} wheel for {where}")
    return checked


def check_disk(cell: support.Cell, report: CellReport, env: Mapping[str, str],
               free_gb: float = disk.RUNNER_FREE_DISK_GB) -> None:
    parts = disk.disk_estimate(cell, env)
    report.disk_parts = parts
    peak, phase = disk.disk_peak(cell, parts)
    report.disk_gb = round(peak, 1)
    if report.disk_gb >= free_gb:
        report.fail("disk", f"estimated {report.disk_gb:.1f} GB at its peak ({phase}; parts: "
                            + ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
                            + f") against the runner's {free_gb:.1f} GB free")


def check_cell(cell: support.Cell, registry: Optional[registries.Registry] = None,
               env: Optional[Mapping[str, str]] = None, free_gb: float = disk.RUNNER_FREE_DISK_GB,
               torch_index: Optional[registries.Registry] = None) -> CellReport:
    """Every check of one cell; ``registry`` None skips PyPI's, ``torch_index`` None PyTorch's index."""
    report = CellReport(matrix.cell_id(cell))
    parsed = check_environment(cell, report, env)
    check_python(cell, report)
    check_stable(cell, report)
    if parsed is not None:
        check_nvcc(cell, report, parsed)
        check_compiler(cell, report, parsed)
        check_disk(cell, report, parsed, free_gb)
    if registry is not None:
        check_registry(cell, report, registry)
    if torch_index is not None:
        report.exact_torch_checked = check_torch_index(cell, report, torch_index)
    return report


# ----------------------------------------------------------------------------- per matrix


def workflow_matrices(cells: Sequence[support.Cell]) -> Dict[str, int]:
    """Jobs per build matrix as release.yml generates them: one matrix per platform."""
    return {p: sum(1 for c in cells if c.platform == p) for p in support.PLATFORMS}


def check_matrices(cells: Sequence[support.Cell], limit: int = MATRIX_LIMIT,
                   workflow: Path = RELEASE_WORKFLOW) -> Tuple[List[str], Dict[str, int]]:
    """One problem line per matrix over ``limit``, and the jobs per matrix."""
    jobs = workflow_matrices(cells)
    problems = []
    text = workflow.read_text() if workflow.is_file() else ""
    for p, n in jobs.items():
        if f"needs.plan.outputs.{p}" not in text:
            problems.append(f"FAIL matrix {p}: {workflow.name} no longer runs one build matrix for "
                            f"{p}; ci/preflight.py counts jobs per platform")
        if n > limit:
            problems.append(f"FAIL matrix {p}: {n} jobs, over GitHub's limit of {limit} per matrix")
    return problems, jobs


# ----------------------------------------------------------------------------- run


def preflight(
    cells: Optional[Sequence[support.Cell]] = None,
    registry: Optional[registries.Registry] = None,
    verbose: bool = False,
    out=None,
    env_of: Optional[Callable[[support.Cell], Mapping[str, str]]] = None,
    free_gb: float = disk.RUNNER_FREE_DISK_GB,
    limit: int = MATRIX_LIMIT,
    workflow: Path = RELEASE_WORKFLOW,
    torch_index: Optional[registries.Registry] = None,
) -> int:
    """Check ``cells`` (default: the whole matrix), print the report, return the exit status.
    ``registry``: PyPI's projects; ``torch_index``: PyTorch's index pages (None: not checked).

    Long: the report is the function: each group of checks in the order the report prints it, with its
    counts.
    """
    out = out or sys.stdout
    start = time.monotonic()
    cells = list(support.cells() if cells is None else cells)
    reg_note = "registry checks skipped (--offline)"
    if registry is not None:
        names = {r.name for c in cells for r in toolkit_pins(c)} | {"torch"}
        registry.prefetch(names)
    if torch_index is not None:
        torch_index.prefetch({u for c in cells for u in torch_index_urls(c)})
    reports = []
    for cell in cells:
        try:
            rep = check_cell(cell, registry, env_of(cell) if env_of else None, free_gb, torch_index)
        except Exception as e:  # one line per cell, never a traceback
            rep = CellReport(matrix.cell_id(cell))
            rep.fail("preflight", f"{type(e).__name__}: {e}")
        reports.append(rep)
    matrix_problems, jobs = check_matrices(cells, limit, workflow)
    matrix_problems += check_stable_coverage(cells)
    for rep in reports:
        if rep.problems:
            print(f"FAIL {rep.cell_id}: " + "; ".join(rep.problems), file=out)
        elif verbose:
            print(f"ok   {rep.cell_id}", file=out)
        if verbose:
            print(f"     {rep.cell_id}: disk ~{rep.disk_gb:.1f} GB of {free_gb:.1f} GB ("
                  + ", ".join(f"{k} {v:.1f}" for k, v in rep.disk_parts.items()) + ")", file=out)
    for line in matrix_problems:
        print(line, file=out)
    failed = sum(1 for r in reports if r.problems)
    from_index = sum(1 for c in cells if not torch_from_pypi(c))
    same = sum(1 for c in cells if torch_on_pypi_is_same_build(c))
    if registry is not None:
        errs = registry.errors()
        reg_note = (f"registry: {registry.requests} PyPI projects read"
                    + (f", {len(errs)} unreadable ({errs[0]})" if errs else ""))
    torch_note = (f"torch from download.pytorch.org for {from_index} cells (not reachable here: "
                  f"PyPI's wheel of the same release, Python and platform checked instead, the very "
                  f"build for {same})" if registry is not None else
                  f"torch from download.pytorch.org for {from_index} cells (not checked)")
    if torch_index is not None:
        exact = [c for c, r in zip(cells, reports) if r.exact_torch_checked]
        rest = [c for c, r in zip(cells, reports) if not r.exact_torch_checked]
        errs = torch_index.errors()
        torch_note = (f"torch: the exact build (torch==X.Y.Z+cuXYZ) looked up on PyTorch's index for "
                      f"{len(exact)} of {len(cells)} cells ({torch_index.requests} index pages read")
        if errs:
            same = sum(1 for c in rest if torch_on_pypi_is_same_build(c))
            torch_note += (f", {len(errs)} unreadable: {errs[0]}); for the other {len(rest)}, "
                           + ("PyPI's wheel of the same release, Python and platform checked instead, the "
                              f"very build for {same}" if registry is not None else "nothing checked"))
        else:
            torch_note += ")"
    disk_max = max((r.disk_gb for r in reports), default=0.0)
    margins = []
    for plat in support.PLATFORMS:
        mine = [r.disk_gb for r, c in zip(reports, cells) if c.platform == plat]
        if mine:
            margins.append(f"{plat} {free_gb - max(mine):.1f} GB")
    job_text = ", ".join(f"{p} {n} ({limit - n} left)" for p, n in jobs.items())
    out_bytes = plan.output_bytes(plan.outputs(cells)) if all(n <= limit for n in jobs.values()) else 0
    status = "FAILED" if failed or matrix_problems else "passed"
    print(f"preflight {status}: {len(cells)} cells, {len(cells) - failed} pass, {failed} fail; "
          f"jobs per matrix (limit {limit}): {job_text}; plan outputs {out_bytes / 1024:.0f} KB of "
          f"GitHub's {plan.OUTPUT_LIMIT_BYTES // 1024} KB per job (UTF-16); disk: largest estimate "
          f"{disk_max:.1f} GB of {free_gb:.1f} GB free, margin {', '.join(margins)}; {reg_note}; "
          f"{torch_note}; {time.monotonic() - start:.1f} s",
          file=out)
    return 1 if failed or matrix_problems else 0


def main(argv: Optional[List[str]] = None, fetcher: Optional[registries.Fetcher] = None,
         torch_fetcher: Optional[registries.IndexFetcher] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ci.preflight", description=__doc__.split("\n\n")[0])
    p.add_argument("--offline", action="store_true", help="skip the registry checks (PyPI, PyTorch's index)")
    p.add_argument("--no-torch-index", action="store_true",
                   help="skip PyTorch's index (the exact torch build of every cell); PyPI is still read")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per cell with its disk estimate")
    p.add_argument("--registry-url", default=registries.REGISTRY_URL,
                   help=f"PyPI's JSON API (default {registries.REGISTRY_URL})")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds per registry request (default 15)")
    p.add_argument("--platform", choices=support.PLATFORMS, help="only the cells of this platform")
    p.add_argument("--torch", help="only the cells serving this torch release, e.g. 2.8 (2.10 and newer: "
                                   "the stable cells)")
    args = p.parse_args(argv)
    try:
        cells = matrix.select(platform=args.platform, torch=args.torch)
    except ValueError as e:
        print(f"preflight: error: {e}", file=sys.stderr)
        return 2
    registry = None
    torch_index = None
    if not args.offline:
        fetch = fetcher or registries.http_fetcher(args.registry_url, timeout=args.timeout)
        registry = registries.Registry(fetch)
        if not args.no_torch_index:
            fetch_index = torch_fetcher or registries.torch_index_fetcher(timeout=args.timeout)
            torch_index = registries.Registry(fetch_index)
    return preflight(cells, registry, verbose=args.verbose, torch_index=torch_index)


if __name__ == "__main__":
    raise SystemExit(main())
