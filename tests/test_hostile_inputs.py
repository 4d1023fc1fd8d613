"""Hostile and broken inputs to ``resolve``, ``download``, ``install``, ``index`` and the sdist
backend, each answered in one line with a documented exit status (docs/INSTALL.md, "What is
trusted" and "Exit status"). Network cases are served on 127.0.0.1; the wheels are real ones
(tests/test_index.make_wheel), some with members our build never writes."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from urllib.parse import quote

import pytest
from terminal import sigint_default
from test_index import make_wheel

from mamba_kernels.build import toolchain as build_toolchain
from mamba_kernels.cli import main as cli
from mamba_kernels.install import environment, fetching, wheel_contents, wheel_metadata
from mamba_kernels.install import installer as install
from mamba_kernels.install import sdist as sdist_install
from mamba_kernels.release import index, wheel_check

TORCH = ["--torch", "2.14.1", "--cuda", "13.0", "--python", "3.11", "--platform", "linux_x86_64"]
NAME = "mamba_kernels-0.1.0+cu130torch2.14-cp311-cp311-manylinux_2_28_x86_64.whl"


def _manifest(folder: Path, entries, name: str = "manifest.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(json.dumps({"schema": 2, "project": "mamba-kernels", "wheels": entries}))
    return p


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A folder on 127.0.0.1 (``root``), plus /drip (60 bytes at one a second), /loop (redirects
    to itself), /to-ftp and /to-file (redirects off http), /hang (never answers)."""
    root = tmp_path_factory.mktemp("hostile")
    wheel = make_wheel(root / "wheels")
    sha = wheel_metadata.sha256_of(wheel)
    release = threading.Event()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path == "/drip":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "60")
                self.end_headers()
                for _ in range(60):
                    if release.wait(1.0):
                        return
                    self.wfile.write(b" ")
                    self.wfile.flush()
                return
            if self.path == "/hang":
                release.wait(60)
                return
            targets = {"/loop": "/loop", "/to-ftp": "ftp://127.0.0.1/x.json",
                       "/to-file": "file:///etc/passwd"}
            if self.path in targets:
                self.send_response(302)
                self.send_header("Location", targets[self.path])
                self.end_headers()
                return
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Handler, directory=str(root)))
    server.daemon_threads = True
    server.handle_error = lambda *a: None  # a client that gave up is no failure of the test
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"url": f"http://127.0.0.1:{server.server_address[1]}", "root": root, "wheel": wheel, "sha": sha}
    release.set()
    server.shutdown()
    server.server_close()


def _cli(argv, capsys):
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ----------------------------------------------------------------------------- 1. the trust model

def test_a_remote_index_cannot_hand_out_local_files(served, tmp_path, capsys):
    planted = tmp_path / NAME
    shutil.copy(served["wheel"], planted)
    root, url = served["root"], served["url"]
    _manifest(root / "planted", [{"filename": NAME, "url": planted.as_uri()}])
    (root / "planted" / "page.html").write_text(f'<a href="{planted.as_uri()}">{NAME}</a>')
    house = tmp_path / "house"
    for where in (f"{url}/planted/manifest.json", f"{url}/planted/page.html"):
        rc, _, err = _cli(["download", "--dest", str(house), "--index", where] + TORCH, capsys)
        line = _one_line(err)
        assert rc == install.EXIT_FETCH and "not an http(s) URL" in line and where in line
        assert not house.exists() or list(house.iterdir()) == []
        rc, _, err = _cli(["resolve", "--index", where] + TORCH, capsys)
        assert rc == 2 and "may point only to http(s) URLs" in _one_line(err)


def test_a_remote_wheel_needs_a_listed_sha256(served, tmp_path, capsys):
    url = served["url"]
    _manifest(served["root"] / "nohash", [{"filename": NAME, "url": f"{url}/wheels/{quote(NAME)}"}])
    house = tmp_path / "house"
    argv = ["download", "--dest", str(house), "--index", f"{url}/nohash/manifest.json"] + TORCH
    rc, _, err = _cli(argv, capsys)
    line = _one_line(err)
    assert rc == install.EXIT_VERIFY and NAME in line and f"{url}/nohash/manifest.json" in line
    assert "lists no sha256" in line and not house.exists()
    rc, out, err = _cli(argv + ["--allow-unhashed"], capsys)  # relaxed, for a mirror one trusts
    assert rc == 0, err
    assert "--allow-unhashed: the index lists none" in out and (house / NAME).is_file()


