"""Linux cells (linux_x86_64, linux_aarch64): built by cibuildwheel inside the cell's manylinux
container, CUDA from PyPI (13.x) or NVIDIA's RPM repository (11.8/12.x), repaired by auditwheel,
compiled through sccache."""

from __future__ import annotations

import os
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ci import cell_fields
from mamba_kernels.facts import support, variant

from . import base
from .base import CellError, Platform, environment_string

# Where provision puts a CUDA toolkit assembled from PyPI inside the manylinux container.
CONTAINER_TOOLKIT = "/opt/mamba-kernels-cuda"
# Libraries the wheel must take from the installed torch and its CUDA packages, and the
# gcc-toolset each CUDA release needs in manylinux_2_28: data in mamba_kernels/facts/support.json
# (docs/COMPAT.md §8, §7.2).
LINUX_EXCLUDES = support.LINUX_EXCLUDES
HOST_GCC = support.HOST_GCC
# cuobjdump (only listing, so one pinned 13.x build serves every cell).
PYPI_CUOBJDUMP = support.PYPI_CUOBJDUMP
SCCACHE_VERSION = "0.16.0"  # the compiler cache on Linux cells, pinned like every CI tool
SCCACHE_CACHE_SIZE = "400M"  # per cache group; about 25 groups fit GitHub's 10 GB per repository


def assemble_pypi_toolkit(cell: support.Cell, dest: Path, python: str = sys.executable) -> Path:
    """Install CUDA ``cell.cuda``'s compiler from PyPI into ``dest`` and return its CUDA_HOME,
    shaped as torch expects: bin/nvcc, include/, lib64/ with an unversioned libcudart.so."""
    major = int(cell.cuda.split(".")[0])
    if major < 13:
        raise CellError(
            f"CUDA {cell.cuda}: PyPI has no complete compiler before 13.x (its 11.8/12.x nvcc "
            "wheels hold only ptxas and libnvvm); install the toolkit from NVIDIA"
        )
    pkgs = dest / "pkgs"
    if not (pkgs / "nvidia" / f"cu{major}" / "bin").is_dir():
        base.sh(
            base.pip_install(python) + ["--quiet", "--no-cache-dir", "--no-deps", "--target", str(pkgs)]
            + support.pypi_toolkit(cell.cuda).requirements()
        )
    home = pkgs / "nvidia" / f"cu{major}"
    tools = dest / "tools"
    if not (tools / "nvidia" / "cu13" / "bin" / "cuobjdump").is_file():
        base.sh(
            base.pip_install(python) + ["--quiet", "--no-cache-dir", "--no-deps", "--target", str(tools)]
            + [PYPI_CUOBJDUMP]
        )
    if not (home / "bin" / "cuobjdump").exists() and (home / "bin").is_dir():
        (home / "bin" / "cuobjdump").symlink_to(tools / "nvidia" / "cu13" / "bin" / "cuobjdump")
    if not (home / "bin" / "nvcc").is_file():
        raise CellError(f"the PyPI CUDA packages did not provide {home}/bin/nvcc")
    lib64 = home / "lib64"
    if not lib64.exists():
        lib64.symlink_to("lib")
    cudart = sorted((home / "lib").glob("libcudart.so.*"))
    if not cudart:
        raise CellError(f"{home}/lib has no libcudart.so.*")
    link = home / "lib" / "libcudart.so"
    if not link.exists():
        link.symlink_to(cudart[0].name)
    return home


# tarfile's extraction filter where this Python has one ("tar": names and links were checked above).
_TAR_FILTER = {"filter": "tar"} if hasattr(__import__("tarfile"), "tar_filter") else {}


def redist_arch(cell: support.Cell) -> str:
    """NVIDIA's name of the cell's architecture in its repositories and archives."""
    return support.PLATFORM_BY_NAME[cell.platform].redist_arch


def cell_toolkit(cell: support.Cell) -> support.LinuxToolkit:
    """Where the cell's CUDA 11.8/12.x toolkit comes from, and what is installed (support.json's
    linux_toolkits, docs/COMPAT.md §6.1)."""
    try:
        return support.linux_toolkit(cell.cuda, cell.manylinux or "", redist_arch(cell))
    except ValueError as e:
        raise CellError(str(e)) from None


