"""Command line: ``python -m mamba_kernels`` / ``mamba-kernels``.

Each verb is a function taking the parsed arguments and returning the exit status;
exit 0 only when what was asked for holds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

from .version import __version__


def _cmd_info(args: argparse.Namespace) -> int:
    from . import variant
    from .environment import snapshot

    info = snapshot()
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    t = info["torch"]
    print(f"mamba-kernels {info['mamba_kernels']}")
    print(f"python        {info['python']} ({info['platform']})")
    if not t.get("installed"):
        print(f"torch         not importable: {t.get('error')}")
        return 0
    abi = variant.abi_name(t["cxx11_abi"])
    print(f"torch         {t['version']} (CUDA {t['cuda'] or 'none'}, {abi} ABI)")
    if t["gpus"]:
        for g in t["gpus"]:
            print(f"gpu {g['index']}         {g['name']} (sm {g['capability']})")
    else:
        print("gpu           none visible")
    print(f"backend mode  {info['backend_mode']}")
    for kernel, b in info["backends"].items():
        print(f"{kernel:<15}{b['backend']}: {b['reason']}")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from . import doctor

    return doctor.main(as_json=args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mamba-kernels",
        description="Drop-in causal_conv1d and selective-scan kernels: environment report and tools.",
    )
    parser.add_argument("--version", action="version", version=f"mamba-kernels {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    p = sub.add_parser("info", help="report the environment and the backend each kernel uses")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=_cmd_info)
    p = sub.add_parser("doctor", help="diagnose what is broken and print the one command that fixes each")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_doctor)
    from . import index, matrix, resolve  # `matrix`, `index`: release tooling; `resolve`: users

    resolve.register(sub)
    matrix.register(sub)
    index.register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except ValueError as e:  # bad knob values and the like: one clear line, no traceback
        print(f"mamba-kernels: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
