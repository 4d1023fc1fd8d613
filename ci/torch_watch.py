#!/usr/bin/env python3
"""Notice a torch release the support table lacks, and propose the table line for it.

``python ci/torch_watch.py [--pypi-json FILE] [--apply] [--body FILE]``

Reads PyPI's JSON for torch (or FILE), finds the newest final major.minor release that
mamba_kernels/support.py does not list, and prints what PyPI says about it: the CPython
versions with wheels (from the file names), Requires-Python, and the CUDA variant of the default
Linux wheel (from its CUDA requirements). With --apply it inserts a ``_release(...)`` line into
the table for a pull request a maintainer completes (PyTorch's own index, which holds the other
CUDA variants, is not reachable through PyPI's API). Exit 0 with nothing to do, 10 when a new
release was found (so the workflow knows to open the pull request).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mamba_kernels import support  # noqa: E402

SUPPORT_PY = ROOT / "mamba_kernels" / "support.py"
PYPI_URL = "https://pypi.org/pypi/torch/json"
NEW_RELEASE = 10


def _mm(version: str) -> Tuple[int, int]:
    parts = version.split(".")
    return int(parts[0]), int(parts[1])


def newest_missing(pypi: Dict[str, Any]) -> Optional[str]:
    """The newest final release (``2.16.0``) whose major.minor the table lacks, or None."""
    known = {r.torch for r in support.RELEASES}
    finals = [v for v, files in pypi["releases"].items() if re.fullmatch(r"\d+\.\d+\.\d+", v) and files]
    newest_known = max(_mm(t + ".0") for t in known)
    missing = [v for v in finals if f"{_mm(v)[0]}.{_mm(v)[1]}" not in known and _mm(v) > newest_known]
    return max(missing, key=lambda v: tuple(int(x) for x in v.split("."))) if missing else None


def facts(pypi: Dict[str, Any], version: str) -> Dict[str, Any]:
    """What PyPI's file list and metadata say about one torch release."""
    files = pypi["releases"][version]
    pys = sorted({int(m.group(1)) for f in files if (m := re.search(r"-cp3(\d+)-cp3\d+-", f["filename"]))})
    platforms = sorted(
        {p for f in files for p in ("manylinux", "win_amd64", "aarch64") if p in f["filename"]}
    )
    requires = pypi.get("info", {}).get("requires_dist") or []
    cuda = None
    for req in requires:
        m = re.match(r"cuda-toolkit\[.*\]\s*==\s*(\d+)\.(\d+)", req) or re.match(
            r"nvidia-cuda-runtime(?:-cu\d+)?\s*==\s*(\d+)\.(\d+)", req
        )
        if m:
            cuda = f"{m.group(1)}.{m.group(2)}"
            break
    return {
        "version": version,
        "pythons": [f"3.{p}" for p in pys],
        "requires_python": pypi.get("info", {}).get("requires_python"),
        "pypi_cuda": cuda,
        "platforms": platforms,
    }


def table_line(f: Dict[str, Any]) -> str:
    mm = ".".join(f["version"].split(".")[:2])
    cuda = f["pypi_cuda"] or "13.0"
    lo, hi = f["pythons"][0], f["pythons"][-1]
    note = "added by ci/torch_watch.py from PyPI: confirm the other CUDA variants"
    return (
        f'    _release("{mm}", ("{lo}", "{hi}"), ("{cuda}",), aarch64=("{cuda}",), windows=(),\n'
        f'             pypi="{cuda}", cxx_std=20, note="{note}"),\n'
    )


def apply(line: str, path: Path = SUPPORT_PY) -> None:
    """Insert ``line`` as the last entry of RELEASES (before its closing parenthesis)."""
    text = path.read_text()
    start = text.index("RELEASES: Tuple[TorchRelease, ...] = (")
    end = text.index("\n)\n", start)
    path.write_text(text[: end + 1] + line + text[end + 1 :])


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pypi-json", help="read this file instead of PyPI")
    p.add_argument("--apply", action="store_true", help="insert the proposed line into support.py")
    p.add_argument("--body", help="write a pull-request body (Markdown) here")
    args = p.parse_args(argv)
    if args.pypi_json:
        pypi = json.loads(Path(args.pypi_json).read_text())
    else:
        with urllib.request.urlopen(PYPI_URL, timeout=60) as r:  # noqa: S310 (fixed https URL)
            pypi = json.load(r)
    version = newest_missing(pypi)
    if version is None:
        print("the support table covers the newest torch release")
        return 0
    f = facts(pypi, version)
    line = table_line(f)
    print(json.dumps(f, indent=2))
    print(line, end="")
    if args.apply:
        apply(line)
    if args.body:
        Path(args.body).write_text(
            f"torch {version} is on PyPI and not in the support table.\n\n"
            f"- CPython wheels: {', '.join(f['pythons'])} (Requires-Python `{f['requires_python']}`)\n"
            f"- CUDA of the default PyPI wheel: {f['pypi_cuda'] or 'not found in its requirements'}\n"
            f"- platforms with wheels: {', '.join(f['platforms'])}\n\n"
            "Before merging: confirm the CUDA variants on PyTorch's index (Linux x86_64, aarch64, "
            "Windows), the C++ ABI and standard, and the architecture lists, then run "
            "`python -m mamba_kernels matrix --torch " + ".".join(version.split(".")[:2]) + "`.\n"
        )
    return NEW_RELEASE


if __name__ == "__main__":
    raise SystemExit(main())