def test_downloads_stop_at_the_listed_size_and_the_cap(served, tmp_path, capsys, monkeypatch):
    url, size = served["url"], served["wheel"].stat().st_size
    wheel_url = f"{url}/wheels/{quote(NAME)}"
    _manifest(served["root"] / "small", [{"filename": NAME, "url": wheel_url, "sha256": served["sha"],
                                           "size": size - 1}])
    house = tmp_path / "house"
    rc, _, err = _cli(["download", "--dest", str(house), "--index", f"{url}/small/manifest.json"] + TORCH,
                      capsys)
    assert rc == install.EXIT_VERIFY and f"above the limit of {size - 1} bytes" in _one_line(err)
    assert list(house.iterdir()) == []
    monkeypatch.setattr(fetching, "MAX_WHEEL_BYTES", size - 1)  # the cap, when the index lists no size
    _manifest(served["root"] / "nosize", [{"filename": NAME, "url": wheel_url, "sha256": served["sha"]}])
    rc, _, err = _cli(["download", "--dest", str(house), "--index", f"{url}/nosize/manifest.json"] + TORCH,
                      capsys)
    assert rc == install.EXIT_VERIFY and "above the limit" in err and list(house.iterdir()) == []


def test_a_local_index_may_not_name_a_device(tmp_path, capsys):
    _manifest(tmp_path / "idx", [{"filename": NAME, "url": "file:///dev/zero"}])
    house = tmp_path / "house"
    rc, _, err = _cli(["download", "--dest", str(house), "--index", str(tmp_path / "idx")] + TORCH, capsys)
    assert rc == install.EXIT_FETCH and "not a regular file" in _one_line(err)
    assert list(house.iterdir()) == []


def test_timeout_bounds_the_whole_fetch(served, capsys):
    # 60 bytes at one a second: every read is quick, the whole is not
    rc, _, err = _cli(["resolve", "--index", served["url"] + "/drip", "--timeout", "1"] + TORCH, capsys)
    assert rc == 2 and "timed out: the fetch took longer than 1 s" in _one_line(err)


@pytest.mark.parametrize("value", ["inf", "1e308", "0", "-1", "nan", "soon", "86401"])
def test_bad_timeouts_are_one_line(value, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["resolve", "--index", "x", "--timeout", value] + TORCH)
    assert e.value.code == 2
    line = _one_line(capsys.readouterr().err)
    assert "--timeout" in line and "above 0" in line and repr(value) in line
    with pytest.raises(sdist_install.StopInstall, match="MAMBA_KERNELS_INDEX_TIMEOUT must be"):
        sdist_install._timeout({"MAMBA_KERNELS_INDEX_TIMEOUT": value})


# ----------------------------------------------------------------------------- 3. malformed content

MALFORMED = {
    "hashes.json": json.dumps({"meta": {"api-version": "1.0"}, "files": [
        {"filename": NAME, "url": "x.whl", "hashes": {"sha256": 12345}}]}),
    "deep.json": "[" * 200_000,
    "archs.json": json.dumps({"project": "mamba-kernels", "wheels": [
        {"filename": NAME, "url": "x.whl", "sha256": "0" * 64, "archs": {"m": {"sass": 5}}}]}),
    "nullurl.json": json.dumps({"project": "mamba-kernels", "wheels": [
        {"filename": NAME, "url": None, "sha256": "0" * 64}]}),
    "newline.json": json.dumps({"project": "mamba-kernels", "wheels": [
        {"filename": NAME + "\n", "url": "x.whl", "sha256": "0" * 64}]}),
    "long.json": json.dumps({"project": "mamba-kernels", "wheels": [
        {"filename": "mamba_kernels-0.1.0+cu130torch2.14-" + "x" * 280 + ".whl", "url": "x.whl"}]}),
}


@pytest.fixture(scope="module")
def malformed(served):
    d = served["root"] / "malformed"
    d.mkdir()
    for name, text in MALFORMED.items():
        (d / name).write_text(text)
    (d / "big.html").write_bytes(b"<p>" + b"x" * (fetching.MAX_PAGE_BYTES + 10))
    return [f"{served['url']}/malformed/{n}" for n in [*MALFORMED, "big.html"]]


