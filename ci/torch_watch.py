#!/usr/bin/env python3
"""Notice a torch release the support table lacks, and propose the table line for it.

``python ci/torch_watch.py [--pypi-json FILE] [--apply] [--body FILE] [--proposed FILE]
[--github-output FILE]``

Reads PyPI's JSON for torch (or FILE), finds the newest final major.minor release that
mamba_kernels/support.py does not list, and prints what PyPI says about it: the CPython
versions with wheels per platform (from the file names), Requires-Python, and the CUDA variant
of the default Linux wheel (from its CUDA requirements). With --apply it inserts a
``_release(...)`` line into the table for a pull request a maintainer completes (PyTorch's own
index, which holds the other CUDA variants, is not reachable through PyPI's API); the line lists
the PyPI CUDA variant on every platform PyPI has wheels for, so that the pull request's smoke
build tries that torch on each of them before merge.

Each release is proposed once, on the branch ``torch-watch/torch-<major.minor>``. --proposed
reads the repository's pull requests (``gh pr list --state all --json
number,state,headRefName,url``); a release whose branch already had a pull request, open,
closed or merged, is not proposed again.

Exit 0 with nothing to propose, 10 when a new release was found and should be proposed (so the
workflow knows to push the branch and open the pull request). --github-output appends
``new``, ``torch``, ``branch`` and ``changed`` (the file --apply edited) for the workflow.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mamba_kernels import support  # noqa: E402

SUPPORT_PY = ROOT / "mamba_kernels" / "support.py"
PYPI_URL = "https://pypi.org/pypi/torch/json"
NEW_RELEASE = 10


def _mm(version: str) -> Tuple[int, int]:
    parts = version.split(".")
    return int(parts[0]), int(parts[1])


def newest_missing(pypi: Dict[str, Any]) -> Optional[str]:
    """The newest final release (``2.16.0``) whose major.minor the table lacks, or None."""
    known = {r.torch for r in support.RELEASES}
    finals = [v for v, files in pypi["releases"].items() if re.fullmatch(r"\d+\.\d+\.\d+", v) and files]
    newest_known = max(_mm(t + ".0") for t in known)
    missing = [v for v in finals if f"{_mm(v)[0]}.{_mm(v)[1]}" not in known and _mm(v) > newest_known]
    return max(missing, key=lambda v: tuple(int(x) for x in v.split("."))) if missing else None


def _platform_of(filename: str) -> Optional[str]:
    if "win_amd64" in filename:
        return "win_amd64"
    if "aarch64" in filename:
        return "linux_aarch64"
    if "manylinux" in filename and "x86_64" in filename:
        return "linux_x86_64"
    return None


def facts(pypi: Dict[str, Any], version: str) -> Dict[str, Any]:
    """What PyPI's file list and metadata say about one torch release."""
    files = pypi["releases"][version]
    per_platform: Dict[str, set] = {}
    for f in files:
        m = re.search(r"-cp3(\d+)-cp3\d+-", f["filename"])
        plat = _platform_of(f["filename"])
        if m and plat:
            per_platform.setdefault(plat, set()).add(int(m.group(1)))
    pys = sorted(set().union(*per_platform.values())) if per_platform else []
    requires = pypi.get("info", {}).get("requires_dist") or []
    cuda = None
    for req in requires:
        m = re.match(r"cuda-toolkit\[.*\]\s*==\s*(\d+)\.(\d+)", req) or re.match(
            r"nvidia-cuda-runtime(?:-cu\d+)?\s*==\s*(\d+)\.(\d+)", req
        )
        if m:
            cuda = f"{m.group(1)}.{m.group(2)}"
            break
    return {
        "version": version,
        "pythons": [f"3.{p}" for p in pys],
        "platform_pythons": {p: [f"3.{v}" for v in sorted(s)] for p, s in sorted(per_platform.items())},
        "requires_python": pypi.get("info", {}).get("requires_python"),
        "pypi_cuda": cuda,
        "platforms": sorted(per_platform),
    }


