"""Where the release wheels are published, and which index a command reads when given none.

``RELEASE_INDEX`` is the one place the address of the published index is written: the site the
release workflow deploys (the project's GitHub Pages). Its root page links ``manifest.json``
(every wheel, its sha256 and architectures) and one PEP 503 index per variant label at
``<root>/<label>/simple/`` (docs/INDEX.md). ``resolve``, ``install``, ``download``, ``info`` and
the source distribution's wheel lookup read it through :func:`default_indexes`.

``MAMBA_KERNELS_INDEX`` replaces it: one or more URLs (http, https, file) or directories,
separated by whitespace (as pip separates ``PIP_FIND_LINKS``; a comma can be part of a URL),
tried in the order given. A mirror, a wheelhouse on a machine without network, or a test
server is named there. No torch import; standard library only (setup.py may import this). The knob's record is
``facts/knob_table.py``'s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional, Tuple

from . import knob_table

ENV_VAR = knob_table.INDEX.name
# The project's published index: GitHub Pages of github.com/mamba-kernels/mamba-kernels, as the
# release workflow's `pages` job deploys it. A fork that publishes elsewhere changes this line.
RELEASE_INDEX = "https://mamba-kernels.github.io/mamba-kernels/"
_SCHEMES = ("http://", "https://", "file://")


def default_indexes(environ: Optional[Mapping[str, str]] = None) -> Tuple[Tuple[str, ...], str]:
    """(the indexes to read, where they come from): ``MAMBA_KERNELS_INDEX`` when set, else the
    release index. A set but blank variable, or an entry with another URL scheme, is an error."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV_VAR)
    if raw is None:
        return (RELEASE_INDEX,), "the release index"
    entries = tuple(raw.split())
    if not entries:
        raise ValueError(f"{ENV_VAR} must name one or more URLs or directories separated by whitespace, "
                         f"got {raw!r} (unset it to use the release index {RELEASE_INDEX})")
    for e in entries:
        if "://" in e and not e.startswith(_SCHEMES):
            raise ValueError(f"{ENV_VAR} entries must be http(s) or file URLs or directories, got {e!r}")
    return entries, ENV_VAR


def variant_index_url(root: str, label: str) -> Optional[str]:
    """The PEP 503 index of one variant under a site ``root`` written by ``python -m mamba_kernels
    index``: ``<root>/<label>/simple/`` for an http(s) URL ending in ``/`` or a directory that
    holds that folder; None for anything else (a manifest, a page, a plain wheel folder)."""
    if root.startswith(("http://", "https://")):
        return f"{root}{label}/simple/" if root.endswith("/") else None
    path = Path(root[len("file://"):] if root.startswith("file://") else root)
    simple = path / label / "simple"
    return str(simple) + os.sep if (simple / "index.html").is_file() else None


def variant_index(label: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The PEP 503 index of ``label`` under the first index :func:`default_indexes` names that is
    a site with per-variant pages (what ``info`` shows and a fix command passes as ``--index-url``);
    None when none is, or when ``MAMBA_KERNELS_INDEX`` is malformed."""
    try:
        indexes, _ = default_indexes(environ)
    except ValueError:
        return None
    return next((u for u in (variant_index_url(i, label) for i in indexes) if u), None)
