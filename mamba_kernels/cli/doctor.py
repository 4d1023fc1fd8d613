"""``doctor``: what is broken, and the one command that fixes each (install/doctor.py)."""

from __future__ import annotations

import argparse

from ..install import doctor


def _cmd_doctor(args: argparse.Namespace) -> int:
    return doctor.main(as_json=args.json)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``doctor`` verb to the CLI."""
    p = subparsers.add_parser("doctor",
                              help="diagnose what is broken and print the one command that fixes each")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_doctor)
