"""All-or-nothing installs: a copy of everything an install of our wheel may change in an
environment, taken before the installer runs and put back when it fails or is interrupted.

What an install of our wheel may change is known before it runs, because the wheel's contents
are vetted (mamba_kernels/install/wheel_contents.py) and the installed distribution's RECORD lists what
it owns:

- in each of the environment's site folders (purelib, platlib): the wheel's top-level folders
  and modules, their ``__pycache__`` files, and every ``mamba_kernels-*.dist-info``;
- every file the installed distribution's RECORD lists inside the environment (an editable
  install's ``.pth`` and finder, the console scripts);
- the console scripts the new wheel's ``entry_points.txt`` names, in the scripts folder;
- pip's stash folders beside them (``~amba_kernels`` and the like), which an interrupted pip
  leaves behind.

:meth:`Snapshot.restore` removes each of these paths as it is now and copies back the ones that
existed, so the environment is file for file what it was. Standard library only.
"""

from __future__ import annotations

import configparser
import csv
import io
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set

RECORD = "record.json"  # in a snapshot's folder: what it holds, written once it is complete
DONE = "done"  # beside it once the install it guards finished
WORK = ".mamba-kernels-install"  # the install's folder in site-packages (snapshots, under the lock)
_SCRIPT_SUFFIXES = ("", ".exe", "-script.py", ".cmd")  # how installers write a console script


class Snapshot:
    """The saved state of the paths an install may change; :meth:`restore` or :meth:`discard`."""

    def __init__(self, paths: Iterable[Path], globs: Iterable[Path], work: Optional[Path] = None) -> None:
        self.paths = _outermost(paths)
        self.globs = sorted(set(globs))  # pattern paths ("<site>/__pycache__/mod.*.pyc")
        if work is not None:
            work.mkdir(exist_ok=True)
        self.backup = Path(tempfile.mkdtemp(prefix="undo-" if work else "mamba-kernels-undo-", dir=work))
        self.saved: Dict[Path, Path] = {}
        self.keep = False  # set when a restore failed: the copy stays for a hand to put back
        try:
            for i, p in enumerate(self._all_now()):
                if os.path.lexists(p):
                    copy = self.backup / str(i)
                    _copy(p, copy)
                    self.saved[p] = copy
            record = {"paths": [str(p) for p in self.paths], "globs": [str(g) for g in self.globs],
                      "saved": {str(p): c.name for p, c in self.saved.items()}}
            (self.backup / "record.tmp").write_text(json.dumps(record), encoding="utf-8")
            os.replace(self.backup / "record.tmp", self.backup / RECORD)  # complete: a later run may undo
        except BaseException:
            self.discard()
            raise

    @classmethod
    def load(cls, backup: Path) -> Snapshot:
        """The snapshot an earlier run left in ``backup`` (its record)."""
        record = json.loads((backup / RECORD).read_text(encoding="utf-8"))
        snap = cls.__new__(cls)
        snap.paths = [Path(p) for p in record["paths"]]
        snap.globs = [Path(g) for g in record["globs"]]
        snap.backup, snap.keep = backup, False
        snap.saved = {Path(p): backup / c for p, c in record["saved"].items()}
        return snap

    def mark_done(self) -> None:
        """The install finished: a later run must not undo it."""
        (self.backup / DONE).write_text("", encoding="utf-8")

    def _all_now(self) -> List[Path]:
        found = list(self.paths)
        for g in self.globs:
            found += sorted(g.parent.glob(g.name)) if g.parent.is_dir() else []
        return sorted(set(found))

    def restore(self) -> None:
        """Put every path back as it was when the snapshot was taken."""
        for p in self._all_now():
            _remove(p)
        for p, copy in self.saved.items():
            p.parent.mkdir(parents=True, exist_ok=True)
            _copy(copy, p)

    def discard(self) -> None:
        if not self.keep:
            shutil.rmtree(self.backup, ignore_errors=True)


def tidy(work: Path, sites: Sequence[str]) -> List[str]:
    """What an earlier install killed part way (SIGKILL, a power cut) left in ``work``, the
    install's folder in site-packages, finished: a snapshot whose install did not finish is put
    back, every folder there removed, and pip's ``~amba_kernels*`` stash folders in the site
    folders removed. Run under the environment lock. Returns a line per thing done."""
    done: List[str] = []
    if work.is_dir():
        for d in sorted(work.iterdir()):
            if d.name.startswith("undo-") and (d / RECORD).is_file() and not (d / DONE).exists():
                Snapshot.load(d).restore()
                done.append(f"put back what an install killed part way had changed ({d})")
            _remove(d)
        work.rmdir()
    for s in dict.fromkeys(sites):
        for stash in sorted(Path(s).glob("~amba_kernels*")):
            _remove(stash)
            done.append(f"removed {stash}, left by an installer that was stopped")
    return done


def _outermost(paths: Iterable[Path]) -> List[Path]:
    """The paths, less those that lie inside another one of them."""
    out: List[Path] = []
    for p in sorted(set(paths), key=lambda p: p.parts):  # a folder, then everything inside it
        if not out or not p.is_relative_to(out[-1]):
            out.append(p)
    return out


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True)
    else:
        shutil.copy2(src, dst, follow_symlinks=False)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif os.path.lexists(p):
        p.unlink()


def _record_paths(dist_info: Path, site: Path, prefix: Path) -> List[Path]:
    """The files an installed distribution's RECORD lists, inside the environment ``prefix``."""
    try:
        text = (dist_info / "RECORD").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    out = []
    root = os.path.realpath(prefix)
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0]:
            continue
        p = Path(os.path.normpath(site / row[0]))
        if os.path.commonpath([root, os.path.realpath(p.parent)]) == root:
            out.append(p)
    return out


def _console_scripts(zf: zipfile.ZipFile, dist_info: str) -> List[str]:
    try:
        text = zf.read(f"{dist_info}/entry_points.txt").decode("utf-8")
    except (KeyError, UnicodeDecodeError):
        return []
    cp = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        cp.read_string(text)
    except configparser.Error:
        return []
    return [name for sec in ("console_scripts", "gui_scripts") if cp.has_section(sec) for name in cp[sec]]


def take(wheel: Path, dist_info: str, sites: Sequence[str], scripts: Optional[str], prefix: str,
         project_prefix: str = "mamba_kernels-", work: Optional[Path] = None) -> Snapshot:
    """The snapshot of what installing ``wheel`` (vetted; its dist-info folder ``dist_info``)
    into the environment at ``prefix`` may change."""
    with zipfile.ZipFile(wheel) as zf:
        tops: Set[str] = {n.split("/", 1)[0] for n in zf.namelist()}
        script_names = _console_scripts(zf, dist_info)
    paths: List[Path] = []
    globs: List[Path] = []
    for s in dict.fromkeys(sites):
        site = Path(s)
        paths += [site / t for t in tops]
        globs += [site / "__pycache__" / f"{t[:-3]}.*.pyc" for t in tops if t.endswith(".py")]
        # pip's stash of what it uninstalls, beside it: the name with its first letters as "~"/"-"
        globs += [site / f"~*{t[1:]}" for t in tops] + [site / f"~*{project_prefix[1:]}*.dist-info"]
        if site.is_dir():
            for d in site.iterdir():
                if d.name.startswith(project_prefix) and d.name.endswith(".dist-info"):
                    paths.append(d)
                    paths += _record_paths(d, site, Path(prefix))
    if scripts:
        paths += [Path(scripts) / f"{n}{suffix}" for n in script_names for suffix in _SCRIPT_SUFFIXES]
    return Snapshot(paths, globs, work)
