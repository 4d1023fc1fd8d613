"""``resolve``: pick the release wheel for this (or another) environment, and say why."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from ..facts import release_index
from ..install import fetching, resolve
from ..install.environment import detect
from . import target_options


def _cmd_resolve(args: argparse.Namespace) -> int:
    def warn(text: str) -> None:
        print(f"mamba-kernels resolve: {text}", file=sys.stderr)

    target = detect(**resolve.target_overrides(args), toolchain=False)
    sources, origin = (args.index, "--index") if args.index else release_index.default_indexes()
    candidates, n_read = resolve.read_each(sources, args.timeout, warn, origin)
    if n_read == 0:
        if len(sources) > 1:
            warn(f"none of the {len(sources)} indexes could be read")
        return 2
    res = resolve.resolve(candidates, target)
    chosen = res.selected
    if chosen is not None and chosen.candidate.sha256 is None and not fetching.is_url(chosen.candidate.url):
        chosen.candidate = replace(chosen.candidate, sha256=resolve.local_sha256(chosen.candidate.url))
    if args.json:
        print(json.dumps(res.as_dict(), indent=2))
        return 0 if res.selected else resolve.EXIT_NO_MATCH
    if res.selected is not None:
        print(res.selected.candidate.filename)
        for line in resolve.chosen_lines(res, [f"target  {resolve.describe_target(target)}"]):
            print(f"  {line}")
        if res.rejected:
            print(f"{len(res.rejected)} other candidate(s) not chosen; --json lists each with its reasons")
        return 0
    print(f"no wheel fits: {resolve.no_match_line(target, len(res.rejected))}")
    for line in resolve.no_match_lines(res.rejected, args.all):
        print(line)
    print(f"no prebuilt wheel: {resolve.source_build_hint()}; or use the pure-PyTorch path")
    return resolve.EXIT_NO_MATCH


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``resolve`` verb to the CLI."""
    p = subparsers.add_parser(
        "resolve", help="pick the release wheel for this (or another) environment, and say why",
        description="Pick the release wheel that fits the target environment (this machine, or the "
                    "one the options describe) from the given index, and say why; exit 3 when none "
                    "fits, listing every candidate with its reasons, nearest first.",
    )
    target_options.add_target_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (every candidate)")
    p.add_argument("--all", action="store_true",
                   help="when none fits, list every candidate "
                        f"(default: the nearest {resolve.NEAREST_SHOWN})")
    p.set_defaults(func=_cmd_resolve)
