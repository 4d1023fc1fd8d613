"""``install`` and ``download`` against an index served on 127.0.0.1: a good wheel installed into
a new virtual environment, a wrong hash, a truncated download, a server that hangs (timeout, then
the next index), a malformed index, a target without torch, an interrupt, a wheelhouse for
another machine and an offline install from it.

The wheels are tiny but real (tests/test_index.make_wheel: METADATA, WHEEL, RECORD, a
``mamba_kernels/_test_probe.py`` module), labelled for the torch of the development environment, and
the index is the one ``python -m mamba_kernels index`` writes. The target environments are new
venvs of this interpreter. ``install`` refuses a target without torch, so those that must have
one see the development environment's real torch through a path file: every distribution of
this environment's site-packages except ours and the installers, linked into one folder
(``torch-env``), which keeps each venv cheap and the torch a real one. Whatever ``install``
writes lands in the venv's own site-packages.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import pytest
import torch
from terminal import sigint_default
from test_index import make_wheel

from mamba_kernels.cli import main as cli
from mamba_kernels.facts import release_index, variant, versions
from mamba_kernels.install import installer as install
from mamba_kernels.install import wheel_metadata
from mamba_kernels.release import index

LABEL = variant.label(torch.__version__, torch.version.cuda or "13.0")
PY = f"cp{sys.version_info[0]}{sys.version_info[1]}"
MACHINE = platform.machine()
OTHER = "aarch64" if MACHINE == "x86_64" else "x86_64"
TORCH_MM = versions.minor(torch.__version__)
OURS = ("mamba_kernels", "__editable__", "causal_conv1d", "selective_scan", "pip", "_distutils_hack",
        "__pycache__")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("install")


@pytest.fixture(scope="module")
def site(scratch):
    """Wheels for this machine (two variants) and for another one, written as an index, plus
    manifests that point at misbehaving URLs of the server below."""
    w = scratch / "wheels-in"
    here = make_wheel(w, version=f"0.1.0+{LABEL}", py=PY, plat=f"manylinux_2_17_{MACHINE}",
                      requires=f"torch=={TORCH_MM}.*")
    make_wheel(w, version="0.1.0+cu128torch2.9", py=PY, plat=f"manylinux_2_17_{MACHINE}",
               requires="torch==2.9.*")
    other = make_wheel(w, version=f"0.1.0+{LABEL}", py="cp312", plat=f"manylinux_2_28_{OTHER}",
                       requires=f"torch=={TORCH_MM}.*")
    out = scratch / "site"
    manifest = index.write_index(w, out)
    entry = next(e for e in manifest["wheels"] if e["filename"] == here.name)

    def variant_manifest(folder: str, url: str, sha: str) -> None:
        (out / folder).mkdir()
        wheel = dict(entry, url=url, sha256=sha)
        (out / folder / "manifest.json").write_text(json.dumps(
            {"schema": 2, "project": "mamba-kernels", "wheels": [wheel]}))

    q = quote(here.name)
    variant_manifest("badhash", f"../wheels/{q}", "f" * 64)
    variant_manifest("trunc", f"/truncated/{q}", entry["sha256"])
    variant_manifest("slowdl", f"/slow/{q}", entry["sha256"])
    (out / "malformed").mkdir()
    (out / "malformed" / "manifest.json").write_text('{"project": "mamba-kernels", "wheels": [')
    return {"root": out, "here": here.name, "other": other.name, "sha": entry["sha256"],
            "shas": {e["filename"]: e["sha256"] for e in manifest["wheels"]}}


@pytest.fixture(scope="module")
def base(site):
    """The site on 127.0.0.1, with /hang (never answers), /truncated/<file> (announces the whole
    file, sends half, closes) and /slow/<file> (sends 1000 bytes, then nothing)."""
    root = site["root"]
    release = threading.Event()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _partial(self, name: str, keep: int, hang: bool) -> None:
            data = (root / "wheels" / name).read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:keep])
            self.wfile.flush()
            if hang:
                release.wait(30)
            self.close_connection = True

        def do_GET(self):  # noqa: N802 (http.server's name)
            from urllib.parse import unquote

            if self.path.startswith("/hang"):
                release.wait(30)
                return
            name = unquote(self.path.rsplit("/", 1)[-1])
            if self.path.startswith("/truncated/"):
                return self._partial(name, (root / "wheels" / name).stat().st_size // 2, hang=False)
            if self.path.startswith("/slow/"):
                return self._partial(name, 1000, hang=True)
            super().do_GET()

    handler = functools.partial(Handler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    release.set()
    server.shutdown()
    server.server_close()


# ----------------------------------------------------------------------------- target environments

@pytest.fixture(scope="module")
def torch_env(scratch):
    """This environment's distributions except ours and the installers, linked into one folder."""
    farm = scratch / "torch-env"
    farm.mkdir()
    for p in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if p.name.startswith(OURS) or p.suffix == ".pth":
            continue
        (farm / p.name).symlink_to(p)
    return farm


