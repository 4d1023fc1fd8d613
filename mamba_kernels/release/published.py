"""The previously published manifest and the merge that keeps every wheel it lists.

``--previous`` (a path or an http(s) URL) is read and checked entry by entry; :func:`merge`
adds the new wheels to it, refusing a file name published before with other bytes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import quote, unquote, urlsplit

from ..facts.variant import PROJECT
from ..install import fetching, wheel_metadata
from .wheel_check import check_filename, fail, label_fields

PREVIOUS_TIMEOUT = 60.0  # seconds for fetching the published manifest, as a whole
MANIFEST_SCHEMA = 2  # 2: every wheel has its own url (absolute, or relative to the manifest)
_READABLE_SCHEMAS = (1, 2)
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# Fields of a carried-over manifest entry that the pages and the resolver read, and their types.
_ENTRY_TYPES: Dict[str, Tuple[type, ...]] = {
    "version": (str,), "requires_python": (str, type(None)), "requires_torch": (str, type(None)),
    "requires_torch_marker": (str, type(None)), "size": (int,), "archs": (dict,), "describe": (str,),
    "binding": (str,), "torch": (str,), "cuda": (str,), "python": (str,), "platform": (str,),
    "platform_tag": (str,), "abi3": (bool,), "cxx11_abi": (bool, type(None)), "cuda_major": (int,),
}


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
    raw, why_missing = _read_source(source)
    if raw is None:
        return _missing(source, why_missing, allow_missing)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise fail(what, source, f"is not a JSON manifest ({e})") from None
    if not isinstance(data, dict) or data.get("project") != PROJECT:
        raise fail(what, source, f"is not a manifest of {PROJECT} (no \"project\": \"{PROJECT}\")")
    if data.get("schema") not in _READABLE_SCHEMAS:
        raise fail(what, source, f"has manifest schema {data.get('schema')!r}; this writer reads "
                    f"{', '.join(map(str, _READABLE_SCHEMAS))}")
    wheels = data.get("wheels")
    if not isinstance(wheels, list):
        raise fail(what, source, "has no \"wheels\" list")
    seen: set = set()
    return [_previous_entry(e, i, source, seen) for i, e in enumerate(wheels)]


def _read_source(source: str) -> Tuple[Optional[bytes], str]:
    """(the manifest's bytes, ""), or (None, why) when it does not exist; any other failure to
    read it raises."""
    what = "--previous"
    if fetching.is_url(source):
        try:
            return fetching.read_all(source, PREVIOUS_TIMEOUT, fetching.MAX_PAGE_BYTES)[0], ""
        except fetching.FetchError as e:
            if e.status in (404, 410):
                return None, f"HTTP {e.status}"
            raise fail(what, source, str(e)) from None
    if "://" in source:
        raise fail(what, source, "must be a path or an http(s) URL")
    path = Path(source)
    if not path.exists() and not path.is_symlink():
        return None, "no such file"
    if not path.is_file():
        raise fail(what, source, "is not a regular file")
    try:
        return path.read_bytes(), ""
    except OSError as e:
        raise fail(what, source, f"cannot be read: {e.strerror or e}") from None


def _previous_entry(e: Any, i: int, source: str, seen: set) -> Dict[str, Any]:
    """Wheel entry ``i`` of the manifest at ``source``, checked and completed (see load_previous)."""
    what = "--previous"
    if not isinstance(e, dict) or not isinstance(e.get("filename"), str):
        raise fail(what, source, f"wheel entry {i} has no \"filename\"")
    fn = e["filename"]
    where = f"{fn} (in {source})"
    info = check_filename(fn, where)
    if fn in seen:
        raise fail("wheel", where, "is listed twice")
    seen.add(fn)
    sha, url = e.get("sha256"), e.get("url")
    if not isinstance(sha, str) or not _SHA256_RE.match(sha):
        raise fail("wheel", where, f"has no valid sha256 (got {sha!r})")
    if not isinstance(url, str) or not url:
        raise fail("wheel", where, "has no url")
    label = fn.split("-")[1].split("+", 1)[1]
    if e.get("label", label) != label:
        raise fail("wheel", where, f"is recorded under label {e.get('label')!r}, its name says "
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
            raise fail("wheel", where, f"has the relative URL {url!r}: a published manifest must "
                        "record absolute asset URLs (write it with --asset-url)")
        local = Path(source).parent / unquote(url.split("#", 1)[0])  # resolved against its base
        if local.is_symlink() or not local.is_file():
            raise fail("wheel", where, f"is linked relatively ({url!r}) but {str(local)!r} is not a "
                        "regular file to carry over")
        if wheel_metadata.sha256_of(local) != sha:
            raise fail("wheel", where, f"{str(local)!r} does not have the recorded sha256")
        entry["_copy_from"] = str(local)
        entry["url"] = "wheels/" + quote(fn)  # copied under the name it is linked by
    return entry


def _check_entry_fields(entry: Dict[str, Any], where: str) -> None:
    for key, kinds in _ENTRY_TYPES.items():
        if key in entry and (not isinstance(entry[key], kinds) or (
                isinstance(entry[key], bool) and bool not in kinds)):
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise fail("wheel", where, f"has {key!r} {entry[key]!r}: it must be {names}")
    if entry.get("requires_python") is not None:
        # optional: packaging is read only where a requirement or version is
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            SpecifierSet(entry["requires_python"])
        except InvalidSpecifier:
            raise fail("wheel", where, f"has requires_python {entry['requires_python']!r}, which is not a "
                        "version specifier") from None


def _missing(source: str, why: str, allow_missing: bool) -> List[Dict[str, Any]]:
    if allow_missing:
        return []
    raise fail("--previous", source, f"not found ({why}); for the first release pass "
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
                raise fail("wheel", e["_path"], f"sha256 {e['sha256']} differs from the published "
                            f"{old['sha256']} of the same file name: a published wheel never changes "
                            "(bump the version)")
            continue
        if fn.lower() in folded:
            raise fail("wheel", e["_path"], f"differs only in case from {folded[fn.lower()]!r}")
        merged[fn] = e
        folded[fn.lower()] = fn
    return [merged[k] for k in sorted(merged)]
