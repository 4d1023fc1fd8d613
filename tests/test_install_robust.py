"""``resolve``, ``install`` and ``download`` where things go wrong around them (issue 42): the
hints they end with work where the user stands; an index that refuses connections or fails for a
moment is retried, then named with the ways forward; a page that is not an index is exit 4 (2
for ``resolve``); a truncated file says so; two installs into one environment take turns; an
install killed with SIGKILL is finished or undone by the next one; a read-only site-packages is
one line with a documented status.

Indexes are served on 127.0.0.1 and the wheels are the small real ones of tests/test_install.py
(its fixtures: a venv of this interpreter that sees this environment's torch)."""

from __future__ import annotations

import errno
import functools
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
import torch
from test_index import make_wheel
from test_install import (  # noqa: F401 (fixtures)
    MACHINE,
    PY,
    _installed,
    _ours,
    _venv,
    scratch,
    site,
    torch_env,
    with_pip,
)

from mamba_kernels.cli import main as cli
from mamba_kernels.facts import release_index
from mamba_kernels.install import fetching, resolve
from mamba_kernels.install import installer as install

HERE = ["--torch", torch.__version__, "--python", f"{PY[2]}.{PY[3:]}"]


def _cli(argv, capsys):
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


# ----------------------------------------------------------------------------- 1. hints that work here

@pytest.fixture
def unfit(tmp_path):
    """A folder of one wheel that fits no torch of this machine."""
    make_wheel(tmp_path / "unfit", version="0.1.0+cu118torch1.13", py=PY, plat=f"manylinux_2_17_{MACHINE}",
               requires="torch==1.13.*")
    return tmp_path / "unfit"


def _checkout(folder: Path) -> Path:
    (folder / "sub").mkdir(parents=True)
    (folder / "pyproject.toml").write_text('[project]\nname = "mamba-kernels"\ndynamic = ["version"]\n')
    return folder


def test_the_source_build_hint_works_where_the_user_is(unfit, tmp_path, monkeypatch, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "pyproject.toml").write_text('[project]\nname = "something-else"\n')  # not ours
    tree = _checkout(tmp_path / "mk-src")
    for cwd, want in ((elsewhere, "/path/to/mamba-kernels"), (tree, "--no-build-isolation .;"),
                      (tree / "sub", f"--no-build-isolation {tree};")):
        monkeypatch.chdir(cwd)
        rc, out, err = _cli(["resolve", "--index", str(unfit)] + HERE, capsys)
        assert rc == resolve.EXIT_NO_MATCH, err
        (line,) = [x for x in out.splitlines() if x.startswith("no prebuilt wheel")]
        assert want in line, line
        if cwd == elsewhere:
            assert "install --no-build-isolation ." not in line and str(elsewhere) in line
    # the real checkout (an unpacked sdist has the same pyproject.toml)
    root = Path(__file__).resolve().parents[1]
    assert resolve.source_root(root / "mamba_kernels" / "install") == root
    assert resolve.source_build_hint(cwd=root).endswith("pip install --no-build-isolation .")


def test_install_that_finds_no_wheel_names_the_targets_installer(unfit, tmp_path, torch_env,  # noqa: F811
                                                                    monkeypatch, capsys):
    python = _venv(tmp_path / "venv", torch_env, pip=False)
    monkeypatch.chdir(tmp_path)
    rc, out, err = _cli(["install", "--index", str(unfit), "--python-exe", str(python)], capsys)
    assert rc == install.EXIT_NO_MATCH, err
    line = err.strip().splitlines()[-1]
    assert f"uv pip install --python {python} --no-build-isolation /path/to/mamba-kernels" in line, line
    assert "Traceback" not in err and _ours(python) == []


# ----------------------------------------------------------------------------- 2.-4. indexes in trouble