def _venv(path: Path, torch_env, pip: bool) -> Path:
    subprocess.run([sys.executable, "-m", "venv", *([] if pip else ["--without-pip"]), str(path)], check=True)
    purelib = subprocess.run([str(path / "bin" / "python"), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                             check=True).stdout.strip()
    if torch_env is not None:
        (Path(purelib) / "torch-env.pth").write_text(f"{torch_env}\n")
    return path / "bin" / "python"


@pytest.fixture(scope="module")
def with_pip(scratch, torch_env):
    return _venv(scratch / "with-pip", torch_env, pip=True)


@pytest.fixture
def bare(tmp_path, torch_env):
    """A new venv without pip (install falls back to uv), with torch."""
    return _venv(tmp_path / "bare", torch_env, pip=False)


def _ours(python: Path) -> list:
    """The mamba-kernels distributions and probe modules in that venv's own site-packages."""
    site = next(python.parent.parent.glob("lib/python*/site-packages"))
    return sorted(p.name for p in site.iterdir() if p.name.lower().startswith("mamba_kernels"))


def _installed(site) -> list:
    """What installing the wheel for this machine adds to a venv's site-packages."""
    return ["mamba_kernels", f"mamba_kernels-{site['here'].split('-')[1]}.dist-info"]


@pytest.fixture(autouse=True)
def _this_environment_untouched():
    """Every install here goes to a new venv: this environment keeps its own mamba-kernels."""
    before = _ours(Path(sys.executable))
    yield
    assert _ours(Path(sys.executable)) == before


@pytest.fixture
def tmpdir_empty(tmp_path, monkeypatch):
    """The temporary folder install downloads into, to check that nothing is left there."""
    t = tmp_path / "tmp"
    t.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(t))
    return t


def _cli(argv, capsys):
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


# ----------------------------------------------------------------------------- install

def test_dry_run_prints_the_plan_and_fetches_nothing(base, site, bare, tmpdir_empty, capsys):
    rc, out, err = _cli(["install", "--dry-run", "--index", base + "/", "--python-exe", str(bare)], capsys)
    assert rc == 0, err
    assert f"chosen  {site['here']}" in out and f"torch {TORCH_MM}" in out
    assert "dry run: would download and verify" in out and "--no-deps" in out
    assert _ours(bare) == [] and list(tmpdir_empty.iterdir()) == []


def test_good_wheel_installs_that_exact_file_with_pip(base, site, with_pip, tmpdir_empty, capsys):
    rc, out, err = _cli(["install", "--index", base + "/", "--python-exe", str(with_pip)], capsys)
    assert rc == 0, err
    assert "sha256 verified" in out and f"torch=={TORCH_MM}.* holds for torch {torch.__version__}" in out
    version = site["here"].split("-")[1]
    assert _ours(with_pip) == _installed(site)
    check = ("import importlib.metadata as m, mamba_kernels._test_probe as p, torch; "
             "print(m.version('mamba-kernels'), p.VALUE, torch.__version__)")
    r = subprocess.run([str(with_pip), "-c", check], capture_output=True, text=True, cwd=tmpdir_empty)
    assert r.stdout.split() == [version, "42", torch.__version__], r.stderr
    assert list(tmpdir_empty.iterdir()) == []  # the downloaded file went with its temporary folder


