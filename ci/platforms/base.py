"""What every platform's cell builder shares: the error type, logging and running commands,
the CIBW_ENVIRONMENT quoting, and the interface each platform module implements."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from mamba_kernels.facts import support


class CellError(RuntimeError):
    """A step of the cell failed; the message says which and why."""


def log(msg: str) -> None:
    print(f"[build_cell] {msg}", file=sys.stderr, flush=True)


def sh(cmd: List[str], env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None) -> None:
    log("$ " + " ".join(cmd))
    r = subprocess.run(cmd, env=env, cwd=cwd)
    if r.returncode != 0:
        raise CellError(f"command failed with exit status {r.returncode}: {' '.join(cmd)}")


def _bash_double_quoted(value: str) -> str:
    """``value`` inside bash double quotes, read back literally: cibuildwheel evaluates
    CIBW_ENVIRONMENT as bash does, where a lone backslash before most characters is dropped
    (``"C:\\Program Files"`` would arrive as ``C:Program Files``)."""
    for ch in ("\\", '"', "$", "`"):
        value = value.replace(ch, "\\" + ch)
    return value


def environment_string(values: Dict[str, str], path_prefix: Optional[str] = None, path_sep: str = ":") -> str:
    """A CIBW_ENVIRONMENT value that cibuildwheel's parser turns into exactly ``values``, plus
    ``PATH=<path_prefix><path_sep>$PATH`` when ``path_prefix`` is given."""
    items = [f'{k}="{_bash_double_quoted(v)}"' for k, v in values.items()]
    if path_prefix is not None:
        items.append(f'PATH="{_bash_double_quoted(path_prefix + path_sep)}$PATH"')
    return " ".join(items)


class Platform:
    """One platform's cell builder (like cibuildwheel's platforms/linux.py, windows.py): where
    the toolkit lives and how it is provisioned, the cibuildwheel environment's platform part,
    the repair command, and what the build and test environments need beyond the shared steps.
    ci/build_cell.py holds the shared steps (torch, verify, the CLI) and ci/preflight.py the
    checks; both pick one of these with ``platforms.for_cell``."""

    #: cibuildwheel's name of the platform ("linux", "windows").
    name: str = ""
    #: The wheel platform tags (support.PLATFORMS) this builder serves.
    tags: Tuple[str, ...] = ()
    #: The family of the host compiler nvcc drives ("gcc", "msvc"): torch's nvcc flags and the
    #: compiler rules ci/preflight.py applies follow from it.
    host_compiler: str = ""
    #: Whether cibuildwheel builds in a container (an image on the runner's disk, the project
    #: copied into it, the compiler cache mounted into it).
    in_container: bool = False
    #: The separator of PATH's entries.
    path_sep: str = ""

    def handles(self, cell: support.Cell) -> bool:
        return cell.platform in self.tags

    def toolkit_home(self, cell: support.Cell) -> str:
        """CUDA_HOME of the cell's toolkit in CI (what provision_toolkit creates)."""
        raise NotImplementedError

    def provision_toolkit(self, cell: support.Cell, python: str) -> None:
        """Install the cell's CUDA toolkit at toolkit_home (``python``: the build environment's)."""
        raise NotImplementedError

    def compiler_env(self, cell: support.Cell) -> Dict[str, str]:
        """Environment that makes the cell's nvcc accept the build's host compiler ({} if none)."""
        raise NotImplementedError

    def cibuildwheel_env(
        self, cell: support.Cell, extra: Dict[str, str], compiler: Dict[str, str], host_cache: str
    ) -> Dict[str, str]:
        """The platform's CIBW_* entries: CIBW_ENVIRONMENT_<OS> from the shared ``extra`` values
        and the ``compiler`` environment, plus image and container settings. ``host_cache``:
        the host folder of the compiler cache."""
        raise NotImplementedError

    def build_tools(self) -> List[str]:
        """pip requirements the build environment needs beyond the shared build tools."""
        raise NotImplementedError

    def torch_dir(self) -> Path:
        """Default folder of the cell's torch, shared by the build and the test environment."""
        raise NotImplementedError

    def repair_command(
        self, cell: support.Cell, wheel: Path, dest: Path, torch_lib: Optional[str], plat: Optional[str]
    ) -> Tuple[List[str], Optional[Dict[str, str]]]:
        """The repair tool's command line (and environment, None: inherited) writing the repaired
        ``wheel`` into ``dest`` with torch's and CUDA's libraries left out."""
        raise NotImplementedError

    def runner_env(self) -> Dict[str, str]:
        """Environment cibuildwheel itself needs on this machine (e.g. the MSVC prompt's)."""
        raise NotImplementedError

    def builds_locally(self, cell: support.Cell) -> bool:
        """Whether ``python -m ci.build_cell local`` can build the cell on this machine."""
        raise NotImplementedError

    def runs_here(self) -> bool:
        """Whether this process runs on this platform."""
        raise NotImplementedError

    def executable_names(self, tool: str) -> List[str]:
        """The file names ``tool`` may have in a bin/ folder, preferred first."""
        raise NotImplementedError

    def bin_dir(self, home: str) -> str:
        """The bin/ folder of the toolkit at ``home``, written as this platform writes paths."""
        raise NotImplementedError

    def intended_environment(self, cell: support.Cell, home: str) -> Dict[str, str]:
        """What the cell's build environment must hold beyond the shared values and PATH, stated
        on its own (not read from cibuildwheel_env) so that ci/preflight.py can check that."""
        raise NotImplementedError

    def container_arch(self, cell: support.Cell) -> Optional[str]:
        """cibuildwheel's architecture name of the cell's manylinux image; None without a container."""
        raise NotImplementedError

    def wheel_platforms(self, tag: str, glibc: Optional[Tuple[int, int]]) -> List[str]:
        """The wheel platform tags pip accepts on ``tag`` (with glibc ``glibc`` on Linux), best first."""
        raise NotImplementedError

    def pypi_torch_is_cuda(self, cell: support.Cell) -> bool:
        """Whether PyPI's torch wheel for the cell's platform is a CUDA build (the release's default
        variant's)."""
        raise NotImplementedError

    def pypi_file_tag(self, filename: str) -> Optional[str]:
        """Which of this platform's tags a PyPI file of torch is for, or None."""
        raise NotImplementedError


#: The methods every platform implements (tests check both platforms define each).
INTERFACE = tuple(
    n for n, v in vars(Platform).items() if callable(v) and not n.startswith("_") and n != "handles"
)
