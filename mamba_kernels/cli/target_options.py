"""The options every verb that picks a wheel takes (resolve, install, download): the indexes,
the target environment's overrides (read by install.resolve.target_overrides), the timeout."""

from __future__ import annotations

import argparse

from ..facts import support
from ..install import fetching, resolve
from ..runtime import knobs


def _index_arg(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must be a path or a URL, got ''")
    return text


def _timeout_arg(text: str) -> float:
    try:
        return fetching.parse_timeout(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("--timeout ", "", 1)) from None


def add_target_arguments(p: argparse.ArgumentParser) -> None:
    """The options every verb that picks a wheel takes (resolve, install, download): the indexes,
    the target environment's overrides, the network timeout."""
    p.add_argument("--index", action="append", metavar="URL|DIR", type=_index_arg,
                   help="manifest.json (path or URL), a PEP 503/691 page, a find-links page, or a "
                        f"directory of wheels; repeatable, tried in order (default: ${knobs.INDEX_VAR}, "
                        "else the release index)")
    p.add_argument("--torch", help="torch version, e.g. 2.4.1, 2.4.1+cu121 or 2.8.0a0+5228986c39.nv25.06")
    p.add_argument("--cuda", help="torch's CUDA version, e.g. 12.4 (none for a CPU build)")
    p.add_argument("--python", help="CPython version, e.g. 3.11 (3.13t: free-threaded)")
    p.add_argument("--platform", help=f"{', '.join(support.PLATFORMS)}, or a wheel platform tag "
                                      "such as manylinux_2_28_x86_64")
    p.add_argument("--cxx11-abi", choices=("0", "1"), help="torch's C++ ABI (_GLIBCXX_USE_CXX11_ABI)")
    p.add_argument("--gpu-arch", metavar="8.0,9.0", help="GPU compute capabilities")
    p.add_argument("--timeout", type=_timeout_arg, default=resolve.DEFAULT_TIMEOUT,
                   help="seconds reading one index (with the pages it links), or downloading one wheel, "
                        "may take as a whole (default %(default)s)")