def install_repo_toolkit(cell: support.Cell) -> Path:
    """CUDA 11.8/12.x inside a manylinux container: NVIDIA's RPM repository (root needed), or
    NVIDIA's redistributable archives where no repository for the image serves that CUDA."""
    tk = cell_toolkit(cell)
    home = Path(f"/usr/local/cuda-{cell.cuda}")
    if (home / "bin" / "nvcc").is_file():
        return home
    if tk.source == "redist":
        return install_redist_toolkit(cell, tk, home)
    el = tk.source
    arch = redist_arch(cell).split("-", 1)[1]  # x86_64, sbsa
    repo = f"https://developer.download.nvidia.com/compute/cuda/repos/{el}/{arch}/cuda-{el}.repo"
    pm = "yum" if el == "rhel7" else "dnf"
    base.sh(
        [
            "bash",
            "-c",
            f"{pm} install -y yum-utils dnf-plugins-core || true; "
            f"{'yum-config-manager' if el == 'rhel7' else 'dnf config-manager'} --add-repo {repo}",
        ]
    )
    base.sh([pm, "install", "-y"] + list(tk.packages))
    gcc = HOST_GCC.get(cell.cuda)
    if gcc and cell.manylinux == "manylinux_2_28":
        base.sh([pm, "install", "-y", f"gcc-toolset-{gcc}-gcc-c++"])
    return home


def install_redist_toolkit(
    cell: support.Cell, tk: support.LinuxToolkit, home: Path, python: str = sys.executable
) -> Path:
    """Unpack NVIDIA's redistributable archives of ``tk`` (each downloaded with retries and
    checked against its sha256 by base.download) into ``home``, shaped as torch expects (lib64
    beside lib, the targets/ folder nvcc's profile names), with cuobjdump from PyPI."""
    home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mamba-kernels-redist-") as tmp:
        for name, (version, sha256) in tk.archives.items():
            url = support.redist_url(name, version, tk.arch)
            dest = Path(tmp) / url.rsplit("/", 1)[1]
            base.log(f"downloading {url}")
            base.download(url, dest, sha256=sha256)  # the sha256 support.json pins
            with tarfile.open(dest) as tar:
                top = f"{name}-{tk.arch}-{version}-archive"
                for member in tar.getmembers():
                    parts = Path(member.name).parts
                    if not parts or parts[0] != top or ".." in parts or member.issym() and (
                            Path(member.linkname).is_absolute() or ".." in Path(member.linkname).parts):
                        raise CellError(f"{dest.name}: unexpected member {member.name!r}")
                    if len(parts) == 1:
                        continue
                    member.name = str(Path(*parts[1:]))
                    tar.extract(member, home, **_TAR_FILTER)
            dest.unlink()
    if not (home / "lib64").exists():
        (home / "lib64").symlink_to("lib")
    target = home / "targets" / ("x86_64-linux" if tk.arch == "linux-x86_64" else "sbsa-linux")
    target.mkdir(parents=True, exist_ok=True)
    for sub in ("include", "lib"):
        if not (target / sub).exists():
            (target / sub).symlink_to(Path("..", "..", sub))
    tools = home / "tools"
    base.sh(base.pip_install(python) + ["--quiet", "--no-cache-dir", "--no-deps", "--target", str(tools),
                                        PYPI_CUOBJDUMP])
    if not (home / "bin" / "cuobjdump").exists():
        (home / "bin" / "cuobjdump").symlink_to(tools / "nvidia" / "cu13" / "bin" / "cuobjdump")
    if not (home / "bin" / "nvcc").is_file():
        raise CellError(f"the CUDA {tk.release} archives did not provide {home}/bin/nvcc")
    return home


def host_compiler_env(cell: support.Cell) -> Dict[str, str]:
    """CC/CXX for CUDA releases older than the container's default GCC (manylinux_2_28);
    {} for every other cell, a Windows one included.

    nvcc gets its host compiler one way only: ``-ccbin $CC``, which torch's extension builder
    adds to every nvcc command whose flags carry no -ccbin (docs/COMPAT.md §7.3), and which our
    nvcc probe (build_toolchain.probe_nvcc) adds the same way. NVCC_PREPEND_FLAGS must not name
    one too: nvcc would see the option twice (ci/preflight.py refuses that)."""
    gcc = HOST_GCC.get(cell.cuda)
    if not gcc or not LINUX.handles(cell) or cell.manylinux != "manylinux_2_28":
        return {}
    root = f"/opt/rh/gcc-toolset-{gcc}/root/usr/bin"
    return {"CC": f"{root}/gcc", "CXX": f"{root}/g++"}


