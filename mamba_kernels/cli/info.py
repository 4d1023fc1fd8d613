"""``info``: the environment and the backend each kernel uses, with the wheel that serves it."""

from __future__ import annotations

import argparse
import json
from typing import Any, Dict

from ..facts import release_index, variant, versions
from ..facts.version import __version__
from ..install import doctor, environment, resolve
from ..install.environment import snapshot
from ..release import matrix
from ..runtime import installed


def _cmd_info(args: argparse.Namespace) -> int:
    info = snapshot()
    info["build"] = installed.describe()
    info["mamba_kernels"] = info["build"]["version"]
    info["index"] = _serving_index(info["torch"])
    info["build_knobs"] = doctor.build_knob_problem()  # None when a source build would accept them
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
    if info["build_knobs"]:
        print(f"build knobs   not valid: {info['build_knobs']} (a source build would stop on it)")
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


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``info`` verb to the CLI."""
    p = subparsers.add_parser("info", help="report the environment and the backend each kernel uses")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=_cmd_info)