def test_without_pip_uv_installs_it(base, site, bare, capsys):
    rc, out, err = _cli(["install", "--index", base + "/", "--python-exe", str(bare)], capsys)
    assert rc == 0, err
    assert "uv pip install --python" in out
    assert _ours(bare) == _installed(site)


def test_wrong_hash_is_refused_and_nothing_kept(base, bare, tmpdir_empty, capsys):
    rc, out, err = _cli(["install", "--index", base + "/badhash/manifest.json", "--python-exe", str(bare)],
                        capsys)
    assert rc == install.EXIT_VERIFY
    assert "sha256 mismatch: the index lists " + "f" * 64 in err and "Traceback" not in err
    assert _ours(bare) == [] and list(tmpdir_empty.iterdir()) == []


def test_truncated_download_is_refused_and_nothing_kept(base, bare, tmpdir_empty, capsys):
    rc, out, err = _cli(["install", "--index", base + "/trunc/manifest.json", "--python-exe", str(bare)],
                        capsys)
    assert rc == install.EXIT_FETCH
    assert "download failed after" in err or "truncated download" in err
    assert err.strip().splitlines()[-1].startswith("mamba-kernels install: ")
    assert _ours(bare) == [] and list(tmpdir_empty.iterdir()) == []


def test_hanging_index_and_stalled_download_fall_through_to_the_next(base, site, bare, tmpdir_empty, capsys):
    rc, out, err = _cli(["install", "--timeout", "0.5", "--index", base + "/hang/", "--index",
                         base + "/slowdl/manifest.json", "--index", base + "/", "--python-exe", str(bare)],
                        capsys)
    assert rc == 0, err
    lines = err.strip().splitlines()
    assert lines[0].startswith(f"mamba-kernels install: --index {base}/hang/: timed out")
    assert lines[0].endswith("trying the next index")
    assert any("download failed after 1000 of" in x and "timed out" in x and
               x.endswith("; trying the next index") for x in lines)
    froms = [x.split()[-1] for x in out.splitlines() if x.startswith("  from ")]
    assert froms == [base + "/slowdl/manifest.json", base + "/"]
    assert _ours(bare) == _installed(site)
    assert list(tmpdir_empty.iterdir()) == []


def test_only_a_hanging_index_is_a_clear_failure(base, bare, capsys):
    rc, _, err = _cli(["install", "--timeout", "0.5", "--index", base + "/hang/", "--python-exe", str(bare)],
                      capsys)
    assert rc == install.EXIT_FETCH
    (line,) = err.strip().splitlines()  # once, not twice
    assert line.startswith(f"mamba-kernels install: --index {base}/hang/: timed out: the fetch took longer "
                           "than 0.5 s; --timeout N waits N seconds"), line
    assert _ours(bare) == []


def test_malformed_index_is_one_clear_line(base, bare, capsys):
    rc, _, err = _cli(["install", "--index", base + "/malformed/manifest.json", "--python-exe", str(bare)],
                      capsys)
    assert rc == install.EXIT_FETCH
    assert "malformed/manifest.json: not valid JSON" in err and "Traceback" not in err
    assert _ours(bare) == []


def test_a_target_without_torch_is_refused(base, tmp_path, capsys):
    python = _venv(tmp_path / "no-torch", None, pip=False)
    rc, _, err = _cli(["install", "--index", base + "/", "--python-exe", str(python)], capsys)
    assert rc == install.EXIT_TARGET
    assert f"torch is not installed in {python}" in err and "never installs or changes torch" in err
    assert _ours(python) == []


# ----------------------------------------------------------------------------- download

