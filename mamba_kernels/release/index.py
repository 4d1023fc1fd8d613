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

import ctypes
import errno
import html
import json
import os
import re
import shutil
import struct
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple
from urllib.parse import quote, unquote, urlsplit

from ..facts import variant
from ..install import fetching, wheel_contents, wheel_metadata

if TYPE_CHECKING:  # packaging is imported where used: `info` and the runtime work without it
    pass

PROJECT = "mamba-kernels"  # PEP 503 normalised project name
PREVIOUS_TIMEOUT = 60.0  # seconds for fetching the published manifest, as a whole
MANIFEST_SCHEMA = 2  # 2: every wheel has its own url (absolute, or relative to the manifest)
_READABLE_SCHEMAS = (1, 2)
_FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
_BINARY_SUFFIXES = (".so", ".pyd", ".dll")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error, struct.error,
               NotImplementedError, RuntimeError, UnicodeDecodeError)


class IndexInputError(ValueError):
    """A problem with the input of the index writer; its message is one line naming the file."""


def _fail(what: str, path: Any, reason: str) -> IndexInputError:
    text = f"{what} {str(path)!r}: {reason}" if what else f"{str(path)!r}: {reason}"
    return IndexInputError(" ".join(text.split("\n")))


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


# --- torch pin, with environment markers ------------------------------------------------------


def _check_torch_pin(
    where: str, requires_dist: List[str], info: variant.WheelInfo
) -> Tuple[str, Optional[str]]:
    """The wheel's pin and the marker(s) it was written under; raises when it does not pin
    exactly its label's torch release (stable: at least its target) for every install."""
    assert info.variant is not None and info.platform is not None
    if info.variant.stable:
        want = variant.stable_torch_requirement(info.variant.torch)
    else:
        want = variant.torch_requirement(info.variant.torch)
    env = wheel_metadata.target_environment(info.python, info.platform)
    try:
        reqs = wheel_metadata.torch_requirements(requires_dist)
        pin = wheel_metadata.torch_pin(requires_dist, env)
    except ValueError as e:
        raise _fail("wheel", where, str(e)) from None
    if pin is None and reqs:
        shown = "; ".join(str(r) for r in reqs)
        raise _fail("wheel", where, f"Requires-Dist must pin {want!r} on every install, but its torch "
                    f"requirement ({shown}) never applies to a cp{info.python.replace('.', '')} "
                    f"{info.platform} install without extras")
    if pin != want:
        raise _fail("wheel", where, f"Requires-Dist must pin {want!r}, got {pin!r}")
    markers = [str(r.marker) for r in reqs if r.marker is not None and wheel_metadata.applies(r, env)]
    return pin, (" and ".join(markers) or None)


# --- one wheel ---------------------------------------------------------------------------------

def check_filename(filename: str, where: Optional[str] = None) -> variant.WheelInfo:
    """The file name of a release wheel of this project, or an error naming the file.

    The distribution must be ours by packaging's own parser (canonical name ``mamba-kernels``)
    and written exactly ``mamba_kernels``: two names differing only in case or punctuation
    would be the same project to an installer and may be the same file on the host.
    """
    # optional: packaging is read only where a requirement or version is
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    where = where or filename
    try:
        dist, _version, build, _tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as e:
        raise _fail("wheel", where, f"not a valid wheel file name ({e})") from None
    if canonicalize_name(dist) != PROJECT:
        raise _fail("wheel", where, f"another project's wheel (distribution {str(dist)!r}); only "
                    f"{PROJECT} is indexed")
    written = filename.split("-", 1)[0]
    if written != variant.DIST_NAME:
        raise _fail("wheel", where, f"the file name must spell the distribution {variant.DIST_NAME!r}, "
                    f"got {written!r} (names that differ only in case or punctuation clash)")
    if build:
        raise _fail("wheel", where, "release wheels carry no build tag")
    try:
        info = variant.parse_wheel_name(filename)
    except ValueError as e:
        raise _fail("wheel", where, str(e)) from None
    if info.variant is None:
        raise _fail("wheel", where, "has no variant label: only release wheels are indexed")
    if info.platform is None:
        raise _fail("wheel", where, f"platform tag {info.platform_tag!r} is not one this project builds")
    return info


