"""The plan step of .github/workflows/release.yml: which cells a run builds, handed to the build
jobs as one GitHub job matrix per platform.

  python -m ci.plan [--event EVENT] [--torch T] [--cuda C] [--python P] [--os O] [--platform PL]
                    [--github-output FILE] [--summary FILE]

- A tag push or a dispatch builds the matrix (``python -m mamba_kernels matrix``), filtered by the
  dispatch's inputs; a filter naming no known value, or matching no cell, is an error.
- A pull request builds the smoke selection (:func:`smoke_cells`): one cell per toolchain family
  the matrix contains, a family being (platform, manylinux image, CUDA major, classic or stable,
  the CUDA toolkit's source, the host-compiler setting, the build torch of a stable cell):
  :func:`family`. The filters are ignored.
- Each platform's matrix holds only the fields build-cells.yml reads (:data:`BUILD_FIELDS`); the
  job re-derives everything else from the cell id. All outputs of the plan job together must fit
  GitHub's limit for one job's outputs (:data:`OUTPUT_LIMIT_BYTES`, counted as UTF-16), and each
  matrix GitHub's 256 jobs.

Writes ``<platform>=<matrix JSON>``, ``n_<platform>=<count>`` and ``total=<count>`` to
``--github-output`` (stdout without it). Errors are one ``::error`` line and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ci import cell_fields, platforms
from mamba_kernels.facts import support, versions
from mamba_kernels.release import matrix

# The matrix fields .github/workflows/build-cells.yml reads (tests/test_workflows.py checks the
# workflow reads no other): the job's name and runner, its limits, and the compiler cache key.
BUILD_FIELDS: Tuple[str, ...] = (
    "id", "runner", "platform", "cuda", "cibw_image", "timeout_minutes", "build_timeout_minutes",
)
# GitHub: the outputs of one job may total at most 1 MB, their size approximated as UTF-16
# (two bytes per character here: the JSON is ASCII); docs/RELEASING.md.
OUTPUT_LIMIT_BYTES = 1024 * 1024
JOB_LIMIT = cell_fields.GITHUB_MATRIX_LIMIT


class PlanError(RuntimeError):
    """The plan cannot be made; the message is one line."""


def _rank(cell: support.Cell) -> Tuple[Tuple[int, ...], ...]:
    """Newest build torch, then CUDA, then Python: the cell a family's smoke build takes."""
    return versions.key(cell.build_with[0]), versions.key(cell.cuda), versions.key(cell.python)


class Family(NamedTuple):
    """A toolchain family (:func:`family`), each part a short text (the plan's summary joins them)."""

    platform: str  # "linux_x86_64"
    image: str  # the manylinux image, or "windows" (the runner itself)
    cuda_major: str  # "12"
    binding: str  # "classic" / "stable"
    toolkit: str  # where the CUDA toolkit comes from: "pypi", "rhel7", "rhel8", "redist", "nvidia-installer"
    host_compiler: str  # "gcc-toolset-13", "gcc of the image", "msvc (MAMBA_KERNELS_CI_MSVC_TOOLSET=14.29)"
    build_torch: str  # a stable cell's build torch ("torch 2.11"); "its own torch" for a classic cell


def toolkit_origin(cell: support.Cell) -> str:
    """Where CI gets the cell's CUDA toolkit, as exactly as the facts tell: PyPI's packages,
    NVIDIA's RPM repository of one RHEL release ("rhel7", "rhel8") or its redistributable archives
    ("redist"), as support.json's linux_toolkits chooses for the image; NVIDIA's Windows installer.
    cell_fields.toolkit_source where linux_toolkits knows no source for the cell (the build says why)."""
    source = cell_fields.toolkit_source(cell)
    if source == "nvidia-repo":
        try:
            return platforms.linux.cell_toolkit(cell).source
        except platforms.base.CellError:
            return source
    return source


_TOOLSET = re.compile(r"/opt/rh/((?:gcc-toolset|devtoolset)-\d+)/")


def host_compiler_setting(cell: support.Cell) -> str:
    """The host compiler the cell's build gives nvcc, as the platform's compiler_env sets it: the
    image's or runner's own, a gcc-toolset (CC/CXX), or the variables that select another (the MSVC
    toolset of a Windows cell below CUDA 12.4)."""
    plat = platforms.for_cell(cell)
    env = plat.compiler_env(cell)
    if not env:
        return f"{plat.host_compiler} of the {'image' if plat.in_container else 'runner'}"
    toolsets = sorted({m.group(1) for v in env.values() for m in [_TOOLSET.search(v)] if m})
    if toolsets:
        return "+".join(toolsets)
    return f"{plat.host_compiler} (" + " ".join(f"{k}={v}" for k, v in sorted(env.items())) + ")"


