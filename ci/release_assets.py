"""Attach a run's wheels to the GitHub Release of its tag, the way immutable releases allow:
every asset goes to a draft, and the draft is published last.

  python -m ci.release_assets --repo OWNER/REPO --tag vX.Y.Z --prerelease true|false WHEEL...

- No release for the tag yet: a draft is created (marked a pre-release for a pre-release
  version), the wheels are uploaded to it, then it is published; a pre-release is never marked
  the latest release.
- A draft already there (a re-run after a failure): its assets of the same names are replaced,
  the missing ones uploaded, then it is published.
- A published release is final (with immutable releases GitHub refuses any change, and the
  index already points at its assets by sha256): a re-run passes when each wheel is already
  attached with the same sha256, and fails naming the first wheel that is not. New wheels for a
  published version need a new tag.

Talks to GitHub's REST API with $GH_TOKEN (the job's token, contents: write). A draft has no tag
ref until it is published, so it is found in the list of releases, not by its tag.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from mamba_kernels.install.wheel_metadata import sha256_of

API = "https://api.github.com"

# (method, url, JSON body or None, file to upload or None) -> decoded JSON answer (None if empty)
Api = Callable[[str, str, Optional[Dict[str, Any]], Optional[Path]], Any]


class ReleaseError(RuntimeError):
    """The release cannot take these wheels; the message is one line."""


def http_api(token: str) -> Api:
    def call(method: str, url: str, body: Optional[Dict[str, Any]] = None,
             upload: Optional[Path] = None) -> Any:
        if not url.startswith("https://"):
            url = API + url
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
                   "X-GitHub-Api-Version": "2022-11-28"}
        data = None
        if upload is not None:
            data = upload.read_bytes()
            headers["Content-Type"] = "application/octet-stream"
        elif body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=600) as r:  # noqa: S310 (GitHub's https API)
                text = r.read()
        except urllib.error.HTTPError as e:
            answer = e.read()[:300].decode(errors="replace")
            raise ReleaseError(f"{method} {url}: HTTP {e.code}: {answer}") from None
        return json.loads(text) if text.strip() else None

    return call


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


def attach(api: Api, repo: str, tag: str, wheels: Sequence[Path], prerelease: bool, notes: str) -> str:
    """Put ``wheels`` on the release of ``tag`` and publish it; returns what was done."""
    names = [w.name for w in wheels]
    if len(set(names)) != len(names):
        raise ReleaseError("two wheels share a file name")
    rel = find_release(api, repo, tag)
    if rel is not None and not rel.get("draft"):
        have = {a["name"]: a for a in rel.get("assets", [])}
        for w in wheels:
            asset = have.get(w.name)
            if asset is None:
                raise ReleaseError(f"release {tag} is published and final; {w.name} is not on it: a new "
                                   "wheel needs a new tag (docs/RELEASING.md)")
            if asset.get("digest") != f"sha256:{sha256_of(w)}":
                raise ReleaseError(f"release {tag} is published and final; its {w.name} is not this "
                                   f"run's (asset digest {asset.get('digest')!r})")
        return f"release {tag} already published with these {len(wheels)} wheels"
    if rel is None:
        rel = api("POST", f"/repos/{repo}/releases", {
            "tag_name": tag, "name": tag, "body": notes, "draft": True, "prerelease": prerelease}, None)
    have = {a["name"]: a for a in rel.get("assets", [])}
    upload = rel["upload_url"].split("{", 1)[0]
    for w in wheels:
        if w.name in have:  # a draft's asset: replaceable
            api("DELETE", f"/repos/{repo}/releases/assets/{have[w.name]['id']}", None, None)
        api("POST", f"{upload}?name={urllib.parse.quote(w.name)}", None, w)
    api("PATCH", f"/repos/{repo}/releases/{rel['id']}", {
        "draft": False, "prerelease": prerelease, "make_latest": "false" if prerelease else "true"}, None)
    kind = "pre-release" if prerelease else "release"
    return f"published {kind} {tag} with {len(wheels)} wheels"


def main(argv: Optional[List[str]] = None, api: Optional[Api] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ci.release_assets", description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--prerelease", choices=("true", "false"), required=True)
    p.add_argument("--notes", default="")
    p.add_argument("wheels", nargs="+", type=Path)
    args = p.parse_args(argv)
    if api is None:
        token = os.environ.get("GH_TOKEN") or os.environ.get("GITHUB_TOKEN")
        if not token:
            print("::error title=publish::no GH_TOKEN", file=sys.stdout)
            return 1
        api = http_api(token)
    try:
        print(attach(api, args.repo, args.tag, args.wheels, args.prerelease == "true", args.notes))
    except ReleaseError as e:
        print(f"::error title=publish::{e}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
