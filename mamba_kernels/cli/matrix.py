"""``matrix``: list the release build matrix (cells, wheel names, GitHub Actions matrix)."""

from __future__ import annotations

import argparse
import json
import sys

from ..facts import support, variant
from ..facts.version import __version__
from ..release import matrix


def _cmd_matrix(args: argparse.Namespace) -> int:
    cells = matrix.select(torch=args.torch, cuda=args.cuda, python=args.python, os=args.os, arch=args.arch,
                          platform=args.platform, abi=args.abi, binding=args.binding)
    version = args.package_version
    if args.github:
        print(json.dumps(matrix.github_matrix(cells, version), separators=(",", ":")))
    elif args.json:
        print(json.dumps({"version": version, "counts": matrix.counts(cells),
                          "cells": [matrix.ci_fields(c, version) for c in cells]}, indent=2))
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


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``matrix`` verb to the CLI."""
    p = subparsers.add_parser(
        "matrix", help="list the release build matrix (cells, wheel names, GitHub Actions matrix)",
        description="The release build matrix: one cell per wheel. Filters are exact values; "
                    "exit 1 when no cell matches.",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="every cell with its CI fields, as JSON")
    out.add_argument("--github", action="store_true", help="a GitHub Actions matrix ({\"include\": [...]})")
    out.add_argument("--wheels", action="store_true", help="the exact wheel file names, one per line")
    out.add_argument("--counts", action="store_true", help="wheels per platform, as JSON")
    out.add_argument("--markdown", action="store_true", help="a summary table per torch and platform")
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
    p.set_defaults(func=_cmd_matrix)
