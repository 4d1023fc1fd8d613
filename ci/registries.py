"""Reading the package registries the preflight checks cells against: PyPI's JSON API (project
JSON per name) and PyTorch's index pages (the torch file names per CUDA variant), each fetched
once, concurrently, with retries; and which wheel tags pip accepts for a cell."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from ci import build_cell, platforms

REGISTRY_URL = "https://pypi.org/pypi"



class RegistryError(RuntimeError):
    """The registry could not be read (network, HTTP status, bad answer): one line."""


# A fetcher takes a project name and returns PyPI's project JSON ({"releases": {version:
# [file, ...]}, ...}), or None when the registry has no such project; it raises RegistryError
# when it cannot tell.
Fetcher = Callable[[str], Optional[dict]]


def read_url(url: str, parse: Callable[[bytes], object], timeout: float, tries: int) -> Optional[object]:
    """``parse`` of the body of ``url``, None on a 404; each of ``tries`` attempts a second apart,
    a network error, another HTTP status or a body ``parse`` refuses (ValueError) retried; then
    RegistryError naming the URL, the last cause and the count."""
    reason = ""
    for attempt in range(tries):
        if attempt:
            time.sleep(1.0)
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (https or test URL)
                data = r.read()
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            reason = f"HTTP {e.code}"
            continue
        except (urllib.error.URLError, OSError) as e:
            reason = str(getattr(e, "reason", e)) or type(e).__name__
            continue
        try:
            return parse(data)
        except ValueError as e:
            reason = str(e)
    raise RegistryError(f"could not read {url}: {reason} ({tries} tries)")


def _project_json(data: bytes) -> dict:
    try:
        doc = json.loads(data)
    except ValueError:
        raise ValueError("the answer is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("releases"), dict):
        raise ValueError("the answer has no releases")
    return doc


def http_fetcher(base_url: str = REGISTRY_URL, timeout: float = 15.0, tries: int = 2) -> Fetcher:
    """Reads ``<base_url>/<name>/json`` (PyPI's JSON API, one request per project), retrying once."""

    def fetch(name: str) -> Optional[dict]:
        return read_url(f"{base_url.rstrip('/')}/{name}/json", _project_json, timeout, tries)  # type: ignore

    return fetch


class Registry:
    """Project JSON per name, fetched once (concurrently by :meth:`prefetch`), kept in memory."""

    def __init__(self, fetch: Fetcher, workers: int = 16) -> None:
        self._fetch = fetch
        self._workers = workers
        self._docs: Dict[str, object] = {}  # name -> dict, None (no such project) or RegistryError
        self._lock = threading.Lock()
        self.requests = 0

    def _get(self, name: str) -> object:
        try:
            doc = self._fetch(name)
        except RegistryError as e:
            doc = e
        except Exception as e:  # a fetcher bug or an unexpected answer: still one line
            doc = RegistryError(f"{name}: {type(e).__name__}: {e}")
        with self._lock:
            self.requests += 1
            self._docs[name] = doc
        return doc

    def prefetch(self, names: Iterable[str]) -> None:
        todo = sorted({n for n in names if n not in self._docs})
        if todo:
            with ThreadPoolExecutor(max_workers=max(1, min(self._workers, len(todo)))) as ex:
                list(ex.map(self._get, todo))

    def doc(self, name: str) -> object:
        """What the fetcher answered for ``name`` (None: no such project or page). Raises
        RegistryError when it could not be read."""
        doc = self._docs[name] if name in self._docs else self._get(name)
        if isinstance(doc, RegistryError):
            raise doc
        return doc

    def releases(self, name: str) -> Optional[Dict[str, List[dict]]]:
        """version -> files of project ``name``; None when the registry has no such project.
        Raises RegistryError when the registry could not be read."""
        doc = self.doc(name)
        return None if doc is None else doc["releases"]  # type: ignore[index]

    def errors(self) -> List[str]:
        return sorted(str(d) for d in self._docs.values() if isinstance(d, RegistryError))


def supported_tags(python: str, platform: str, glibc: Optional[Tuple[int, int]]) -> Set[Tag]:
    """The wheel tags pip accepts for CPython ``python`` on ``platform`` (a Linux one with glibc
    ``glibc``, the manylinux image's)."""
    major, minor = (int(x) for x in python.split("."))
    plats = platforms.for_tag(platform).wheel_platforms(platform, glibc)
    py = (major, minor)
    interp = f"cp{major}{minor}"
    return set(cpython_tags(py, abis=[interp], platforms=plats)) | set(compatible_tags(py, interp, plats))


def wheel_fits(files: Sequence[dict], tags: Set[Tag]) -> bool:
    for f in files:
        name = f.get("filename", "")
        if f.get("yanked") or not name.endswith(".whl"):
            continue
        try:
            _, _, _, file_tags = parse_wheel_filename(name)
        except InvalidWheelFilename:
            continue
        if file_tags & tags:
            return True
    return False


# A fetcher of PyTorch's index: an index URL (https://download.pytorch.org/whl/cu128) -> the file
# names its torch page lists, None when it has no such page; RegistryError when it cannot tell.
IndexFetcher = Callable[[str], Optional[List[str]]]


def torch_index_fetcher(timeout: float = 15.0, tries: int = 2) -> IndexFetcher:
    """Reads ``<index URL>/torch/`` (a PEP 503 page, build_cell.simple_page_files), retrying once."""

    def fetch(index_url: str) -> Optional[List[str]]:
        page = lambda data: build_cell.simple_page_files(data.decode("utf-8", errors="replace"))  # noqa: E731
        return read_url(f"{index_url.rstrip('/')}/torch/", page, timeout, tries)  # type: ignore

    return fetch
