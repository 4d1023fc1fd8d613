"""A local stand-in for the parts of GitHub's REST API that the release workflows use, so that a
release can be rehearsed (and ci/release_assets.py tested) over real HTTP on this machine.

  python -m ci.rehearsal.github_api --port 0 --state DIR [--faults FILE] [--token TOKEN]
  python -m ci.rehearsal.github_api seed --state DIR --repo O/R --tag T [--published] [--prerelease]
                                         [--asset FILE]... [--wrong FILE]... [--starter FILE]...
  python -m ci.rehearsal.github_api pages --state DIR --repo O/R {workflow,legacy,disabled}
  python -m ci.rehearsal.github_api deploy --state DIR --repo O/R SITE_DIR

Serving prints the base URL (``http://127.0.0.1:PORT``) as one line and serves until killed; in
a test, ``GitHubStandIn(state_dir).start()`` does the same in a thread (``.url``, ``.stop()``).
Point the tools at it with GITHUB_API_URL={url} and GITHUB_SERVER_URL={url}.

What it answers, for any OWNER/REPO (the base URL plays api.github.com, uploads.github.com and
github.com at once):

- ``GET /repos/O/R/releases?per_page=&page=`` (drafts included, newest first),
  ``POST /repos/O/R/releases`` (tag_name, name, body, draft, prerelease),
  ``GET|PATCH|DELETE /repos/O/R/releases/ID``, ``GET /repos/O/R/releases/tags/TAG`` (published
  releases only: a draft has no tag yet, 404 like GitHub), ``GET|DELETE
  /repos/O/R/releases/assets/ID``.
- A release's ``upload_url`` is ``{url}/uploads/repos/O/R/releases/ID/assets{?name,label}``;
  ``POST`` there with ``?name=`` stores the bytes and answers the asset: id, name, size, state
  ``uploaded``, digest ``sha256:<hex>``, browser_download_url. A name already on the release is
  refused (422 ``already_exists``), as GitHub does.
- Published releases are immutable: no new assets, no asset deleted, no edit (422).
- ``GET {url}/O/R/releases/download/TAG/NAME``: an asset of a published release (404
  otherwise), so ``${GITHUB_SERVER_URL}/O/R/releases/download/TAG/FILE`` works.
- ``GET /repos/O/R/pages``: ``{"html_url": "{url}/pages/O/R/", "build_type": "workflow"}``, or
  404 (Pages disabled) or build_type ``legacy``, as set by ``set_pages``; the deployed site is
  served under ``/pages/O/R/`` from ``DIR/pages/O/R/``, which ``deploy_site`` replaces at once.
- ``GET /repos/O/R/pulls?state=open|closed|all`` and ``POST /repos/O/R/pulls`` (title, head,
  base, body): the pull requests torch-watch opens, recorded with a number and URLs.
- The API paths (``/repos/``, ``/uploads/``) need an Authorization header (``Bearer T`` or
  ``token T``; any token, or exactly ``--token`` when given), else 401. Downloads and the Pages
  site are public.

State lives in DIR, so that a second server started on the same DIR (a re-run) sees the same
releases:

- ``DIR/state.json``: releases, pull requests and Pages settings per repository (written
  atomically after every change);
- ``DIR/assets/ID``: each asset's bytes;
- ``DIR/pages/O/R``: the deployed site (a link to the latest ``DIR/pages/O/.R.site-*`` folder);
- ``DIR/requests.log``: one line per request, ``METHOD PATH STATUS`` (the path with its query
  string; STATUS ``closed`` where the connection was dropped).

Faults, from ``--faults FILE`` (a JSON list) or ``set_faults``: each rule
``{"method": "POST", "path_contains": "/assets", "times": 2, "status": 403, "retry_after": 1,
"body": "You have exceeded a secondary rate limit", "headers": {...}}`` answers the next
``times`` (default 1) requests that match (method and path_contains are optional) with that
status, Retry-After, extra headers and message; ``{"close": true}`` drops the connection without
an answer instead. With ``"after": true`` the request is carried out first and only its answer
is replaced (GitHub took the upload, the client never heard). The first matching rule with
uses left applies. ``seed_release`` puts a release (a draft by default) with assets in a state
dir, right or wrong bytes, state ``uploaded`` or ``starter`` (an upload that stopped half-way).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.server
import json
import mimetypes
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

STATE_FILE = "state.json"
LOG_FILE = "requests.log"
DOCS = "https://docs.github.com/rest"

Response = Tuple[int, Dict[str, str], bytes]
SeedAsset = Union[Tuple[str, bytes], Tuple[str, bytes, str]]

_LOCKS: Dict[str, threading.RLock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock(state_dir: Path) -> threading.RLock:
    key = str(Path(state_dir).resolve())
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, threading.RLock())


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _split_repo(repo: str) -> Tuple[str, str]:
    owner, _, name = repo.partition("/")
    if not owner or not name or "/" in name or owner.startswith(".") or name.startswith("."):
        raise ValueError(f"not OWNER/REPO: {repo!r}")
    return owner, name


# ------------------------------------------------------------------ the state dir


def _empty() -> Dict[str, Any]:
    return {"next_id": 1, "repos": {}}


def load_state(state_dir: Union[str, Path]) -> Dict[str, Any]:
    """The stand-in's state as stored in ``state_dir`` (empty when there is none yet)."""
    path = Path(state_dir) / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else _empty()


