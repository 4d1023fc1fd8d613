"""Attach a run's wheels to the GitHub Release of its tag, the way immutable releases allow:
every asset goes to a draft, and the draft is published last.

  python -m ci.release_assets --repo OWNER/REPO --tag vX.Y.Z --prerelease true|false [--notes TEXT] WHEEL...
  python -m ci.release_assets pages --repo OWNER/REPO

The release:

- No release for the tag yet: a draft is created (marked a pre-release for a pre-release
  version), the wheels are uploaded to it, then it is published; a pre-release is never marked
  the latest release.
- A draft already there (a re-run after a failure) is resumed. An asset of a wheel's name is
  kept when its ``digest`` is ``sha256:`` of the wheel and its ``state`` is ``uploaded``; any
  other asset of that name (other bytes, or an upload that stopped half-way, which GitHub lists
  in state ``starter``) is deleted and uploaded again; a wheel with no asset is uploaded. Assets
  of other names are left as they are.
- Before publishing, the release is read again: every wheel must be on it, uploaded, with its
  sha256. Only then is the draft published (PATCH ``draft: false``).
- A published release is final (with immutable releases GitHub refuses any change, and the
  index already points at its assets by sha256): a re-run passes when each wheel is already
  attached with the same sha256, and fails naming the first wheel that is not. New wheels for a
  published version need a new tag.
- The last line says what was done: how many assets were uploaded, kept and replaced.

``pages`` prints the repository's Pages settings as one JSON object
``{"html_url": ..., "build_type": ...}``, or one ``::error title=pages::`` line (exit 1) when
Pages is not enabled (404) or not built by GitHub Actions (``build_type`` other than
``workflow``). The workflow asks this module rather than ``gh``, which cannot be pointed at the
local stand-in of the release rehearsal (ci/rehearsal/github_api.py).

Talking to GitHub:

- The token is $GH_TOKEN, else $GITHUB_TOKEN (the job's token, contents: write). The API is
  $GITHUB_API_URL when set (runners, and the ``act`` engine, set it), else
  https://api.github.com. Assets go to the release's ``upload_url`` (uploads.github.com, the
  template ending ``{?name,label}``). Only https URLs are used, except http://127.0.0.1 and
  http://localhost (the stand-in); the token is never sent anywhere else.
- A draft has no tag ref until it is published, so it is found in the list of releases, not by
  its tag.
- GitHub's secondary rate limits allow roughly 80 content-creating requests a minute and 500 an
  hour. Requests that create or change something (POST, PATCH, PUT, DELETE) are therefore paced
  here: at most ``per_minute`` (60 by default) in any minute and ``per_hour`` (450) in any hour.
- Every request is retried, a bounded number of times (``max_attempts``, 8) within a bounded
  total wait (``max_total_wait`` seconds, 900), when GitHub answers with a secondary rate limit
  (403 or 429; a 403 counts as one only with a Retry-After or x-ratelimit-* header saying so, or
  a body mentioning a rate limit), with 500, 502, 503 or 504, or when the connection fails
  (refused, reset, closed without an answer, timed out). The wait: a Retry-After header's
  seconds when there is one; else, when x-ratelimit-remaining is 0, until x-ratelimit-reset
  (epoch seconds); else, for a rate limit, a minute doubling with each retry, and for a server
  or connection error a few seconds doubling with each retry. Each wait is one log line on
  stderr (which request, why, how long). Any other error (a 403 that is no rate limit, 401, 404,
  422) is not retried. When the retries run out, one line names the method, the URL, the last
  status or cause and the number of attempts.
"""

from __future__ import annotations

import argparse
import email.utils
import http.client
import json
import os
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mamba_kernels.install.wheel_metadata import sha256_of

API = "https://api.github.com"
LOCAL_HOSTS = ("127.0.0.1", "localhost")
CREATING = ("POST", "PATCH", "PUT", "DELETE")  # content-creating requests, as GitHub counts them
RETRY_STATUSES = (500, 502, 503, 504)

# (method, url, JSON body or None, file to upload or None) -> decoded JSON answer (None if empty)
Api = Callable[[str, str, Optional[Dict[str, Any]], Optional[Path]], Any]


class ReleaseError(RuntimeError):
    """The release cannot take these wheels; the message is one line."""


