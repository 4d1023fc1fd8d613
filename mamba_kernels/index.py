"""The static wheel index: ``python -m mamba_kernels index WHEEL_DIR OUT_DIR``.

Writes plain files that any static host (GitHub Pages, a bucket, ``python -m http.server``)
can serve:

    OUT_DIR/index.html                              the variants, with links to their pages
    OUT_DIR/manifest.json                           every wheel: name, variant, URL, sha256, size, archs
    OUT_DIR/<label>/simple/index.html               PEP 503 root of the variant's index
    OUT_DIR/<label>/simple/mamba-kernels/index.html the variant's files, with #sha256= fragments
    OUT_DIR/<label>/find-links.html                 the same links as a flat ``--find-links`` page
    OUT_DIR/wheels/<file>                           the wheels themselves, unless --base-url is given

``<label>`` is the variant label (``cu130torch2.14``); one index per label, because a wheel
pins ``torch==M.m.*`` and an index mixing torch releases would invite the installer to replace
the user's torch. Every wheel is checked before it is listed: the label in its file name must
equal the one in its METADATA, and it must pin the torch release of its label.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import shutil
import struct
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import quote

from . import variant

PROJECT = "mamba-kernels"  # PEP 503 normalised project name
MANIFEST_SCHEMA = 1
_FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
_BINARY_SUFFIXES = (".so", ".pyd", ".dll")


def fatbin_archs(data: bytes) -> Tuple[List[str], List[str]]:
    """The CUDA targets embedded in a compiled binary (ELF or PE): (SASS, PTX), e.g.
    (["sm_80", "sm_90"], ["compute_90"]), each sorted by architecture.

    Walks every fat-binary container (magic 0xBA55ED50; entries of kind 1 = PTX, 2 = SASS with
    the architecture number at offset 28 of each entry header), which is what cuobjdump lists.
    """
    sass, ptx = set(), set()
    i = data.find(_FATBIN_MAGIC)
    while i >= 0:
        if i + 16 > len(data):
            break
        _magic, version, header_size, fat_size = struct.unpack_from("<IHHQ", data, i)
        end = i + header_size + fat_size
        if version != 1 or header_size != 16 or end > len(data):
            i = data.find(_FATBIN_MAGIC, i + 4)  # four bytes that merely look like the magic
            continue
        p = i + header_size
        while p + 32 <= end:
            kind, _ver, entry_header, payload = struct.unpack_from("<HHIQ", data, p)
            arch = struct.unpack_from("<I", data, p + 28)[0]
            if kind not in (1, 2) or entry_header < 32:
                break
            (ptx if kind == 1 else sass).add(arch)
            p += entry_header + payload
        i = data.find(_FATBIN_MAGIC, end)
    return [f"sm_{a}" for a in sorted(sass)], [f"compute_{a}" for a in sorted(ptx)]


def wheel_metadata(path: Path) -> Dict[str, Any]:
    """METADATA of a wheel: Name, Version, Requires-Python and the Requires-Dist list."""
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise ValueError(
                f"wheel {path.name!r} must hold exactly one *.dist-info/METADATA, found {len(names)}"
            )
        msg = Parser().parsestr(zf.read(names[0]).decode("utf-8"))
    return {
        "name": msg.get("Name", ""),
        "version": msg.get("Version", ""),
        "requires_python": msg.get("Requires-Python"),
        "requires_dist": msg.get_all("Requires-Dist") or [],
    }


def wheel_archs(path: Path) -> Dict[str, Dict[str, List[str]]]:
    """CUDA targets of every compiled module in a wheel: {member: {"sass": [...], "ptx": [...]}}."""
    out: Dict[str, Dict[str, List[str]]] = {}
    with zipfile.ZipFile(path) as zf:
        for name in sorted(zf.namelist()):
            if name.endswith(_BINARY_SUFFIXES) or ".so." in name.rsplit("/", 1)[-1]:
                sass, ptx = fatbin_archs(zf.read(name))
                if sass or ptx:
                    out[name] = {"sass": sass, "ptx": ptx}
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def torch_pin(requires_dist: List[str]) -> Optional[str]:
    """The torch requirement of a wheel (``torch==2.14.*``), without markers and spaces."""
    for req in requires_dist:
        spec = req.split(";")[0].replace(" ", "")
        if spec.lower().startswith("torch") and not spec[5:6].isalnum() and spec[5:6] not in ("-", "_"):
            return spec
    return None


def describe_wheel(path: Path) -> Dict[str, Any]:
    """One manifest entry (without URL), after checking that name, METADATA and pin agree."""
    info = variant.parse_wheel_name(path.name)
    if info.variant is None:
        raise ValueError(f"wheel {path.name!r} has no variant label: only release wheels are indexed")
    meta = wheel_metadata(path)
    local = path.name.split("-")[1]
    if meta["version"] != local:
        raise ValueError(
            f"wheel {path.name!r}: METADATA Version {meta['version']!r} must equal the file name's "
            f"version {local!r} (label in both places)"
        )
    want_pin = variant.torch_requirement(info.variant.torch)
    pin = torch_pin(meta["requires_dist"])
    if pin != want_pin:
        raise ValueError(f"wheel {path.name!r}: Requires-Dist must pin {want_pin!r}, got {pin!r}")
    label = local.split("+", 1)[1]
    return {
        "filename": path.name,
        "version": meta["version"],
        "label": label,
        "torch": info.variant.torch,
        "cuda": info.variant.cuda,
        "cxx11_abi": info.variant.cxx11_abi,
        "python": info.python,
        "platform": info.platform,
        "platform_tag": info.platform_tag,
        "requires_python": meta["requires_python"],
        "requires_torch": pin,
        "sha256": _sha256(path),
        "size": path.stat().st_size,
        "archs": wheel_archs(path),
    }


def _anchor(href: str, entry: Dict[str, Any]) -> str:
    attrs = f'href="{html.escape(href)}#sha256={entry["sha256"]}"'
    if entry["requires_python"]:
        attrs += f' data-requires-python="{html.escape(entry["requires_python"])}"'
    return f"    <a {attrs}>{html.escape(entry['filename'])}</a><br/>"


def _page(title: str, body: List[str]) -> str:
    t = html.escape(title)
    head = '    <meta name="pypi:repository-version" content="1.0">\n' f"    <title>{t}</title>\n"
    return (f"<!DOCTYPE html>\n<html>\n  <head>\n{head}  </head>\n  <body>\n    <h1>{t}</h1>\n"
            + "\n".join(body) + "\n  </body>\n</html>\n")


def write_index(wheel_dir: Path, out_dir: Path, base_url: Optional[str] = None) -> Dict[str, Any]:
    """Write the static index for every wheel under ``wheel_dir`` (searched recursively).

    Without ``base_url`` the wheels are copied to ``out_dir/wheels/`` and linked relatively;
    with it (e.g. a GitHub Release download URL) they are linked as ``base_url + file name``.
    Returns the manifest.
    """
    wheel_dir, out_dir = Path(wheel_dir), Path(out_dir)
    if not wheel_dir.is_dir():
        raise ValueError(f"WHEEL_DIR must be a directory, got {str(wheel_dir)!r}")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ValueError(f"OUT_DIR must be an empty or new directory, got {str(out_dir)!r}")
    wheels = sorted(wheel_dir.rglob("*.whl"), key=lambda p: p.name)
    if not wheels:
        raise ValueError(f"WHEEL_DIR {str(wheel_dir)!r} holds no .whl file")
    seen: Dict[str, Path] = {}
    for w in wheels:
        if w.name in seen:
            raise ValueError(f"wheel {w.name!r} appears twice: {str(seen[w.name])!r} and {str(w)!r}")
        seen[w.name] = w
    if base_url is not None and not base_url.endswith("/"):
        base_url += "/"

    entries = [describe_wheel(w) for w in wheels]
    out_dir.mkdir(parents=True, exist_ok=True)
    if base_url is None:
        (out_dir / "wheels").mkdir()
        for w in wheels:
            shutil.copy2(w, out_dir / "wheels" / w.name)
    for e in entries:
        e["url"] = (base_url or "wheels/") + quote(e["filename"])

    by_label: Dict[str, List[Dict[str, Any]]] = {}
    for e in entries:
        by_label.setdefault(e["label"], []).append(e)

    def href(e: Dict[str, Any], depth: int) -> str:
        return e["url"] if base_url is not None else "../" * depth + e["url"]

    for label, group in sorted(by_label.items()):
        simple = out_dir / label / "simple"
        (simple / PROJECT).mkdir(parents=True)
        root = _page(f"Simple index: {label}", [f'    <a href="{PROJECT}/">{PROJECT}</a><br/>'])
        (simple / "index.html").write_text(root, encoding="utf-8")
        links = _page(f"Links for {PROJECT} ({label})", [_anchor(href(e, 3), e) for e in group])
        (simple / PROJECT / "index.html").write_text(links, encoding="utf-8")
        flat = _page(f"{PROJECT} wheels ({label})", [_anchor(href(e, 1), e) for e in group])
        (out_dir / label / "find-links.html").write_text(flat, encoding="utf-8")

    rows = [f'    <a href="{lab}/simple/">{lab}/simple/</a> (<a href="{lab}/find-links.html">find-links</a>, '
            f"{len(g)} wheels)<br/>" for lab, g in sorted(by_label.items())]
    rows.append('    <a href="manifest.json">manifest.json</a><br/>')
    (out_dir / "index.html").write_text(_page(f"{PROJECT} wheel index", rows), encoding="utf-8")

    manifest = {"schema": MANIFEST_SCHEMA, "project": PROJECT, "base_url": base_url,
                "variants": sorted(by_label), "wheels": entries}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _cmd_index(args: argparse.Namespace) -> int:
    manifest = write_index(Path(args.wheel_dir), Path(args.out_dir), args.base_url)
    if args.json:
        print(json.dumps(manifest, indent=2))
    else:
        for label in manifest["variants"]:
            n = sum(1 for w in manifest["wheels"] if w["label"] == label)
            print(f"{label}: {n} wheel(s): pip install {PROJECT} --index-url <OUT_DIR URL>/{label}/simple/")
        n_wheels, n_variants = len(manifest["wheels"]), len(manifest["variants"])
        print(f"wrote {args.out_dir} ({n_wheels} wheels, {n_variants} variants)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``index`` verb to the CLI."""
    p = subparsers.add_parser(
        "index", help="write a static wheel index (PEP 503 per variant, find-links pages, manifest)",
        description="Write static index files for the release wheels under WHEEL_DIR into OUT_DIR.",
    )
    p.add_argument("wheel_dir", metavar="WHEEL_DIR", help="folder searched recursively for .whl files")
    p.add_argument("out_dir", metavar="OUT_DIR", help="new or empty folder to write the index into")
    p.add_argument("--base-url", help="link wheels at BASE_URL/<file> (e.g. the GitHub Release download "
                                      "URL) instead of copying them into OUT_DIR/wheels/")
    p.add_argument("--json", action="store_true", help="print the manifest")
    p.set_defaults(func=_cmd_index)

