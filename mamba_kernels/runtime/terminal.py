"""Showing one line to the user from inside an installer's build (standard library only).

pip and uv hide a successful build's output, so :func:`tell` writes the line to the controlling
terminal when there is one, else to stderr (shown with -v). The sdist backend's line and a
source build's progress line (mamba_kernels/build/plan.py) both go through it.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping


def to_terminal(line: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Write ``line`` to the controlling terminal; False when there is none.

    On its own line: pip's spinner is mid-line. uv redraws a live region of a line per build plus
    a progress line by moving the cursor up over the rows it drew last; the blank rows after the
    line take that redraw, so the line stays on screen (tests/test_sdist.py checks the screen)."""
    tty = "CONOUT$" if sys.platform == "win32" else "/dev/tty"
    pad = "\n\n" if environ.get("UV") else ""
    try:
        with open(tty, "w") as f:
            f.write("\n" + line + "\n" + pad)
        return True
    except OSError:
        return False


def tell(line: str, environ: Mapping[str, str] = os.environ) -> None:
    """Show one line to the user. pip and uv hide a successful build's output, so the line goes
    to the controlling terminal when there is one; else to stderr (shown with -v)."""
    if not to_terminal(line, environ):
        print(line, file=sys.stderr, flush=True)