def _save(state_dir: Path, state: Dict[str, Any]) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=".state-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
    os.replace(tmp, state_dir / STATE_FILE)


@contextlib.contextmanager
def _editing(state_dir: Union[str, Path]) -> Iterator[Dict[str, Any]]:
    """The state to change in place; saved when the block ends without an exception."""
    state_dir = Path(state_dir)
    with _lock(state_dir):
        state = load_state(state_dir)
        yield state
        _save(state_dir, state)


def _repo(state: Dict[str, Any], repo: str) -> Dict[str, Any]:
    r = state["repos"].setdefault(repo, {})
    r.setdefault("releases", [])
    r.setdefault("pulls", [])
    r.setdefault("pages", {"enabled": True, "build_type": "workflow"})
    return r


def _new_id(state: Dict[str, Any]) -> int:
    n = state["next_id"]
    state["next_id"] = n + 1
    return n


def _store_asset(state_dir: Path, state: Dict[str, Any], rel: Dict[str, Any], name: str, data: bytes,
                 asset_state: str = "uploaded", label: str = "",
                 content_type: str = "application/octet-stream") -> Dict[str, Any]:
    folder = state_dir / "assets"
    folder.mkdir(parents=True, exist_ok=True)
    asset_id = _new_id(state)
    part = folder / f".{asset_id}.part"
    part.write_bytes(data)
    os.replace(part, folder / str(asset_id))
    asset = {"id": asset_id, "name": name, "label": label, "size": len(data), "state": asset_state,
             "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "content_type": content_type,
             "download_count": 0, "created_at": _now(), "updated_at": _now()}
    rel["assets"].append(asset)
    return asset


def seed_release(state_dir: Union[str, Path], repo: str, tag: str, assets: Sequence[SeedAsset] = (), *,
                 draft: bool = True, prerelease: bool = False, body: str = "") -> Dict[str, Any]:
    """Put a release of ``tag`` (a draft unless ``draft=False``) into ``state_dir``, holding
    ``assets``: (name, bytes) or (name, bytes, state), state ``uploaded`` (the default) or
    ``starter`` (an upload that stopped half-way). Returns the stored release (no URLs)."""
    _split_repo(repo)
    state_dir = Path(state_dir)
    with _editing(state_dir) as state:
        rel = {"id": _new_id(state), "tag_name": tag, "name": tag, "body": body, "draft": draft,
               "prerelease": prerelease, "target_commitish": "main", "created_at": _now(),
               "published_at": None if draft else _now(), "assets": []}
        _repo(state, repo)["releases"].append(rel)
        for entry in assets:
            name, data = entry[0], entry[1]
            _store_asset(state_dir, state, rel, name, data, entry[2] if len(entry) > 2 else "uploaded")
        return json.loads(json.dumps(rel))


def set_pages(state_dir: Union[str, Path], repo: str, *, enabled: bool = True,
              build_type: str = "workflow") -> None:
    """Pages of ``repo``: disabled (GET /repos/O/R/pages answers 404), or built by ``build_type``."""
    _split_repo(repo)
    with _editing(state_dir) as state:
        _repo(state, repo)["pages"] = {"enabled": enabled, "build_type": build_type}


def deploy_site(state_dir: Union[str, Path], repo: str, site_dir: Union[str, Path]) -> Path:
    """Make ``site_dir``'s files the Pages site of ``repo``, all at once: they are copied to a new
    folder beside DIR/pages/O/R, and DIR/pages/O/R (a link) is renamed onto it, so a reader sees
    the old site or the new one, never a mix. Returns DIR/pages/O/R."""
    owner, name = _split_repo(repo)
    parent = Path(state_dir) / "pages" / owner
    parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}.site-"))
    shutil.copytree(site_dir, new, dirs_exist_ok=True)
    os.chmod(new, 0o755)
    target = parent / name
    with _lock(Path(state_dir)):
        old = Path(os.path.realpath(target)) if target.is_symlink() else None
        if target.exists() and not target.is_symlink():  # a folder written by hand: moved aside first
            aside = Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}.old-"))
            os.replace(target, aside / name)
            old = aside
        link = parent / f".{name}.link-{os.getpid()}-{threading.get_ident()}"
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(new.name, link)
        os.replace(link, target)
    if old is not None and old != new:
        shutil.rmtree(old, ignore_errors=True)
    return target