class ApiError(ReleaseError):
    """GitHub answered a request with an error that is not retried (or no more)."""

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        self.status = status


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


def _cause(answer: str) -> str:
    """An error answer in one line: GitHub's JSON ``message`` (and ``errors``), else the text."""
    try:
        data = json.loads(answer)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        errors = data.get("errors")
        return _one_line(data["message"] + (f" {json.dumps(errors)}" if errors else ""))
    return _one_line(answer)


def check_url(url: str) -> str:
    """``url`` if requests may go there (https, or http to this machine), else ReleaseError."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and parts.hostname in LOCAL_HOSTS:
        return url
    raise ReleaseError(f"refusing {url!r}: only https URLs, or http://127.0.0.1 and http://localhost "
                       "(the local stand-in), are used")


def api_base(environ: Optional[Dict[str, str]] = None) -> str:
    """$GITHUB_API_URL when set, else https://api.github.com; without a trailing slash."""
    env = os.environ if environ is None else environ
    return check_url((env.get("GITHUB_API_URL") or API).rstrip("/"))


class Pacer:
    """At most ``n`` requests in any ``window`` seconds, for each (window, n) of ``limits``."""

    def __init__(self, limits: Sequence[Tuple[float, int]], clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, log: Optional[Callable[[str], None]] = None):
        self.limits = [(float(w), int(n)) for w, n in limits if n and n > 0]
        self.clock, self.sleep, self.log = clock, sleep, log
        self.sent: List[float] = []  # when each paced request went out, oldest first

    def wait(self, what: str) -> float:
        """Sleep until one more request fits every limit, record it; returns the time slept."""
        slept = 0.0
        while True:
            now = self.clock()
            longest = max((w for w, _ in self.limits), default=0.0)
            self.sent = [t for t in self.sent if t > now - longest]
            delay, why = 0.0, ""
            for window, n in self.limits:
                recent = [t for t in self.sent if t > now - window]
                if len(recent) >= n and recent[-n] + window - now > delay:
                    delay = recent[-n] + window - now
                    why = f"{n} content-creating requests per {_span(window)}"
            if delay <= 0:
                self.sent.append(now)
                return slept
            if self.log:
                self.log(f"waiting {delay:.1f} s before {what}: pacing at {why}")
            self.sleep(delay)
            slept += delay


def _span(seconds: float) -> str:
    return {60.0: "minute", 3600.0: "hour"}.get(seconds, f"{seconds:g} s")


def _stderr(line: str) -> None:
    print(f"release_assets: {line}", file=sys.stderr, flush=True)


def _header(headers: Any, name: str) -> Optional[str]:
    value = headers.get(name) if headers is not None else None
    return value.strip() if isinstance(value, str) else None