def test_malformed_index_content_is_one_line(malformed, capsys):
    for where in malformed:
        rc, _, err = _cli(["resolve", "--index", where, "--gpu-arch", "9.0"] + TORCH, capsys)
        line = _one_line(err)
        assert rc == 2 and where in line, line


def test_malformed_index_content_falls_through_in_the_sdist_backend(malformed, tmp_path):
    target = environment.detect(torch="2.14.1", cuda="13.0", python="3.11", platform_tag="linux_x86_64",
                                gpu_archs=["9.0"], toolchain=False)
    got, why = sdist_install.prebuilt(target, malformed, str(tmp_path), 10.0)
    assert got is None and len(why) == len(malformed)
    assert all(w.startswith("the index could not be read") for w in why), why


def test_redirects_stay_on_http_and_loops_are_one_line(served, capsys):
    for path, words in (("/loop", "too many redirects"), ("/to-ftp", "not an http(s) URL"),
                        ("/to-file", "not an http(s) URL")):
        rc, _, err = _cli(["resolve", "--index", served["url"] + path] + TORCH, capsys)
        assert rc == 2 and words in _one_line(err)


def test_a_file_url_of_another_host_is_refused(capsys):
    rc, _, err = _cli(["resolve", "--index", "file://otherhost/srv/manifest.json"] + TORCH, capsys)
    assert rc == 2 and "names the host 'otherhost'" in _one_line(err)


@pytest.mark.parametrize("torch", ["2.13.0 ; rm -rf /", "2.13.0+cu1300000", "2.13.0+"])
def test_junk_torch_versions_are_refused(torch, capsys):
    rc, _, err = _cli(["resolve", "--index", "x", "--torch", torch], capsys)
    assert rc == 2 and "--torch" in _one_line(err) and repr(torch) in err


def test_an_unreadable_second_index_does_not_hide_the_first(served, capsys):
    site = served["root"] / "site1"
    index.write_index(served["wheel"].parent, site)
    rc, out, err = _cli(["resolve", "--index", f"{served['url']}/site1/", "--index",
                         f"{served['url']}/nothing/"] + TORCH, capsys)
    assert rc == 0 and out.startswith(NAME) and "HTTP 404" in _one_line(err)


def test_empty_paths_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["resolve", "--index", ""] + TORCH)
    assert e.value.code == 2 and "--index" in _one_line(capsys.readouterr().err)
    rc, _, err = _cli(["download", "--dest", "", "--index", "x"] + TORCH, capsys)
    assert rc == 2 and "--dest must name a folder" in _one_line(err)


# ----------------------------------------------------------------------------- 4, 5, 14: the machine

def test_an_nvidia_smi_that_cannot_run_is_no_crash(tmp_path, monkeypatch):
    (tmp_path / "nvidia-smi").write_bytes(b"")  # on PATH, not executable
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert environment._nvidia_smi(build_toolchain.run) == ((), None)
    (tmp_path / "nvidia-smi").chmod(0o755)  # executable, but no program (empty)
    rc, out = build_toolchain.run(["nvidia-smi"], 5)
    assert rc in (126, 0) and "Traceback" not in out
    t = environment.detect(torch="2.14.1", cuda="13.0", toolchain=False)
    assert t.gpus == ()


def test_file_system_errors_are_one_line(served, tmp_path, capsys):
    site = served["root"] / "site2"
    if not site.exists():
        index.write_index(served["wheel"].parent, site)
    where = ["--index", str(site)]
    (tmp_path / "afile").write_text("")
    rc, _, err = _cli(["download", "--dest", str(tmp_path / "afile" / "sub")] + where + TORCH, capsys)
    assert rc == 2 and "is not a folder" in _one_line(err)
    # a write that fails part way (the file-size limit stands in for a full disk)
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100)); "
            "from mamba_kernels.cli import main as cli; "
            "sys.exit(cli.main(sys.argv[1:]))")
    argv = ["download", "--dest", str(tmp_path / "h")] + where + TORCH
    r = subprocess.run([sys.executable, "-c", code] + argv, capture_output=True, text=True)
    assert r.returncode == install.EXIT_FS, r.stderr
    assert r.stderr.startswith("downloading ") and "Traceback" not in r.stderr  # the progress line, then
    assert "cannot be written: File too large" in _one_line(r.stderr.split("\n", 1)[1])
    assert list((tmp_path / "h").iterdir()) == []


