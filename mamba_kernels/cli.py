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

from .version import __version__


def _cmd_info(args: argparse.Namespace) -> int:
    from . import variant
    from .environment import snapshot

    info = snapshot()
    info["build"] = _installed_build()
    info["index"] = _serving_index(info["torch"])
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
    b = info["build"]
    print(f"build         {b['label'] or 'no variant label'} ({b['how']})")
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


def _installed_build() -> Dict[str, Any]:
    """The installed build's variant label: from the distribution's version (a release wheel
    carries it), else from the compiled extensions' BUILD_INFO (a local build), else none."""
    from importlib import metadata

    from . import buildinfo, dispatch, variant

    try:
        version = metadata.version("mamba-kernels")
    except metadata.PackageNotFoundError:
        version = None
    if version and "+" in version:
        text = version.split("+", 1)[1]
        try:
            variant.parse_label(text)
            return {"label": text, "version": version,
                    "how": f"the installed distribution's version {version}"}
        except ValueError:
            pass
    for kernel, name in dispatch.EXTENSIONS.items():
        path = dispatch._extension_file(name)
        found = buildinfo.find_in_file(path) if path else None
        if found is not None:
            try:  # a stable binary is labelled for its target, a classic one for its torch
                text = (variant.stable_label(found.torch_cuda, found.stable_target) if found.stable
                        else variant.label(found.torch_version, found.torch_cuda, found.cxx11_abi))
            except (ValueError, TypeError):
                continue
            return {"label": text, "version": version,
                    "how": f"a local build: BUILD_INFO of {kernel}'s extension ({found.describe()})"}
    return {"label": None, "version": version, "how": f"mamba-kernels {version or __version__} without a "
            "compiled extension: the PyTorch path runs"}


def _serving_index(torch_facts: Dict[str, Any]) -> Dict[str, Any]:
    """The index ``install`` reads and, for the running torch, the label of the release wheel and
    its PEP 503 index URL (the resolver's own choice among the wheels the matrix builds)."""
    from . import environment, matrix, release_index, resolve, variant

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
        cells = matrix.select(torch=variant.minor(target.torch or ""), python=target.python,
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
    from . import doctor

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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
    from . import index, install, matrix, resolve  # `matrix`, `index`: release tooling; the rest: users

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
