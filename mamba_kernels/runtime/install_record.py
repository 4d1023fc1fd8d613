"""The install record: how the sdist installed this distribution, read back at run time.

Each wheel the sdist hands to an installer carries ``mamba_kernels_install.json`` in its
dist-info (written by mamba_kernels/install/sdist.py): the path taken (prebuilt, source or
pure), the line shown, the target. The doctor, ``info`` and the fallback warning read it here,
so the runtime never imports the installer to say why it runs the reference path.
"""

from __future__ import annotations

import json
from importlib import metadata
from typing import Any, Dict, Optional

from ..facts import variant

RECORD_NAME = "mamba_kernels_install.json"  # in the wheel's dist-info


def read_record() -> Optional[Dict[str, Any]]:
    """The install record of the installed distribution, or None (not installed from the sdist)."""
    try:
        text = metadata.distribution(variant.PROJECT).read_text(RECORD_NAME)
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def install_note() -> str:
    """A sentence for the fallback warning when the install from the sdist went pure-Python:
    why, as recorded then; empty otherwise (never raises: it decorates a warning)."""
    try:
        record = read_record()
    except Exception:
        return ""
    if not record or record.get("path") != "pure" or not record.get("reasons"):
        return ""
    return f" When it was installed from the sdist: {'; '.join(str(r) for r in record['reasons'])}."
