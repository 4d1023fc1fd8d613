"""The disk a cell's job uses at its peak, estimated per part (the manylinux image, torch, pip's
downloads and cache, the CUDA toolkit, the build, the checkout and its copies, the compiler
cache) and per phase of the job, against the runner's free disk."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Tuple

from ci import build_cell, cell_fields, platforms
from mamba_kernels.facts import support

ROOT = Path(__file__).resolve().parent.parent

# Free disk of GitHub's standard Linux and Windows runners, as GitHub states it: 14 GB.
RUNNER_FREE_DISK_GB = 14.0
# The peak disk use of a cell, in GB, per part (estimates, rounded up):
DISK_GB = {
    # The manylinux image as docker stores it on the runner's disk (Linux builds run in it).
    "image": {"manylinux2014": 2.5, "manylinux_2_28": 3.0},
    # torch with its CUDA wheels (and triton), installed once per cell: measured 5.3 GB for
    # torch 2.14.1+cu130 on Linux x86_64 (torch 1.2, nvidia-* 3.2, triton 0.9); Windows' torch
    # carries the CUDA libraries inside its own wheel.
    "torch": {"linux": 5.3, "windows": 5.5},
    # The downloaded wheels pip holds in its temporary folder until that install finishes.
    "download": {"linux": 2.9, "windows": 2.8},
    # The CUDA toolkit: PyPI's 13.x compiler packages; NVIDIA's RPMs with a gcc-toolset and the
    # package manager's cache; NVIDIA's Windows network installer with its downloads.
    "toolkit": {"pypi": 0.4, "nvidia-repo": 1.0, "nvidia-installer": 1.5},
    # Object files, the built and the repaired wheel (1.5 GB with the compiler cache, which is
    # counted on its own from SCCACHE_CACHE_SIZE).
    "build": 1.1,
}
GB = 1e9


def _tree_bytes(root: Path, excludes: Sequence[str] = ()) -> int:
    """Bytes of the files under ``root``, leaving out names matching ``excludes`` (the way
    shutil.ignore_patterns does for build_cell.stage_project)."""
    total = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not any(fnmatch.fnmatch(d, pat) for pat in excludes)]
        for f in files:
            if not any(fnmatch.fnmatch(f, pat) for pat in excludes):
                try:
                    total += (Path(folder) / f).lstat().st_size
                except OSError:
                    pass
    return total


def _tracked_bytes(root: Path) -> Optional[int]:
    """Bytes of the files git tracks under ``root`` (what CI's checkout holds), None without git."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    total = 0
    for name in out.decode(errors="replace").split("\0"):
        if name:
            try:
                total += (root / name).lstat().st_size
            except OSError:
                pass
    return total


def project_sizes(root: Path = ROOT) -> Dict[str, float]:
    """GB of the checkout as CI has it (its files and .git; never less than the copy) and of the
    clean copy a build starts from (build_cell.stage_project: no .git, cache or outputs): the
    files git tracks, or without git every file but build_cell.COPY_EXCLUDES."""
    tracked = _tracked_bytes(root)
    copy = (tracked if tracked is not None else _tree_bytes(root, build_cell.COPY_EXCLUDES)) / GB
    git = _tree_bytes(root / ".git") / GB if (root / ".git").is_dir() else copy
    return {"checkout": copy + git, "copy": copy}


_PROJECT: Dict[str, float] = {}


def cached_project_sizes() -> Dict[str, float]:
    """project_sizes of the checkout, measured once."""
    if not _PROJECT:
        _PROJECT.update(project_sizes())
    return _PROJECT


def cache_gb(size: str) -> float:
    """sccache's SCCACHE_CACHE_SIZE ("400M", "2G") in GB."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", size.strip().upper())
    if not m:
        raise ValueError(f"SCCACHE_CACHE_SIZE={size!r} is not a size")
    return float(m.group(1)) * {"": 1e-9, "K": 1e-6, "M": 1e-3, "G": 1.0, "T": 1e3}[m.group(2)]


def disk_estimate(cell: support.Cell, env: Mapping[str, str]) -> Dict[str, float]:
    """The cell's peak disk use per part, in GB (DISK_GB)."""
    plat = platforms.for_cell(cell)
    kind = plat.name
    parts: Dict[str, float] = {}
    if plat.in_container:
        parts["image"] = DISK_GB["image"][cell_fields.cibw_image(cell)]
    parts["torch"] = DISK_GB["torch"][kind]
    parts["download"] = DISK_GB["download"][kind]
    if env.get("PIP_NO_CACHE_DIR", "").lower() not in ("1", "true", "yes", "on"):
        # pip keeps a second copy of every download in its cache.
        parts["pip cache"] = DISK_GB["download"][kind]
    parts["toolkit"] = DISK_GB["toolkit"][cell_fields.toolkit_source(cell)]
    parts["build"] = DISK_GB["build"]
    # The checkout, and the clean copy of the project the build runs from: on Linux that copy is
    # on the disk twice (cibuildwheel copies it once more into the container), and the restored
    # compiler cache sits in the checkout (mounted into the container, never copied).
    proj = cached_project_sizes()
    parts["checkout"] = proj["checkout"]
    parts["project copy"] = proj["copy"] * (2 if plat.in_container else 1)
    if plat.in_container:
        parts["compiler cache"] = cache_gb(env.get("SCCACHE_CACHE_SIZE", "0"))
    return parts


# What is on the disk in each phase of a cell's job, beyond what stays from start to end (the
# image, the checkout, the project copies, the compiler cache and a pip cache): pip's downloads
# exist only while torch is installed (pip removes its temporary folder when it is done); a
# stable cell's test replaces the build's torch with its target while the toolkit and the build
# outputs are still there.
DISK_PHASES = {
    "torch install": ("torch", "download"),
    "build": ("torch", "toolkit", "build"),
    "stable test": ("toolkit", "build", "torch", "download"),
}
_ALWAYS = ("image", "checkout", "project copy", "compiler cache", "pip cache")


def disk_peak(cell: support.Cell, parts: Mapping[str, float]) -> Tuple[float, str]:
    """The largest phase of ``parts`` (GB) and its name."""
    base = sum(parts.get(k, 0.0) for k in _ALWAYS)
    phases = {n: base + sum(parts.get(k, 0.0) for k in ks) for n, ks in DISK_PHASES.items()
              if cell.stable or n != "stable test"}
    name = max(phases, key=phases.get)
    return phases[name], name