def read_requests(state_dir: Union[str, Path]) -> List[Tuple[str, str, str]]:
    """DIR/requests.log as (method, path, status) rows, oldest first."""
    path = Path(state_dir) / LOG_FILE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) == 3:
            rows.append((parts[0], parts[1], parts[2]))
    return rows


def load_faults(path: Union[str, Path]) -> List[Dict[str, Any]]:
    """The rules of a faults file (a JSON list of objects)."""
    rules = json.loads(Path(path).read_text())
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise ValueError(f"{path}: a faults file is a JSON list of objects")
    return rules


# ------------------------------------------------------------------ answers


def _json(status: int, data: Any, headers: Optional[Dict[str, str]] = None) -> Response:
    body = b"" if data is None else json.dumps(data).encode()
    h = {"Content-Type": "application/json; charset=utf-8"} if data is not None else {}
    h.update(headers or {})
    return status, h, body


def _error(status: int, message: str, errors: Optional[List[Dict[str, str]]] = None) -> Response:
    data: Dict[str, Any] = {"message": message, "documentation_url": DOCS, "status": str(status)}
    if errors:
        data["errors"] = errors
    return _json(status, data)


NOT_FOUND = ("Not Found",)
IMMUTABLE = "Cannot modify an immutable release: it is published"


class _Request:
    def __init__(self, method: str, raw_path: str, headers: Any, body: bytes):
        self.method, self.raw_path, self.headers, self.body = method, raw_path, headers, body
        parts = urllib.parse.urlsplit(raw_path)
        self.path = parts.path
        self.query = {k: v[-1] for k, v in urllib.parse.parse_qs(parts.query, keep_blank_values=True).items()}

    def json(self) -> Dict[str, Any]:
        if not self.body.strip():
            return {}
        data = json.loads(self.body)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return data


_ROUTES: List[Tuple[str, re.Pattern[str], str]] = [
    (m, re.compile(p), h) for m, p, h in [
        ("GET", r"/repos/([^/]+)/([^/]+)", "get_repo"),
        ("GET", r"/repos/([^/]+)/([^/]+)/releases", "list_releases"),
        ("POST", r"/repos/([^/]+)/([^/]+)/releases", "create_release"),
        ("GET", r"/repos/([^/]+)/([^/]+)/releases/tags/(.+)", "release_by_tag"),
        ("GET", r"/repos/([^/]+)/([^/]+)/releases/(\d+)", "get_release"),
        ("PATCH", r"/repos/([^/]+)/([^/]+)/releases/(\d+)", "update_release"),
        ("DELETE", r"/repos/([^/]+)/([^/]+)/releases/(\d+)", "delete_release"),
        ("GET", r"/repos/([^/]+)/([^/]+)/releases/assets/(\d+)", "get_asset"),
        ("DELETE", r"/repos/([^/]+)/([^/]+)/releases/assets/(\d+)", "delete_asset"),
        ("POST", r"/uploads/repos/([^/]+)/([^/]+)/releases/(\d+)/assets", "upload_asset"),
        ("GET", r"/repos/([^/]+)/([^/]+)/pages", "get_pages"),
        ("GET", r"/repos/([^/]+)/([^/]+)/pulls", "list_pulls"),
        ("POST", r"/repos/([^/]+)/([^/]+)/pulls", "create_pull"),
        ("GET", r"/([^/]+)/([^/]+)/releases/download/([^/]+)/([^/]+)", "download"),
        ("GET", r"/pages/([^/]+)/([^/]+)(/.*)?", "pages_file"),
    ]
]