class Linux(Platform):
    name = "linux"
    tags = tuple(p.name for p in support.PLATFORM_RECORDS if p.os == "linux")
    host_compiler = "gcc"
    in_container = True
    path_sep = ":"

    def toolkit_home(self, cell: support.Cell) -> str:
        if cell_fields.toolkit_source(cell) == "pypi":
            return f"{CONTAINER_TOOLKIT}/pkgs/nvidia/cu{cell.cuda.split('.')[0]}"
        return f"/usr/local/cuda-{cell.cuda}"

    def provision_toolkit(self, cell: support.Cell, python: str) -> None:
        if cell_fields.toolkit_source(cell) == "pypi":
            assemble_pypi_toolkit(cell, Path(CONTAINER_TOOLKIT), python)
        else:
            install_repo_toolkit(cell)

    def compiler_env(self, cell: support.Cell) -> Dict[str, str]:
        return host_compiler_env(cell)

    def cibuildwheel_env(
        self, cell: support.Cell, extra: Dict[str, str], compiler: Dict[str, str], host_cache: str
    ) -> Dict[str, str]:
        """On Linux the compiler cache (sccache, which torch puts in front of the C++ compiler
        and PYTORCH_NVCC puts in front of nvcc) lives in ``host_cache`` on the host, mounted
        into the container, so CI can save it even when a build times out and a re-run resumes
        from it."""
        home = extra["CUDA_HOME"]
        extra = dict(extra, **compiler)
        key = self.container_arch(cell).upper()
        env = {f"CIBW_MANYLINUX_{key}_IMAGE": cell_fields.cibw_image(cell)}
        # Without -MD (torch's ninja rule adds it to nvcc unless told not to) sccache can cache
        # the nvcc objects; the size cap keeps a few dozen such caches inside the repository's
        # 10 GB.
        extra.update(
            SCCACHE_DIR="/sccache",
            SCCACHE_CACHE_SIZE=SCCACHE_CACHE_SIZE,
            PYTORCH_NVCC=f"sccache {home}/bin/nvcc",
            TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES="1",
        )
        env["CIBW_ENVIRONMENT_LINUX"] = environment_string(extra, path_prefix=self.bin_dir(home),
                                                           path_sep=self.path_sep)
        env["CIBW_CONTAINER_ENGINE"] = f"docker; create_args: --volume {host_cache}:/sccache"
        return env

    def build_tools(self) -> List[str]:
        return [f"sccache=={SCCACHE_VERSION}"]

    def torch_dir(self) -> Path:
        return Path("/opt/mamba-kernels-torch")

    def repair_command(
        self, cell: support.Cell, wheel: Path, dest: Path, torch_lib: Optional[str], plat: Optional[str]
    ) -> Tuple[List[str], Optional[Dict[str, str]]]:
        plat = plat or variant.platform_tag(cell).split(".")[0]
        cmd = ["auditwheel", "repair", "--plat", plat, "--only-plat", "-w", str(dest)]
        for pattern in LINUX_EXCLUDES:
            cmd += ["--exclude", pattern]
        env = dict(os.environ)
        if torch_lib:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [torch_lib, env.get("LD_LIBRARY_PATH")]))
        return cmd + [str(wheel)], env

    def runner_env(self, cell: Optional[support.Cell] = None) -> Dict[str, str]:
        return {}

    def builds_locally(self, cell: support.Cell) -> bool:
        return cell.platform == support.PLATFORMS[0] and self.runs_here()

    def runs_here(self) -> bool:
        return sys.platform == "linux"

    def why_not_built_here(self, cell: support.Cell) -> Optional[str]:
        if not self.builds_locally(cell):
            return f"a {cell.platform} cell: needs a runner of that platform"
        try:
            support.pypi_toolkit(cell.cuda)
        except ValueError:
            return (f"CUDA {cell.cuda}: PyPI has no nvcc of it (NVIDIA's repositories and archives, "
                    "which CI uses, are not reachable here)")
        torch, cuda = cell.build_with
        if support.torch_release(torch).pypi_cuda != cuda:
            return f"torch {torch} built for CUDA {cuda} is on PyTorch's index only, not on PyPI"
        return None

    def executable_names(self, tool: str) -> List[str]:
        return [tool]

    def bin_dir(self, home: str) -> str:
        return f"{home}/bin"

    def intended_environment(self, cell: support.Cell, home: str) -> Dict[str, str]:
        # nvcc through the compiler cache, whose folder is the one mounted into the container
        return {"PYTORCH_NVCC": f"sccache {home}/bin/nvcc", "SCCACHE_DIR": "/sccache"}

    def container_arch(self, cell: support.Cell) -> Optional[str]:
        return support.PLATFORM_BY_NAME[cell.platform].tag_arch

    def wheel_platforms(self, tag: str, glibc: Optional[Tuple[int, int]]) -> List[str]:
        """manylinux_2_<m> from the image's glibc down to 2_5 (with the legacy aliases of 2_17,
        2_12 and 2_5 where they exist for the architecture), then the bare linux tag."""
        arch = tag.split("_", 1)[1]
        top = glibc[1] if glibc else 17
        plats = []
        for m in range(top, 4, -1):
            plats.append(f"manylinux_2_{m}_{arch}")
            legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}.get(m)
            if legacy and (m == 17 or arch == "x86_64"):
                plats.append(f"{legacy}_{arch}")
        plats.append(f"linux_{arch}")
        return plats

    def pypi_torch_is_cuda(self, cell: support.Cell) -> bool:
        return support.PLATFORM_BY_NAME[cell.platform].pypi_wheel

    def pypi_file_tag(self, filename: str) -> Optional[str]:
        name = variant.platform_of_tag(filename[:-len(".whl")].rsplit("-", 1)[-1])
        return name if name in self.tags else None


LINUX = Linux()