def family(cell: support.Cell) -> Family:
    """The toolchain family of a cell: its platform, manylinux image (or the Windows runner), CUDA
    major and binding, where its CUDA toolkit comes from (:func:`toolkit_origin`), the host
    compiler its build sets (:func:`host_compiler_setting`) and, for a stable cell, the torch it
    builds with (the newest with a build of its CUDA: not the same for every stable cell). Cells of
    one family share the container or runner, the toolkit's source and layout, the host compiler
    and the binding (a classic cell builds with its own torch, which the family's smoke cell takes
    newest), so one built cell stands for them."""
    image = cell.manylinux or platforms.for_cell(cell).name  # no image: the runner itself
    build_torch = f"torch {cell.build_with[0]}" if cell.stable else "its own torch"
    return Family(cell.platform, image, cell.cuda.split(".")[0], matrix.binding(cell), toolkit_origin(cell),
                  host_compiler_setting(cell), build_torch)


def smoke_cells(cells: Sequence[support.Cell]) -> List[support.Cell]:
    """One cell per toolchain family present in ``cells``, in matrix order: the family's newest
    torch, then newest CUDA, then newest Python (so a pull request adding a release builds it)."""
    best: Dict[Family, support.Cell] = {}
    for cell in cells:
        key = family(cell)
        held = best.get(key)
        if held is None or _rank(cell) > _rank(held):
            best[key] = cell
    order = {family(c): i for i, c in reversed(list(enumerate(cells)))}
    return sorted(best.values(), key=lambda c: order[family(c)])


def build_entry(cell: support.Cell) -> Dict[str, object]:
    """A build job's matrix entry: the fields build-cells.yml reads."""
    fields = cell_fields.ci_fields(cell)
    return {k: fields[k] for k in BUILD_FIELDS}


def outputs(cells: Sequence[support.Cell]) -> Dict[str, str]:
    """The plan job's outputs for ``cells``: one matrix per platform, the counts, the total."""
    out: Dict[str, str] = {}
    for plat in support.PLATFORMS:
        mine = [c for c in cells if c.platform == plat]
        if len(mine) > JOB_LIMIT:
            raise PlanError(f"{plat} has {len(mine)} cells; a job matrix holds at most {JOB_LIMIT}")
        out[plat] = json.dumps({"include": [build_entry(c) for c in mine]}, separators=(",", ":"))
        out[f"n_{plat}"] = str(len(mine))
    out["total"] = str(len(cells))
    size = output_bytes(out)
    if size > OUTPUT_LIMIT_BYTES:
        raise PlanError(f"the plan's outputs are {size} bytes (UTF-16), over GitHub's "
                        f"{OUTPUT_LIMIT_BYTES} per job")
    return out


def output_bytes(out: Dict[str, str]) -> int:
    """The size GitHub counts for a job's outputs: names and values, as UTF-16."""
    return sum(len((k + v).encode("utf-16-le")) for k, v in out.items())


def select(event: str, torch: Optional[str] = None, cuda: Optional[str] = None,
           python: Optional[str] = None, os: Optional[str] = None,
           platform: Optional[str] = None) -> List[support.Cell]:
    """The cells of a run: the smoke selection for a pull request, else the filtered matrix."""
    if event == "pull_request":
        return smoke_cells(matrix.select())
    filters = {"torch": torch or None, "cuda": cuda or None, "python": python or None, "os": os or None,
               "platform": platform or None}
    try:
        cells = matrix.select(**filters)
    except ValueError as e:
        raise PlanError(str(e)) from None
    if not cells:
        given = " ".join(f"--{k} {v}" for k, v in filters.items() if v)
        raise PlanError(f"the filters ({given}) match no cell of the matrix; "
                        "see python -m mamba_kernels matrix")
    return cells


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ci.plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--event", default="workflow_dispatch", help="github.event_name")
    for name in ("torch", "cuda", "python", "os", "platform"):
        p.add_argument(f"--{name}", default="", help=f"the dispatch's {name} filter (empty: all)")
    p.add_argument("--github-output", help="append the outputs to this file ($GITHUB_OUTPUT)")
    p.add_argument("--summary", help="append a summary to this file ($GITHUB_STEP_SUMMARY)")
    args = p.parse_args(argv)
    try:
        cells = select(args.event, args.torch, args.cuda, args.python, args.os, args.platform)
        out = outputs(cells)
    except PlanError as e:
        print(f"::error title=plan::{e}")
        return 1
    lines = [f"{k}={v}" for k, v in out.items()]
    if args.github_output:
        with open(args.github_output, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    else:
        print("\n".join(lines))
    if args.summary:
        kind = "smoke cells, one per toolchain family" if args.event == "pull_request" else "cells"
        text = [f"{plat}: {out[f'n_{plat}']} {kind}" for plat in support.PLATFORMS]
        if args.event == "pull_request":
            parts = ", ".join(f.replace("_", " ") for f in Family._fields)
            text.append(f"a toolchain family: ({parts})")
            text += [f"- {matrix.cell_id(c)} ({', '.join(family(c))})" for c in cells]
        text.append(f"plan outputs: {output_bytes(out)} of {OUTPUT_LIMIT_BYTES} bytes (UTF-16)")
        with open(args.summary, "a", encoding="utf-8") as f:
            f.write("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