@pytest.fixture(scope="module")
def flaky(site):  # noqa: F811
    """tests/test_install's site on 127.0.0.1, and: /f/ its root page after two 503s, the wheels
    under /f/wheels/ after one 429 (Retry-After: 0); /welcome/ a web server's welcome page;
    /empty/ an empty 200; /nolen/ a manifest without sizes whose wheel arrives half, with no
    Content-Length."""
    root = site["root"]
    seen: dict = {}
    entry = {"filename": site["here"], "url": f"/half/{quote(site['here'])}", "sha256": site["sha"]}
    (root / "nolen").mkdir(exist_ok=True)
    (root / "nolen" / "manifest.json").write_text(json.dumps({"schema": 2, "project": "mamba-kernels",
                                                              "wheels": [entry]}))

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code: int, body: bytes, headers: dict) -> None:
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 (http.server's name)
            n = seen[self.path] = seen.get(self.path, 0) + 1
            if self.path == "/f/" and n <= 2:
                return self._send(503, b"busy", {"Content-Length": "4"})
            if self.path.startswith("/f/wheels/") and n == 1:
                return self._send(429, b"", {"Retry-After": "0", "Content-Length": "0"})
            if self.path == "/welcome/":
                page = b"<html><body><h1>It works!</h1><a href='/docs/'>docs</a></body></html>"
                return self._send(200, page, {"Content-Type": "text/html"})
            if self.path == "/empty/":
                return self._send(200, b"", {"Content-Type": "text/html", "Content-Length": "0"})
            if self.path.startswith("/half/"):
                data = (root / "wheels" / unquote(self.path.rsplit("/", 1)[-1])).read_bytes()
                self.close_connection = True
                return self._send(200, data[: len(data) // 2], {"Content-Type": "application/octet-stream"})
            if self.path.startswith("/f/"):
                self.path = self.path[2:]
            super().do_GET()

    handler = functools.partial(Handler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"url": f"http://127.0.0.1:{server.server_address[1]}", "seen": seen}
    server.shutdown()
    server.server_close()


def test_an_index_that_fails_for_a_moment_is_retried_and_installs(flaky, site, with_pip, capsys):  # noqa: F811
    rc, out, err = _cli(["install", "--index", flaky["url"] + "/f/", "--python-exe", str(with_pip)], capsys)
    assert rc == 0, err
    assert flaky["seen"]["/f/"] == 3 and flaky["seen"][f"/f/wheels/{quote(site['here'])}"] == 2
    assert _ours(with_pip) == _installed(site)


def test_a_refused_index_is_retried_a_few_seconds_then_one_line(capsys):
    start = time.monotonic()
    rc, _, err = _cli(["resolve", "--index", "http://127.0.0.1:9/"] + HERE, capsys)
    took = time.monotonic() - start
    (line,) = err.strip().splitlines()
    assert rc == 2 and 3 <= took < 8, (took, line)
    assert "Connection refused (4 attempts in" in line and "give another --index" in line
    assert "/path/to/wheels" in line


def test_the_failure_names_where_the_index_came_from(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fetching, "RETRY_DELAYS", (0.01, 0.01, 0.01))
    monkeypatch.setenv(release_index.ENV_VAR, "http://127.0.0.1:9/")
    for verb in (["download", "--dest", str(tmp_path / "d")], ["resolve"]):
        rc, _, err = _cli(verb + HERE, capsys)
        line = err.strip().splitlines()[-1]
        assert rc == (4 if verb[0] == "download" else 2), err
        assert line.split(": ", 1)[1].startswith(f"{release_index.ENV_VAR} entry http://127.0.0.1:9/: "), line
        assert f"set {release_index.ENV_VAR} to another index" in line and "--index" in line
    monkeypatch.delenv(release_index.ENV_VAR)
    rc, _, err = _cli(["download", "--dest", str(tmp_path / "d"), "--index", "http://127.0.0.1:9/"] + HERE,
                      capsys)
    line = err.strip().splitlines()[-1]
    assert rc == 4 and "--index http://127.0.0.1:9/: cannot be fetched" in line
    assert release_index.ENV_VAR not in line


def test_a_timeout_says_how_to_wait_longer(capsys):
    mute = type("Mute", (http.server.BaseHTTPRequestHandler,),  # a server that does not answer in time
                {"do_GET": lambda self: time.sleep(3), "log_message": lambda *a: None})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), mute)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        rc, _, err = _cli(["resolve", "--timeout", "0.3", "--index", f"http://127.0.0.1:{srv.server_address[1]}/"]
                          + HERE, capsys)
    finally:
        srv.shutdown()
        srv.server_close()
    (line,) = err.strip().splitlines()
    assert rc == 2 and "timed out" in line and "--timeout N waits N seconds" in line, line


@pytest.mark.parametrize("page", ["welcome", "empty"])
def test_a_page_that_is_not_an_index_is_exit_4(page, flaky, tmp_path, capsys):
    where = f"{flaky['url']}/{page}/"
    rc, out, err = _cli(["download", "--dest", str(tmp_path / "d"), "--index", where] + HERE, capsys)
    (line,) = err.strip().splitlines()
    assert rc == install.EXIT_FETCH and "not an index" in line and where in line, line
    assert "no wheel fits" not in out + err and "build from source" not in out + err
    rc, out, err = _cli(["resolve", "--index", where] + HERE, capsys)
    (line,) = err.strip().splitlines()
    assert rc == 2 and "not an index" in line and "index's address" in line, line


def test_a_truncated_file_without_a_listed_size_says_so(flaky, site, tmp_path, capsys):  # noqa: F811
    house = tmp_path / "house"
    rc, _, err = _cli(["download", "--dest", str(house), "--index", flaky["url"] + "/nolen/manifest.json"]
                      + HERE, capsys)
    line = err.strip().splitlines()[-1]
    size = (site["root"] / "wheels" / site["here"]).stat().st_size
    assert rc == install.EXIT_VERIFY and f"received {size // 2} bytes" in line, line
    assert "may be truncated or altered" in line and list(house.iterdir()) == []


# ----------------------------------------------------------------------------- 5. one install at a time

def test_two_installs_at_once_leave_one_version(site, tmp_path, torch_env, flaky):  # noqa: F811
    python = _venv(tmp_path / "venv", torch_env, pip=True)
    argv = [sys.executable, "-m", "mamba_kernels", "install", "--index", f"{flaky['url']}/", "--python-exe",
            str(python)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    site_dir = next(python.parent.parent.glob("lib/python*/site-packages"))
    assert len(list(site_dir.glob("mamba_kernels-*.dist-info"))) == 1 and _ours(python) == _installed(site)
    assert not list(site_dir.glob("~*"))


def test_a_held_lock_is_waited_for_with_a_line(site, tmp_path, torch_env, flaky, monkeypatch, capsys):  # noqa: F811
    python = _venv(tmp_path / "venv", torch_env, pip=False)
    purelib = next(python.parent.parent.glob("lib/python*/site-packages"))
    monkeypatch.setattr(install, "LOCK_WAIT", 0.5)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; "
                               "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(30)",
                               str(purelib / install.LOCK_NAME)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        rc, out, err = _cli(["install", "--index", f"{flaky['url']}/", "--python-exe", str(python)], capsys)
    finally:
        holder.kill()
        holder.wait()
    assert "waiting for another install into" in out, out
    assert rc == install.EXIT_TARGET and "still holds" in err.strip().splitlines()[-1] and _ours(python) == []


# ----------------------------------------------------------------------------- 7. a read-only site-packages

def test_an_undo_that_cannot_write_is_one_line_exit_7(site, tmp_path, torch_env, flaky, monkeypatch,  # noqa: F811
                                                       capsys):
    python = _venv(tmp_path / "venv", torch_env, pip=False)
    monkeypatch.setattr(install, "_run_installer", lambda cmd, fd=None: 1)  # the installer fails...

    def read_only(self):  # ...and nothing can be put back
        raise OSError(errno.EROFS, "Read-only file system", str(purelib))

    purelib = next(python.parent.parent.glob("lib/python*/site-packages"))
    monkeypatch.setattr(install.site_snapshot.Snapshot, "restore", read_only)
    rc, _, err = _cli(["install", "--index", f"{flaky['url']}/", "--python-exe", str(python)], capsys)
    line = err.strip().splitlines()[-1]
    assert rc == install.EXIT_FS and "Traceback" not in err, err
    assert "could not be put back as it was: Read-only file system" in line and "is kept in" in line


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_site_packages_is_one_line_exit_7(site, tmp_path, torch_env, flaky, capsys):  # noqa: F811
    python = _venv(tmp_path / "venv", torch_env, pip=True)
    purelib = next(python.parent.parent.glob("lib/python*/site-packages"))
    purelib.chmod(0o555)
    try:
        rc, _, err = _cli(["install", "--index", f"{flaky['url']}/", "--python-exe", str(python)], capsys)
    finally:
        purelib.chmod(0o755)
    assert rc == install.EXIT_FS and "Traceback" not in err, err
    assert "cannot be written" in err.strip().splitlines()[-1] and _ours(python) == []
