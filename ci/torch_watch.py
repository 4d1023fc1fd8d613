"""Notice a torch release the support table lacks, and propose the table entry for it.

``python -m ci.torch_watch [--pypi-json FILE] [--apply] [--data FILE] [--body FILE]
[--proposed FILE] [--github-output FILE]``

Reads PyPI's JSON for torch (or FILE), finds the newest final major.minor release that the support
table (mamba_kernels/facts/support.json, read by mamba_kernels/facts/support.py) does not list, and
prints what PyPI says about it: the CPython versions with wheels per platform (from the file names),
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

A release from the stable-ABI floor (torch 2.10) on needs no new cells: the stable wheels
already published serve it (docs/COMPAT.md §11). What it needs is a smoke test: on each platform
and each CUDA variant it ships, install that torch, install the stable wheel the resolver picks
for it from the release index, and import both extensions (python -m ci.build_cell
check-installed --torch). Only a CUDA variant no stable cell serves (a new CUDA major, or a minor with a new
architecture list) makes new stable cells, which are built (from the proposal branch) like a
release's; a release below the floor would make classic cells, built alike. :func:`plan` says
which.

Exit 0 with nothing to propose, 10 when a new release was found and should be proposed (so the
workflow knows to push the branch and open the pull request). --github-output appends
``new``, ``torch``, ``branch`` and ``changed`` (the data file --apply edited, relative to the
repository), and for a new release ``smoke`` / ``n_smoke`` (a job matrix of smoke tests, one
line of JSON) and ``build`` / ``n_build`` (a JSON list of the cell ids to build) for the workflow.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

from ci import cell_fields, platforms
from ci.platforms import base
from mamba_kernels.facts import support, variant, versions
from mamba_kernels.release import matrix

ROOT = Path(__file__).resolve().parent.parent

SUPPORT_DATA = support.DATA_FILE
PYPI_URL = "https://pypi.org/pypi/torch/json"
NEW_RELEASE = 10


def newest_missing(pypi: Dict[str, Any], known: Optional[Set[str]] = None) -> Optional[str]:
    """The newest final release (``2.16.0``) whose major.minor the table (or ``known``) lacks,
    or None."""
    known = {r.torch for r in support.RELEASES} if known is None else known
    finals = [v for v, files in pypi["releases"].items() if re.fullmatch(r"\d+\.\d+\.\d+", v) and files]
    newest_known = max(versions.minor_key(t + ".0") for t in known)
    missing = [v for v in finals if versions.minor(v) not in known and versions.minor_key(v) > newest_known]
    return max(missing, key=versions.key) if missing else None


def _platform_of(filename: str) -> Optional[str]:
    for p in platforms.PLATFORMS:
        tag = p.pypi_file_tag(filename)
        if tag is not None:
            return tag
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


def _serving(cells: List[support.Cell], platform: str, cuda: str) -> Optional[support.Cell]:
    """The stable cell whose wheel the resolver picks for torch's CUDA ``cuda`` on ``platform``:
    the same major, the highest minor not above torch's (mamba_kernels/install/resolve.py)."""
    fits = [c for c in cells if c.platform == platform and c.cuda.split(".")[0] == cuda.split(".")[0]
            and versions.minor_key(c.cuda) <= versions.minor_key(cuda)]
    return max(fits, key=lambda c: versions.minor_key(c.cuda)) if fits else None