def test_download_honours_the_umask(served, tmp_path, capsys):
    old = os.umask(0o022)
    try:
        rc, _, err = _cli(["download", "--dest", str(tmp_path), "--index", str(served["wheel"].parent)]
                          + TORCH, capsys)
    finally:
        os.umask(old)
    assert rc == 0, err
    assert stat.S_IMODE((tmp_path / NAME).stat().st_mode) == 0o644


# ----------------------------------------------------------------------------- 11: junk interpreters

@pytest.mark.parametrize("prints", ["[1, 2]", '{"python": "3.11"}', "not json"])
def test_junk_interpreters_are_one_line(prints, tmp_path, capsys):
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\necho '{prints}'\n")
    exe.chmod(0o755)
    rc, _, err = _cli(["install", "--index", str(tmp_path), "--python-exe", str(exe)], capsys)
    assert rc == install.EXIT_TARGET and "not a Python that can report its packages" in _one_line(err)
    with pytest.raises(sdist_install.StopInstall, match="not a Python this backend can ask"):
        sdist_install.probe_target(str(exe), str(tmp_path), {})


# ----------------------------------------------------------------------------- 12, 13: signals

def _spawn(argv, cwd):
    return subprocess.Popen([sys.executable, "-m", "mamba_kernels"] + argv, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, preexec_fn=sigint_default)


def test_ctrl_c_in_resolve_is_one_line(served, tmp_path):
    p = _spawn(["resolve", "--index", served["url"] + "/hang", "--timeout", "60"] + TORCH, tmp_path)
    time.sleep(1.5)  # past start-up, waiting on the server
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130 and _one_line(err) == "mamba-kernels resolve: interrupted"


def test_sigterm_during_download_leaves_no_part_file(served, tmp_path):
    url = served["url"]
    _manifest(served["root"] / "slow", [{"filename": NAME, "url": f"{url}/drip", "sha256": "0" * 64}])
    house = tmp_path / "house"
    p = _spawn(["download", "--dest", str(house), "--index", f"{url}/slow/manifest.json", "--timeout", "60"]
               + TORCH, tmp_path)
    deadline = time.monotonic() + 60
    while not (house.is_dir() and any(house.iterdir())) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert [x.name.endswith(".part") for x in house.iterdir()] == [True]
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143 and "interrupted" in err and "Traceback" not in err
    assert list(house.iterdir()) == []


# ----------------------------------------------------------------------------- 18: wheel contents

def _with_members(tmp_path: Path, members: dict, tag: str) -> Path:
    """A real wheel of ours plus ``members`` (name -> bytes), in a folder of its own."""
    w = make_wheel(tmp_path / f"src-{tag}")
    out = tmp_path / f"in-{tag}"
    out.mkdir()
    with zipfile.ZipFile(w) as src, zipfile.ZipFile(out / w.name, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        for name, data in members.items():
            dst.writestr(name, data)
    return out / w.name


BAD_MEMBERS = {
    "dotdot": ({"../../evil.txt": b"x"}, "'..' path component"),
    "absolute": ({"/etc/evil": b"x"}, "absolute path"),
    "pth": ({"evil.pth": b"import os"}, ".pth"),
    "pth-inside": ({"mamba_kernels/evil.pth": b"import os"}, ".pth"),
    "scripts": ({"mamba_kernels-0.1.0+cu130torch2.14.data/scripts/pip": b"#!/bin/sh\n"}, ".data folder"),
    "other": ({"requests/__init__.py": b""}, "outside this project's packages"),
    "bomb": ({"mamba_kernels/pad.bin": bytes(40 << 20)}, "zip bomb"),
}


@pytest.mark.parametrize("case", sorted(BAD_MEMBERS))
def test_wheel_contents_are_vetted_by_index_install_and_download(case, tmp_path, capsys):
    members, words = BAD_MEMBERS[case]
    w = _with_members(tmp_path, members, case)
    with pytest.raises(wheel_check.IndexInputError, match="not the layout our build writes") as e:
        index.write_index(w.parent, tmp_path / "site")
    assert words in str(e.value) and not (tmp_path / "site").exists()
    rc, _, err = _cli(["download", "--dest", str(tmp_path / "house"), "--index", str(w.parent)] + TORCH,
                      capsys)
    assert rc == install.EXIT_VERIFY and words in err and list((tmp_path / "house").iterdir()) == []


def test_the_layout_is_pyprojects(capsys):
    import tomllib

    root = Path(__file__).parent.parent
    cfg = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert sorted({p.split(".")[0] for p in cfg["packages"]}) == sorted(wheel_contents.PACKAGES)
    # every package folder is listed, so the wheel and the sdist hold all of it
    found = {".".join(i.parent.relative_to(root).parts) for top in wheel_contents.PACKAGES
             for i in (root / top).rglob("__init__.py")}
    assert sorted(cfg["packages"]) == sorted(found)
    assert sorted(cfg["py-modules"]) == sorted(wheel_contents.MODULES)


# ----------------------------------------------------------------------------- 7, 9, 10: index

def test_index_never_deletes_what_it_did_not_create(served, tmp_path):
    mine = tmp_path / ".site.new-mybackup"
    mine.mkdir()
    (mine / "precious.txt").write_text("keep")
    (tmp_path / ".site.old-notes").write_text("a plain file")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "own.txt").write_text("not an index")
    with pytest.raises(wheel_check.IndexInputError, match="OUT_DIR"):
        index.write_index(served["wheel"].parent, tmp_path / "site")
    assert (mine / "precious.txt").read_text() == "keep"
    index.write_index(served["wheel"].parent, tmp_path / "site2")
    index.write_index(served["wheel"].parent, tmp_path / "site2")  # and again, over its own index
    assert (mine / "precious.txt").read_text() == "keep"
    assert (tmp_path / ".site.old-notes").read_text() == "a plain file"
    (tmp_path / ".site2.new-x").write_text("a plain file of the temporary name")
    index.write_index(served["wheel"].parent, tmp_path / "site2")  # no "Not a directory"
    assert (tmp_path / ".site2.new-x").is_file()


