"""The CI fields of a release cell, beyond the plan of mamba_kernels/release/matrix.py: the
GitHub runner label, cibuildwheel's identifiers and image, PyTorch's index of the build and test
torch, where the CUDA toolkit comes from, the job's time limits; and the GitHub Actions job
matrix. They live here, outside the wheel: the package ships the planner, not the CI plumbing.

  python -m ci.cell_fields (--json | --github) [the filters of `python -m mamba_kernels matrix`]

``--json`` prints every selected cell with its fields, ``--github`` a GitHub job matrix.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

from mamba_kernels.cli import matrix as matrix_verb
from mamba_kernels.facts import support, variant
from mamba_kernels.facts.version import __version__
from mamba_kernels.release import matrix

# GitHub Actions refuses a job matrix of more than 256 entries.
GITHUB_MATRIX_LIMIT = 256

# Per platform (its record in facts/support.json): the GitHub runner label of its cells.
RUNNERS = {p.name: p.runner for p in support.PLATFORM_RECORDS}
# cibuildwheel's names for the manylinux images of each glibc baseline torch used: the tag's own
# name from manylinux_2_28 on, the legacy alias for 2_17.
_CIBW_IMAGE = {"manylinux_2_17": "manylinux2014"}
TORCH_INDEX = "https://download.pytorch.org/whl/{tag}"
# Hosted runners stop a job at 6 h; the build step stops earlier so the compiler cache is saved
# and a re-run resumes from it.
JOB_TIMEOUT_MINUTES = 350
BUILD_TIMEOUT_MINUTES = 320


def toolkit_source(cell: support.Cell) -> str:
    """Where CI gets the cell's CUDA toolkit.

    ``pypi``: CUDA 13.x on Linux (PyPI carries a complete 13.x compiler: nvcc, nvvm, crt, cccl,
    runtime). ``nvidia-repo``: CUDA 11.8/12.x on Linux (PyPI's 11.8/12.x "nvcc" wheels hold only
    ptxas and libnvvm), from NVIDIA's RPM repository inside the manylinux container.
    ``nvidia-installer``: Windows, NVIDIA's network installer on the runner.
    """
    if support.PLATFORM_BY_NAME[cell.platform].os == "windows":
        return "nvidia-installer"
    return "pypi" if int(cell.cuda.split(".")[0]) >= 13 else "nvidia-repo"


def cibuildwheel_identifier(cell: support.Cell) -> str:
    return f"{variant.python_tag(cell.python)}-{support.PLATFORM_BY_NAME[cell.platform].cibw_identifier}"


def cibw_image(cell: support.Cell) -> Optional[str]:
    """cibuildwheel's name of the cell's manylinux image; None without a container (Windows)."""
    return _CIBW_IMAGE.get(cell.manylinux, cell.manylinux) if cell.manylinux else None


def torch_index(cuda: str) -> str:
    """PyTorch's index of the torch builds for CUDA ``cuda``."""
    return TORCH_INDEX.format(tag=variant.cuda_tag(cuda))


def ci_fields(cell: support.Cell, version: str = __version__) -> Dict[str, Any]:
    """Everything the workflows and ci/build_cell.py need to know about one cell: the plan's
    fields (matrix.cell_fields) and the CI plumbing; ``torch_index`` and ``test_torch_index``
    are PyTorch's indexes of the build and test torch."""
    plat = support.PLATFORM_BY_NAME[cell.platform]
    return {
        **matrix.cell_fields(cell, version),
        "torch_index": torch_index(cell.build_with[1]),
        "test_torch_index": torch_index(cell.test_with[1]),
        "toolkit": toolkit_source(cell),
        "runner": RUNNERS[cell.platform],
        "cibw_platform": plat.cibw_platform,
        "cibw_archs": plat.cibw_arch,
        "cibw_build": cibuildwheel_identifier(cell),
        "cibw_image": cibw_image(cell),
        "timeout_minutes": JOB_TIMEOUT_MINUTES,
        "build_timeout_minutes": BUILD_TIMEOUT_MINUTES,
    }


def github_matrix(cells: List[support.Cell], version: str = __version__) -> Dict[str, Any]:
    """A GitHub Actions ``strategy.matrix`` value: ``{"include": [...]}``, one entry per cell."""
    if len(cells) > GITHUB_MATRIX_LIMIT:
        raise ValueError(
            f"a GitHub job matrix holds at most {GITHUB_MATRIX_LIMIT} cells, got {len(cells)}: "
            "split it with --platform (the release workflow runs one build job per platform)"
        )
    return {"include": [ci_fields(c, version) for c in cells]}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ci.cell_fields", description=__doc__.split("\n\n")[0])
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--json", action="store_true", help="every cell with its CI fields, as JSON")
    out.add_argument("--github", action="store_true", help="a GitHub Actions matrix ({\"include\": [...]})")
    matrix_verb.add_filters(p)
    args = p.parse_args(argv)
    try:
        cells = matrix_verb.selected(args)
        if args.github:
            print(json.dumps(github_matrix(cells, args.package_version), separators=(",", ":")))
        else:
            print(json.dumps({"version": args.package_version, "counts": matrix.counts(cells),
                              "cells": [ci_fields(c, args.package_version) for c in cells]}, indent=2))
    except ValueError as e:
        print(f"python -m ci.cell_fields: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly, as the verb does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    if not cells:
        print("python -m ci.cell_fields: no cell matches these filters", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
