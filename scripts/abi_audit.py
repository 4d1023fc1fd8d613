#!/usr/bin/env python3
"""ABI audit of stable-ABI extensions (docs/STABLE_ABI.md): a binary that claims to run on every
torch from 2.10 on may depend on torch only through the stable C shim that torch 2.10 exports.

For each shared object given, its undefined dynamic symbols (``nm -D --undefined-only``) must
include no C++ symbol of torch, ATen or c10 (``_ZN3c10``, ``_ZN2at``, ``_ZN5torch`` and their
``_ZNK`` const-method forms: those change between releases), and every ``aoti_torch_*`` /
``torch_*`` function it calls must be in the list torch 2.10 exports
(abi_audit_torch2.10_exports.txt next to this script, with how it was made).

Usage: ``python scripts/abi_audit.py FILE.so [...]``; prints one line per finding and a verdict
per file; exit 0 only when every file passes, 1 on findings, 2 when a file cannot be read.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterable, List, Set

EXPORTS = Path(__file__).with_name("abi_audit_torch2.10_exports.txt")
TARGET = "2.10"
# C++ torch/ATen/c10 symbols, mangled: namespaces c10, at, torch (N = nested name, K = const method).
_CXX_TORCH = re.compile(r"^_ZN(K)?(3c10|2at|5torch)")
_SHIM = re.compile(r"^(aoti_torch_|torch_)")


def exported(path: Path = EXPORTS) -> Set[str]:
    """The names torch 2.10 exports (comment lines skipped)."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            names.add(line)
    return names


def undefined_symbols(so: Path) -> List[str]:
    """The undefined dynamic symbols of ``so``, version suffixes (``@GLIBCXX_3.4``) dropped."""
    nm = shutil.which("nm")
    if nm is None:
        raise OSError("nm (binutils) is not on PATH")
    out = subprocess.run([nm, "-D", "--undefined-only", str(so)], capture_output=True, text=True)
    if out.returncode != 0:
        raise OSError(f"nm failed on {so}: {out.stderr.strip()}")
    return [line.split()[-1].split("@")[0] for line in out.stdout.splitlines() if line.strip()]


def findings(symbols: Iterable[str], allowed: Set[str]) -> List[str]:
    """Why these undefined symbols break the stable ABI (empty: they do not)."""
    found = []
    for sym in sorted(set(symbols)):
        if _CXX_TORCH.match(sym):
            found.append(f"{sym}: a C++ torch/ATen/c10 symbol (not part of the stable ABI)")
        elif _SHIM.match(sym) and sym not in allowed:
            found.append(f"{sym}: not exported by torch {TARGET} (newer than the target or no shim function)")
    return found


def audit(paths: Iterable[Path], allowed: Set[str]) -> int:
    status = 0
    for so in paths:
        try:
            found = findings(undefined_symbols(so), allowed)
        except OSError as e:
            print(f"abi audit: {so}: cannot read its symbols: {e}")
            return 2
        for f in found:
            print(f"abi audit: {so}: {f}")
        print(f"abi audit: {so}: {'FAILED' if found else 'OK'} (stable ABI of torch {TARGET})")
        status = status or (1 if found else 0)
    return status


def main(argv: List[str]) -> int:
    if not argv:
        print("usage: python scripts/abi_audit.py FILE.so [...]")
        return 2
    return audit([Path(a) for a in argv], exported())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