class _Api:
    """The answers, computed from the state dir; ``url`` is the server's base URL."""

    def __init__(self, state_dir: Path, url: str):
        self.dir, self.url = state_dir, url

    # -- rendering
    def release_json(self, repo: str, rel: Dict[str, Any]) -> Dict[str, Any]:
        out = {k: v for k, v in rel.items() if k != "assets"}
        rid, tag = rel["id"], rel["tag_name"]
        out.update({
            "url": f"{self.url}/repos/{repo}/releases/{rid}",
            "assets_url": f"{self.url}/repos/{repo}/releases/{rid}/assets",
            "upload_url": f"{self.url}/uploads/repos/{repo}/releases/{rid}/assets{{?name,label}}",
            "html_url": (f"{self.url}/{repo}/releases/tag/{urllib.parse.quote(tag)}" if not rel["draft"]
                         else f"{self.url}/{repo}/releases/tag/untagged-{rid}"),
            "immutable": not rel["draft"],
            "assets": [self.asset_json(repo, rel, a) for a in rel["assets"]],
        })
        return out

    def asset_json(self, repo: str, rel: Dict[str, Any], asset: Dict[str, Any]) -> Dict[str, Any]:
        out = dict(asset)
        out["url"] = f"{self.url}/repos/{repo}/releases/assets/{asset['id']}"
        out["browser_download_url"] = (f"{self.url}/{repo}/releases/download/"
                                       f"{urllib.parse.quote(rel['tag_name'])}/{urllib.parse.quote(asset['name'])}")
        return out

    def pull_json(self, repo: str, pr: Dict[str, Any]) -> Dict[str, Any]:
        out = dict(pr)
        out["url"] = f"{self.url}/repos/{repo}/pulls/{pr['number']}"
        out["html_url"] = f"{self.url}/{repo}/pull/{pr['number']}"
        return out

    @staticmethod
    def find(state: Dict[str, Any], repo: str, rid: Union[int, str]) -> Optional[Dict[str, Any]]:
        return next((r for r in _repo(state, repo)["releases"] if r["id"] == int(rid)), None)

    # -- releases
    def list_releases(self, req: _Request, repo: str) -> Response:
        try:
            per_page = max(1, min(100, int(req.query.get("per_page", 30))))
            page = max(1, int(req.query.get("page", 1)))
        except ValueError:
            return _error(422, "Validation Failed: per_page and page are numbers")
        state = load_state(self.dir)
        rels = sorted(_repo(state, repo)["releases"], key=lambda r: -r["id"])
        batch = rels[(page - 1) * per_page:page * per_page]
        headers = {}
        if page * per_page < len(rels):
            nxt = f"{self.url}/repos/{repo}/releases?per_page={per_page}&page={page + 1}"
            headers["Link"] = f'<{nxt}>; rel="next"'
        return _json(200, [self.release_json(repo, r) for r in batch], headers)

    def create_release(self, req: _Request, repo: str) -> Response:
        data = req.json()
        tag = data.get("tag_name")
        if not isinstance(tag, str) or not tag:
            return _error(422, "Validation Failed", [{"resource": "Release", "field": "tag_name",
                                                      "code": "missing_field"}])
        draft = bool(data.get("draft", False))
        with _editing(self.dir) as state:
            rels = _repo(state, repo)["releases"]
            if not draft and any(r["tag_name"] == tag and not r["draft"] for r in rels):
                return _error(422, "Validation Failed", [{"resource": "Release", "field": "tag_name",
                                                          "code": "already_exists"}])
            rel = {"id": _new_id(state), "tag_name": tag, "name": data.get("name") or tag,
                   "body": data.get("body") or "", "draft": draft,
                   "prerelease": bool(data.get("prerelease", False)),
                   "target_commitish": data.get("target_commitish") or "main",
                   "make_latest": data.get("make_latest", "true"), "created_at": _now(),
                   "published_at": None if draft else _now(), "assets": []}
            rels.append(rel)
            return _json(201, self.release_json(repo, rel))

    def release_by_tag(self, req: _Request, repo: str, tag: str) -> Response:
        state = load_state(self.dir)
        rel = next((r for r in _repo(state, repo)["releases"] if r["tag_name"] == tag and not r["draft"]),
                   None)
        return _json(200, self.release_json(repo, rel)) if rel else _error(404, *NOT_FOUND)

    def get_release(self, req: _Request, repo: str, rid: str) -> Response:
        rel = self.find(load_state(self.dir), repo, rid)
        return _json(200, self.release_json(repo, rel)) if rel else _error(404, *NOT_FOUND)

    def update_release(self, req: _Request, repo: str, rid: str) -> Response:
        data = req.json()
        with _editing(self.dir) as state:
            rel = self.find(state, repo, rid)
            if rel is None:
                return _error(404, *NOT_FOUND)
            if not rel["draft"]:
                return _error(422, IMMUTABLE)
            for key in ("tag_name", "name", "body", "prerelease", "make_latest", "target_commitish"):
                if key in data:
                    rel[key] = data[key]
            if data.get("draft") is False:
                tag = rel["tag_name"]
                if any(r["tag_name"] == tag and not r["draft"] for r in _repo(state, repo)["releases"]):
                    return _error(422, "Validation Failed", [{"resource": "Release", "field": "tag_name",
                                                              "code": "already_exists"}])
                rel["draft"] = False
                rel["published_at"] = _now()
            return _json(200, self.release_json(repo, rel))

    def delete_release(self, req: _Request, repo: str, rid: str) -> Response:
        with _editing(self.dir) as state:
            rel = self.find(state, repo, rid)
            if rel is None:
                return _error(404, *NOT_FOUND)
            if not rel["draft"]:
                return _error(422, IMMUTABLE)
            _repo(state, repo)["releases"].remove(rel)
            for a in rel["assets"]:
                (self.dir / "assets" / str(a["id"])).unlink(missing_ok=True)
            return _json(204, None)

    def _asset(self, state: Dict[str, Any], repo: str,
               aid: str) -> Tuple[Optional[Dict[str, Any]], Optional[Dict[str, Any]]]:
        for rel in _repo(state, repo)["releases"]:
            for a in rel["assets"]:
                if a["id"] == int(aid):
                    return rel, a
        return None, None

    def get_asset(self, req: _Request, repo: str, aid: str) -> Response:
        rel, asset = self._asset(load_state(self.dir), repo, aid)
        return _json(200, self.asset_json(repo, rel, asset)) if rel and asset else _error(404, *NOT_FOUND)

    def delete_asset(self, req: _Request, repo: str, aid: str) -> Response:
        with _editing(self.dir) as state:
            rel, asset = self._asset(state, repo, aid)
            if rel is None or asset is None:
                return _error(404, *NOT_FOUND)
            if not rel["draft"]:
                return _error(422, IMMUTABLE)
            rel["assets"].remove(asset)
            (self.dir / "assets" / str(asset["id"])).unlink(missing_ok=True)
            return _json(204, None)

    def upload_asset(self, req: _Request, repo: str, rid: str) -> Response:
        name = req.query.get("name", "")
        if not name:
            return _error(422, "Validation Failed", [{"resource": "ReleaseAsset", "field": "name",
                                                      "code": "missing"}])
        with _editing(self.dir) as state:
            rel = self.find(state, repo, rid)
            if rel is None:
                return _error(404, *NOT_FOUND)
            if not rel["draft"]:
                return _error(422, IMMUTABLE)
            if any(a["name"] == name for a in rel["assets"]):
                return _error(422, "Validation Failed", [{"resource": "ReleaseAsset", "field": "name",
                                                          "code": "already_exists"}])
            ctype = req.headers.get("Content-Type") or "application/octet-stream"
            asset = _store_asset(self.dir, state, rel, name, req.body, "uploaded",
                                 req.query.get("label", ""), ctype)
            return _json(201, self.asset_json(repo, rel, asset))

    def download(self, req: _Request, owner: str, name: str, tag: str, file: str) -> Response:
        repo = f"{owner}/{name}"
        state = load_state(self.dir)
        if repo not in state["repos"]:
            return 404, {"Content-Type": "text/plain"}, b"Not Found"
        for rel in _repo(state, repo)["releases"]:
            if rel["tag_name"] == tag and not rel["draft"]:
                for a in rel["assets"]:
                    if a["name"] == file and a["state"] == "uploaded":
                        data = (self.dir / "assets" / str(a["id"])).read_bytes()
                        return 200, {"Content-Type": "application/octet-stream"}, data
        return 404, {"Content-Type": "text/plain"}, b"Not Found"

    # -- pages
    def get_pages(self, req: _Request, repo: str) -> Response:
        pages = _repo(load_state(self.dir), repo)["pages"]
        if not pages.get("enabled", True):
            return _error(404, *NOT_FOUND)
        build_type = pages.get("build_type", "workflow")
        data = {"url": f"{self.url}/repos/{repo}/pages", "status": "built", "cname": None,
                "html_url": f"{self.url}/pages/{repo}/", "build_type": build_type, "public": True,
                "https_enforced": True}
        if build_type == "legacy":
            data["source"] = {"branch": "gh-pages", "path": "/"}
        return _json(200, data)

    def pages_file(self, req: _Request, owner: str, name: str, rest: Optional[str]) -> Response:
        root = self.dir / "pages" / owner / name
        not_found = (404, {"Content-Type": "text/html"}, b"<h1>404</h1>")
        if not rest:
            return 301, {"Location": f"{self.url}/pages/{owner}/{name}/"}, b""
        if not root.is_dir():
            return not_found
        real_root = Path(os.path.realpath(root))
        target = Path(os.path.realpath(real_root / rest.lstrip("/")))
        if target != real_root and real_root not in target.parents:
            return not_found
        if target.is_dir():
            if not rest.endswith("/"):
                return 301, {"Location": f"{self.url}/pages/{owner}/{name}{rest}/"}, b""
            target = target / "index.html"
        if not target.is_file():
            return not_found
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        return 200, {"Content-Type": ctype, "Cache-Control": "max-age=600"}, target.read_bytes()

    # -- pull requests
    def get_repo(self, req: _Request, repo: str) -> Response:
        return _json(200, {"full_name": repo, "name": repo.split("/")[1], "default_branch": "main",
                           "html_url": f"{self.url}/{repo}", "clone_url": f"{self.url}/{repo}.git"})

    def list_pulls(self, req: _Request, repo: str) -> Response:
        want = req.query.get("state", "open")
        try:
            per_page = max(1, min(100, int(req.query.get("per_page", 30))))
            page = max(1, int(req.query.get("page", 1)))
        except ValueError:
            return _error(422, "Validation Failed: per_page and page are numbers")
        pulls = sorted(_repo(load_state(self.dir), repo)["pulls"], key=lambda p: -p["number"])
        pulls = [p for p in pulls if want == "all" or p["state"] == want]
        return _json(200, [self.pull_json(repo, p) for p in pulls[(page - 1) * per_page:page * per_page]])

    def create_pull(self, req: _Request, repo: str) -> Response:
        data = req.json()
        missing = [k for k in ("title", "head", "base") if not isinstance(data.get(k), str) or not data[k]]
        if missing:
            return _error(422, "Validation Failed", [{"resource": "PullRequest", "field": k,
                                                      "code": "missing_field"} for k in missing])
        with _editing(self.dir) as state:
            r = _repo(state, repo)
            if any(p["head"]["ref"] == data["head"] and p["state"] == "open" for p in r["pulls"]):
                return _error(422, "Validation Failed", [{
                    "resource": "PullRequest", "code": "custom",
                    "message": f"A pull request already exists for {repo.split('/')[0]}:{data['head']}."}])
            pr = {"id": _new_id(state), "number": len(r["pulls"]) + 1, "state": "open",
                  "title": data["title"], "body": data.get("body") or "", "draft": bool(data.get("draft")),
                  "head": {"ref": data["head"], "label": f"{repo.split('/')[0]}:{data['head']}"},
                  "base": {"ref": data["base"]}, "created_at": _now()}
            r["pulls"].append(pr)
            return _json(201, self.pull_json(repo, pr))