def test_previous_relative_urls_are_copied_under_their_linked_name(served, tmp_path):
    old = tmp_path / "old"
    w1 = make_wheel(tmp_path / "w1", py="cp312")
    w2 = make_wheel(tmp_path / "w2", py="cp313")
    shutil.copy(w1, tmp_path / "outside.whl")
    (old / "wheels").mkdir(parents=True)
    shutil.copy(w2, old / "wheels" / "renamed.whl")
    _manifest(old, [{"filename": w1.name, "url": "../outside.whl", "sha256": wheel_metadata.sha256_of(w1)},
                    {"filename": w2.name, "url": "wheels/renamed.whl",
                     "sha256": wheel_metadata.sha256_of(w2)}])
    m = index.write_index(served["wheel"].parent, tmp_path / "site", previous=str(old / "manifest.json"))
    site = tmp_path / "site"
    for e in m["wheels"]:
        assert e["url"] == "wheels/" + quote(e["filename"])
        assert (site / "wheels" / e["filename"]).is_file()
    page = (site / "cu130torch2.14" / "find-links.html").read_text()
    assert "outside.whl" not in page and "renamed.whl" not in page


def test_previous_fields_of_the_wrong_type_are_one_line(served, tmp_path):
    entry = {"filename": NAME, "url": "https://example.invalid/x.whl", "sha256": "0" * 64,
             "requires_python": 5}
    p = _manifest(tmp_path / "prev", [entry])
    with pytest.raises(wheel_check.IndexInputError, match="'requires_python' 5: it must be str or null"):
        index.write_index(served["wheel"].parent, tmp_path / "site", previous=str(p))


def test_data_requires_python_follows_the_tag():
    assert index.file_requires_python(NAME, ">=3.9") == "==3.11.*"
    stable = "mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-manylinux_2_28_x86_64.whl"
    assert index.file_requires_python(stable, ">=3.9") == ">=3.10"
    assert index.file_requires_python(stable, "<3.14,>=3.9") == ">=3.10,<3.14"


# ----------------------------------------------------------------------------- speed: no torch import

NO_TORCH = ("import sys\nfrom mamba_kernels.cli import main as cli\nrc = cli.main(sys.argv[1:])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nprint('rc', rc)\n")


@pytest.mark.parametrize("verb", [["resolve"], ["download", "--dry-run", "--dest", "house"]])
def test_the_environment_given_imports_no_torch(verb, served, tmp_path):
    site = served["root"] / "site3"
    if not site.exists():
        index.write_index(served["wheel"].parent, site)
    r = subprocess.run([sys.executable, "-c", NO_TORCH, *verb, "--index", str(site)] + TORCH,
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("rc 0"), r.stdout + r.stderr
