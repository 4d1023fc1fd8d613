"""The one description of this install, which ``info``, ``doctor`` and the packages' ``__version__``
share: its version with the local label, what was installed (a release wheel, a prebuilt wheel
through the sdist, a local build, or no compiled extension) and the torch line.

:func:`version` reads distribution metadata only (no torch, no extension file): the installed
distribution's version when it carries a label (a release wheel); a prebuilt wheel the sdist
installed keeps the sdist's version in METADATA, so its label is read from the install record
(the original wheel's file name); otherwise the distribution's or the source's version.
"""

from __future__ import annotations

import functools
import platform
import sysconfig
from importlib import metadata
from typing import Any, Dict, List, Optional

from ..facts import variant
from ..facts.version import __version__
from . import buildinfo, dispatch, install_record


def _distribution_version() -> Optional[str]:
    try:
        return metadata.version(variant.PROJECT)
    except metadata.PackageNotFoundError:
        return None


def _label_of(version: Optional[str]) -> Optional[str]:
    """The variant label of a version (``0.1.0+cu130stable2.10`` -> ``cu130stable2.10``), or None."""
    if not version or "+" not in version:
        return None
    text = version.split("+", 1)[1]
    try:
        variant.parse_label(text)
    except ValueError:
        return None
    return text


def _prebuilt_from_sdist(record: Optional[Dict[str, Any]]) -> Optional[variant.WheelInfo]:
    """The prebuilt wheel the sdist installed (from its install record), or None."""
    if not record or record.get("path") != "prebuilt" or not isinstance(record.get("wheel"), str):
        return None
    try:
        info = variant.parse_wheel_name(record["wheel"])
    except ValueError:
        return None
    return info if info.variant is not None else None


def _read_record() -> Optional[Dict[str, Any]]:
    try:
        return install_record.read_record()
    except (OSError, UnicodeDecodeError):
        return None


def version() -> str:
    """The installed version with its local label when it has one (see the module's text)."""
    dist = _distribution_version()
    if _label_of(dist):
        return dist  # type: ignore[return-value]
    wheel = _prebuilt_from_sdist(_read_record())
    public = (dist or __version__).split("+")[0]
    if wheel is not None and wheel.variant is not None:
        return f"{public}+{variant.variant_label(wheel.variant)}"
    return dist or __version__


@functools.lru_cache(maxsize=1)
def cached_version() -> str:
    """:func:`version`, read once per process (the packages' ``__version__``)."""
    return version()


def describe() -> Dict[str, Any]:
    """{version, label, how, record}: the install's version (with label), its variant label (or
    None) and how it came to be, in words; ``record`` is the sdist's install record or None."""
    dist = _distribution_version()
    record = _read_record()
    full = version()
    label = _label_of(full)
    via_sdist = " through the sdist" if record else ""
    if label and _label_of(dist):
        return {"version": full, "label": label, "record": record,
                "how": f"a release wheel{via_sdist}: the installed distribution's version {full}"}
    wheel = _prebuilt_from_sdist(record)
    if label and wheel is not None and record is not None:
        where = f" from {record['index']}" if record.get("index") else ""
        return {"version": full, "label": label, "record": record,
                "how": f"the prebuilt wheel {record['wheel']}{where}, installed through the sdist"}
    for kernel, name in dispatch.EXTENSIONS.items():
        path = dispatch._extension_file(name)
        found = buildinfo.find_in_file(path) if path else None
        if found is None:
            continue
        try:  # a stable binary is labelled for its target, a classic one for its torch
            text = (variant.stable_label(found.torch_cuda, found.stable_target) if found.stable
                    else variant.label(found.torch_version, found.torch_cuda, found.cxx11_abi))
        except (ValueError, TypeError):
            continue
        return {"version": full, "label": text, "record": record,
                "how": f"a local build{via_sdist}: BUILD_INFO of {kernel}'s extension ({found.describe()})"}
    return {"version": full, "label": None, "record": record,
            "how": f"mamba-kernels {full}{via_sdist} without a compiled extension: the PyTorch path runs"}


def python_text() -> str:
    """``3.11.7 (linux_x86_64)``: the running interpreter's version and its platform tag, the
    python line's text in both reports."""
    tag = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{platform.python_version()} ({tag})"


def torch_text(torch_version: Optional[str], torch_cuda: Optional[str], cxx11_abi: Optional[bool]) -> str:
    """``2.14.1+cu130 (CUDA 13.0, cxx11 ABI)``: the torch line's text, the ABI named one way."""
    if not torch_version:
        return "not installed"
    return f"{torch_version} (CUDA {torch_cuda or 'none'}, {variant.abi_name(cxx11_abi)} ABI)"


def lines(desc: Dict[str, Any]) -> List[str]:
    """The lines ``info`` and ``doctor`` both start their report with (the torch line aside)."""
    return [f"mamba-kernels {desc['version']}",
            f"build         {desc['label'] or 'no variant label'} ({desc['how']})"]