def _retry_after(value: Optional[str], now: float) -> Optional[float]:
    """Retry-After as seconds: a number, or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError, IndexError):
        return None


def _retriable_os_error(err: BaseException) -> bool:
    """A failure of the connection (refused, reset, closed without an answer, timed out)."""
    if isinstance(err, urllib.error.URLError):
        if not isinstance(err.reason, BaseException):
            return False  # a bad URL, not the network
        err = err.reason
    if isinstance(err, ssl.CertificateError):
        return False
    if isinstance(err, socket.gaierror):  # a name that does not resolve is final; a busy resolver is not
        return err.errno == socket.EAI_AGAIN
    return isinstance(err, (ConnectionError, TimeoutError, socket.timeout, http.client.HTTPException))


class GitHubClient:
    """GitHub's REST API with retries and pacing; an ``Api`` (call it like a function).

    ``url`` is a path under the API base (``/repos/...``) or an absolute URL (an upload URL).
    ``sleep``, ``clock`` (monotonic, for pacing) and ``wall_clock`` (epoch seconds, for
    x-ratelimit-reset) can be replaced, so that tests wait for nothing.
    """

    def __init__(self, token: str, api_url: Optional[str] = None, *, max_attempts: int = 8,
                 max_total_wait: float = 900.0, base_delay: float = 2.0, rate_limit_delay: float = 60.0,
                 per_minute: int = 60, per_hour: int = 450, timeout: float = 300.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, log: Callable[[str], None] = _stderr):
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.token = token
        self.base = check_url((api_url or api_base()).rstrip("/"))
        self.max_attempts, self.max_total_wait = max_attempts, max_total_wait
        self.base_delay, self.rate_limit_delay = base_delay, rate_limit_delay
        self.timeout, self.sleep, self.wall_clock, self.log = timeout, sleep, wall_clock, log
        self.pacer = Pacer([(60.0, per_minute), (3600.0, per_hour)], clock, sleep, log)

    def url(self, url: str) -> str:
        return check_url(self.base + url if url.startswith("/") else url)

    def _request(self, method: str, url: str, body: Optional[Dict[str, Any]],
                 upload: Optional[Path]) -> urllib.request.Request:
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/vnd.github+json",
                   "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "mamba-kernels-release-assets"}
        data = None
        if upload is not None:
            data = upload.read_bytes()
            headers["Content-Type"] = "application/octet-stream"
        elif body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        elif method in CREATING:
            data = b""
        return urllib.request.Request(url, data=data, method=method, headers=headers)

    def _wait_for(self, status: Optional[int], headers: Any, text: str,
                  retries: Dict[str, int]) -> Optional[Tuple[float, str]]:
        """(seconds, why) to wait before trying again, or None when this answer is final."""
        now = self.wall_clock()
        after = _retry_after(_header(headers, "Retry-After"), now)
        remaining = _header(headers, "x-ratelimit-remaining")
        reset = _header(headers, "x-ratelimit-reset")
        if status in (403, 429):
            limited = (status == 429 or after is not None or remaining == "0"
                       or "rate limit" in text.lower())
            if not limited:
                return None
            kind = "rate limit" if remaining == "0" else "secondary rate limit"
            if after is not None:
                return after, f"HTTP {status} {kind}, Retry-After: {_header(headers, 'Retry-After')}"
            if remaining == "0" and reset:
                try:
                    return max(0.0, float(reset) - now), f"HTTP {status} {kind}, x-ratelimit-reset: {reset}"
                except ValueError:
                    pass
            retries["limit"] += 1
            return (self.rate_limit_delay * 2 ** (retries["limit"] - 1),
                    f"HTTP {status} {kind}, backing off")
        if status in RETRY_STATUSES or status is None:
            retries["error"] += 1
            return self.base_delay * 2 ** (retries["error"] - 1), (
                f"HTTP {status}" if status is not None else text)
        return None

    def __call__(self, method: str, url: str, body: Optional[Dict[str, Any]] = None,
                 upload: Optional[Path] = None) -> Any:
        url = self.url(url)
        waited, retries = 0.0, {"limit": 0, "error": 0}
        for attempt in range(1, self.max_attempts + 1):
            if method in CREATING:
                self.pacer.wait(f"{method} {url}")
            req = self._request(method, url, body, upload)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:  # noqa: S310 (checked)
                    text = r.read()
                status, headers, cause = r.status, r.headers, ""
            except urllib.error.HTTPError as e:
                try:
                    answer = e.read().decode(errors="replace")
                except (OSError, http.client.HTTPException):
                    answer = ""
                status, headers, cause = e.code, e.headers, _cause(answer)
            except (OSError, http.client.HTTPException) as e:
                if not _retriable_os_error(e):
                    raise ApiError(f"{method} {url}: {_one_line(str(e)) or type(e).__name__}") from None
                reason = e.reason if isinstance(e, urllib.error.URLError) else e
                status, headers = None, None
                cause = f"connection error: {type(reason).__name__}: {_one_line(str(reason))}".rstrip(": ")
            else:
                if not text.strip():
                    return None
                try:
                    return json.loads(text)
                except ValueError:
                    raise ApiError(f"{method} {url}: HTTP {status}: not JSON: "
                                   f"{_one_line(text.decode(errors='replace'), 100)}", status) from None
            last = f"HTTP {status}: {cause}" if status is not None else cause
            wait = self._wait_for(status, headers, cause, retries)
            if wait is None:
                raise ApiError(f"{method} {url}: {last}".rstrip(": "), status)
            delay, why = wait
            if attempt == self.max_attempts:
                break
            if waited + delay > self.max_total_wait:
                raise ApiError(f"{method} {url}: gave up after {attempt} attempts (last: {last}); waiting "
                               f"{delay:.1f} s more would pass the {self.max_total_wait:g} s retry budget",
                               status)
            self.log(f"waiting {delay:.1f} s before attempt {attempt + 1} of {self.max_attempts} of "
                     f"{method} {url}: {why}")
            self.sleep(delay)
            waited += delay
        raise ApiError(f"{method} {url}: gave up after {self.max_attempts} attempts (last: {last})", status)


def http_api(token: str, api_url: Optional[str] = None, **options: Any) -> GitHubClient:
    """The retrying, paced client (options: GitHubClient's keyword arguments)."""
    return GitHubClient(token, api_url, **options)


def find_release(api: Api, repo: str, tag: str) -> Optional[Dict[str, Any]]:
    """The release (draft or published) whose tag name is ``tag``, or None."""
    page = 1
    while True:
        batch = api("GET", f"/repos/{repo}/releases?per_page=100&page={page}", None, None) or []
        for rel in batch:
            if rel.get("tag_name") == tag:
                return rel
        if len(batch) < 100:
            return None
        page += 1


@dataclass
class Outcome:
    """What attach did: asset counts, and whether this run published the release."""

    tag: str
    wheels: int
    uploaded: int = 0
    kept: int = 0
    replaced: int = 0
    published: bool = False
    message: str = ""

    def counts(self) -> str:
        return f"{self.uploaded} uploaded, {self.kept} kept, {self.replaced} replaced"


def _digest(path: Path) -> str:
    return f"sha256:{sha256_of(path)}"


def _is_current(asset: Dict[str, Any], digest: str) -> bool:
    return asset.get("digest") == digest and asset.get("state") == "uploaded"


def _upload(api: Api, repo: str, rel: Dict[str, Any], upload: str, wheel: Path, digest: str) -> None:
    url = f"{upload}?name={urllib.parse.quote(wheel.name)}"
    try:
        api("POST", url, None, wheel)
        return
    except ApiError as e:
        if e.status != 422:
            raise
    # already there: an attempt that GitHub took although its answer was lost, or a half-done one
    fresh = api("GET", f"/repos/{repo}/releases/{rel['id']}", None, None) or {}
    asset = next((a for a in fresh.get("assets", []) if a.get("name") == wheel.name), None)
    if asset is not None and _is_current(asset, digest):
        return
    if asset is not None:
        api("DELETE", f"/repos/{repo}/releases/assets/{asset['id']}", None, None)
    api("POST", url, None, wheel)


def _check_published(rel: Dict[str, Any], tag: str, wheels: Sequence[Path]) -> None:
    have = {a["name"]: a for a in rel.get("assets", [])}
    for w in wheels:
        asset = have.get(w.name)
        if asset is None:
            raise ReleaseError(f"release {tag} is published and final; {w.name} is not on it: a new "
                               "wheel needs a new tag (docs/RELEASING.md)")
        if asset.get("digest") != _digest(w):
            raise ReleaseError(f"release {tag} is published and final; its {w.name} is not this "
                               f"run's (asset digest {asset.get('digest')!r})")


def _check_draft(rel: Dict[str, Any], tag: str, digests: Dict[str, str]) -> None:
    have = {a["name"]: a for a in rel.get("assets", [])}
    for name, digest in digests.items():
        asset = have.get(name)
        if asset is None:
            problem = "is missing"
        elif asset.get("state") != "uploaded":
            problem = f"is in state {asset.get('state')!r}"
        elif asset.get("digest") != digest:
            problem = f"has digest {asset.get('digest')!r}, not {digest}"
        else:
            continue
        raise ReleaseError(f"after the uploads, the draft of {tag}'s {name} {problem}; not published "
                           "(a re-run resumes the draft)")


def publish(api: Api, repo: str, tag: str, wheels: Sequence[Path], prerelease: bool, notes: str) -> Outcome:
    """Put ``wheels`` on the release of ``tag`` and publish it (the rules of the module's doc)."""
    names = [w.name for w in wheels]
    if len(set(names)) != len(names):
        raise ReleaseError("two wheels share a file name")
    out = Outcome(tag, len(wheels))
    rel = find_release(api, repo, tag)
    if rel is not None and not rel.get("draft"):
        _check_published(rel, tag, wheels)
        out.kept = len(wheels)
        out.message = f"release {tag} already published with these {len(wheels)} wheels ({out.counts()})"
        return out
    if rel is None:
        rel = api("POST", f"/repos/{repo}/releases", {
            "tag_name": tag, "name": tag, "body": notes, "draft": True, "prerelease": prerelease}, None)
    have = {a["name"]: a for a in rel.get("assets", [])}
    upload = check_url(rel["upload_url"].split("{", 1)[0])
    digests = {}
    for w in wheels:
        digest = digests[w.name] = _digest(w)
        asset = have.get(w.name)
        if asset is not None and _is_current(asset, digest):
            out.kept += 1
            continue
        if asset is not None:  # other bytes, or an upload that stopped half-way: replaced
            api("DELETE", f"/repos/{repo}/releases/assets/{asset['id']}", None, None)
            out.replaced += 1
        else:
            out.uploaded += 1
        _upload(api, repo, rel, upload, w, digest)
    _check_draft(api("GET", f"/repos/{repo}/releases/{rel['id']}", None, None) or {}, tag, digests)
    done = api("PATCH", f"/repos/{repo}/releases/{rel['id']}", {
        "draft": False, "prerelease": prerelease, "make_latest": "false" if prerelease else "true"}, None)
    if isinstance(done, dict) and done.get("draft"):
        raise ReleaseError(f"GitHub left release {tag} a draft after publishing it")
    out.published = True
    kind = "pre-release" if prerelease else "release"
    out.message = f"published {kind} {tag} with {len(wheels)} wheels ({out.counts()})"
    return out


def attach(api: Api, repo: str, tag: str, wheels: Sequence[Path], prerelease: bool, notes: str) -> str:
    """Put ``wheels`` on the release of ``tag`` and publish it; returns the summary line."""
    return publish(api, repo, tag, wheels, prerelease, notes).message


PAGES_SOURCE = "Settings > Pages > Source: GitHub Actions (docs/RELEASING.md)"
PAGES_DISABLED = f"GitHub Pages is not enabled: {PAGES_SOURCE}"
PAGES_LEGACY = f"Pages must be built by GitHub Actions: {PAGES_SOURCE}"


def pages_site(api: Api, repo: str) -> Dict[str, Any]:
    """The repository's Pages settings, {"html_url", "build_type"}; ReleaseError unless built by Actions."""
    try:
        pages = api("GET", f"/repos/{repo}/pages", None, None)
    except ApiError as e:
        if e.status == 404:
            raise ReleaseError(PAGES_DISABLED) from None
        raise ReleaseError(f"could not read the Pages settings: {e}") from None
    if not isinstance(pages, dict) or pages.get("build_type") != "workflow":
        raise ReleaseError(PAGES_LEGACY)
    return {"html_url": pages.get("html_url"), "build_type": pages.get("build_type")}


def _client(api: Optional[Api]) -> Api:
    if api is not None:
        return api
    token = os.environ.get("GH_TOKEN") or os.environ.get("GITHUB_TOKEN")
    if not token:
        raise ReleaseError("no GH_TOKEN or GITHUB_TOKEN")
    return GitHubClient(token)


def _pages_main(argv: List[str], api: Optional[Api]) -> int:
    p = argparse.ArgumentParser(prog="python -m ci.release_assets pages",
                                description="Print the repository's Pages settings as JSON.")
    p.add_argument("--repo", required=True)
    args = p.parse_args(argv)
    try:
        print(json.dumps(pages_site(_client(api), args.repo)))
    except ReleaseError as e:
        print(f"::error title=pages::{e}")
        return 1
    return 0


def main(argv: Optional[List[str]] = None, api: Optional[Api] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["pages"]:
        return _pages_main(argv[1:], api)
    p = argparse.ArgumentParser(prog="python -m ci.release_assets", description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--prerelease", choices=("true", "false"), required=True)
    p.add_argument("--notes", default="")
    p.add_argument("wheels", nargs="+", type=Path)
    args = p.parse_args(argv)
    try:
        print(attach(_client(api), args.repo, args.tag, args.wheels, args.prerelease == "true",
                     args.notes))
    except ReleaseError as e:
        print(f"::error title=publish::{e}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
