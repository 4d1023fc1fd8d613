"""Choosing the release wheel for an environment: ``python -m mamba_kernels resolve``.

Reads the candidate wheels from one or more sources: our ``manifest.json`` (a path or URL; a
directory holding one), a PEP 503 simple page or PEP 691 JSON page, a ``--find-links`` page, or
a plain directory of wheels (by file name alone). Then it checks each candidate against the
target environment (:func:`mamba_kernels.install.environment.detect`) with the rules of
docs/COMPAT.md §9, as :mod:`mamba_kernels.facts.variant` writes them:

- the wheel's Python tag is the target's (a ``cp310-abi3`` stable wheel: any CPython from 3.10
  on; no wheel of ours loads on a free-threaded CPython) and its platform tag installs there;
- torch major.minor equal (a stable wheel, label ``cu<XY>stable<M.m>``: torch at least its
  target M.m, docs/COMPAT.md §11); CUDA major equal and the wheel's CUDA minor not above
  torch's; C++ ABI equal where the label records one (never for a stable wheel);
- every visible GPU runs the wheel: its compute capability is in the wheel's SASS or reachable
  through its PTX. The arch list comes from the manifest when it records one, else from the
  support table's default list for the wheel's CUDA and platform (the reason says which).

Of the wheels that fit, the one with torch's exact CUDA wins, then the same major with the
highest lower minor, then the newest package version, then a per-minor (classic) wheel over a
stable one (it skips the stable ABI's few-microsecond call shim). From torch 2.10 on the
matrix builds only stable wheels, so the last rule matters only for an index that still lists
older per-minor releases of the same version. Every other candidate is reported with the
reasons it was not chosen, nearest first.
"""

from __future__ import annotations

import argparse
import html.parser
import json
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import unquote, urljoin, urlsplit

from ..facts import release_index, support, variant, versions
from ..facts.archs import Arch
from ..facts.variant import PROJECT
from . import fetching
from .environment import Target, parse_gpu_archs, tag_installs
from .wheel_metadata import sha256_of

DEFAULT_TIMEOUT = 30.0
EXIT_NO_MATCH = 3
_ACCEPT = ("application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.5, "
           "text/html;q=0.2, application/json;q=0.2, */*;q=0.1")
_MAX_FOLLOW = 2  # links followed from an HTML page without wheels (root index -> project page)
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class SourceError(ValueError):
    """A source cannot be read; the message is one line naming it. ``kind``: "fetch" (network,
    HTTP), "timeout", "notindex" (a page that is no index) or "content" (a malformed index)."""

    def __init__(self, line: str, kind: str = "content") -> None:
        super().__init__(line)
        self.kind = kind


@dataclass(frozen=True)
class Candidate:
    """One wheel some source lists."""

    filename: str
    url: str  # an absolute URL or a local path
    sha256: Optional[str] = None
    archs: Optional[Dict[str, Dict[str, List[str]]]] = None  # as the manifest records them
    source: str = ""
    remote: bool = False  # listed by an index read over http(s): its file must carry a sha256
    size: Optional[int] = None  # bytes, when the index records them


@dataclass
class Verdict:
    candidate: Candidate
    reasons: List[str] = field(default_factory=list)  # empty: it fits
    why: List[str] = field(default_factory=list)  # what holds, for the chosen one
    info: Optional[variant.WheelInfo] = None
    distance: int = 0

    @property
    def fits(self) -> bool:
        return not self.reasons


@dataclass
class Resolution:
    target: Target
    selected: Optional[Verdict]
    rejected: List[Verdict]

    def as_dict(self) -> Dict[str, Any]:
        s = self.selected
        return {
            "selected": s.candidate.filename if s else None,
            "url": s.candidate.url if s else None,
            "sha256": s.candidate.sha256 if s else None,
            "reason": "; ".join(s.why) if s else no_match_line(self.target, len(self.rejected)),
            "rejected": [{"file": v.candidate.filename, "reasons": v.reasons} for v in self.rejected],
            "target": self.target.as_dict(),
        }


