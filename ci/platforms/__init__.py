"""One cell builder per platform behind one small interface (``base.Platform``), in the spirit
of cibuildwheel's own platform modules: ``linux`` (manylinux containers) and ``windows``
(the runner itself). ``for_cell`` picks the builder of a matrix cell, ``for_tag`` that of a
wheel platform tag."""

from __future__ import annotations

from typing import List

from mamba_kernels.facts import support

from . import base, linux, windows
from .base import Platform

PLATFORMS = (linux.LINUX, windows.WINDOWS)


def for_tag(tag: str) -> Platform:
    """The builder of the wheel platform tag ``tag`` (a support.PLATFORMS entry)."""
    for p in PLATFORMS:
        if tag in p.tags:
            return p
    raise base.CellError(f"no cell builder for platform {tag!r}")


def for_cell(cell: support.Cell) -> Platform:
    """The builder of ``cell``'s platform."""
    return for_tag(cell.platform)


def executable_names(tool: str) -> List[str]:
    """The file names of ``tool`` on this machine, preferred first (a bare name elsewhere)."""
    for p in PLATFORMS:
        if p.runs_here():
            return p.executable_names(tool)
    return [tool]


__all__ = ["PLATFORMS", "Platform", "base", "executable_names", "for_cell", "for_tag", "linux", "windows"]