# ------------------------------------------------------------------ git over HTTP

# {url}/O/R.git/...: git's smart HTTP protocol on a bare repository DIR/git/O/R.git (init_git),
# through git's own CGI program, so that `git push https://x-access-token:T@github.com/O/R.git`
# has its stand-in in `git push {url}/O/R.git` (the token asked for and checked as GitHub does).
GIT_PATH = re.compile(r"/([^/]+)/([^/]+)\.git(/.*)")


def init_git(state_dir: Union[str, Path], repo: str, source: Union[str, Path]) -> Path:
    """DIR/git/O/R.git: a bare clone of ``source`` that accepts pushes over HTTP."""
    owner, name = _split_repo(repo)
    bare = Path(state_dir) / "git" / owner / f"{name}.git"
    shutil.rmtree(bare, ignore_errors=True)
    bare.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "clone", "--quiet", "--bare", str(source), str(bare)], check=True,
                   capture_output=True)
    subprocess.run(["git", "-C", str(bare), "config", "http.receivepack", "true"], check=True)
    subprocess.run(["git", "-C", str(bare), "config", "uploadpack.allowAnySHA1InWant", "true"], check=True)
    return bare


def _git_http(state_dir: Path, req: _Request, owner: str, name: str, rest: str) -> Response:
    query = req.raw_path.partition("?")[2]
    pushing = rest.endswith("git-receive-pack") or "service=git-receive-pack" in query
    auth = req.headers.get("Authorization") or ""
    if pushing and not auth.lower().startswith("basic "):
        return 401, {"WWW-Authenticate": 'Basic realm="GitHub"', "Content-Type": "text/plain"}, b"auth\n"
    if not (state_dir / "git" / owner / f"{name}.git").is_dir():
        return _error(404, "Repository not found")
    env = dict(os.environ, GIT_PROJECT_ROOT=str(state_dir / "git"), GIT_HTTP_EXPORT_ALL="1",
               PATH_INFO=f"/{owner}/{name}.git{rest}", QUERY_STRING=query, REQUEST_METHOD=req.method,
               CONTENT_TYPE=req.headers.get("Content-Type") or "", CONTENT_LENGTH=str(len(req.body)),
               REMOTE_USER="x-access-token", REMOTE_ADDR="127.0.0.1")
    out = subprocess.run(["git", "http-backend"], input=req.body, env=env, capture_output=True)
    head, _, body = out.stdout.partition(b"\r\n\r\n")
    status, headers = 200, {}
    for line in head.decode("latin-1").split("\r\n"):
        key, _, value = line.partition(":")
        if key.lower() == "status":
            status = int(value.split()[0])
        elif key:
            headers[key.strip()] = value.strip()
    return status, headers, body


