"""The repository stands alone: no tracked file cites documents that live outside it.

The facts our code relies on are restated in docs/ (docs/COMPAT.md and the others); a
comment, docstring, test or doc that points at a team guide or reference kept elsewhere (the
design guide, the compatibility and kernel-API references, the folder beside the checkout)
leaves a reader of this repository with a reason they cannot check. A citation of one of those
names is allowed only as a path to a file that exists in this repository (``docs/COMPAT.md``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parent.parent
SELF = Path(__file__).resolve()

# Document names kept outside this repository; a mention is fine only as a path that exists here.
_DOC_RE = re.compile(r"[\w./-]*\b(?:DESIGN|compat|kernel-api|scan-kernel-notes)\.md\b", re.IGNORECASE)
# Places outside this repository: never cited at all.
_OUTSIDE_RE = re.compile(r"shared/reference|/work/shared|\.\./shared\b|peer[-]tests")


def _tracked_files() -> List[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.decode("utf-8", "surrogateescape")
    return [ROOT / p for p in out.split("\0") if p]


def _in_repo(mention: str) -> bool:
    """Whether ``mention`` is a relative path, spelled exactly, of a file in this repository."""
    path = Path(mention[2:] if mention.startswith("./") else mention)
    if path.is_absolute() or ".." in path.parts or len(path.parts) < 2:
        return False
    full = ROOT / path
    return full.is_file() and path.name in os.listdir(full.parent)  # exact case, on any file system


def outside_citations(path: Path, text: str) -> List[str]:
    """``path:line: text`` for each line of ``text`` that cites a document outside the repository."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        bad = bool(_OUTSIDE_RE.search(line)) or any(
            not _in_repo(m.group(0)) for m in _DOC_RE.finditer(line)
        )
        if bad:
            found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return found


def _md(stem: str) -> str:
    """A document name, assembled so that this file itself cites nothing."""
    return stem + ".md"


def test_checker_flags_outside_citations_and_allows_docs_paths():
    p = ROOT / "x.py"
    outside = "/".join(("..", "shared", "reference"))
    for line in (
        f"# see {_md('DESIGN')}, Conventions",
        f"# {_md('compat')} 2.1",
        f'"""(see {outside[3:]}/{_md("kernel-api")} section 2)"""',
        f"Facts come from {outside}/{_md('compat')}",
        f"# {_md('kernel-api')} 1.1",
        f"# {_md('scan-kernel-notes')}",
        "# the " + "peer" + "-tests folder",
        f"# {_md('COMPAT')} §2",  # a bare name is not a path in this repository
        f"# docs/{_md('DESIGN')}",  # no such file here
    ):
        assert outside_citations(p, line), line
    for line in ("# docs/COMPAT.md §2 C++ ABI", "# see docs/SCAN.md", "# compatible with torch 2.6"):
        assert not outside_citations(p, line), line


def test_no_tracked_file_cites_documents_outside_the_repository():
    found = []
    for path in _tracked_files():
        if path.resolve() == SELF or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        found += outside_citations(path, text)
    assert not found, "citations of documents outside this repository:\n" + "\n".join(found)
