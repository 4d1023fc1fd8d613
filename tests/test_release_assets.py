"""ci/release_assets.py against the GitHub API stand-in (ci/rehearsal/github_api.py) over real
HTTP on 127.0.0.1: the uploads, the retries and their waits, the pacing, a draft resumed, the
published release left alone, the Pages settings; and the stand-in's own behaviour.

Nothing waits for real: the client gets a sleep that records the waits (and a fake clock where
the pacing is checked), and the stand-in's faults say how each request goes wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import List

import pytest

from ci import release_assets
from ci.rehearsal import github_api
from ci.rehearsal.github_api import GitHubStandIn

ROOT = Path(__file__).resolve().parent.parent
REPO = "owner/repo"
SECONDARY = "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."


def _wheel(folder: Path, label: str, data: bytes = b"") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"mamba_kernels-0.1.0+{label}-cp312-cp312-manylinux_2_28_x86_64.whl"
    path.write_bytes(data or f"wheel {label}\n".encode() * 50)
    return path


def _wheels(tmp_path: Path, n: int = 3) -> List[Path]:
    return [_wheel(tmp_path / "wheels", f"cu130torch2.{10 + i}") for i in range(n)]


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def gh(tmp_path):
    with GitHubStandIn(tmp_path / "gh") as standin:
        yield standin


class Waits:
    """A sleep that records instead of sleeping, and the log lines."""

    def __init__(self):
        self.slept: List[float] = []
        self.lines: List[str] = []

    def sleep(self, s: float) -> None:
        self.slept.append(s)


def _client(gh, waits=None, **kw):
    waits = waits or Waits()
    options = {"base_delay": 0.5, "rate_limit_delay": 60.0, "per_minute": 1000, "per_hour": 10000,
               "timeout": 5.0, "sleep": waits.sleep, "log": waits.lines.append}
    options.update(kw)
    return release_assets.GitHubClient("test-token", gh.url, **options)


def _release(gh, tag="v0.2.0"):
    (rel,) = [r for r in gh.state()["repos"][REPO]["releases"] if r["tag_name"] == tag]
    return rel


def _log(gh, method=None, contains=""):
    return [r for r in gh.requests() if (method is None or r[0] == method) and contains in r[1]]


def _uploads(gh, name=""):
    return _log(gh, "POST", "/assets?name=" + name.replace("+", "%2B"))


def _download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read()


# ------------------------------------------------------------------ a release from nothing


@pytest.mark.parametrize("pre", [False, True])
def test_a_fresh_release_gets_every_wheel_then_is_published(tmp_path, gh, pre):
    wheels = _wheels(tmp_path)
    tag = "v0.2.0rc1" if pre else "v0.2.0"
    msg = release_assets.attach(_client(gh), REPO, tag, wheels, pre, "the notes")
    assert msg == f"published {'pre-release' if pre else 'release'} {tag} with 3 wheels " \
                  "(3 uploaded, 0 kept, 0 replaced)"
    assert [(m, s) for m, _, s in gh.requests()] == [
        ("GET", "200"), ("POST", "201"), ("POST", "201"), ("POST", "201"), ("POST", "201"),
        ("GET", "200"), ("PATCH", "200")]
    rel = _release(gh, tag)
    assert rel["draft"] is False and rel["prerelease"] is pre and rel["body"] == "the notes"
    assert rel["make_latest"] == ("false" if pre else "true")
    # published: found by its tag now, and every asset downloads with the wheel's bytes
    with urllib.request.urlopen(urllib.request.Request(
            f"{gh.url}/repos/{REPO}/releases/tags/{tag}", headers={"Authorization": "Bearer t"})) as r:
        assets = json.loads(r.read())["assets"]
    assert sorted(a["name"] for a in assets) == sorted(w.name for w in wheels)
    for a in assets:
        data = _download(a["browser_download_url"])
        assert _sha(data) == a["digest"] == _sha((tmp_path / "wheels" / a["name"]).read_bytes())
        assert a["state"] == "uploaded" and a["size"] == len(data)
    # GITHUB_SERVER_URL/{repo}/releases/download/{tag}/{file}, the form the workflows use
    assert _download(f"{gh.url}/{REPO}/releases/download/{tag}/{wheels[0].name}") == wheels[0].read_bytes()


def test_the_command_line_reads_github_api_url_and_the_token(tmp_path, gh):
    wheels = _wheels(tmp_path, 2)
    env = dict(os.environ, GITHUB_API_URL=gh.url + "/", GITHUB_TOKEN="t")
    env.pop("GH_TOKEN", None)
    r = subprocess.run([sys.executable, "-m", "ci.release_assets", "--repo", REPO, "--tag", "v0.2.0",
                        "--prerelease", "false", "--notes", "n", *map(str, wheels)],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == "published release v0.2.0 with 2 wheels (2 uploaded, 0 kept, 0 replaced)\n"
    assert _release(gh)["draft"] is False
    env.pop("GITHUB_TOKEN")
    r = subprocess.run([sys.executable, "-m", "ci.release_assets", "pages", "--repo", REPO],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (1, "::error title=pages::no GH_TOKEN or GITHUB_TOKEN")


@pytest.mark.parametrize("url, ok", [
    ("https://api.github.com", True), ("https://ghe.example/api/v3", True), ("http://127.0.0.1:8080", True),
    ("http://localhost:1/api", True), ("http://api.github.com", False), ("http://10.0.0.1", False),
    ("ftp://127.0.0.1", False), ("file:///etc/passwd", False), ("api.github.com", False)])
def test_only_https_or_this_machine(url, ok):
    if ok:
        assert release_assets.check_url(url) == url
    else:
        with pytest.raises(release_assets.ReleaseError, match="only https URLs"):
            release_assets.check_url(url)


def test_the_api_base_comes_from_the_environment():
    assert release_assets.api_base({}) == "https://api.github.com"
    assert release_assets.api_base({"GITHUB_API_URL": "http://127.0.0.1:9/"}) == "http://127.0.0.1:9"
    with pytest.raises(release_assets.ReleaseError):
        release_assets.api_base({"GITHUB_API_URL": "http://example.com"})


def test_an_upload_url_elsewhere_is_refused(tmp_path, gh):
    client = _client(gh)
    with pytest.raises(release_assets.ReleaseError, match="only https"):
        client("POST", "http://uploads.example/repos/o/r/releases/1/assets?name=x", None, None)
    assert gh.requests() == []


# ------------------------------------------------------------------ retries


def test_a_secondary_rate_limit_waits_its_retry_after(tmp_path, gh):
    wheels = _wheels(tmp_path)
    gh.set_faults([{"method": "POST", "path_contains": "/assets", "times": 2, "status": 403,
                    "retry_after": 7, "body": SECONDARY}])
    waits = Waits()
    msg = release_assets.attach(_client(gh, waits), REPO, "v0.2.0", wheels, False, "")
    assert "3 uploaded" in msg
    assert waits.slept == [7.0, 7.0]  # Retry-After, not the one-minute backoff
    assert [s for _, _, s in _uploads(gh, wheels[0].name)] == ["403", "403", "201"]
    assert len(waits.lines) == 2 and all("\n" not in line for line in waits.lines)
    line = waits.lines[0]
    assert line.startswith("waiting 7.0 s before attempt 2 of 8 of POST http://127.0.0.1:")
    assert "secondary rate limit, Retry-After: 7" in line
    assert _release(gh)["draft"] is False


def test_a_429_without_retry_after_backs_off_from_a_minute(tmp_path, gh):
    gh.set_faults([{"method": "POST", "path_contains": "/releases", "times": 3, "status": 429}])
    waits = Waits()
    release_assets.attach(_client(gh, waits), REPO, "v0.2.0", _wheels(tmp_path, 1), False, "")
    assert waits.slept == [60.0, 120.0, 240.0]
    assert "HTTP 429 secondary rate limit, backing off" in waits.lines[0]


def test_a_403_whose_body_names_a_rate_limit_is_retried(tmp_path, gh):
    gh.set_faults([{"method": "PATCH", "status": 403, "body": SECONDARY}])
    waits = Waits()
    release_assets.attach(_client(gh, waits), REPO, "v0.2.0", _wheels(tmp_path, 1), False, "")
    assert waits.slept == [60.0] and _release(gh)["draft"] is False


def test_an_exhausted_primary_limit_waits_until_its_reset(tmp_path, gh):
    now = 1_800_000_000.0
    gh.set_faults([{"method": "GET", "status": 403, "body": "API rate limit exceeded",
                    "headers": {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(now) + 42)}}])
    waits = Waits()
    release_assets.attach(_client(gh, waits, wall_clock=lambda: now), REPO, "v0.2.0",
                          _wheels(tmp_path, 1), False, "")
    assert waits.slept == [42.0]
    assert "x-ratelimit-reset" in waits.lines[0]


def test_server_errors_back_off_and_succeed(tmp_path, gh):
    gh.set_faults([{"method": "POST", "path_contains": "/assets", "times": 2, "status": 502}])
    waits = Waits()
    release_assets.attach(_client(gh, waits), REPO, "v0.2.0", _wheels(tmp_path, 2), False, "")
    assert waits.slept == [0.5, 1.0]
    assert [s for _, _, s in _uploads(gh)] == ["502", "502", "201", "201"]
    assert "HTTP 502" in waits.lines[0]


@pytest.mark.parametrize("status", [500, 503, 504])
def test_other_server_errors_are_retried(tmp_path, gh, status):
    gh.set_faults([{"method": "GET", "status": status}])
    waits = Waits()
    release_assets.attach(_client(gh, waits), REPO, "v0.2.0", _wheels(tmp_path, 1), False, "")
    assert waits.slept == [0.5]


def test_a_dropped_connection_is_retried(tmp_path, gh):
    wheels = _wheels(tmp_path, 2)
    gh.set_faults([{"method": "POST", "path_contains": "/assets", "close": True}])
    waits = Waits()
    release_assets.attach(_client(gh, waits), REPO, "v0.2.0", wheels, False, "")
    assert waits.slept == [0.5] and "connection error" in waits.lines[0]
    assert [s for _, _, s in _uploads(gh, wheels[0].name)] == ["closed", "201"]
    assert len(_release(gh)["assets"]) == 2


def test_an_upload_taken_whose_answer_was_lost_is_not_uploaded_twice(tmp_path, gh):
    wheels = _wheels(tmp_path, 2)
    gh.set_faults([{"method": "POST", "path_contains": "/assets", "close": True, "after": True}])
    msg = release_assets.attach(_client(gh), REPO, "v0.2.0", wheels, False, "")
    assert "published release" in msg
    # the retry meets the asset already there (422), reads the release and finds it complete
    assert [s for _, _, s in _uploads(gh, wheels[0].name)] == ["closed", "422"]
    assets = _release(gh)["assets"]
    assert sorted(a["name"] for a in assets) == sorted(w.name for w in wheels)


def test_a_refused_connection_is_retried_then_reported(tmp_path, capsys):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    waits = Waits()
    client = release_assets.GitHubClient("t", f"http://127.0.0.1:{port}", max_attempts=3, base_delay=0.5,
                                         sleep=waits.sleep, log=waits.lines.append)
    argv = ["--repo", REPO, "--tag", "v0.2.0", "--prerelease", "false", str(_wheels(tmp_path, 1)[0])]
    assert release_assets.main(argv, api=client) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("::error title=publish::GET http://127.0.0.1:")
    assert "gave up after 3 attempts (last: connection error: ConnectionRefusedError" in out[0]
    assert waits.slept == [0.5, 1.0]


def test_retries_run_out_in_one_line_and_exit_1(tmp_path, gh, capsys):
    gh.set_faults([{"method": "POST", "path_contains": "/assets", "times": 99, "status": 503,
                    "body": "upstream\nbusy"}])
    waits = Waits()
    argv = ["--repo", REPO, "--tag", "v0.2.0", "--prerelease", "false", *map(str, _wheels(tmp_path, 2))]
    assert release_assets.main(argv, api=_client(gh, waits, max_attempts=4)) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("::error title=publish::POST http://127.0.0.1:")
    assert "/assets?name=mamba_kernels-0.1.0%2Bcu130torch2.10" in line
    assert line.endswith("gave up after 4 attempts (last: HTTP 503: upstream busy)")
    assert waits.slept == [0.5, 1.0, 2.0] and len(_uploads(gh)) == 4
    assert _release(gh)["draft"] is True  # never published


def test_a_wait_past_the_retry_budget_is_not_waited(tmp_path, gh):
    gh.set_faults([{"method": "GET", "status": 429, "retry_after": 3600}])
    waits = Waits()
    budget = r"gave up after 1 attempts \(last: HTTP 429: .*\); waiting 3600.0 s more would pass the 900 s"
    with pytest.raises(release_assets.ApiError, match=budget):
        release_assets.attach(_client(gh, waits), REPO, "v0.2.0", _wheels(tmp_path, 1), False, "")
    assert waits.slept == [] and len(gh.requests()) == 1


def test_a_403_that_is_no_rate_limit_is_not_retried(tmp_path, gh, capsys):
    gh.set_faults([{"method": "POST", "status": 403, "body": "Resource not accessible by integration"}])
    waits = Waits()
    argv = ["--repo", REPO, "--tag", "v0.2.0", "--prerelease", "false", str(_wheels(tmp_path, 1)[0])]
    assert release_assets.main(argv, api=_client(gh, waits)) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line == f"::error title=publish::POST {gh.url}/repos/{REPO}/releases: HTTP 403: " \
                   "Resource not accessible by integration"
    assert waits.slept == [] and [r[0] for r in gh.requests()] == ["GET", "POST"]


def test_a_missing_token_is_a_401_not_retried(gh):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{gh.url}/repos/{REPO}/releases", timeout=5)
    assert e.value.code == 401
    waits = Waits()
    client = _client(gh, waits)
    client.token = ""
    with pytest.raises(release_assets.ApiError, match="HTTP 401: .*Requires authentication"):
        client("GET", f"/repos/{REPO}/releases", None, None)
    assert waits.slept == []


# ------------------------------------------------------------------ pacing


class FakeClock:
    def __init__(self):
        self.now = 1000.0
        self.slept: List[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_uploads_are_paced_per_minute(tmp_path, gh):
    clock = FakeClock()
    lines: List[str] = []
    client = _client(gh, per_minute=2, clock=clock, sleep=clock.sleep, log=lines.append)
    release_assets.attach(client, REPO, "v0.2.0", _wheels(tmp_path, 3), False, "")
    # content-creating: POST release, 3 uploads, PATCH = 5, two a minute; the GETs are not paced
    assert clock.slept == [60.0, 60.0]
    assert all("pacing at 2 content-creating requests per minute" in line for line in lines)
    assert len(lines) == 2 and _release(gh)["draft"] is False


def test_the_pacer_keeps_every_window():
    clock = FakeClock()
    pacer = release_assets.Pacer([(60.0, 3), (3600.0, 5)], clock, clock.sleep)
    sent = []
    for _ in range(11):
        pacer.wait("x")
        sent.append(clock.now)
        clock.now += 1.0  # each request takes a second
    for window, n in ((60.0, 3), (3600.0, 5)):
        assert all(sum(1 for t in sent if s <= t < s + window) <= n for s in sent)
    assert sent[:4] == [1000.0, 1001.0, 1002.0, 1060.0]
    assert sent[5] == 3600.0 + 1000.0  # the sixth waits for the hour of the first


def test_a_pacer_of_zero_does_not_pace():
    clock = FakeClock()
    pacer = release_assets.Pacer([(60.0, 0)], clock, clock.sleep)
    for _ in range(100):
        pacer.wait("x")
    assert clock.slept == []


# ------------------------------------------------------------------ re-runs


def test_a_half_done_draft_is_resumed(tmp_path, gh):
    right, wrong, starter, missing = wheels = _wheels(tmp_path, 4)
    gh.seed_release(REPO, "v0.2.0", [
        (right.name, right.read_bytes()),
        (wrong.name, b"an older build of it"),
        (starter.name, starter.read_bytes(), "starter"),  # its bytes were right; the upload never ended
        ("notes.txt", b"left as it is"),
    ])
    msg = release_assets.attach(_client(gh), REPO, "v0.2.0", wheels, False, "")
    assert msg == "published release v0.2.0 with 4 wheels (1 uploaded, 1 kept, 2 replaced)"
    assert _uploads(gh, right.name) == []  # kept: never uploaded again
    for w in (wrong, starter, missing):
        assert [s for _, _, s in _uploads(gh, w.name)] == ["201"]
    assert [s for _, _, s in _log(gh, "DELETE")] == ["204", "204"]
    rel = _release(gh)
    assert rel["draft"] is False
    assert sorted(a["name"] for a in rel["assets"]) == sorted([w.name for w in wheels] + ["notes.txt"])
    for w in wheels:
        assert _download(f"{gh.url}/{REPO}/releases/download/v0.2.0/{w.name}") == w.read_bytes()


def test_a_rerun_of_a_published_release_passes_and_changes_nothing(tmp_path, gh):
    wheels = _wheels(tmp_path)
    release_assets.attach(_client(gh), REPO, "v0.2.0", wheels, False, "")
    n = len(gh.requests())
    # a second server on the same state folder: how a re-run of the workflow meets the release
    with GitHubStandIn(gh.state_dir) as again:
        msg = release_assets.attach(_client(again), REPO, "v0.2.0", wheels, False, "")
        assert msg == "release v0.2.0 already published with these 3 wheels (0 uploaded, 3 kept, 0 replaced)"
        assert [r[0] for r in again.requests()[n:]] == ["GET"]


def test_a_published_release_is_never_changed(tmp_path, gh, capsys):
    wheels = _wheels(tmp_path)
    release_assets.attach(_client(gh), REPO, "v0.2.0", wheels[:2], False, "")
    n = len(gh.requests())
    argv = ["--repo", REPO, "--tag", "v0.2.0", "--prerelease", "false"]
    assert release_assets.main([*argv, *map(str, wheels)], api=_client(gh)) == 1
    assert capsys.readouterr().out == (
        f"::error title=publish::release v0.2.0 is published and final; {wheels[2].name} is not on it: "
        "a new wheel needs a new tag (docs/RELEASING.md)\n")
    wheels[1].write_bytes(wheels[1].read_bytes() + b"\0")  # rebuilt: same name, other bytes
    assert release_assets.main([*argv, *map(str, wheels[:2])], api=_client(gh)) == 1
    out = capsys.readouterr().out
    assert out.startswith("::error title=publish::release v0.2.0 is published and final; "
                          f"its {wheels[1].name} is not this run's (asset digest 'sha256:")
    assert [r[0] for r in gh.requests()[n:]] == ["GET", "GET"]


def test_a_draft_left_incomplete_is_not_published(tmp_path, gh, monkeypatch):
    """The check before publishing: an asset that did not end up right stops the run."""
    wheels = _wheels(tmp_path, 2)
    real = release_assets._upload

    def half(api, repo, rel, upload, wheel, digest):  # the server takes an upload that then stays broken
        real(api, repo, rel, upload, wheel, digest)
        with github_api._editing(gh.state_dir) as state:
            for r in state["repos"][REPO]["releases"]:
                for a in r["assets"]:
                    if a["name"] == wheels[1].name:
                        a["state"] = "starter"

    monkeypatch.setattr(release_assets, "_upload", half)
    stopped = re.escape(f"the draft of v0.2.0's {wheels[1].name} is in state 'starter'; not published")
    with pytest.raises(release_assets.ReleaseError, match=stopped):
        release_assets.attach(_client(gh), REPO, "v0.2.0", wheels, False, "")
    assert _release(gh)["draft"] is True and _log(gh, "PATCH") == []
    monkeypatch.undo()
    msg = release_assets.attach(_client(gh), REPO, "v0.2.0", wheels, False, "")  # the re-run
    assert msg.endswith("(0 uploaded, 1 kept, 1 replaced)")


def test_two_wheels_of_one_name_are_refused(tmp_path, gh):
    w = _wheels(tmp_path, 1)[0]
    with pytest.raises(release_assets.ReleaseError, match="two wheels share a file name"):
        release_assets.attach(_client(gh), REPO, "v0.2.0", [w, w], False, "")


def test_a_draft_is_found_past_the_first_page(tmp_path, gh):
    draft = gh.seed_release(REPO, "v0.2.0", [])
    with github_api._editing(gh.state_dir) as state:  # 100 newer releases push it to the second page
        rels = state["repos"][REPO]["releases"]
        rels += [dict(draft, id=draft["id"] + i, tag_name=f"v0.1.{i}", draft=False) for i in range(1, 101)]
        state["next_id"] = draft["id"] + 101
    release_assets.attach(_client(gh), REPO, "v0.2.0", _wheels(tmp_path, 1), False, "")
    assert [p for _, p, _ in _log(gh, "GET", "per_page")][-1].endswith("page=2")
    assert ("POST", f"/repos/{REPO}/releases") not in [r[:2] for r in gh.requests()]  # no second draft
    assert _release(gh)["draft"] is False


# ------------------------------------------------------------------ pages


@pytest.mark.parametrize("mode, code, out", [
    ("workflow", 0, None),
    ("disabled", 1, "::error title=pages::GitHub Pages is not enabled: Settings > Pages > Source: "
                    "GitHub Actions (docs/RELEASING.md)"),
    ("legacy", 1, "::error title=pages::Pages must be built by GitHub Actions: Settings > Pages > Source: "
                  "GitHub Actions (docs/RELEASING.md)"),
])
def test_pages_settings(gh, capsys, mode, code, out):
    gh.set_pages(REPO, enabled=mode != "disabled", build_type=mode if mode != "disabled" else "workflow")
    assert release_assets.main(["pages", "--repo", REPO], api=_client(gh)) == code
    printed = capsys.readouterr().out
    if out is None:
        assert json.loads(printed) == {"html_url": f"{gh.url}/pages/{REPO}/", "build_type": "workflow"}
        assert printed.count("\n") == 1
    else:
        assert printed == out + "\n"


def test_pages_settings_are_read_with_retries(gh, capsys):
    gh.set_faults([{"path_contains": "/pages", "status": 502}])
    waits = Waits()
    assert release_assets.main(["pages", "--repo", REPO], api=_client(gh, waits)) == 0
    assert waits.slept == [0.5]
    gh.set_faults([{"path_contains": "/pages", "status": 403, "body": "Forbidden"}])
    assert release_assets.main(["pages", "--repo", REPO], api=_client(gh)) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith(
        "::error title=pages::could not read the Pages settings: GET ")


def test_the_deployed_site_is_served_and_replaced_at_once(tmp_path, gh):
    site = tmp_path / "site"
    (site / "pre").mkdir(parents=True)
    (site / "manifest.json").write_text('{"wheels": []}')
    (site / "pre" / "index.html").write_text("pre")
    with pytest.raises(urllib.error.HTTPError) as e:
        _download(f"{gh.url}/pages/{REPO}/manifest.json")
    assert e.value.code == 404
    gh.deploy_site(REPO, site)
    assert _download(f"{gh.url}/pages/{REPO}/manifest.json?nonce=1") == b'{"wheels": []}'
    assert _download(f"{gh.url}/pages/{REPO}/pre/") == b"pre"
    assert _download(f"{gh.url}/pages/{REPO}/pre") == b"pre"  # redirected to pre/
    (site / "manifest.json").write_text('{"wheels": [1]}')
    (site / "pre" / "index.html").unlink()
    github_api.deploy_site(gh.state_dir, REPO, site)
    assert _download(f"{gh.url}/pages/{REPO}/manifest.json") == b'{"wheels": [1]}'
    with pytest.raises(urllib.error.HTTPError):
        _download(f"{gh.url}/pages/{REPO}/pre/")
    with pytest.raises(urllib.error.HTTPError):
        _download(f"{gh.url}/pages/{REPO}/..%2F..%2Fstate.json")
    folders = sorted(p.name for p in (gh.state_dir / "pages" / "owner").iterdir())
    assert len(folders) == 2 and folders[1] == "repo"  # the old copy is gone


# ------------------------------------------------------------------ the stand-in itself


def _call(gh, method, path, body=None, data=None, token="t"):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body is not None:
        data = json.dumps(body).encode()
    req = urllib.request.Request(path if path.startswith("http") else gh.url + path, data=data,
                                 method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            text = r.read()
            return r.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_a_published_release_is_immutable_and_a_draft_has_no_tag(gh):
    status, rel = _call(gh, "POST", f"/repos/{REPO}/releases", {"tag_name": "v1", "draft": True})
    assert status == 201 and rel["upload_url"].endswith(f"/releases/{rel['id']}/assets{{?name,label}}")
    upload = rel["upload_url"].split("{")[0]
    assert _call(gh, "GET", f"/repos/{REPO}/releases/tags/v1")[0] == 404
    status, asset = _call(gh, "POST", upload + "?name=a.whl", data=b"abc")
    assert status == 201 and asset["digest"] == _sha(b"abc") and asset["state"] == "uploaded"
    assert _call(gh, "POST", upload + "?name=a.whl", data=b"abc")[1]["errors"][0]["code"] == "already_exists"
    with pytest.raises(urllib.error.HTTPError):  # a draft's assets are not downloadable
        _download(asset["browser_download_url"])
    assert _call(gh, "PATCH", f"/repos/{REPO}/releases/{rel['id']}", {"draft": False})[0] == 200
    assert _call(gh, "GET", f"/repos/{REPO}/releases/tags/v1")[1]["assets"][0]["name"] == "a.whl"
    assert _download(asset["browser_download_url"]) == b"abc"
    assert _call(gh, "POST", upload + "?name=b.whl", data=b"x")[0] == 422
    assert _call(gh, "DELETE", f"/repos/{REPO}/releases/assets/{asset['id']}")[0] == 422
    assert _call(gh, "PATCH", f"/repos/{REPO}/releases/{rel['id']}", {"body": "x"})[0] == 422
    assert _call(gh, "POST", f"/repos/{REPO}/releases", {"tag_name": "v1"})[0] == 422
    assert _call(gh, "GET", f"/repos/{REPO}/releases", token="")[0] == 401
    assert _call(gh, "GET", "/repos/other/repo/releases")[1] == []


def test_pull_requests_are_recorded(gh):
    status, pr = _call(gh, "POST", f"/repos/{REPO}/pulls", {"title": "Support table: add torch 2.15",
                                                              "head": "torch-watch/2.15", "base": "main"})
    assert status == 201 and pr["number"] == 1 and pr["html_url"] == f"{gh.url}/{REPO}/pull/1"
    assert _call(gh, "POST", f"/repos/{REPO}/pulls", {"title": "again", "head": "torch-watch/2.15",
                                                       "base": "main"})[0] == 422
    assert _call(gh, "POST", f"/repos/{REPO}/pulls", {"title": "no head"})[0] == 422
    status, pulls = _call(gh, "GET", f"/repos/{REPO}/pulls?state=all&per_page=100")
    assert status == 200 and [p["head"]["ref"] for p in pulls] == ["torch-watch/2.15"]
    assert _call(gh, "GET", f"/repos/{REPO}/pulls?state=closed")[1] == []


def test_the_command_line_serves_a_state_folder_with_faults(tmp_path):
    state = tmp_path / "state"
    github_api.seed_release(state, REPO, "v1", [("a.whl", b"abc")], draft=False)
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"method": "GET", "path_contains": "/releases", "status": 503}]))
    cmd = [sys.executable, "-m", "ci.rehearsal.github_api", "--port", "0", "--state", str(state),
           "--faults", str(faults)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        req = urllib.request.Request(f"{url}/repos/{REPO}/releases", headers={"Authorization": "token t"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        assert e.value.code == 503
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.loads(r.read())[0]["assets"][0]["browser_download_url"] == \
                f"{url}/{REPO}/releases/download/v1/a.whl"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert github_api.read_requests(state) == [("GET", f"/repos/{REPO}/releases", "503"),
                                               ("GET", f"/repos/{REPO}/releases", "200")]


def test_the_seed_command_line(tmp_path):
    a, b, c = _wheels(tmp_path, 3)
    state = tmp_path / "state"
    cmd = [sys.executable, "-m", "ci.rehearsal.github_api", "seed", "--state", str(state), "--repo", REPO,
           "--tag", "v1", "--asset", str(a), "--wrong", str(b), "--starter", str(c)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    (rel,) = github_api.load_state(state)["repos"][REPO]["releases"]
    assert rel["draft"] is True
    got = {x["name"]: (x["digest"] == _sha(p.read_bytes()), x["state"])
           for x, p in zip(rel["assets"], (a, b, c))}
    assert got == {a.name: (True, "uploaded"), b.name: (False, "uploaded"), c.name: (True, "starter")}
