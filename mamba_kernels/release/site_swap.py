"""Putting a new index in place of the old one all at once, and cleaning up after a run that
was killed: the site is built in a marked temporary folder next to OUT_DIR, then exchanged with
it (renameat2 RENAME_EXCHANGE where the system has it, else two renames)."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import List

from ..facts.variant import PROJECT


def own_index(path: Path) -> bool:
    """Whether ``path`` holds an index this writer made (its manifest.json names the project)."""
    m = path / "manifest.json"
    try:
        return m.is_file() and json.loads(m.read_text(encoding="utf-8")).get("project") == PROJECT
    except (OSError, ValueError, AttributeError):
        return False


def _rename_exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


MARK = ".mamba-kernels-index-temporary"  # in a folder this writer made and may remove


def mark(folder: Path) -> None:
    (folder / MARK).write_text("a temporary folder of `python -m mamba_kernels index`\n", encoding="utf-8")


def leftovers(out_dir: Path) -> List[Path]:
    """The temporary folders earlier runs into ``out_dir`` left: beside it, named after it, a
    real folder (not a file or a symlink) holding this writer's mark. Nothing else is touched."""
    parent = out_dir.parent
    if not parent.is_dir():
        return []
    pre = (f".{out_dir.name}.new-", f".{out_dir.name}.old-")
    return sorted(p for p in parent.iterdir() if p.name.startswith(pre) and not p.is_symlink()
                  and p.is_dir() and (p / MARK).is_file() and not (p / MARK).is_symlink())


def recover(out_dir: Path) -> None:
    """After an interrupted run: put a displaced old index back (a run killed between its two
    renames), then remove the temporary folders of earlier runs (only those this writer marked
    as its own). Runs into the same OUT_DIR must not overlap."""
    for p in leftovers(out_dir):
        if p.name.startswith(f".{out_dir.name}.old-") and not out_dir.exists() and own_index(p):
            (p / MARK).unlink()
            os.rename(p, out_dir)
    for p in leftovers(out_dir):
        shutil.rmtree(p)


def swap_into_place(new: Path, out_dir: Path) -> None:
    """Make the finished folder ``new`` be ``out_dir``: one rename when there was none, one
    atomic exchange where the OS has it, else two renames; then drop the old index."""
    (new / MARK).unlink()  # from here on it is the index itself
    if not out_dir.exists():
        os.rename(new, out_dir)
        return
    mark(out_dir)  # after the exchange it is the temporary folder `new`
    if _rename_exchange(new, out_dir):
        shutil.rmtree(new)  # now the old index
        return
    (out_dir / MARK).unlink()
    old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.old-"))
    os.rmdir(old)
    mark(out_dir)  # it becomes the temporary folder `old`
    os.rename(out_dir, old)
    os.rename(new, out_dir)
    shutil.rmtree(old)