def describe_wheel(path: Path) -> Dict[str, Any]:
    """One manifest entry (without URL), after checking the file, its name, METADATA and pin."""
    # optional: packaging is read only where a requirement or version is
    from packaging.utils import canonicalize_name

    path = Path(path)
    where = str(path)
    if path.is_symlink():
        raise _fail("wheel", where, "is a symlink: the index reads only regular files (copy the wheel)")
    if not path.is_file():
        raise _fail("wheel", where, "is not a regular file")
    info = check_filename(path.name, where)
    if path.stat().st_size == 0:
        raise _fail("wheel", where, "is empty (0 bytes): an interrupted download or copy?")
    try:
        with zipfile.ZipFile(path) as zf:
            wheel_contents.vet(zf, wheel_metadata.dist_info_name(path.name))  # before reading any member
            bad = zf.testzip()
        if bad is not None:
            raise zipfile.BadZipFile(f"member {bad!r} fails its CRC check")
        meta = wheel_metadata.wheel_metadata(path)
        archs = wheel_archs(path)
    except _ZIP_ERRORS as e:
        raise _fail("wheel", where, f"not a readable wheel (zip archive): {e}") from None
    except OSError as e:
        raise _fail("wheel", where, f"cannot be read: {e.strerror or e}") from None
    except wheel_contents.WheelContentError as e:
        raise _fail("wheel", where, f"{e}: not the layout our build writes (docs/INDEX.md)") from None
    except ValueError as e:  # no or several METADATA
        raise _fail("wheel", where, str(e).replace(f"wheel {path.name!r} ", "")) from None
    if canonicalize_name(meta["name"] or "-") != PROJECT:
        raise _fail("wheel", where, f"METADATA Name {meta['name']!r} is another project; only {PROJECT} "
                    "is indexed")
    local = path.name.split("-")[1]
    if meta["version"] != local:
        raise _fail("wheel", where, f"METADATA Version {meta['version']!r} must equal the file name's "
                    f"version {local!r} (label in both places)")
    pin, marker = _check_torch_pin(where, meta["requires_dist"], info)
    assert info.variant is not None
    return {
        "filename": path.name,
        "version": meta["version"],
        "label": local.split("+", 1)[1],
        **label_fields(info),
        "cxx11_abi": info.variant.cxx11_abi,
        "python": info.python,
        "platform": info.platform,
        "platform_tag": info.platform_tag,
        "requires_python": meta["requires_python"],
        "requires_torch": pin,
        "requires_torch_marker": marker,
        "sha256": wheel_metadata.sha256_of(path),
        "size": path.stat().st_size,
        "archs": archs,
    }


def label_fields(info: variant.WheelInfo) -> Dict[str, Any]:
    """What a wheel's label and tags say, as manifest fields (one writer for new and carried
    entries): binding, torch (a stable wheel's target), cuda, cuda_major, abi3, describe."""
    assert info.variant is not None
    return {
        "binding": variant.BINDINGS[info.variant.stable],
        "torch": info.variant.torch,
        "cuda": info.variant.cuda,
        "cuda_major": int(info.variant.cuda.split(".")[0]),
        "abi3": info.abi3,
        "describe": info.variant.describe(),
    }


# --- the previously published index -----------------------------------------------------------

