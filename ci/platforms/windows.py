"""Windows cells (win_amd64): built by cibuildwheel on the runner itself with MSVC, CUDA from
NVIDIA's network installer, repaired by delvewheel."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from mamba_kernels.facts import support

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


def msvc_env() -> Dict[str, str]:
    """The environment of the MSVC x64 developer prompt (vcvars64.bat), found with vswhere."""
    vswhere = Path(os.environ.get("ProgramFiles(x86)", r"C:\Program Files (x86)")) / (
        r"Microsoft Visual Studio\Installer\vswhere.exe"
    )
    if not vswhere.is_file():
        raise CellError(f"{vswhere} not found: install Visual Studio 2022 Build Tools")
    vs = subprocess.run(
        [str(vswhere), "-latest", "-products", "*", "-property", "installationPath"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    bat = Path(vs) / "VC" / "Auxiliary" / "Build" / "vcvars64.bat"
    out = subprocess.run(f'cmd /s /c ""{bat}" >nul && set"', capture_output=True, text=True, shell=True)
    if out.returncode != 0:
        raise CellError(f"{bat} failed: {out.stderr.strip()[:200]}")
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


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
    """Flags that make an nvcc older than 12.4 accept the runners' MSVC 19.4x (support.py);
    {} for every other cell, a Linux one included. nvcc reads NVCC_APPEND_FLAGS itself; cl.exe
    reads CL itself, for the C++ files and for the host side of every nvcc compile, so no build
    script has to pass them on."""
    if not WINDOWS.handles(cell) or not support.nvcc_needs_msvc_override(cell.cuda):
        return {}
    define = support.MSVC_OVERRIDE_DEFINE
    return {"NVCC_APPEND_FLAGS": f"-allow-unsupported-compiler -D{define}", "CL": f"/D{define}"}


class Windows(Platform):
    name = "windows"
    tags = ("win_amd64",)
    host_compiler = "msvc"
    in_container = False
    path_sep = ";"

    def toolkit_home(self, cell: support.Cell) -> str:
        return rf"C:\Program Files\NVIDIA GPU Computing Toolkit\CUDA\v{cell.cuda}"

    def provision_toolkit(self, cell: support.Cell, python: str) -> None:
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

    def runner_env(self) -> Dict[str, str]:
        return msvc_env()

    def builds_locally(self, cell: support.Cell) -> bool:
        return False

    def runs_here(self) -> bool:
        return sys.platform == "win32"

    def executable_names(self, tool: str) -> List[str]:
        return [f"{tool}.exe", tool]

    def bin_dir(self, home: str) -> str:
        return home + "\\bin"

    def intended_environment(self, cell: support.Cell, home: str) -> Dict[str, str]:
        # CUDA_PATH is what NVIDIA's installer sets; DISTUTILS_USE_SDK: MSVC from the prompt's environment
        return {"CUDA_PATH": home, "DISTUTILS_USE_SDK": "1"}

    def container_arch(self, cell: support.Cell) -> Optional[str]:
        return None

    def wheel_platforms(self, tag: str, glibc: Optional[Tuple[int, int]]) -> List[str]:
        return [tag]

    def pypi_torch_is_cuda(self, cell: support.Cell) -> bool:
        return False

    def pypi_file_tag(self, filename: str) -> Optional[str]:
        return "win_amd64" if "win_amd64" in filename else None


WINDOWS = Windows()
