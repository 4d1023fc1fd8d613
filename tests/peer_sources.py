"""mamba_ssm 2.3.2's Python sources, for the tests that run the original's own code on our
modules: the sdist from MAMBA_SSM_SDIST, else fetched once from PyPI into build/peer-sdists
(the registry is reachable where CI runs), unpacked to its ``.py`` files."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
SDIST_NAME = "mamba_ssm-2.3.2.post1.tar.gz"
SDIST_DIR = ROOT / "build" / "peer-sdists"


def mamba_ssm_sdist() -> Path:
    """The sdist's path (it may be missing when PyPI cannot be reached). Its setup.py is told
    to skip its CUDA build and its wheel download: only the file is fetched."""
    if os.environ.get("MAMBA_SSM_SDIST"):
        return Path(os.environ["MAMBA_SSM_SDIST"])
    path = SDIST_DIR / SDIST_NAME
    if not path.is_file():
        env = dict(os.environ, MAMBA_SKIP_CUDA_BUILD="TRUE", MAMBA_FORCE_BUILD="TRUE")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-build-isolation",
                        "--no-binary", ":all:", "mamba-ssm==2.3.2.post1", "-d", str(SDIST_DIR)],
                       env=env, capture_output=True, timeout=120)
    return path


def mamba_ssm_src_or_skip(tmp_path_factory) -> Path:
    """For a module-scoped fixture: the unpacked sdist's folder (see unpack_mamba_ssm), or the
    test skipped when the sdist is not at hand."""
    top = unpack_mamba_ssm(tmp_path_factory.mktemp("mamba_ssm_src"))
    if top is None:
        pytest.skip(f"no mamba_ssm sdist at {mamba_ssm_sdist()}, and it could not be fetched")
    return top


def unpack_mamba_ssm(dest: Path) -> Optional[Path]:
    """The sdist's ``.py`` files under ``dest``; returns the folder that holds the ``mamba_ssm``
    package (to put on sys.path), or None when the sdist is not at hand."""
    sdist = mamba_ssm_sdist()
    if not sdist.is_file():
        return None
    with tarfile.open(sdist) as t:
        members = [m for m in t.getmembers() if "/mamba_ssm/" in m.name and m.name.endswith(".py")]
        t.extractall(dest, members=members)
    return next(dest.glob("*/mamba_ssm")).parent
