"""The pull requests torch-watch reads and opens, through GitHub's REST API with the retrying
client of ci/release_assets.py (GITHUB_API_URL, GH_TOKEN), so that the same step runs against
GitHub and against the rehearsal's local stand-in (the runner's gh CLI talks to github.com only).

  python -m ci.pulls list --repo OWNER/REPO
      every pull request, open, closed or merged, as gh pr list --state all --json
      number,state,headRefName,url prints them (state OPEN, CLOSED or MERGED)
  python -m ci.pulls open --repo OWNER/REPO --head BRANCH --title T --body-file F [--base B] [--draft]
      opens one and prints its URL

Errors are one ``::error title=pulls::`` line and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from ci import release_assets

PAGE = 100
MAX_PAGES = 50


def list_pulls(api: release_assets.Api, repo: str) -> List[Dict[str, Any]]:
    """Every pull request of ``repo`` in gh's JSON shape."""
    out: List[Dict[str, Any]] = []
    for page in range(1, MAX_PAGES + 1):
        batch = api("GET", f"/repos/{repo}/pulls?state=all&per_page={PAGE}&page={page}", None, None) or []
        for pr in batch:
            state = "MERGED" if pr.get("merged_at") else str(pr.get("state", "")).upper()
            out.append({"number": pr["number"], "state": state, "headRefName": pr["head"]["ref"],
                        "url": pr.get("html_url", "")})
        if len(batch) < PAGE:
            break
    return out


def open_pull(api: release_assets.Api, repo: str, head: str, title: str, body: str, base: Optional[str],
              draft: bool) -> str:
    if base is None:
        base = (api("GET", f"/repos/{repo}", None, None) or {}).get("default_branch") or "main"
    pr = api("POST", f"/repos/{repo}/pulls", {"head": head, "base": base, "title": title, "body": body,
                                              "draft": draft}, None)
    return str(pr.get("html_url") or pr.get("url"))


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ci.pulls", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("list")
    lp.add_argument("--repo", required=True)
    op = sub.add_parser("open")
    op.add_argument("--repo", required=True)
    op.add_argument("--head", required=True)
    op.add_argument("--title", required=True)
    op.add_argument("--body-file", required=True, type=Path)
    op.add_argument("--base")
    op.add_argument("--draft", action="store_true")
    args = p.parse_args(argv)
    token = os.environ.get("GH_TOKEN") or os.environ.get("GITHUB_TOKEN")
    if not token:
        print("::error title=pulls::no GH_TOKEN")
        return 1
    try:
        api = release_assets.http_api(token)
        if args.cmd == "list":
            print(json.dumps(list_pulls(api, args.repo)))
        else:
            print(open_pull(api, args.repo, args.head, args.title, args.body_file.read_text(), args.base,
                            args.draft))
    except release_assets.ReleaseError as e:
        print(f"::error title=pulls::{e}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
