"""The static wheel index: ``python -m mamba_kernels index WHEEL_DIR OUT_DIR``.

Writes plain files that any static host (GitHub Pages, a bucket, ``python -m http.server``)
can serve:

    OUT_DIR/index.html                              the variants, with links to their pages
    OUT_DIR/manifest.json                           every wheel: name, variant, URL, sha256, size, archs
    OUT_DIR/<label>/simple/index.html               PEP 503 root of the variant's index
    OUT_DIR/<label>/simple/mamba-kernels/index.html the variant's files, with #sha256= fragments
    OUT_DIR/<label>/find-links.html                 the same links as a flat ``--find-links`` page
    OUT_DIR/wheels/<file>                           wheels linked relatively (no --asset-url)

``<label>`` is the variant label (``cu128torch2.8``, or ``cu130stable2.10`` for a stable-ABI
wheel; grammar in mamba_kernels/facts/variant.py); one index per label, because a classic wheel pins
``torch==M.m.*`` and an index mixing torch releases would invite the installer to replace the
user's torch. A stable label's index holds the cp310-abi3 wheels (one per platform) that
require ``torch>=2.10`` and serve every torch from 2.10 on built for that CUDA major.

Every release adds to the index: ``--previous`` (the published manifest.json, a path or an
http(s) URL) brings every wheel listed there into the new index with its recorded URL and
sha256, so no older version and no other variant is ever dropped. New wheels are linked at
``--asset-url`` (``https://.../releases/download/vX.Y.Z/{filename}``) or copied into
``OUT_DIR/wheels/``. The site is built in a temporary folder next to OUT_DIR and renamed into
place, so an interrupted run leaves the old index as it was. docs/INDEX.md has the rules.

Every wheel is checked before it is listed: a regular file, a readable zip; the distribution
``mamba_kernels`` by its file name (exactly so written) and by METADATA ``Name``; the label in its
file name equal to the one in its METADATA; and a torch requirement of its label that holds on
every install of the wheel (environment markers evaluated for the wheel's Python and platform):
``torch==M.m.*`` for a classic label, ``torch>=M.m`` (the target) for a stable one. Any problem
is a :class:`IndexInputError` naming the file and the reason.

Each manifest entry records the label and what it means: ``binding`` (``classic`` or
``stable``), ``torch`` (a stable wheel's target, the oldest torch it runs on), ``cuda`` and
``cuda_major``, ``abi3``, and ``describe`` (the label in words). Entries of older manifests
without these keys get them from their label when carried over.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import quote, urlsplit

from ..facts import variant
from ..facts.variant import PROJECT
from ..install import fetching
from . import published, site_swap, wheel_check
from .wheel_check import fail


def file_requires_python(filename: str, requires_python: Optional[str]) -> str:
    """The Pythons a wheel file installs on, for an index page's ``data-requires-python``: its
    Python tag's (cp311: 3.11 only; cp310-abi3: 3.10 and later), narrowed by METADATA's
    Requires-Python when that says more. An installer reads the page's value before the tags,
    so the project's wider Requires-Python alone would invite it to try files that never fit."""
    # optional: packaging is read only where a requirement or version is
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    info = variant.parse_wheel_name(filename)
    if not info.abi3:  # one Python: METADATA can only say that it does not install at all
        spec = f"=={info.python}.*"
        fits = not requires_python or SpecifierSet(requires_python).contains(f"{info.python}.0")
        return spec if fits else f"{spec},{SpecifierSet(requires_python)}"
    floor = Version(info.python)
    more = [str(s) for s in SpecifierSet(requires_python or "")
            if not (s.operator in (">=", ">") and Version(s.version) < floor)]  # implied by the tag
    return ",".join([f">={info.python}", *sorted(more)])


def _anchor(href: str, entry: Dict[str, Any]) -> str:
    attrs = f'href="{html.escape(href)}#sha256={entry["sha256"]}"'
    needs = file_requires_python(entry["filename"], entry.get("requires_python"))
    attrs += f' data-requires-python="{html.escape(needs)}"'
    return f"    <a {attrs}>{html.escape(entry['filename'])}</a><br/>"


def _page(title: str, body: List[str]) -> str:
    t = html.escape(title)
    head = '    <meta name="pypi:repository-version" content="1.0">\n' f"    <title>{t}</title>\n"
    return (f"<!DOCTYPE html>\n<html>\n  <head>\n{head}  </head>\n  <body>\n    <h1>{t}</h1>\n"
            + "\n".join(body) + "\n  </body>\n</html>\n")


