"""Command line: ``python -m mamba_kernels`` / ``mamba-kernels``, the one entry point.

Each verb is a module of this package with a ``register(subparsers)``; the function it sets
takes the parsed arguments and returns the exit status, 0 only when what was asked for holds.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any, List, Optional

from ..runtime import installed
from . import doctor, index, info, install, matrix, resolve

# in the order --help lists them: users' verbs first, then release tooling
VERBS = (info, doctor, resolve, install, matrix, index)

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
    for verb in VERBS:
        verb.register(sub)
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


def program() -> int:
    """The command's entry point as a process (the console script and ``python -m
    mamba_kernels``): main(), then Ctrl-C ignored until the process has exited. The verb is over
    by then, done or undone, and CPython puts the default SIGINT handler back while it shuts
    down: an interrupt then would kill the process and lose the status it reports. (Not in
    main() itself, which tests also call in-process.)"""
    code = main()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # CPython's shutdown keeps an ignored signal ignored
    return code


if __name__ == "__main__":
    raise SystemExit(program())
