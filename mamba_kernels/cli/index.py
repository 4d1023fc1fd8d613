"""``index``: write the static wheel index (PEP 503 per variant, find-links pages, manifest)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..facts import variant
from ..release import index


def _cmd_index(args: argparse.Namespace) -> int:
    manifest, n_previous = index.write_index_counted(
        Path(args.wheel_dir), Path(args.out_dir), args.base_url, args.asset_url, args.previous,
        args.allow_missing_previous)
    if args.json:
        print(json.dumps(manifest, indent=2))
    else:
        for label in manifest["variants"]:
            n = sum(1 for w in manifest["wheels"] if w["label"] == label)
            print(f"{label} ({variant.describe_label(label)}): {n} wheel(s): "
                  f"pip install {variant.PROJECT} --index-url <OUT_DIR URL>/{label}/simple/")
        n_wheels, n_variants = len(manifest["wheels"]), len(manifest["variants"])
        print(f"wrote {args.out_dir} ({n_wheels} wheels, {n_variants} variants; "
              f"{n_previous} from the previous manifest)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``index`` verb to the CLI."""
    p = subparsers.add_parser(
        "index", help="write a static wheel index (PEP 503 per variant, find-links pages, manifest)",
        description="Write the static index of the release wheels under WHEEL_DIR, plus every wheel "
                    "of the previously published manifest, into OUT_DIR (replaced atomically).",
    )
    p.add_argument("wheel_dir", metavar="WHEEL_DIR", help="folder searched recursively for .whl files")
    p.add_argument("out_dir", metavar="OUT_DIR",
                   help="new or empty folder, or an index this command wrote (replaced as a whole)")
    p.add_argument("--previous", metavar="MANIFEST",
                   help="the published manifest.json (path or http(s) URL): its wheels stay in the index")
    p.add_argument("--allow-missing-previous", action="store_true",
                   help="a --previous that does not exist (no file, HTTP 404/410) means no earlier "
                        "release (the first one); other failures stay errors")
    p.add_argument("--asset-url", metavar="TEMPLATE",
                   help="absolute URL of each new wheel, with {filename} for its (URL-quoted) file "
                        "name, e.g. https://github.com/OWNER/REPO/releases/download/vX.Y.Z/{filename}; "
                        "without it (and --base-url) new wheels are copied into OUT_DIR/wheels/")
    p.add_argument("--base-url", help="short for --asset-url BASE_URL/{filename}")
    p.add_argument("--json", action="store_true", help="print the manifest")
    p.set_defaults(func=_cmd_index)