def plan(entry: Dict[str, Any]) -> Dict[str, Any]:
    """What the release of ``entry`` (a ``releases`` entry) needs before merge.

    ``build``: the ids of the cells the table gains (every cell of a release below the
    stable-ABI floor; otherwise the stable cells a CUDA variant no existing one serves adds).
    ``smoke``: for a release from the floor on, one test per platform and CUDA variant it
    ships that an existing (published) stable wheel serves: that torch from PyTorch's index
    with the wheel the resolver picks, on the newest CPython the release has there.
    """
    new = support.release_from_data(entry)
    if versions.minor_key(new.torch + ".0") < versions.minor_key(support.STABLE_ABI_MIN_TORCH + ".0"):
        cells = support.release_cells(new)
        return {"torch": new.torch, "build": [matrix.cell_id(c) for c in cells], "smoke": []}
    # By id: a newer build torch for an existing cell makes no new wheel.
    before = {matrix.cell_id(c) for c in support.stable_cells()}
    after = support.stable_cells(releases=tuple(support.RELEASES) + (new,))
    built = [c for c in after if matrix.cell_id(c) not in before]
    smoke = []
    for plat in support.PLATFORMS:
        pythons = [py for py in new.pythons_on(plat)
                   if versions.minor_key(py) >= versions.minor_key(support.STABLE_ABI_PYTHON)]
        for cuda in new.cuda[plat]:
            cell = _serving(after, plat, cuda)
            if cell is None or cell in built or not pythons:
                continue  # a new cell: its build tests it
            smoke.append({
                "id": f"smoke-torch{new.torch}-{variant.cuda_tag(cuda)}-{plat}",
                "torch": new.torch,
                "torch_cuda": cuda,
                "torch_requirement": variant.torch_requirement(new.torch),
                "torch_index": cell_fields.torch_index(cuda),
                "python": pythons[-1],
                "platform": plat,
                "runner": cell_fields.RUNNERS[plat],
                "cell": matrix.cell_id(cell),
                "label": variant.cell_label(cell),
            })
    return {"torch": new.torch, "build": [matrix.cell_id(c) for c in built], "smoke": smoke}


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
    p.add_argument("--pypi-url", default=PYPI_URL, help="PyPI's JSON for torch (default: %(default)s)")
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
        with tempfile.TemporaryDirectory() as tmp:  # retried, one line when it gives up
            try:
                got = base.download(args.pypi_url, Path(tmp) / "torch.json")
            except base.CellError as e:
                print(f"::error title=torch-watch::{e}")
                return 1
            pypi = json.loads(got.read_text())
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
    try:
        todo = plan(entry)
    except ValueError as e:  # e.g. a CUDA major the architecture table does not know yet
        todo = {"torch": mm, "build": [], "smoke": [], "problem": f"the matrix cannot place it: {e}"}
    print(json.dumps(f, indent=2))
    print(json.dumps(entry, indent=2))
    print(f"torch {mm}: {len(todo['smoke'])} smoke test(s) of the published stable wheels, "
          f"{len(todo['build'])} new cell(s) to build: {', '.join(todo['build']) or 'none'}")
    changed = ""
    if args.apply:
        edited = apply(entry, data_file)
        changed = edited.relative_to(ROOT).as_posix() if ROOT in edited.parents else str(edited)
    if args.body:
        served = ("- served by the published stable wheels, smoke-tested before merge: "
                  + (", ".join(f"{t['platform']} CUDA {t['torch_cuda']} with {t['label']}"
                               for t in todo["smoke"]) or "none") + "\n"
                  + f"- new cells to build: {', '.join(todo['build']) or 'none'}\n"
                  + (f"- **{todo['problem']}**: complete mamba_kernels/facts/support.json before merging\n"
                     if todo.get("problem") else ""))
        Path(args.body).write_text(
            f"torch {version} is on PyPI and not in the support table.\n\n"
            f"- CPython wheels: {', '.join(f['pythons'])} (Requires-Python `{f['requires_python']}`)\n"
            f"- CUDA of the default PyPI wheel: {f['pypi_cuda'] or 'not found in its requirements'}\n"
            f"- platforms with wheels: {', '.join(f['platforms'])}\n" + served + "\n"
            "Before merging: confirm the CUDA variants on PyTorch's index (Linux x86_64, aarch64, "
            "Windows), the C++ ABI and standard, and the architecture lists, then run "
            f"`python -m mamba_kernels matrix --torch {mm}`.\n"
        )
    smoke = json.dumps({"include": todo["smoke"]}, separators=(",", ":"))
    _github_output(args.github_output, new="true", torch=mm, branch=branch, changed=changed,
                   smoke=smoke, n_smoke=str(len(todo["smoke"])),
                   build=json.dumps(todo["build"], separators=(",", ":")), n_build=str(len(todo["build"])),
                   problem=todo.get("problem", ""))
    return NEW_RELEASE


if __name__ == "__main__":
    raise SystemExit(main())
