"""One cell builder per platform behind one small interface (``base.Platform``), in the spirit
of cibuildwheel's own platform modules: ``linux`` (manylinux containers) and ``windows``
(the runner itself). ``for_cell`` picks the builder of a matrix cell."""

from __future__ import annotations

from mamba_kernels.facts import support

from . import base, linux, windows
from .base import Platform

PLATFORMS = (linux.LINUX, windows.WINDOWS)


def for_cell(cell: support.Cell) -> Platform:
    """The builder of ``cell``'s platform."""
    for p in PLATFORMS:
        if p.handles(cell):
            return p
    raise base.CellError(f"no cell builder for platform {cell.platform!r}")


__all__ = ["PLATFORMS", "Platform", "base", "for_cell", "linux", "windows"]