# ------------------------------------------------------------------ the server


def _authorized(headers: Any, token: Optional[str]) -> bool:
    value = (headers.get("Authorization") or "").strip()
    scheme, _, given = value.partition(" ")
    if scheme.lower() not in ("bearer", "token") or not given.strip():
        return False
    return token is None or given.strip() == token


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "GitHubStandIn/1"

    def log_message(self, *args: Any) -> None:
        pass

    def _serve(self, method: str) -> None:
        standin = self.server.standin  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        req = _Request(method, self.path, self.headers, body)
        fault = standin._take_fault(method, req.raw_path)
        if fault is not None and not fault.get("after"):
            self._fault(req, fault)
            return
        try:
            answer = self._answer(req, standin)
        except (ValueError, KeyError, TypeError) as e:
            answer = _error(400, f"Problems parsing JSON: {e}")
        if fault is not None:
            self._fault(req, fault)
            return
        self._send(req, answer)

    def _answer(self, req: _Request, standin: GitHubStandIn) -> Response:
        git = GIT_PATH.fullmatch(req.path)
        if git:
            return _git_http(standin.state_dir, req, *git.groups())
        verb = "GET" if req.method == "HEAD" else req.method
        api = _Api(standin.state_dir, standin.url)
        path_matched = False
        for method, pattern, handler in _ROUTES:
            m = pattern.fullmatch(req.path)
            if m is None:
                continue
            path_matched = True
            if method != verb:
                continue
            if req.path.startswith(("/repos/", "/uploads/")) and not _authorized(req.headers, standin.token):
                return _error(401, "Requires authentication")
            args = [urllib.parse.unquote(g) if g is not None else None for g in m.groups()]
            if req.path.startswith(("/repos/", "/uploads/")):
                args = [f"{args[0]}/{args[1]}", *args[2:]]
            return getattr(api, handler)(req, *args)
        if path_matched:
            return _error(404 if req.path.startswith("/pages/") else 405, "Not Found")
        return _error(404, *NOT_FOUND)

    def _fault(self, req: _Request, fault: Dict[str, Any]) -> None:
        if fault.get("close"):
            self.server.standin._log(req.method, req.raw_path, "closed")  # type: ignore[attr-defined]
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        status = int(fault.get("status", 500))
        headers = {str(k): str(v) for k, v in (fault.get("headers") or {}).items()}
        if fault.get("retry_after") is not None:
            headers["Retry-After"] = str(fault["retry_after"])
        message = fault.get("body") or http.server.BaseHTTPRequestHandler.responses.get(status, ("Error",))[0]
        s, h, b = _error(status, message)
        h.update(headers)
        self._send(req, (s, h, b))

    def _send(self, req: _Request, answer: Response) -> None:
        status, headers, body = answer
        self.server.standin._log(req.method, req.raw_path, str(status))  # type: ignore[attr-defined]
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if req.method != "HEAD" and body:
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        self._serve("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def do_PATCH(self) -> None:  # noqa: N802
        self._serve("PATCH")

    def do_PUT(self) -> None:  # noqa: N802
        self._serve("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve("DELETE")


class GitHubStandIn:
    """The stand-in server on 127.0.0.1 (``port`` 0: any free port), in a background thread.

    ``faults``: rules as in the module's doc; ``token``: the one token accepted (any, if None).
    """

    def __init__(self, state_dir: Union[str, Path], port: int = 0,
                 faults: Optional[Sequence[Dict[str, Any]]] = None, token: Optional[str] = None):
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.port, self.token = port, token
        self._faults: List[Dict[str, Any]] = []
        self._fault_lock = threading.Lock()
        self._server: Optional[http.server.ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self.set_faults(faults or [])

    # -- faults
    def set_faults(self, rules: Sequence[Dict[str, Any]]) -> None:
        """Replace the fault rules (each applies to its next ``times`` matching requests)."""
        with self._fault_lock:
            self._faults = [dict(r, times=int(r.get("times", 1))) for r in rules]

    def add_fault(self, **rule: Any) -> None:
        with self._fault_lock:
            self._faults.append(dict(rule, times=int(rule.get("times", 1))))

    def faults_left(self) -> List[Dict[str, Any]]:
        with self._fault_lock:
            return [dict(r) for r in self._faults if r["times"] > 0]

    def _take_fault(self, method: str, path: str) -> Optional[Dict[str, Any]]:
        with self._fault_lock:
            for rule in self._faults:
                if rule["times"] <= 0:
                    continue
                if rule.get("method") and rule["method"].upper() != method:
                    continue
                if rule.get("path_contains") and rule["path_contains"] not in path:
                    continue
                rule["times"] -= 1
                return dict(rule)
        return None

    # -- the log
    def _log(self, method: str, path: str, status: str) -> None:
        with _lock(self.state_dir), open(self.state_dir / LOG_FILE, "a") as f:
            f.write(f"{method} {path.replace(' ', '%20')} {status}\n")

    def requests(self) -> List[Tuple[str, str, str]]:
        return read_requests(self.state_dir)

    # -- the state, for tests
    def seed_release(self, repo: str, tag: str, assets: Sequence[SeedAsset] = (),
                     **kw: Any) -> Dict[str, Any]:
        return seed_release(self.state_dir, repo, tag, assets, **kw)

    def set_pages(self, repo: str, **kw: Any) -> None:
        set_pages(self.state_dir, repo, **kw)

    def deploy_site(self, repo: str, site_dir: Union[str, Path]) -> Path:
        return deploy_site(self.state_dir, repo, site_dir)

    def state(self) -> Dict[str, Any]:
        return load_state(self.state_dir)

    # -- running
    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the stand-in is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _bind(self) -> http.server.ThreadingHTTPServer:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), _Handler)
        server.daemon_threads = True
        server.standin = self  # type: ignore[attr-defined]
        self._server = server
        return server

    def start(self) -> GitHubStandIn:
        """Serve in a background thread; returns self (``.url`` then says where)."""
        server = self._bind()
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="github-standin", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread (the command line), printing the URL first, until interrupted."""
        server = self._bind()
        print(self.url, flush=True)
        try:
            server.serve_forever()
        finally:
            server.server_close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread = None

    def __enter__(self) -> GitHubStandIn:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ------------------------------------------------------------------ the command line


def _serve_main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m ci.rehearsal.github_api",
                                description="Serve the GitHub API stand-in on 127.0.0.1 until killed.")
    p.add_argument("--port", type=int, default=0, help="0: any free port (the URL printed says which)")
    p.add_argument("--state", type=Path, required=True, help="the state folder (kept between servers)")
    p.add_argument("--faults", type=Path, help="a JSON list of fault rules (see the module's doc)")
    p.add_argument("--token", help="accept only this token (default: any)")
    args = p.parse_args(argv)
    standin = GitHubStandIn(args.state, args.port, load_faults(args.faults) if args.faults else None,
                            args.token)
    with contextlib.suppress(KeyboardInterrupt):
        standin.serve_forever()
    return 0


def _seed_main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m ci.rehearsal.github_api seed",
                                description="Put a release (a draft unless --published) into a state folder.")
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--published", action="store_true")
    p.add_argument("--prerelease", action="store_true")
    p.add_argument("--asset", type=Path, action="append", default=[], help="an asset with FILE's bytes")
    p.add_argument("--wrong", type=Path, action="append", default=[],
                   help="an asset named like FILE with other bytes")
    p.add_argument("--starter", type=Path, action="append", default=[],
                   help="an asset of FILE's bytes in state 'starter' (an upload stopped half-way)")
    args = p.parse_args(argv)
    assets: List[SeedAsset] = [(f.name, f.read_bytes()) for f in args.asset]
    assets += [(f.name, f.read_bytes() + b"\0not this run's\0") for f in args.wrong]
    assets += [(f.name, f.read_bytes(), "starter") for f in args.starter]
    rel = seed_release(args.state, args.repo, args.tag, assets, draft=not args.published,
                       prerelease=args.prerelease)
    print(json.dumps({"id": rel["id"], "tag_name": rel["tag_name"], "draft": rel["draft"],
                      "assets": [a["name"] for a in rel["assets"]]}))
    return 0


def _pages_main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m ci.rehearsal.github_api pages",
                                description="Set how a repository's Pages are configured.")
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("mode", choices=("workflow", "legacy", "disabled"))
    args = p.parse_args(argv)
    set_pages(args.state, args.repo, enabled=args.mode != "disabled",
              build_type="legacy" if args.mode == "legacy" else "workflow")
    return 0


def _deploy_main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m ci.rehearsal.github_api deploy",
                                description="Make a folder the deployed Pages site of a repository.")
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("site", type=Path)
    args = p.parse_args(argv)
    print(deploy_site(args.state, args.repo, args.site))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"seed": _seed_main, "pages": _pages_main, "deploy": _deploy_main}
    if argv[:1] and argv[0] in commands:
        return commands[argv[0]](argv[1:])
    return _serve_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
