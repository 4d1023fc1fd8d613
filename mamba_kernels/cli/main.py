"""Command line: ``python -m mamba_kernels`` / ``mamba-kernels``.

Each verb is a function taking the parsed arguments and returning the exit status;
exit 0 only when what was asked for holds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any, Dict, List, Optional

from ..facts import release_index, variant, versions
from ..facts.version import __version__
from ..install import doctor, environment, resolve
from ..install import installer as install
from ..install.environment import snapshot
from ..release import index, matrix
from ..runtime import installed


def _cmd_info(args: argparse.Namespace) -> int:
    info = snapshot()
    info["build"] = installed.describe()
    info["mamba_kernels"] = info["build"]["version"]
    info["index"] = _serving_index(info["torch"])
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    t = info["torch"]
    head = installed.lines(info["build"])
    print(head[0])
    print(f"python        {installed.python_text()}")
    if not t.get("installed"):
        print(f"torch         not importable: {t.get('error')}")
        return 0
    print(f"torch         {installed.torch_text(t['version'], t['cuda'], t['cxx11_abi'])}")
    if t["gpus"]:
        for g in t["gpus"]:
            print(f"gpu {g['index']}         {g['name']} (sm {g['capability']})")
    else:
        print("gpu           none visible")
    print(head[1])
    ix = info["index"]
    print(f"index         {' '.join(ix['indexes'])} ({ix['from']})")
    if ix["url"]:
        print(f"wheels here   {ix['url']} (label {ix['label']})")
    else:
        print(f"wheels here   {ix['why']}")
    print(f"backend mode  {info['backend_mode']}")
    print(f"scan states   {info['scan_states']}")
    for kernel, b in info["backends"].items():
        print(f"{kernel:<15}{b['backend']}: {b['reason']}")
    return 0


def _serving_index(torch_facts: Dict[str, Any]) -> Dict[str, Any]:
    """The index ``install`` reads and, for the running torch, the label of the release wheel and
    its PEP 503 index URL (the resolver's own choice among the wheels the matrix builds)."""

    indexes, origin = release_index.default_indexes()
    out: Dict[str, Any] = {"indexes": list(indexes), "from": origin, "label": None, "url": None, "why": ""}
    if not torch_facts.get("installed"):
        out["why"] = "no torch: no wheel to choose"
        return out
    if not torch_facts.get("cuda"):
        out["why"] = f"torch {torch_facts['version']} is a CPU build: no release wheel serves it"
        return out
    target = environment.detect(torch=torch_facts["version"], cuda=torch_facts["cuda"],
                                cxx11_abi=torch_facts["cxx11_abi"],
                                gpu_archs=[g["capability"] for g in torch_facts.get("gpus", [])],
                                toolchain=False)
    try:
        cells = matrix.select(torch=versions.minor(target.torch or ""), python=target.python,
                              platform=target.platform)
    except ValueError as e:
        out["why"] = f"no release wheel known for this environment ({e})"
        return out
    names = [variant.wheel_name(__version__, c) for c in cells]
    res = resolve.resolve([resolve.Candidate(n, n) for n in names], target)
    if res.selected is None or res.selected.info is None or res.selected.info.variant is None:
        out["why"] = f"the release matrix has no wheel for {resolve.describe_target(target)}"
        return out
    label = variant.variant_label(res.selected.info.variant)
    out["label"] = label
    out["url"] = release_index.variant_index(label)
    if out["url"] is None:
        out["why"] = f"label {label}; {' '.join(indexes)} is not a site with per-variant index pages"
    return out


def _cmd_doctor(args: argparse.Namespace) -> int:
    return doctor.main(as_json=args.json)


EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # Ctrl-C; SIGTERM is 143 (128 + the signal number, as shells report it)


class _Parser(argparse.ArgumentParser):
    """argparse with a usage error as one line (the verb, the argument, the rule, the value)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())} (--help shows the usage)\n")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that what is under way is undone as for Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.exit_status = 128 + signum


def _on_sigterm(signum: int, _frame: Any) -> None:
    raise Terminated(signum)


class _Version(argparse.Action):
    """``--version``: the installed version with its label (read only when asked: metadata)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"mamba-kernels {installed.version()}")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mamba-kernels",
        description="Drop-in causal_conv1d and selective-scan kernels: environment report and tools.",
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="print the installed version and exit")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    p = sub.add_parser("info", help="report the environment and the backend each kernel uses")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=_cmd_info)
    p = sub.add_parser("doctor", help="diagnose what is broken and print the one command that fixes each")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_doctor)

    resolve.register(sub)
    install.register(sub)
    matrix.register(sub)
    index.register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    old = None
    if hasattr(signal, "SIGTERM") and threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return args.func(args)
    except ValueError as e:  # bad knob values and the like: one clear line, no traceback
        print(f"mamba-kernels: error: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM in a verb that has nothing to undo
        print(f"mamba-kernels {args.verb}: interrupted", file=sys.stderr)
        return getattr(e, "exit_status", EXIT_INTERRUPTED)
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


if __name__ == "__main__":
    raise SystemExit(main())
