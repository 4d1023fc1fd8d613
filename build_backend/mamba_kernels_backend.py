"""The PEP 517 build backend of mamba-kernels: setuptools.build_meta, plus the install-time
choice when a wheel is built from our sdist (mamba_kernels/install/sdist.py says what and why).

From a source checkout, for editable installs, and for release builds (MAMBA_KERNELS_RELEASE)
every hook is setuptools' own: setup.py and mamba_kernels/build/plan.py decide as they always did.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator, Optional

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401  (hooks used as they are)
    build_editable,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the package's build helpers, importable without torch

from mamba_kernels.build import plan as build  # noqa: E402
from mamba_kernels.install import sdist as sdist_install  # noqa: E402
from mamba_kernels.runtime import knobs  # noqa: E402


def _from_sdist() -> bool:
    """Building a wheel from an unpacked sdist (it has PKG-INFO at its root), not a release."""
    release = knobs.env_bool(build.RELEASE_VAR) if os.environ.get(build.RELEASE_VAR, "").strip() else False
    return os.path.isfile(os.path.join(ROOT, "PKG-INFO")) and not release


@contextlib.contextmanager
def _pure() -> Iterator[None]:
    """setuptools with the CUDA build skipped: the metadata, or the pure-Python wheel (the
    build's own line goes to the log only: the sdist shows its line, which says why)."""
    saved = {var: os.environ.get(var) for var in (build.SKIP_BUILD_VAR, build.FROM_SDIST_VAR)}
    os.environ.update({var: "1" for var in saved})
    try:
        yield
    finally:
        for var, old in saved.items():
            if old is None:
                del os.environ[var]
            else:
                os.environ[var] = old


def get_requires_for_build_wheel(config_settings=None):
    if not _from_sdist():
        return _setuptools.get_requires_for_build_wheel(config_settings)
    with _pure():
        return _setuptools.get_requires_for_build_wheel(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    """From the sdist: the metadata of every wheel build_wheel may hand back (the sdist's version,
    no torch requirement), without looking at torch or nvcc."""
    if not _from_sdist():
        return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)
    with _pure():
        name = _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)
    sdist_install.strip_torch_requirement(os.path.join(metadata_directory, name),
                                          sdist_install.sdist_version(ROOT))
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory: Optional[str] = None):
    if not _from_sdist():
        return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)

    def pure(out_dir: str) -> str:
        os.makedirs(out_dir, exist_ok=True)
        with _pure():
            return os.path.join(out_dir, _setuptools.build_wheel(out_dir, config_settings))

    try:
        return sdist_install.build_wheel(ROOT, wheel_directory, pure)
    except sdist_install.StopInstall as e:
        text = str(e)
        sys.exit(text if text.startswith(sdist_install.PREFIX) else sdist_install.PREFIX + "error: " + text)


def build_sdist(sdist_directory, config_settings=None):
    """setuptools' sdist, with no torch requirement in its metadata (see
    sdist_install.strip_torch_from_sdist): installing it never installs or changes torch."""
    name = _setuptools.build_sdist(sdist_directory, config_settings)
    sdist_install.strip_torch_from_sdist(os.path.join(sdist_directory, name))
    return name