def test_download_for_another_machine_then_install_offline(base, site, bare, tmp_path, capsys):
    house = tmp_path / "wheelhouse"
    other = ["--torch", torch.__version__.split("+")[0], "--cuda", torch.version.cuda or "13.0",
             "--python", "3.12", "--platform", f"linux_{OTHER}"]
    rc, out, err = _cli(["download", "--dest", str(house), "--index", base + "/"] + other, capsys)
    assert rc == 0, err
    assert sorted(p.name for p in house.iterdir()) == [site["other"]]  # nothing else, no .part left
    assert wheel_metadata.sha256_of(house / site["other"]) == site["shas"][site["other"]]
    assert "mamba_kernels install" not in out  # that machine has no mamba_kernels to run yet
    # the same from a file:// URL of the site's manifest (local files, hashes still checked)
    rc, out, err = _cli(["download", "--dest", str(house), "--index",
                         (site["root"] / "manifest.json").as_uri()], capsys)
    assert rc == 0, err
    assert "sha256 verified" in out
    assert sorted(p.name for p in house.iterdir()) == sorted([site["other"], site["here"]])
    # the command it prints works when pasted on a machine without mamba-kernels (DIR: the copy)
    printed = [x.strip() for x in out.splitlines() if x.strip().startswith("python -m pip install")]
    assert len(printed) == 1
    fresh = _venv(tmp_path / "fresh", torch_env=None, pip=True)
    cmd = shlex.split(printed[0].replace("DIR", shlex.quote(str(house))))
    r = subprocess.run([str(fresh)] + cmd[1:], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _ours(fresh) == _installed(site)
    # offline: a plain directory, chosen by file name, hashed as read
    rc, out, err = _cli(["install", "--index", str(house), "--python-exe", str(bare)], capsys)
    assert rc == 0, err
    assert f"chosen  {site['here']}" in out and "computed: the local index lists none" in out
    assert _ours(bare) == _installed(site)


def test_interrupted_download_leaves_nothing(base, site, tmp_path):
    house = tmp_path / "wheelhouse"
    p = subprocess.Popen([sys.executable, "-m", "mamba_kernels", "download", "--dest", str(house), "--index",
                          base + "/slowdl/manifest.json", "--timeout", "30", "--torch", torch.__version__,
                          "--python", f"{sys.version_info[0]}.{sys.version_info[1]}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    deadline = time.monotonic() + 60
    while not (house.is_dir() and any(house.iterdir())) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert [x.name.endswith(".part") for x in house.iterdir()] == [True]  # the download is under way
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == install.EXIT_INTERRUPTED, err
    assert "interrupted: the partial download was removed" in err and "Traceback" not in err
    assert list(house.iterdir()) == []


# ----------------------------------------------------------------------------- the default index

def test_default_index_comes_from_the_environment(base, site, monkeypatch, capsys):
    monkeypatch.setenv(release_index.ENV_VAR, f"{base}/hang-not-used-first {base}/")
    assert release_index.default_indexes() == ((f"{base}/hang-not-used-first", f"{base}/"),
                                               release_index.ENV_VAR)
    monkeypatch.setenv(release_index.ENV_VAR, f"{base}/")
    rc, out, err = _cli(["resolve", "--torch", torch.__version__, "--python",
                         f"{sys.version_info[0]}.{sys.version_info[1]}", "--json"], capsys)
    assert rc == 0, err
    assert json.loads(out)["selected"] == site["here"]
    monkeypatch.setenv(release_index.ENV_VAR, "  ")
    rc, _, err = _cli(["resolve", "--torch", torch.__version__], capsys)
    assert rc == 2 and "MAMBA_KERNELS_INDEX must name one or more URLs or directories" in err
    monkeypatch.setenv(release_index.ENV_VAR, "ftp://example.invalid/")
    rc, _, err = _cli(["download", "--dest", "unused", "--torch", torch.__version__], capsys)
    assert rc == 2 and "must be http(s) or file URLs or directories, got 'ftp://example.invalid/'" in err
    monkeypatch.delenv(release_index.ENV_VAR)
    assert release_index.default_indexes() == ((release_index.RELEASE_INDEX,), "the release index")


def test_variant_index_url(site):
    assert release_index.variant_index_url("https://h.example/x/", "cu130torch2.14") == \
        "https://h.example/x/cu130torch2.14/simple/"
    assert release_index.variant_index_url("https://h.example/x/manifest.json", "cu130torch2.14") is None
    simple = str(site["root"] / LABEL / "simple") + os.sep
    assert release_index.variant_index_url(str(site["root"]), LABEL) == simple
    assert release_index.variant_index_url(str(site["root"]), "cu999torch9.9") is None