# ----------------------------------------------------------------------------- reading sources

def _fetch(url: str, source: str, deadline: float) -> Tuple[bytes, str, str]:
    """(body, content type, final URL) of ``url``, or a one-line SourceError naming ``source``."""
    try:
        return fetching.read_all(url, _left(source, deadline), fetching.MAX_PAGE_BYTES, _ACCEPT)
    except fetching.FetchError as e:
        shown = source if url == source else f"{source} ({url})"
        kind = "timeout" if e.kind == "timeout" else "fetch" if e.kind in ("network", "http") else "content"
        raise SourceError(f"--index {shown}: {e}", kind) from None


def _left(source: str, deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise SourceError(f"--index {source}: timed out: reading it took longer than --timeout", "timeout")
    return left


def _join(base: str, ref: str, source: str, remote: bool) -> str:
    """``ref`` (an href or a manifest url) relative to ``base`` (a URL or a local file path). An
    index read over http(s) may point only to http(s) URLs; a local one also to local files."""
    ref_no_frag = ref.split("#", 1)[0]
    if fetching.is_url(base) or fetching.is_url(ref_no_frag):
        out = urljoin(base, ref_no_frag)
        if remote and not fetching.is_url(out):
            raise SourceError(f"--index {source}: lists {ref!r}, which is not an http(s) URL: an index "
                              "read over http(s) may point only to http(s) URLs (docs/INSTALL.md, What is "
                              "trusted)")
        return out
    scheme = urlsplit(ref_no_frag).scheme
    if scheme == "file":
        try:
            return fetching.local_path(ref_no_frag)
        except fetching.FetchError as e:
            raise SourceError(f"--index {source}: {e}") from None
    if scheme and len(scheme) > 1:  # "C:" is a Windows drive, not a scheme
        raise SourceError(f"--index {source}: lists {ref!r}: only http(s) URLs, file: URLs and paths "
                          "are read")
    return str(Path(base).parent / unquote(ref_no_frag))


_BAD_NAME_CHARS = re.compile(r"[\x00-\x20\x7f/\\]")


def check_plain_filename(name: str, source: str) -> str:
    """A wheel file name as an index lists it: a plain name (no folder, no space or control
    character such as a newline), at most 255 characters, ending in ``.whl``."""
    if not name.endswith(".whl") or _BAD_NAME_CHARS.search(name) or len(name.encode("utf-8")) > 255 or \
            name.startswith("."):
        raise SourceError(f"--index {source}: lists the file name {name!r}, which is not a plain wheel file "
                          "name (no folder, space or control character; at most 255 bytes; ending .whl)")
    return name


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: List[Tuple[str, str]] = []  # (href, text)
        self._href: Optional[str] = None
        self._text: List[str] = []

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def _wheel_name_of(href: str, text: str) -> Optional[str]:
    name = unquote(urlsplit(href).path.rsplit("/", 1)[-1])
    if name.endswith(".whl"):
        return name
    return text if text.endswith(".whl") else None


def _from_html(text: str, base: str, source: str, deadline: float, depth: int, remote: bool
               ) -> List[Candidate]:
    parser = _Links()
    try:
        parser.feed(text)
        parser.close()
    except Exception as e:  # the parser is lenient; anything it still refuses is a bad page
        raise SourceError(f"--index {source}: not a readable HTML page ({e})") from None
    out = []
    for href, label in parser.links:
        name = _wheel_name_of(href, label)
        if name is None:
            continue
        frag = href.split("#", 1)[1] if "#" in href else ""
        sha = frag[len("sha256="):] if frag.startswith("sha256=") else None
        out.append(Candidate(check_plain_filename(name, source), _join(base, href, source, remote),
                             _sha(sha, name, source), None, source, remote))
    if out:
        return out
    # A page without wheels: our site's root (-> manifest.json) or a PEP 503 root (-> project).
    for href, label in parser.links if depth < _MAX_FOLLOW else ():
        target = href.split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if target == "manifest.json" or label.rstrip("/") in (PROJECT, variant.DIST_NAME) or target in (
                PROJECT, variant.DIST_NAME):
            return _read(_join(base, href, source, remote), source, deadline, depth + 1, remote)
    if _DIST_FILE.search(text) or "pypi:repository-version" in text:
        return out  # an index, of other projects' files (or other projects)
    where = "" if base == source else f" ({base})"
    raise SourceError(f"--index {source}: the page{where} lists no wheel and links no manifest.json or "
                      f"{PROJECT} page: not an index (a web server's welcome page?)", "notindex")


_DIST_FILE = re.compile(r"""href\s*=\s*["']?[^"'>\s]*\.(whl|tar\.gz|zip|tar\.bz2|egg)(#[^"'>\s]*)?["'\s>]""",
                        re.IGNORECASE)  # a link to a distribution file: an index with no wheel of ours


def _sha(value: Any, name: str, source: str) -> Optional[str]:
    """A listed sha256: 64 hex digits (any case), or None when the index lists none."""
    if value is None:
        return None
    if not isinstance(value, str) or not _SHA256_RE.match(value.lower()):
        raise SourceError(f"--index {source}: the sha256 listed for {name} must be 64 hex digits, got "
                          f"{_short(value)}")
    return value.lower()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _size(value: Any, name: str, source: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SourceError(f"--index {source}: the size listed for {name} must be a whole number of bytes, "
                          f"got {_short(value)}")
    return value


def _archs(value: Any, name: str, source: str) -> Optional[Dict[str, Dict[str, List[str]]]]:
    """A manifest's ``archs``: {module: {"sass": ["sm_90", ...], "ptx": ["compute_90", ...]}}."""
    if value is None:
        return None
    ok = isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(m, dict) and all(
            key in ("sass", "ptx") and isinstance(v, list) and all(
                isinstance(a, str) and re.fullmatch(r"(sm|compute)_\d{2,4}[a-z]?", a) for a in v)
            for key, v in m.items())
        for k, m in value.items())
    if not ok:
        raise SourceError(f"--index {source}: the archs listed for {name} must map each module to "
                          f"{{\"sass\": [\"sm_XY\", ...], \"ptx\": [\"compute_XY\", ...]}}, got "
                          f"{_short(value)}")
    return value


def _from_json(data: Any, base: str, source: str, remote: bool) -> List[Candidate]:
    if isinstance(data, dict) and data.get("project") == PROJECT and isinstance(data.get("wheels"), list):
        out = []
        for i, e in enumerate(data["wheels"]):  # our manifest
            if not isinstance(e, dict) or not isinstance(e.get("filename"), str):
                raise SourceError(f"--index {source}: wheel entry {i} has no \"filename\" string")
            name = check_plain_filename(e["filename"], source)
            url = e.get("url", name)
            if not isinstance(url, str) or not url:
                raise SourceError(f"--index {source}: the url listed for {name} must be a non-empty "
                                  f"string, got {_short(url)}")
            out.append(Candidate(name, _join(base, url, source, remote), _sha(e.get("sha256"), name, source),
                                 _archs(e.get("archs"), name, source), source, remote,
                                 _size(e.get("size"), name, source)))
        return out
    if isinstance(data, dict) and isinstance(data.get("files"), list):
        out = []
        for i, f in enumerate(data["files"]):  # PEP 691
            if not isinstance(f, dict) or not isinstance(f.get("filename"), str):
                raise SourceError(f"--index {source}: file entry {i} has no \"filename\" string")
            if not f["filename"].endswith(".whl"):
                continue
            name = check_plain_filename(f["filename"], source)
            url, hashes = f.get("url"), f.get("hashes", {})
            if not isinstance(url, str) or not url:
                raise SourceError(f"--index {source}: the url listed for {name} must be a non-empty "
                                  f"string, got {_short(url)}")
            if not isinstance(hashes, dict):
                raise SourceError(f"--index {source}: the hashes listed for {name} must be an object, got "
                                  f"{_short(hashes)}")
            out.append(Candidate(name, _join(base, url, source, remote),
                                 _sha(hashes.get("sha256"), name, source), None, source, remote,
                                 _size(f.get("size"), name, source)))
        return out
    raise SourceError(f"--index {source}: JSON that is neither a {PROJECT} manifest nor a PEP 691 page")


def _read(where: str, source: str, deadline: float, depth: int = 0, remote: bool = False
          ) -> List[Candidate]:
    if fetching.is_url(where):
        body, ctype, base = _fetch(where, source, deadline)
        remote = True
    else:
        path = Path(where)
        if path.is_dir():
            manifest = path / "manifest.json"
            if manifest.is_file():
                return _read(str(manifest), source, deadline, depth, remote)
            try:  # a name that is no plain wheel name is no wheel of ours: not listed
                return sorted((Candidate(p.name, str(p), None, None, source) for p in path.rglob("*.whl")
                               if p.is_file() and not _BAD_NAME_CHARS.search(p.name)),
                              key=lambda c: c.filename)
            except OSError as e:
                raise SourceError(f"--index {where}: cannot be read: {e.strerror or e}") from None
        if not path.is_file():
            raise SourceError(f"--index {where}: no such file or directory")
        try:
            body = fetching.read_all(where, _left(source, deadline), fetching.MAX_PAGE_BYTES)[0]
        except fetching.FetchError as e:
            raise SourceError(f"--index {where}: {e}") from None
        ctype, base = ("application/json" if path.suffix == ".json" else "text/html"), str(path)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise SourceError(f"--index {where}: not UTF-8 text (expected a manifest or an index page)") from None
    if not text.strip():
        raise SourceError(f"--index {where}: an empty page (0 bytes of text): not an index", "notindex")
    if "json" in ctype or text.lstrip().startswith(("{", "[")):
        try:
            data = json.loads(text)
        except RecursionError:
            raise SourceError(f"--index {where}: not valid JSON (nested too deeply)") from None
        except ValueError as e:
            raise SourceError(f"--index {where}: not valid JSON ({e})") from None
        return _from_json(data, base, source, remote)
    return _from_html(text, base, source, deadline, depth, remote)


def read_source(source: str, timeout: float = DEFAULT_TIMEOUT, origin: Optional[str] = None
                ) -> List[Candidate]:
    """Every candidate one source lists; ``timeout`` bounds reading it as a whole (with the
    pages it links), or a one-line SourceError. ``origin`` (``--index``, ``MAMBA_KERNELS_INDEX``
    or ``the release index``), when given, names where the source came from in that line, and an
    index that cannot be fetched or is no index ends it with the ways forward from there."""
    try:
        return _read_source(source, timeout)
    except SourceError as e:
        if origin is None:
            raise
        raise SourceError(_named(str(e), origin) + ways_forward(e.kind, origin), e.kind) from None


def _named(line: str, origin: str) -> str:
    """``line`` ("--index SOURCE: ...") with the source named as the user gave it."""
    if origin == "--index" or not line.startswith("--index "):
        return line
    name = f"{release_index.ENV_VAR} entry" if origin == release_index.ENV_VAR else origin
    return f"{name} {line[len('--index '):]}"


def ways_forward(kind: str, origin: str) -> str:
    """What to do about an index of ``origin`` that failed as ``kind`` (SourceError.kind), as
    the end of its one line; "" for a malformed index (its line says what is wrong)."""
    if kind not in ("fetch", "timeout", "notindex"):
        return ""
    folder = "a folder of wheels (one `download --dest DIR` filled where there is network)"
    if origin == release_index.ENV_VAR:
        other = (f"set {release_index.ENV_VAR} to another index or to {folder}, or give --index URL|DIR, "
                 "which overrides it")
    elif origin == "--index":
        other = f"give another --index: a mirror's URL, or {folder} as --index /path/to/wheels"
    else:
        other = (f"give --index (or set {release_index.ENV_VAR}): a mirror's URL, or {folder} as "
                 "--index /path/to/wheels")
    if kind == "timeout":
        return f"; --timeout N waits N seconds (default {DEFAULT_TIMEOUT:g}), or {other}"
    if kind == "notindex":
        return (f"; is this the index's address? (a manifest.json, a PEP 503/691 page or a find-links page); "
                f"else {other}")
    return f"; check the address and the network, or {other}"


def _read_source(source: str, timeout: float) -> List[Candidate]:
    if not source.strip():
        raise SourceError(f"--index {source!r}: must be a path or a URL, not empty")
    if "://" in source and not fetching.is_url(source) and not source.startswith("file://"):
        raise SourceError(f"--index {source}: must be a path or an http(s) URL")
    try:
        where = fetching.local_path(source)
    except fetching.FetchError as e:
        raise SourceError(f"--index {source}: {e}") from None
    return _read(where, source, time.monotonic() + timeout)


def read_sources(sources: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> List[Candidate]:
    """Every candidate of every source, each file name once (the first source wins)."""
    seen: Dict[str, Candidate] = {}
    for s in sources:
        for c in read_source(s, timeout):
            seen.setdefault(c.filename, c)
    return list(seen.values())


# ----------------------------------------------------------------------------- judging

def _ours(filename: str) -> bool:
    """Whether the file's distribution is ours (PEP 503 normalised name)."""
    return re.sub(r"[-_.]+", "-", filename.split("-", 1)[0]).lower() == PROJECT


def _version_key(version: str) -> Tuple[int, ...]:
    """The release segment of a public version (``0.2.1`` -> (0, 2, 1)); pre-releases are not
    published, so this orders our versions."""
    m = re.match(r"\d+(\.\d+)*", version)
    return versions.key(m.group(0)) if m else (0,)


def _arch_lists(c: Candidate, built: variant.Variant, platform: Optional[str]
                ) -> Tuple[List[Tuple[List[str], List[str]]], str]:
    """[(SASS, PTX) per compiled module] and where the lists come from."""
    if c.archs:
        lists = [(list(m.get("sass") or []), list(m.get("ptx") or [])) for m in c.archs.values()
                 if isinstance(m, dict)]
        if lists:
            return lists, "arch list from the manifest"
    if platform is None:
        return [], "no arch list (unknown platform)"
    try:
        archs = support.default_archs(built.cuda, platform)
    except ValueError:
        return [], f"no arch list known for CUDA {built.cuda} on {platform}"
    how = "by file name" if c.archs is None else "the manifest records none"
    return ([([Arch.parse(a).sass_name for a in archs], [Arch.parse(archs[-1]).ptx_name])],
            f"arch list from the support table for CUDA {built.cuda} on {platform} ({how})")


def _gpu_check(c: Candidate, built: variant.Variant, target: Target, platform: Optional[str]
               ) -> Tuple[List[str], Optional[str]]:
    """(reasons, what holds) for the target's GPUs."""
    if not target.gpus:
        return [], "no GPU visible: architecture not checked (give --gpu-arch to check)"
    lists, how = _arch_lists(c, built, platform)
    if not lists:
        return [], f"GPU architecture not checked: {how}"
    problems, ok = [], []
    for cap in target.gpu_archs:
        bad = [(s, p) for s, p in lists if not variant.arch_runs(s, p, cap)]
        if bad:
            s, p = bad[0]
            problems.append(f"GPU sm {cap} is neither in its SASS ({', '.join(s) or 'none'}) nor reachable "
                            f"through its PTX ({', '.join(p) or 'none'}); {how}")
        else:
            sass = lists[0][0]
            direct = Arch.capability(cap).sass_name in sass
            ok.append(f"sm {cap} " + ("in SASS" if direct else "runs (same-major SASS or PTX)"))
    return problems, f"GPU {', '.join(ok)}; {how}"


def judge(c: Candidate, target: Target) -> Verdict:
    """What holds and what does not for one candidate."""
    v = Verdict(c)
    try:
        info = variant.parse_wheel_name(c.filename)
    except ValueError:
        v.reasons.append("the file name is not one of this project's wheel names")
        v.distance = 10_000
        return v
    v.info = info
    dist = 0
    if info.variant is None:
        v.reasons.append("no variant label: a local or source build, for no known torch")
        v.distance = 10_000
        return v
    built = info.variant
    # Python and platform
    py_problems, py_dist, py_why = _python_check(info, target)
    v.reasons.extend(py_problems)
    dist += py_dist
    if py_why:
        v.why.append(py_why)
    if not tag_installs(info.platform_tag, target.platform_tags):
        where = target.platform or "this platform"
        if info.platform is not None and info.platform == target.platform:
            v.reasons.append(f"platform tag {info.platform_tag} needs a newer glibc than the target's "
                             f"({target.platform_tags[0]})")
        else:
            v.reasons.append(f"built for {info.platform or info.platform_tag}, the target is {where}")
            dist += 50
    else:
        v.why.append(f"{info.platform_tag} installs on {target.platform or target.platform_tags[0]}")
    # torch, CUDA, ABI
    if target.torch is None:
        need = f">= {built.torch} (stable ABI)" if built.stable else built.torch
        v.reasons.append(f"needs torch {need}; the target has no torch (give --torch)")
    else:
        who = "given torch" if target.sources.get("torch") == "given" else "running torch"
        problems = variant.mismatches(built, target.torch, target.torch_cuda, target.cxx11_abi, who)
        v.reasons.extend(problems)
        try:
            t_mm, b_mm = versions.minor_key(target.torch), versions.minor_key(built.torch)
            if not built.stable or t_mm < b_mm:  # a stable wheel is as near to every newer torch
                dist += abs(t_mm[1] - b_mm[1]) * 10 + abs(t_mm[0] - b_mm[0]) * 100
        except ValueError:
            pass
        if target.torch_cuda:
            b, t = versions.minor_key(built.cuda), versions.minor_key(target.torch_cuda)
            dist += abs(b[0] - t[0]) * 10 + abs(b[1] - t[1])
        if not problems:
            if built.stable:
                v.why.append(f"torch {target.torch} is at least {built.torch}: {built.describe()} serves "
                             f"every torch from {built.torch} on")
            else:
                v.why.append(f"torch {built.torch} is the target's torch {target.torch}")
            if built.cuda == target.torch_cuda:
                v.why.append(f"CUDA {built.cuda} is torch's CUDA (exact)")
            else:
                v.why.append(f"CUDA {built.cuda} runs under torch's CUDA {target.torch_cuda} "
                             "(same major, lower minor)")
            if built.cxx11_abi is not None:
                if target.cxx11_abi is None:
                    v.why.append(f"C++ ABI {variant.abi_name(built.cxx11_abi)} (the target's ABI is "
                                 "unknown: give --cxx11-abi to check)")
                else:
                    v.why.append(f"C++ ABI {variant.abi_name(built.cxx11_abi)} is torch's")
    # GPU
    problems, holds = _gpu_check(c, built, target, info.platform)
    v.reasons.extend(problems)
    if holds and not problems:
        v.why.append(holds)
    v.distance = dist + 1000 * len(v.reasons)
    return v


def _python_check(info: variant.WheelInfo, target: Target) -> Tuple[List[str], int, Optional[str]]:
    """(reasons, distance, what holds) for the wheel's Python tags against the target's."""
    want = f"Python {target.python}" + (" (free-threaded)" if target.free_threaded else "")
    tag = variant.python_tag(info.python) + ("-abi3" if info.abi3 else "")
    gap = abs(int(info.python.split(".")[1]) - int(target.python.split(".")[1]))
    if target.free_threaded:
        why = ("the stable ABI (abi3) does not load on a free-threaded CPython" if info.abi3 else
               "a free-threaded CPython loads only cpXYt wheels")
        return [f"{tag} cannot serve {want}: {why}; no wheel of ours is built for it"], gap + 1, None
    if info.abi3:
        if versions.minor_key(target.python) < versions.minor_key(info.python):
            return [f"{tag} needs CPython >= {info.python}, the target is {want}"], gap, None
        return [], 0, f"{tag} serves {want} (CPython >= {info.python})"
    if info.python != target.python:
        return [f"for Python {info.python}, the target is {want}"], gap, None
    return [], 0, f"{tag} for {want}"


def _preference(v: Verdict, target: Target) -> Tuple:
    assert v.info is not None and v.info.variant is not None
    cuda = versions.minor_key(v.info.variant.cuda)
    exact = v.info.variant.cuda == target.torch_cuda
    classic = not v.info.variant.stable
    return (exact, cuda, _version_key(v.info.version), classic, v.candidate.filename)


def resolve(candidates: Sequence[Candidate], target: Target) -> Resolution:
    """The best fitting candidate and every other one with its reasons, nearest first."""
    verdicts = [judge(c, target) for c in candidates if _ours(c.filename)]
    fitting = sorted((v for v in verdicts if v.fits), key=lambda v: _preference(v, target), reverse=True)
    selected = fitting[0] if fitting else None
    if selected is not None:
        for v in fitting[1:]:
            assert v.info is not None and v.info.variant is not None and selected.info is not None
            sv = selected.info.variant
            assert sv is not None
            if v.info.variant.cuda != sv.cuda:
                pref = f"CUDA {sv.cuda} is closer to torch's CUDA {target.torch_cuda}"
            elif v.info.version != selected.info.version:
                pref = f"version {selected.info.version} is newer"
            elif v.info.variant.stable != sv.stable:
                pref = "a per-minor build skips the stable ABI's call shim"
            else:
                pref = "the same build (listed twice)"
            v.reasons.append(f"fits too, but {selected.candidate.filename} is preferred: {pref}")
            v.distance = -1
    rejected = sorted((v for v in verdicts if v is not selected),
                      key=lambda v: (v.distance, len(v.reasons), v.candidate.filename))
    return Resolution(target, selected, rejected)


def local_sha256(path: str) -> Optional[str]:
    try:
        return sha256_of(Path(path))
    except OSError:
        return None


_OUR_NAME = re.compile(r"""^\s*name\s*=\s*["']mamba[-_.]kernels["']""", re.MULTILINE | re.IGNORECASE)


def source_root(folder: Path) -> Optional[Path]:
    """The root of a mamba-kernels source tree (a checkout or an unpacked sdist) that ``folder``
    is or lies in: the nearest folder up whose pyproject.toml names the project, or whose
    setup.py is ours; None when there is none."""
    for d in (folder, *folder.parents):
        if _OUR_NAME.search(_text(d / "pyproject.toml")) or "mamba_kernels.build" in _text(d / "setup.py"):
            return d
    return None


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def source_build_hint(install: str = "pip install", cwd: Optional[Path] = None) -> str:
    """How to build from source, as a command that works where the user is (``cwd``, default the
    current folder): ``.`` in the root of a source tree, its path from inside or beside one,
    else a path to a checkout or unpacked sdist still to be fetched (no sdist is installable by
    name until the project is published on PyPI, so none is named). ``install`` is the install
    command (``/path/to/python -m pip install`` for a target interpreter)."""
    here = Path.cwd() if cwd is None else cwd
    try:
        root = source_root(here.resolve())
    except OSError:
        root = None
    if root is not None:
        where = "." if root == here.resolve() else shlex.quote(str(root))
        return f"build from source: {install} --no-build-isolation {where}"
    return (f"build from source: get the source (a git checkout, or the sdist unpacked) and run "
            f"{install} --no-build-isolation /path/to/mamba-kernels (the folder with its "
            f"pyproject.toml; {here} is not one)")


def describe_target(t: Target) -> str:
    torch = "no torch" if t.torch is None else (
        f"torch {t.torch} (CUDA {t.torch_cuda or 'none'}, {variant.abi_name(t.cxx11_abi)} ABI)")
    gpus = ", ".join(f"sm {c}" for c in t.gpu_archs) or "no GPU visible"
    py = f"Python {t.python}" + ("t (free-threaded)" if t.free_threaded else "")
    return f"{torch}, {py}, {t.platform or t.platform_tags[0]}, {gpus}"


def chosen_lines(res: Resolution, extra: Sequence[str] = ()) -> List[str]:
    """The chosen wheel's url, sha256, ``extra`` and reasons, a ``name    value`` line each, as
    resolve and install print them under the file name."""
    assert res.selected is not None
    c = res.selected.candidate
    sha = c.sha256 or "not listed by the index (computed when the file is read)"
    lines = [f"url     {c.url}", f"sha256  {sha}"]
    return lines + list(extra) + [f"why     {why}" for why in res.selected.why]


def no_match_line(t: Target, n: int) -> str:
    if n == 0:
        return "no wheel of mamba-kernels in the given index"
    return f"none of the {n} candidate wheel(s) fits {describe_target(t)}"


# ----------------------------------------------------------------------------- CLI

NEAREST_SHOWN = 5  # candidates a no-fit answer lists without --all


def read_each(sources: Sequence[str], timeout: float, warn: Any, origin: Optional[str] = None
              ) -> Tuple[List[Candidate], int]:
    """(every candidate of the sources that could be read, how many could be read): a source
    that cannot be read is one line through ``warn`` and the others still count."""
    seen: Dict[str, Candidate] = {}
    n_read = 0
    for s in sources:
        try:
            found = read_source(s, timeout, origin)
        except SourceError as e:
            warn(str(e) + ("; reading the other indexes" if len(sources) > 1 else ""))
            continue
        n_read += 1
        for c in found:
            seen.setdefault(c.filename, c)
    return list(seen.values()), n_read


def no_match_lines(rejected: Sequence[Verdict], show_all: bool,
                   more: str = "--all lists every one, --json too") -> List[str]:
    """The rejected candidates with their reasons, nearest first: the nearest
    :data:`NEAREST_SHOWN` unless ``show_all``, then a line saying how many more there are."""
    rejected = sorted(rejected, key=lambda v: (v.distance, len(v.reasons), v.candidate.filename))
    shown = rejected if show_all else rejected[:NEAREST_SHOWN]
    lines = ["candidates, nearest first:"] if shown else []
    for v in shown:
        lines.append(f"  {v.candidate.filename}")
        lines += [f"    - {r}" for r in v.reasons]
    rest = len(rejected) - len(shown)
    if rest:
        lines.append(f"  ... and {rest} more ({more})")
    return lines


def target_overrides(args: argparse.Namespace) -> Dict[str, Any]:
    """The keyword arguments of :func:`detect` the command line gives (None: detect it)."""
    return {
        "torch": args.torch, "cuda": args.cuda, "python": args.python, "platform_tag": args.platform,
        "cxx11_abi": None if args.cxx11_abi is None else args.cxx11_abi == "1",
        "gpu_archs": None if args.gpu_arch is None else list(parse_gpu_archs(args.gpu_arch)),
    }


def default_sources() -> List[str]:
    """The indexes read when none is given: $MAMBA_KERNELS_INDEX, else the release index
    (mamba_kernels/facts/release_index.py)."""
    return list(release_index.default_indexes()[0])
