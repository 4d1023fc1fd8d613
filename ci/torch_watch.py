#!/usr/bin/env python3
"""Notice a torch release the support table lacks, and propose the table entry for it.

``python ci/torch_watch.py [--pypi-json FILE] [--apply] [--data FILE] [--body FILE]
[--proposed FILE] [--github-output FILE]``

Reads PyPI's JSON for torch (or FILE), finds the newest final major.minor release that the support
table (mamba_kernels/support.json, read by mamba_kernels/support.py) does not list, and prints what
PyPI says about it: the CPython versions with wheels per platform (from the file names),
Requires-Python, and the CUDA variant of the default Linux wheel (from its CUDA requirements).
With --apply it appends a ``releases`` entry to the data file (never to code) for a pull request a
maintainer completes (PyTorch's own index, which holds the other CUDA variants, is not reachable
through PyPI's API); the entry lists the PyPI CUDA variant on every platform PyPI has wheels for,
so that the pull request's smoke build tries that torch on each of them before merge. The file is
rewritten in its canonical formatting (``support.write_data``), so the diff is the new entry alone.

Each release is proposed once, on the branch ``torch-watch/torch-<major.minor>``. --proposed
reads the repository's pull requests (``gh pr list --state all --json
number,state,headRefName,url``); a release whose branch already had a pull request, open,
closed or merged, is not proposed again.

Exit 0 with nothing to propose, 10 when a new release was found and should be proposed (so the
workflow knows to push the branch and open the pull request). --github-output appends
``new``, ``torch``, ``branch`` and ``changed`` (the data file --apply edited, relative to the
repository) for the workflow.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mamba_kernels import support  # noqa: E402

SUPPORT_DATA = support.DATA_FILE
PYPI_URL = "https://pypi.org/pypi/torch/json"
NEW_RELEASE = 10


def _mm(version: str) -> Tuple[int, int]:
    parts = version.split(".")
    return int(parts[0]), int(parts[1])


def newest_missing(pypi: Dict[str, Any], known: Optional[Set[str]] = None) -> Optional[str]:
    """The newest final release (``2.16.0``) whose major.minor the table (or ``known``) lacks,
    or None."""
    known = {r.torch for r in support.RELEASES} if known is None else known
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


def release_entry(f: Dict[str, Any]) -> Dict[str, Any]:
    """The ``releases`` entry for the data file: the PyPI CUDA variant on every platform PyPI
    has wheels for (PyTorch's index is expected to carry it there too; the smoke build before
    merge finds out), each platform's Python range where it differs from the union."""
    mm = ".".join(f["version"].split(".")[:2])
    cuda = f["pypi_cuda"] or "13.0"
    plats = set(f.get("platforms", []))
    per_platform = {
        p: list(v) for p, v in f.get("platform_pythons", {}).items()
        if p in support.PLATFORMS and list(v) != list(f["pythons"])
    }
    entry = {
        "torch": mm,
        "pythons": list(f["pythons"]),
        "platform_pythons": {p: per_platform[p] for p in support.PLATFORMS if p in per_platform},
        "cuda": {p: [cuda] if p in plats else [] for p in support.PLATFORMS},
        "pypi_cuda": cuda,
        "linux_pre_cxx11": [],
        "manylinux": "manylinux_2_28",
        "cxx_std": 20,
        "note": "added by ci/torch_watch.py from PyPI: confirm the other CUDA variants",
    }
    assert tuple(entry) == support.RELEASE_KEYS
    return entry


def apply(entry: Dict[str, Any], path: Path = SUPPORT_DATA) -> Path:
    """Append ``entry`` as the newest release of the data file at ``path`` (checked, then
    written canonically); the file it edited."""
    data = support.read_data(path)
    data["releases"].append(entry)
    return support.write_data(data, path)


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
    p.add_argument("--apply", action="store_true", help="append the proposed entry to the data file")
    p.add_argument("--data", default=str(SUPPORT_DATA), help="the support data file (default: %(default)s)")
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
    data_file = Path(args.data).resolve()
    known = {str(e["torch"]) for e in support.read_data(data_file)["releases"]}
    version = newest_missing(pypi, known)
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
    entry = release_entry(f)
    print(json.dumps(f, indent=2))
    print(json.dumps(entry, indent=2))
    changed = ""
    if args.apply:
        edited = apply(entry, data_file)
        changed = edited.relative_to(ROOT).as_posix() if ROOT in edited.parents else str(edited)
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