def _write_site(site: Path, entries: List[Dict[str, Any]], manifest: Dict[str, Any]) -> None:
    """Every file of the index into the (new, empty) folder ``site``."""
    for e in entries:
        src = e.get("_copy_from") or e.get("_path")
        if not fetching.is_url(e["url"]):
            (site / "wheels").mkdir(exist_ok=True)
            shutil.copyfile(src, site / "wheels" / e["filename"])

    def href(e: Dict[str, Any], depth: int) -> str:
        return e["url"] if fetching.is_url(e["url"]) else "../" * depth + e["url"]

    by_label: Dict[str, List[Dict[str, Any]]] = {}
    for e in entries:
        by_label.setdefault(e["label"], []).append(e)
    for label, group in sorted(by_label.items()):
        simple = site / label / "simple"
        (simple / PROJECT).mkdir(parents=True)
        root = _page(f"Simple index: {label}", [f'    <a href="{PROJECT}/">{PROJECT}</a><br/>'])
        (simple / "index.html").write_text(root, encoding="utf-8")
        links = _page(f"Links for {PROJECT} ({label})", [_anchor(href(e, 3), e) for e in group])
        (simple / PROJECT / "index.html").write_text(links, encoding="utf-8")
        flat = _page(f"{PROJECT} wheels ({label})", [_anchor(href(e, 1), e) for e in group])
        (site / label / "find-links.html").write_text(flat, encoding="utf-8")
    rows = [f'    <a href="{lab}/simple/">{lab}/simple/</a> (<a href="{lab}/find-links.html">find-links</a>, '
            f"{len(g)} wheels)<br/>" for lab, g in sorted(by_label.items())]
    rows.append('    <a href="manifest.json">manifest.json</a><br/>')
    (site / "index.html").write_text(_page(f"{PROJECT} wheel index", rows), encoding="utf-8")
    (site / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _asset_url_template(asset_url: Optional[str], base_url: Optional[str]) -> Optional[str]:
    if asset_url is not None and base_url is not None:
        raise fail("--asset-url", asset_url, "give --asset-url or --base-url, not both")
    if base_url is not None:
        asset_url = base_url.rstrip("/") + "/{filename}"
    if asset_url is None:
        return None
    rest = asset_url.replace("{filename}", "")
    if asset_url.count("{filename}") != 1 or "{" in rest or "}" in rest:
        raise fail("--asset-url", asset_url, "must hold the placeholder {filename} once and no other braces")
    if not fetching.is_url(asset_url) or not urlsplit(asset_url).netloc:
        raise fail("--asset-url", asset_url, "must be an absolute http(s) URL")
    return asset_url


def _find_wheels(wheel_dir: Path) -> List[Path]:
    """Every ``*.whl`` under ``wheel_dir``; a symlink (file or folder) or a ``.whl`` that is not a
    regular file is an error."""
    found: List[Path] = []

    def onerror(e: OSError) -> None:
        raise e

    for root, dirs, files in os.walk(wheel_dir, onerror=onerror):
        for d in sorted(dirs):
            if os.path.islink(os.path.join(root, d)):
                raise fail("", os.path.join(root, d), "is a symlink: the index reads only regular "
                            "files and folders")
            if d.endswith(".whl"):
                raise fail("wheel", os.path.join(root, d), "is not a regular file (a folder)")
        for f in sorted(files):
            p = Path(root) / f
            if f.endswith(".whl"):
                found.append(p)
    return sorted(found, key=lambda p: (p.name, str(p)))


def _check_out_dir(out_dir: Path, wheel_dir: Path) -> None:
    if out_dir.is_symlink():
        raise fail("OUT_DIR", out_dir, "is a symlink; give the real folder")
    if out_dir.exists():
        if not out_dir.is_dir():
            raise fail("OUT_DIR", out_dir, "exists and is not a folder")
        if not os.access(out_dir, os.R_OK | os.W_OK | os.X_OK):
            raise fail("OUT_DIR", out_dir, "is not readable and writable (permission denied)")
        try:
            empty = not any(out_dir.iterdir())
        except OSError as e:
            raise fail("OUT_DIR", out_dir, f"cannot be read: {e.strerror or e}") from None
        if not empty and not site_swap.own_index(out_dir):
            raise fail("OUT_DIR", out_dir, "must be an empty or new directory, or an index this "
                        f"command wrote (its manifest.json names {PROJECT}); it holds other files")
    parent = out_dir.parent
    if parent.exists() and not parent.is_dir():
        raise fail("OUT_DIR", out_dir, f"cannot be created: {str(parent)!r} is not a folder")
    if parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise fail("OUT_DIR", out_dir, f"cannot be replaced: its folder {str(parent)!r} is not writable")
    o, w = out_dir.resolve(), wheel_dir.resolve()
    if o == w or o in w.parents or w in o.parents:
        raise fail("OUT_DIR", out_dir, f"must not contain or lie inside WHEEL_DIR {str(wheel_dir)!r}")


def write_index(
    wheel_dir: Path,
    out_dir: Path,
    base_url: Optional[str] = None,
    *,
    asset_url: Optional[str] = None,
    previous: Optional[str] = None,
    allow_missing_previous: bool = False,
) -> Dict[str, Any]:
    """Write the static index for every wheel under ``wheel_dir`` (searched recursively), plus
    every wheel of the ``previous`` manifest (path or URL), into ``out_dir``; returns the manifest.

    New wheels are linked at ``asset_url`` (a template with ``{filename}``, filled in URL-quoted;
    ``base_url`` is short for ``base_url/{filename}``), or without either copied to
    ``out_dir/wheels/`` and linked relatively. ``out_dir`` may be new, empty, or an index this
    function wrote: it is replaced as a whole, by rename, only after the new site is complete.
    Every problem with the input raises :class:`IndexInputError` (a ValueError), one line.
    """
    return write_index_counted(wheel_dir, out_dir, base_url, asset_url, previous, allow_missing_previous)[0]


def write_index_counted(wheel_dir: Path, out_dir: Path, base_url: Optional[str], asset_url: Optional[str],
                         previous: Optional[str], allow_missing_previous: bool) -> Tuple[Dict[str, Any], int]:
    """:func:`write_index`, also returning how many wheels came from the previous manifest."""
    wheel_dir, out_dir = Path(wheel_dir), Path(out_dir)
    try:
        return _write_index(wheel_dir, out_dir, base_url, asset_url, previous, allow_missing_previous)
    except OSError as e:
        where = e.filename if e.filename is not None else out_dir
        raise fail("", where, e.strerror or str(e)) from None


def _write_index(wheel_dir: Path, out_dir: Path, base_url: Optional[str], asset_url: Optional[str],
                 previous: Optional[str], allow_missing_previous: bool) -> Tuple[Dict[str, Any], int]:
    if not wheel_dir.is_dir():
        raise fail("WHEEL_DIR", wheel_dir, "must be a directory" + ("" if wheel_dir.exists() else
                                                                        " (it does not exist)"))
    template = _asset_url_template(asset_url, base_url)
    _check_out_dir(out_dir, wheel_dir)  # before anything beside it is touched
    site_swap.recover(out_dir)  # then, so that a --previous inside OUT_DIR is back in place
    _check_out_dir(out_dir, wheel_dir)
    wheels = _find_wheels(wheel_dir)
    if not wheels and previous is None:
        raise fail("WHEEL_DIR", wheel_dir, "holds no .whl file")
    seen: Dict[str, Path] = {}
    for w in wheels:
        if w.name in seen:
            raise fail("wheel", w.name, f"appears twice: {str(seen[w.name])!r} and {str(w)!r}")
        seen[w.name] = w
    old = published.load_previous(previous, allow_missing_previous) if previous is not None else []

    new = []
    for w in wheels:
        e = wheel_check.describe_wheel(w)
        e["url"] = template.replace("{filename}", quote(e["filename"])) if template else (
            "wheels/" + quote(e["filename"]))
        e["_path"] = str(w)
        new.append(e)
    entries = published.merge(old, new)
    if not entries:  # no new wheel (a site half only carried over) and no published one either
        raise fail("WHEEL_DIR", wheel_dir, "holds no .whl file and the previous manifest lists none")
    public = [{k: v for k, v in e.items() if not k.startswith("_")} for e in entries]
    manifest = {"schema": published.MANIFEST_SCHEMA, "project": PROJECT,
                "variants": sorted({e["label"] for e in entries}), "wheels": public}

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    mode = out_dir.stat().st_mode & 0o7777 if out_dir.is_dir() else 0o755
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.new-"))
    try:
        site_swap.mark(tmp)
        os.chmod(tmp, mode)
        _write_site(tmp, entries, manifest)
        site_swap.swap_into_place(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return manifest, len(old)