def table_line(f: Dict[str, Any]) -> str:
    """The ``_release(...)`` entry for the table: the PyPI CUDA variant on every platform PyPI
    has wheels for (PyTorch's index is expected to carry it there too; the smoke build before
    merge finds out), Windows' Python range where it differs."""
    mm = ".".join(f["version"].split(".")[:2])
    cuda = f["pypi_cuda"] or "13.0"
    lo, hi = f["pythons"][0], f["pythons"][-1]
    plats = f.get("platforms", [])
    aarch64 = f'("{cuda}",)' if "linux_aarch64" in plats else "()"
    windows = f'("{cuda}",)' if "win_amd64" in plats else "()"
    extra = ""
    win = f.get("platform_pythons", {}).get("win_amd64")
    if win and (win[0], win[-1]) != (lo, hi):
        extra = f' win_pythons=("{win[0]}", "{win[-1]}"),'
    note = "added by ci/torch_watch.py from PyPI: confirm the other CUDA variants"
    return (
        f'    _release("{mm}", ("{lo}", "{hi}"), ("{cuda}",), aarch64={aarch64}, windows={windows},{extra}\n'
        f'             pypi="{cuda}", cxx_std=20, note="{note}"),\n'
    )


def apply(line: str, path: Path = SUPPORT_PY) -> Path:
    """Insert ``line`` as the last entry of RELEASES (before its closing parenthesis); the file
    it edited."""
    text = path.read_text()
    start = text.index("RELEASES: Tuple[TorchRelease, ...] = (")
    end = text.index("\n)\n", start)
    path.write_text(text[: end + 1] + line + text[end + 1 :])
    return path


def branch_name(version: str) -> str:
    """The one branch (and so the one pull request) a torch release is ever proposed on."""
    return "torch-watch/torch-" + ".".join(version.split(".")[:2])


def earlier_proposal(prs: List[Dict[str, Any]], branch: str) -> Optional[Dict[str, Any]]:
    """The pull request (any state) already opened from ``branch``, if any."""
    for pr in prs:
        if pr.get("headRefName") == branch:
            return pr
    return None


def _github_output(path: Optional[str], **values: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as out:
            for k, v in values.items():
                out.write(f"{k}={v}\n")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pypi-json", help="read this file instead of PyPI")
    p.add_argument("--apply", action="store_true", help="insert the proposed line into support.py")
    p.add_argument("--body", help="write a pull-request body (Markdown) here")
    p.add_argument("--proposed", help="the repository's pull requests as JSON (gh pr list --state all "
                   "--json number,state,headRefName,url): a release proposed before is skipped")
    p.add_argument("--github-output", help="append new=, torch=, branch=, changed= to this file")
    args = p.parse_args(argv)
    if args.pypi_json:
        pypi = json.loads(Path(args.pypi_json).read_text())
    else:
        with urllib.request.urlopen(PYPI_URL, timeout=60) as r:  # noqa: S310 (fixed https URL)
            pypi = json.load(r)
    version = newest_missing(pypi)
    if version is None:
        print("the support table covers the newest torch release")
        _github_output(args.github_output, new="false")
        return 0
    mm = ".".join(version.split(".")[:2])
    branch = branch_name(version)
    if args.proposed:
        earlier = earlier_proposal(json.loads(Path(args.proposed).read_text()), branch)
        if earlier is not None:
            state = str(earlier.get("state", "")).lower()
            print(f"torch {mm} was proposed before in pull request #{earlier.get('number')} "
                  f"({state}, {earlier.get('url', branch)}): not proposing it again")
            _github_output(args.github_output, new="false", torch=mm, branch=branch)
            return 0
    f = facts(pypi, version)
    line = table_line(f)
    print(json.dumps(f, indent=2))
    print(line, end="")
    changed = ""
    if args.apply:
        changed = str(apply(line).relative_to(ROOT))
    if args.body:
        Path(args.body).write_text(
            f"torch {version} is on PyPI and not in the support table.\n\n"
            f"- CPython wheels: {', '.join(f['pythons'])} (Requires-Python `{f['requires_python']}`)\n"
            f"- CUDA of the default PyPI wheel: {f['pypi_cuda'] or 'not found in its requirements'}\n"
            f"- platforms with wheels: {', '.join(f['platforms'])}\n\n"
            "Before merging: confirm the CUDA variants on PyTorch's index (Linux x86_64, aarch64, "
            "Windows), the C++ ABI and standard, and the architecture lists, then run "
            f"`python -m mamba_kernels matrix --torch {mm}`.\n"
        )
    _github_output(args.github_output, new="true", torch=mm, branch=branch, changed=changed)
    return NEW_RELEASE


if __name__ == "__main__":
    raise SystemExit(main())
