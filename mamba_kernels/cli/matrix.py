"""``matrix``: list the release build matrix (cells, wheel names, counts, tables)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import List

from ..facts import support, variant
from ..facts.version import __version__
from ..release import matrix


def selected(args: argparse.Namespace) -> List[support.Cell]:
    """The cells the filters of :func:`add_filters` select."""
    return matrix.select(torch=args.torch, cuda=args.cuda, python=args.python, os=args.os, arch=args.arch,
                         platform=args.platform, abi=args.abi, binding=args.binding)


def _cmd_matrix(args: argparse.Namespace) -> int:
    cells = selected(args)
    version = args.package_version
    if args.json:
        print(json.dumps({"version": version, "counts": matrix.counts(cells),
                          "cells": [matrix.cell_fields(c, version) for c in cells]}, indent=2))
    elif args.wheels:
        for c in cells:
            print(variant.wheel_name(version, c))
    elif args.counts:
        print(json.dumps(matrix.counts(cells)))
    elif args.markdown:
        print(matrix.markdown_table(cells))
    else:
        print(matrix.text_table(cells))
    if not cells:
        print("mamba-kernels: no cell matches these filters", file=sys.stderr)
        return 1
    return 0


def _one_of(names) -> str:
    """``a, b or c``."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def add_filters(p: argparse.ArgumentParser) -> None:
    """The cell filters and the version of the wheel names (ci/cell_fields.py takes them too)."""
    p.add_argument("--torch", help="torch release, e.g. 2.4")
    p.add_argument("--cuda", help="CUDA variant, e.g. 12.1")
    p.add_argument("--python", help="CPython version, e.g. 3.11")
    p.add_argument("--os", help=_one_of(matrix.OS_NAMES))
    p.add_argument("--arch", help=_one_of(matrix.ARCH_NAMES))
    p.add_argument("--platform", help=_one_of(support.PLATFORMS))
    p.add_argument("--abi", help="cxx11 or pre-cxx11 (Linux C++ ABI; classic cells only)")
    p.add_argument("--binding", help="classic (per torch minor) or stable (stable ABI, torch >= 2.10)")
    p.add_argument("--package-version", default=__version__,
                   help=f"public version for the wheel names (default {__version__})")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``matrix`` verb to the CLI."""
    p = subparsers.add_parser(
        "matrix", help="list the release build matrix (cells, wheel names, counts, tables)",
        description="The release build matrix: one cell per wheel. Filters are exact values; "
                    "exit 1 when no cell matches. The CI fields of each cell and the GitHub job "
                    "matrix: python -m ci.cell_fields in a checkout.",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="every cell with its planned fields, as JSON")
    out.add_argument("--wheels", action="store_true", help="the exact wheel file names, one per line")
    out.add_argument("--counts", action="store_true", help="wheels per platform, as JSON")
    out.add_argument("--markdown", action="store_true", help="a summary table per torch and platform")
    add_filters(p)
    p.set_defaults(func=_cmd_matrix)