def load_previous(source: str, allow_missing: bool = False) -> List[Dict[str, Any]]:
    """The wheels of the published manifest at ``source`` (a path or an http(s) URL).

    A manifest that does not exist (no such file, HTTP 404 or 410) is an error unless
    ``allow_missing`` (the first release); any other failure to read it is always an error,
    because going on would publish an index without the earlier releases. Each entry keeps
    what was recorded; an entry with a relative URL (a local index built without --asset-url)
    is carried only from a local manifest whose wheel file is next to it, with the sha256
    recorded ("_copy_from" names that file).
    """
    what = "--previous"
    if fetching.is_url(source):
        try:
            raw = fetching.read_all(source, PREVIOUS_TIMEOUT, fetching.MAX_PAGE_BYTES)[0]
        except fetching.FetchError as e:
            if e.status in (404, 410):
                return _missing(source, f"HTTP {e.status}", allow_missing)
            raise _fail(what, source, str(e)) from None
    elif "://" in source:
        raise _fail(what, source, "must be a path or an http(s) URL")
    else:
        path = Path(source)
        if not path.exists() and not path.is_symlink():
            return _missing(source, "no such file", allow_missing)
        if not path.is_file():
            raise _fail(what, source, "is not a regular file")
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise _fail(what, source, f"cannot be read: {e.strerror or e}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _fail(what, source, f"is not a JSON manifest ({e})") from None
    if not isinstance(data, dict) or data.get("project") != PROJECT:
        raise _fail(what, source, f"is not a manifest of {PROJECT} (no \"project\": \"{PROJECT}\")")
    if data.get("schema") not in _READABLE_SCHEMAS:
        raise _fail(what, source, f"has manifest schema {data.get('schema')!r}; this writer reads "
                    f"{', '.join(map(str, _READABLE_SCHEMAS))}")
    wheels = data.get("wheels")
    if not isinstance(wheels, list):
        raise _fail(what, source, "has no \"wheels\" list")
    out: List[Dict[str, Any]] = []
    seen = set()
    for i, e in enumerate(wheels):
        if not isinstance(e, dict) or not isinstance(e.get("filename"), str):
            raise _fail(what, source, f"wheel entry {i} has no \"filename\"")
        fn = e["filename"]
        where = f"{fn} (in {source})"
        info = check_filename(fn, where)
        if fn in seen:
            raise _fail("wheel", where, "is listed twice")
        seen.add(fn)
        sha, url = e.get("sha256"), e.get("url")
        if not isinstance(sha, str) or not _SHA256_RE.match(sha):
            raise _fail("wheel", where, f"has no valid sha256 (got {sha!r})")
        if not isinstance(url, str) or not url:
            raise _fail("wheel", where, "has no url")
        label = fn.split("-")[1].split("+", 1)[1]
        if e.get("label", label) != label:
            raise _fail("wheel", where, f"is recorded under label {e.get('label')!r}, its name says "
                        f"{label!r}")
        entry = dict(e)
        entry["label"] = label
        assert info.variant is not None
        for k, v in label_fields(info).items():
            entry.setdefault(k, v)
        entry.setdefault("requires_python", None)
        _check_entry_fields(entry, where)
        if not fetching.is_url(url):
            if fetching.is_url(source) or urlsplit(url).scheme or url.startswith("/"):
                raise _fail("wheel", where, f"has the relative URL {url!r}: a published manifest must "
                            "record absolute asset URLs (write it with --asset-url)")
            local = Path(source).parent / unquote(url.split("#", 1)[0])  # resolved against its base
            if local.is_symlink() or not local.is_file():
                raise _fail("wheel", where, f"is linked relatively ({url!r}) but {str(local)!r} is not a "
                            "regular file to carry over")
            if wheel_metadata.sha256_of(local) != sha:
                raise _fail("wheel", where, f"{str(local)!r} does not have the recorded sha256")
            entry["_copy_from"] = str(local)
            entry["url"] = "wheels/" + quote(fn)  # copied under the name it is linked by
        out.append(entry)
    return out


# Fields of a carried-over manifest entry that the pages and the resolver read, and their types.
_ENTRY_TYPES: Dict[str, Tuple[type, ...]] = {
    "version": (str,), "requires_python": (str, type(None)), "requires_torch": (str, type(None)),
    "requires_torch_marker": (str, type(None)), "size": (int,), "archs": (dict,), "describe": (str,),
    "binding": (str,), "torch": (str,), "cuda": (str,), "python": (str,), "platform": (str,),
    "platform_tag": (str,), "abi3": (bool,), "cxx11_abi": (bool, type(None)), "cuda_major": (int,),
}


def _check_entry_fields(entry: Dict[str, Any], where: str) -> None:
    for key, kinds in _ENTRY_TYPES.items():
        if key in entry and (not isinstance(entry[key], kinds) or (
                isinstance(entry[key], bool) and bool not in kinds)):
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise _fail("wheel", where, f"has {key!r} {entry[key]!r}: it must be {names}")
    if entry.get("requires_python") is not None:
        # optional: packaging is read only where a requirement or version is
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            SpecifierSet(entry["requires_python"])
        except InvalidSpecifier:
            raise _fail("wheel", where, f"has requires_python {entry['requires_python']!r}, which is not a "
                        "version specifier") from None


def _missing(source: str, why: str, allow_missing: bool) -> List[Dict[str, Any]]:
    if allow_missing:
        return []
    raise _fail("--previous", source, f"not found ({why}); for the first release pass "
                "--allow-missing-previous")


def merge(previous: List[Dict[str, Any]], new: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Every previous wheel plus every new one, by file name. The same name with another
    sha256 is an error (a published file never changes); the same name and sha256 keeps the
    published entry; two names that differ only in case are an error."""
    merged: Dict[str, Dict[str, Any]] = {e["filename"]: e for e in previous}
    folded = {fn.lower(): fn for fn in merged}
    for e in new:
        fn = e["filename"]
        old = merged.get(fn)
        if old is not None:
            if old["sha256"] != e["sha256"]:
                raise _fail("wheel", e["_path"], f"sha256 {e['sha256']} differs from the published "
                            f"{old['sha256']} of the same file name: a published wheel never changes "
                            "(bump the version)")
            continue
        if fn.lower() in folded:
            raise _fail("wheel", e["_path"], f"differs only in case from {folded[fn.lower()]!r}")
        merged[fn] = e
        folded[fn.lower()] = fn
    return [merged[k] for k in sorted(merged)]


# --- writing the site --------------------------------------------------------------------------

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
        raise _fail("--asset-url", asset_url, "give --asset-url or --base-url, not both")
    if base_url is not None:
        asset_url = base_url.rstrip("/") + "/{filename}"
    if asset_url is None:
        return None
    rest = asset_url.replace("{filename}", "")
    if asset_url.count("{filename}") != 1 or "{" in rest or "}" in rest:
        raise _fail("--asset-url", asset_url, "must hold the placeholder {filename} once and no other braces")
    if not fetching.is_url(asset_url) or not urlsplit(asset_url).netloc:
        raise _fail("--asset-url", asset_url, "must be an absolute http(s) URL")
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
                raise _fail("", os.path.join(root, d), "is a symlink: the index reads only regular "
                            "files and folders")
            if d.endswith(".whl"):
                raise _fail("wheel", os.path.join(root, d), "is not a regular file (a folder)")
        for f in sorted(files):
            p = Path(root) / f
            if f.endswith(".whl"):
                found.append(p)
    return sorted(found, key=lambda p: (p.name, str(p)))


def _own_index(path: Path) -> bool:
    """Whether ``path`` holds an index this writer made (its manifest.json names the project)."""
    m = path / "manifest.json"
    try:
        return m.is_file() and json.loads(m.read_text(encoding="utf-8")).get("project") == PROJECT
    except (OSError, ValueError, AttributeError):
        return False


def _check_out_dir(out_dir: Path, wheel_dir: Path) -> None:
    if out_dir.is_symlink():
        raise _fail("OUT_DIR", out_dir, "is a symlink; give the real folder")
    if out_dir.exists():
        if not out_dir.is_dir():
            raise _fail("OUT_DIR", out_dir, "exists and is not a folder")
        if not os.access(out_dir, os.R_OK | os.W_OK | os.X_OK):
            raise _fail("OUT_DIR", out_dir, "is not readable and writable (permission denied)")
        try:
            empty = not any(out_dir.iterdir())
        except OSError as e:
            raise _fail("OUT_DIR", out_dir, f"cannot be read: {e.strerror or e}") from None
        if not empty and not _own_index(out_dir):
            raise _fail("OUT_DIR", out_dir, "must be an empty or new directory, or an index this "
                        f"command wrote (its manifest.json names {PROJECT}); it holds other files")
    parent = out_dir.parent
    if parent.exists() and not parent.is_dir():
        raise _fail("OUT_DIR", out_dir, f"cannot be created: {str(parent)!r} is not a folder")
    if parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise _fail("OUT_DIR", out_dir, f"cannot be replaced: its folder {str(parent)!r} is not writable")
    o, w = out_dir.resolve(), wheel_dir.resolve()
    if o == w or o in w.parents or w in o.parents:
        raise _fail("OUT_DIR", out_dir, f"must not contain or lie inside WHEEL_DIR {str(wheel_dir)!r}")


def _rename_exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


_MARK = ".mamba-kernels-index-temporary"  # in a folder this writer made and may remove


def _mark(folder: Path) -> None:
    (folder / _MARK).write_text("a temporary folder of `python -m mamba_kernels index`\n", encoding="utf-8")


def _leftovers(out_dir: Path) -> List[Path]:
    """The temporary folders earlier runs into ``out_dir`` left: beside it, named after it, a
    real folder (not a file or a symlink) holding this writer's mark. Nothing else is touched."""
    parent = out_dir.parent
    if not parent.is_dir():
        return []
    pre = (f".{out_dir.name}.new-", f".{out_dir.name}.old-")
    return sorted(p for p in parent.iterdir() if p.name.startswith(pre) and not p.is_symlink()
                  and p.is_dir() and (p / _MARK).is_file() and not (p / _MARK).is_symlink())


def _recover(out_dir: Path) -> None:
    """After an interrupted run: put a displaced old index back (a run killed between its two
    renames), then remove the temporary folders of earlier runs (only those this writer marked
    as its own). Runs into the same OUT_DIR must not overlap."""
    for p in _leftovers(out_dir):
        if p.name.startswith(f".{out_dir.name}.old-") and not out_dir.exists() and _own_index(p):
            (p / _MARK).unlink()
            os.rename(p, out_dir)
    for p in _leftovers(out_dir):
        shutil.rmtree(p)


def _swap_into_place(new: Path, out_dir: Path) -> None:
    """Make the finished folder ``new`` be ``out_dir``: one rename when there was none, one
    atomic exchange where the OS has it, else two renames; then drop the old index."""
    (new / _MARK).unlink()  # from here on it is the index itself
    if not out_dir.exists():
        os.rename(new, out_dir)
        return
    _mark(out_dir)  # after the exchange it is the temporary folder `new`
    if _rename_exchange(new, out_dir):
        shutil.rmtree(new)  # now the old index
        return
    (out_dir / _MARK).unlink()
    old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.old-"))
    os.rmdir(old)
    _mark(out_dir)  # it becomes the temporary folder `old`
    os.rename(out_dir, old)
    os.rename(new, out_dir)
    shutil.rmtree(old)


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
        raise _fail("", where, e.strerror or str(e)) from None


def _write_index(wheel_dir: Path, out_dir: Path, base_url: Optional[str], asset_url: Optional[str],
                 previous: Optional[str], allow_missing_previous: bool) -> Tuple[Dict[str, Any], int]:
    if not wheel_dir.is_dir():
        raise _fail("WHEEL_DIR", wheel_dir, "must be a directory" + ("" if wheel_dir.exists() else
                                                                        " (it does not exist)"))
    template = _asset_url_template(asset_url, base_url)
    _check_out_dir(out_dir, wheel_dir)  # before anything beside it is touched
    _recover(out_dir)  # then, so that a --previous inside OUT_DIR is back in place
    _check_out_dir(out_dir, wheel_dir)
    wheels = _find_wheels(wheel_dir)
    if not wheels and previous is None:
        raise _fail("WHEEL_DIR", wheel_dir, "holds no .whl file")
    seen: Dict[str, Path] = {}
    for w in wheels:
        if w.name in seen:
            raise _fail("wheel", w.name, f"appears twice: {str(seen[w.name])!r} and {str(w)!r}")
        seen[w.name] = w
    old = load_previous(previous, allow_missing_previous) if previous is not None else []

    new = []
    for w in wheels:
        e = describe_wheel(w)
        e["url"] = template.replace("{filename}", quote(e["filename"])) if template else (
            "wheels/" + quote(e["filename"]))
        e["_path"] = str(w)
        new.append(e)
    entries = merge(old, new)
    if not entries:  # no new wheel (a site half only carried over) and no published one either
        raise _fail("WHEEL_DIR", wheel_dir, "holds no .whl file and the previous manifest lists none")
    public = [{k: v for k, v in e.items() if not k.startswith("_")} for e in entries]
    manifest = {"schema": MANIFEST_SCHEMA, "project": PROJECT,
                "variants": sorted({e["label"] for e in entries}), "wheels": public}

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    mode = out_dir.stat().st_mode & 0o7777 if out_dir.is_dir() else 0o755
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.new-"))
    try:
        _mark(tmp)
        os.chmod(tmp, mode)
        _write_site(tmp, entries, manifest)
        _swap_into_place(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return manifest, len(old)
