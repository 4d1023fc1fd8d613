"""``install`` and ``download``: choose, fetch, verify and install (or keep) the release wheel."""

from __future__ import annotations

import argparse
from typing import Callable

from ..install import installer
from . import target_options

Verb = Callable[[argparse.Namespace], int]


def _verb(name: str, body: Verb, interrupted: str) -> Verb:
    """A verb's entry point: its installer.Failure as one line and its exit code; Ctrl-C as
    ``interrupted``."""

    def run(args: argparse.Namespace) -> int:
        try:
            return body(args)
        except installer.Failure as e:
            if not e.shown:
                installer.warn(name, e.line)
            return e.code
        except KeyboardInterrupt as e:
            installer.warn(name, interrupted)
            return getattr(e, "exit_status", installer.EXIT_INTERRUPTED)
        except OSError as e:  # a file-system error no step foresaw: still one line, exit 7
            installer.warn(name, f"a file could not be written or read: {e.strerror or e}"
                           + (f" ({e.filename})" if e.filename else ""))
            return installer.EXIT_FS

    return run


_cmd_install = _verb("install", installer.run_install, "interrupted: the partial download was removed "
                     "and the environment is as it was before")
_cmd_download = _verb("download", installer.run_download, "interrupted: the partial download was removed")


def _common(p: argparse.ArgumentParser) -> None:
    target_options.add_target_arguments(p)
    p.add_argument("--dry-run", action="store_true",
                   help="choose and print what would be done; fetch nothing")
    p.add_argument("--allow-unhashed", action="store_true",
                   help="accept a wheel from a remote index that lists no sha256 for it (for a local "
                        "mirror you trust; docs/INSTALL.md, What is trusted)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``install`` and ``download`` verbs to the CLI."""
    codes = ("exit status: 0 done, 2 bad arguments, 3 no wheel fits, 4 no index or download could be read "
             "(network, timeout, truncated, malformed page), 5 the file did not verify (sha256, no hash, "
             "not our wheel, torch pin), 6 the target cannot take it (no torch, no pip/uv, installer "
             "failed), 7 a file could not be written (disk full, read-only, not a folder), 130 "
             "interrupted (143 on SIGTERM)")
    p = subparsers.add_parser(
        "install", help="choose, download, verify and install the release wheel for this environment",
        description="Choose the release wheel for the target interpreter's torch, download it, verify "
                    "its sha256 and install that exact file with pip --no-deps (torch is never "
                    "changed). " + codes,
    )
    _common(p)
    p.add_argument("--python-exe", metavar="PATH",
                   help="the interpreter whose environment gets the wheel (default: this one); its torch "
                        "decides the wheel")
    p.set_defaults(func=_cmd_install)
    p = subparsers.add_parser(
        "download", help="fill a wheelhouse with the verified release wheel for another machine",
        description="Choose the release wheel for the machine the options describe (this one where "
                    "not given), download and verify it into --dest, and print how to install it "
                    "there. " + codes,
    )
    p.add_argument("--dest", required=True, metavar="DIR", help="the wheelhouse directory (created)")
    _common(p)
    p.set_defaults(func=_cmd_download)
