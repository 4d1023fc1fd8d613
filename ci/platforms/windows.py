"""Windows cells (win_amd64): built by cibuildwheel on the runner itself with MSVC, CUDA from
NVIDIA's network installer, repaired by delvewheel."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from mamba_kernels.facts import support
from mamba_kernels.runtime import knobs

from . import base
from .base import CellError, Platform, environment_string

# torch's and CUDA's DLLs come from the installed torch; the MSVC C++ runtime (msvcp140*,
# vcruntime140*, concrt140, vcomp140, vccorlib140) is the system's or the one torch loads first.
# delvewheel 1.13 leaves out only vcruntime140*.dll by itself and would bundle msvcp140.dll; it
# lowercases these and matches them with '*' wildcards. The lists, and the full toolkit versions
# for NVIDIA's Windows network installer, are data in mamba_kernels/facts/support.json
# (docs/COMPAT.md §8, §6).
WINDOWS_TORCH_CUDA_EXCLUDES = support.WINDOWS_TORCH_CUDA_EXCLUDES
MSVC_RUNTIME_EXCLUDES = support.MSVC_RUNTIME_EXCLUDES
WINDOWS_EXCLUDES = WINDOWS_TORCH_CUDA_EXCLUDES + MSVC_RUNTIME_EXCLUDES
WINDOWS_CUDA = support.WINDOWS_TOOLKITS


# MSVC (docs/COMPAT.md §7.1). nvcc before 12.4 refuses the runner's MSVC 19.4x and that MSVC's STL
# refuses nvcc before 12.4, so those cells build with an older toolset (support.msvc_toolset):
# build_cell loads the developer prompt with `vcvars64.bat -vcvars_ver=<toolset>` (runner_env),
# after the runner's Visual Studio installer has added the toolset where it is missing. The
# cell's environment names the toolset (MSVC_TOOLSET_VAR), so that provision can check the
# prompt it runs in is that one, and ci/preflight.py that nvcc accepts it.
MSVC_TOOLSET_VAR = knobs.CI_MSVC_TOOLSET_VAR
# The Visual Studio installer's exit statuses that mean done (3010: done, a restart is pending).
VS_INSTALLER_OK = (0, 3010)
# How long to wait for the toolset's compiler after the installer returns (it may return before
# its setup process is done), in seconds.
VS_INSTALL_WAIT_S = 1800


def cell_msvc_toolset(cell: support.Cell) -> Optional[support.MsvcToolset]:
    """The older MSVC toolset the cell builds with; None for one that builds with the runner's
    default MSVC, and for a Linux cell."""
    if not WINDOWS.handles(cell):
        return None
    return support.msvc_toolset(cell.cuda)


def _installer_dir() -> Path:
    root = Path(os.environ.get("ProgramFiles(x86)", r"C:\Program Files (x86)"))
    return root / "Microsoft Visual Studio" / "Installer"


def visual_studio() -> Path:
    """The installation folder of the newest Visual Studio (vswhere)."""
    vswhere = _installer_dir() / "vswhere.exe"
    if not vswhere.is_file():
        raise CellError(f"{vswhere} not found: install Visual Studio 2022 Build Tools")
    vs = subprocess.run(
        [str(vswhere), "-latest", "-products", "*", "-property", "installationPath"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(vs)


def toolset_installed(vs: Path, toolset: support.MsvcToolset) -> bool:
    """Whether Visual Studio at ``vs`` holds the x64 compiler of ``toolset`` (VC/Tools/MSVC/14.29.*)."""
    found = (vs / "VC" / "Tools" / "MSVC").glob(toolset.version + ".*")
    return any((d / "bin" / "Hostx64" / "x64" / "cl.exe").is_file() for d in found)


def toolset_install_command(vs: Path, toolset: support.MsvcToolset) -> List[str]:
    """The Visual Studio installer adding ``toolset``'s component to the installation at ``vs``,
    silently (the runner's Visual Studio is an administrator install; the job runs elevated)."""
    return [str(_installer_dir() / "vs_installer.exe"), "modify", "--installPath", str(vs),
            "--add", toolset.component, "--quiet", "--norestart", "--nocache"]


def install_msvc_toolset(vs: Path, toolset: support.MsvcToolset) -> None:
    """Add ``toolset`` to Visual Studio at ``vs`` unless it is there; wait for its compiler."""
    if toolset_installed(vs, toolset):
        base.log(f"MSVC toolset {toolset.version} is installed in {vs}")
        return
    cmd = toolset_install_command(vs, toolset)
    base.log("$ " + " ".join(cmd))
    # started from another folder than the installer's own, as the installer requires
    r = subprocess.run(cmd, cwd=tempfile.gettempdir())
    if r.returncode not in VS_INSTALLER_OK:
        raise CellError(f"the Visual Studio installer failed (exit status {r.returncode}): {' '.join(cmd)}")
    deadline = time.monotonic() + VS_INSTALL_WAIT_S
    while not toolset_installed(vs, toolset):
        if time.monotonic() > deadline:
            raise CellError(f"the Visual Studio installer did not add MSVC {toolset.version} "
                            f"({toolset.component}) to {vs} within {VS_INSTALL_WAIT_S} s")
        time.sleep(10)


def vcvars_command(bat: Path, toolset: Optional[support.MsvcToolset] = None) -> str:
    """The cmd line printing the environment of the x64 developer prompt, of ``toolset`` if given
    (else Visual Studio's default toolset)."""
    arg = f" {toolset.vcvars_arg}" if toolset else ""
    return f'cmd /s /c ""{bat}"{arg} >nul && set"'


def msvc_env(toolset: Optional[support.MsvcToolset] = None) -> Dict[str, str]:
    """The environment of the MSVC x64 developer prompt (vcvars64.bat of the Visual Studio vswhere
    finds), of ``toolset`` if given: installed first where it is missing, and checked to be the
    one the prompt loaded (VCToolsVersion)."""
    vs = visual_studio()
    if toolset is not None:
        install_msvc_toolset(vs, toolset)
    bat = vs / "VC" / "Auxiliary" / "Build" / "vcvars64.bat"
    out = subprocess.run(vcvars_command(bat, toolset), capture_output=True, text=True, shell=True)
    if out.returncode != 0:
        raise CellError(f"{bat} failed: {(out.stderr.strip() or out.stdout.strip())[:300]}")
    env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    if toolset is not None:
        problem = msvc_environment_problem(toolset, env)
        if problem:
            raise CellError(f"{bat} {toolset.vcvars_arg}: {problem}")
    return env


def _tools_version(environ: Dict[str, str]) -> str:
    # Windows' environment names are case-insensitive; the prompt spells it VCToolsVersion
    for k, v in environ.items():
        if k.lower() == "vctoolsversion":
            return v.strip()
    return ""


def msvc_environment_problem(
    toolset: Optional[support.MsvcToolset], environ: Dict[str, str]
) -> Optional[str]:
    """Why ``environ`` is not the developer prompt of ``toolset`` (None: it is, or no toolset is
    asked for and the runner's default serves)."""
    if toolset is None:
        return None
    have = _tools_version(environ)
    if not have.startswith(toolset.version + "."):
        return (f"the MSVC environment is VCToolsVersion {have or '(none)'}, the cell builds with toolset "
                f"{toolset.version} (Visual Studio {toolset.visual_studio}): load vcvars64.bat "
                f"{toolset.vcvars_arg} (ci/platforms/windows.py runner_env)")
    return None


def install_windows_toolkit(cell: support.Cell) -> Path:
    """NVIDIA's network installer, silent, compiler and runtime only."""
    full = WINDOWS_CUDA.get(cell.cuda)
    if full is None or cell.cuda not in support.WINDOWS_COMPONENTS:
        raise CellError(
            f"no Windows installer version or components known for CUDA {cell.cuda}; add them to "
            "windows_toolkits and windows_components in mamba_kernels/facts/support.json"
        )
    home = Path(WINDOWS.toolkit_home(cell))
    if (home / "bin" / "nvcc.exe").is_file():
        return home
    url = (
        f"https://developer.download.nvidia.com/compute/cuda/{full}/network_installers/"
        f"cuda_{full}_windows_network.exe"
    )
    exe = Path(tempfile.gettempdir()) / f"cuda_{full}.exe"
    base.log(f"downloading {url}")
    base.download(url, exe)  # retried on network failures (base.download)
    # The subpackage names differ per release (crt and nvvm are their own from 13.0 on, and an
    # older installer stops at a name it does not know): data, docs/COMPAT.md §6.2.
    base.sh([str(exe), "-s"] + list(support.windows_components(cell.cuda)) + ["-n"])
    if not (home / "bin" / "nvcc.exe").is_file():
        raise CellError(f"the CUDA {full} installer did not create {home}\\bin\\nvcc.exe")
    return home


def windows_compiler_env(cell: support.Cell) -> Dict[str, str]:
    """The MSVC toolset a cell older than CUDA 12.4 builds with, named for provision's check and
    the preflight's (the prompt itself comes from runner_env); {} for every other cell, a Linux
    one included. No flag silences nvcc's check of the host compiler or the STL's check of nvcc:
    the toolset is one both accept (docs/COMPAT.md §7.1)."""
    toolset = cell_msvc_toolset(cell)
    return {} if toolset is None else {MSVC_TOOLSET_VAR: toolset.version}


class Windows(Platform):
    name = "windows"
    tags = tuple(p.name for p in support.PLATFORM_RECORDS if p.os == "windows")
    host_compiler = "msvc"
    in_container = False
    path_sep = ";"

    def toolkit_home(self, cell: support.Cell) -> str:
        return rf"C:\Program Files\NVIDIA GPU Computing Toolkit\CUDA\v{cell.cuda}"

    def provision_toolkit(self, cell: support.Cell, python: str) -> None:
        # The build inherits the developer prompt cibuildwheel was started in: stop here, not an
        # hour into the compile, when it is not the toolset the cell needs.
        problem = msvc_environment_problem(cell_msvc_toolset(cell), dict(os.environ))
        if problem:
            raise CellError(problem)
        install_windows_toolkit(cell)

    def compiler_env(self, cell: support.Cell) -> Dict[str, str]:
        return windows_compiler_env(cell)

    def cibuildwheel_env(
        self, cell: support.Cell, extra: Dict[str, str], compiler: Dict[str, str], host_cache: str
    ) -> Dict[str, str]:
        """No container and no compiler cache: the toolkit and MSVC are the runner's."""
        home = extra["CUDA_HOME"]
        extra = dict(extra, CUDA_PATH=home, DISTUTILS_USE_SDK="1", **compiler)
        value = environment_string(extra, path_prefix=self.bin_dir(home), path_sep=self.path_sep)
        return {"CIBW_ENVIRONMENT_WINDOWS": value}

    def build_tools(self) -> List[str]:
        return []

    def torch_dir(self) -> Path:
        return Path(tempfile.gettempdir()) / "mamba-kernels-torch"

    def repair_command(
        self, cell: support.Cell, wheel: Path, dest: Path, torch_lib: Optional[str], plat: Optional[str]
    ) -> Tuple[List[str], Optional[Dict[str, str]]]:
        cmd = ["delvewheel", "repair", "-w", str(dest), "--no-mangle-all"]
        cmd += ["--exclude", ";".join(WINDOWS_EXCLUDES)]
        if torch_lib:
            cmd += ["--add-path", torch_lib]
        return cmd + [str(wheel)], None

    def runner_env(self, cell: Optional[support.Cell] = None) -> Dict[str, str]:
        """The developer prompt for ``cell``: its older toolset where it has one (installed by the
        runner's Visual Studio installer first where missing), else Visual Studio's default."""
        return msvc_env(None if cell is None else cell_msvc_toolset(cell))

    def builds_locally(self, cell: support.Cell) -> bool:
        return False

    def runs_here(self) -> bool:
        return sys.platform == "win32"

    def why_not_built_here(self, cell: support.Cell) -> Optional[str]:
        return "a Windows cell: needs a Windows runner (MSVC, NVIDIA's installer, delvewheel)"

    def executable_names(self, tool: str) -> List[str]:
        return [f"{tool}.exe", tool]

    def bin_dir(self, home: str) -> str:
        return home + "\\bin"

    def intended_environment(self, cell: support.Cell, home: str) -> Dict[str, str]:
        # CUDA_PATH is what NVIDIA's installer sets; DISTUTILS_USE_SDK: MSVC from the prompt's
        # environment, which is the older toolset's where the cell has one (support.msvc_toolset)
        want = {"CUDA_PATH": home, "DISTUTILS_USE_SDK": "1"}
        toolset = support.msvc_toolset(cell.cuda)
        if toolset is not None:
            want[MSVC_TOOLSET_VAR] = toolset.version
        return want

    def container_arch(self, cell: support.Cell) -> Optional[str]:
        return None

    def wheel_platforms(self, tag: str, glibc: Optional[Tuple[int, int]]) -> List[str]:
        return [tag]

    def pypi_torch_is_cuda(self, cell: support.Cell) -> bool:
        return False

    def pypi_file_tag(self, filename: str) -> Optional[str]:
        name = filename[:-len(".whl")].rsplit("-", 1)[-1]
        return name if name in self.tags else None


WINDOWS = Windows()
