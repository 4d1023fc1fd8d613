"""``install`` is all-or-nothing: Ctrl-C at the terminal (SIGINT to the whole process group) at
random points of the pip step, or a pip that fails, leaves the target environment file for file
as it was; then ``pip uninstall``, ``pip check`` and a re-install work.

The wheels are real and large enough for pip to take a while (1500 modules under
mamba_kernels/); the target is a new venv of this interpreter that sees this environment's torch
(tests/test_install.py's torch-env)."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Optional

import pytest
from terminal import sigint_default
from test_install import LABEL, MACHINE, PY, TORCH_MM, _venv, scratch, torch_env  # noqa: F401 (fixtures)
from wheel_files import write_wheel

N_FILES = 1500


def _big_wheel(folder: Path, version: str, extra: tuple = ()) -> Path:
    di = f"mamba_kernels-{version}.dist-info"
    files = {f"mamba_kernels/m{i:04d}.py": f"VALUE = {i}\n".encode() * 20 for i in range(N_FILES)}
    files.update((name, b"") for name in extra)
    files["mamba_kernels/__init__.py"] = f"VERSION = {version!r}\n".encode()
    files[f"{di}/METADATA"] = (f"Metadata-Version: 2.1\nName: mamba-kernels\nVersion: {version}\n"
                               f"Requires-Dist: torch=={TORCH_MM}.*\n\n").encode()
    files[f"{di}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
                            f"Tag: {PY}-{PY}-manylinux_2_17_{MACHINE}\n").encode()
    files[f"{di}/entry_points.txt"] = b"[console_scripts]\nmamba-kernels = mamba_kernels:VERSION\n"
    return write_wheel(folder / f"mamba_kernels-{version}-{PY}-{PY}-manylinux_2_17_{MACHINE}.whl", files, di,
                       zipfile.ZIP_DEFLATED)


def _state(python: Path) -> dict:
    """Every file an install of ours may touch (site-packages' mamba_kernels*, bin/), with its
    sha256 (symlinks by their target). pip's own files are left out: running pip compiles them."""
    root = python.parent.parent
    site = next(root.glob("lib/python*/site-packages"))
    out = {}
    walk = [root / "bin", *site.glob("mamba_kernels*"), *site.glob("~*")]  # ~: pip's stash folders
    for dirpath, names in ((d, [p.name for p in Path(d).iterdir() if not p.is_dir()])
                           for w in walk for d in ([w] + [x for x in w.rglob("*") if x.is_dir()]
                                                   if w.is_dir() else [])):
        for n in names:
            p = Path(dirpath) / n
            out[str(p.relative_to(root))] = (
                os.readlink(p) if p.is_symlink() else "a .pyc (its bytes hold the time it was made)"
                if n.endswith(".pyc") else hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True)


def _pip_check_ours(python: Path) -> bool:
    """``pip check`` finds nothing wrong with mamba-kernels (the venv's own setuptools may be older
    than the linked torch asks for: not ours to judge)."""
    r = _pip(python, "check")
    return "mamba-kernels" not in (r.stdout + r.stderr).lower() and "mamba_kernels" not in r.stdout + r.stderr


def _install(python: Path, wheels: Path, tmpdir: Optional[Path] = None) -> subprocess.Popen:
    env = dict(os.environ, **({"TMPDIR": str(tmpdir)} if tmpdir else {}))
    return subprocess.Popen([sys.executable, "-m", "mamba_kernels", "install", "--index", str(wheels),
                             "--python-exe", str(python)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=env,  # its own group, as a terminal's job
                            preexec_fn=sigint_default)


@pytest.fixture(scope="module")
def target(scratch, torch_env, tmp_path_factory):  # noqa: F811 (the fixtures imported above)
    d = tmp_path_factory.mktemp("atomic")
    old = _big_wheel(d / "old", f"0.1.0+{LABEL}")
    new_dir = d / "new"
    _big_wheel(new_dir, f"0.2.0+{LABEL}")
    python = _venv(d / "venv", torch_env, pip=True)
    return python, old, new_dir


def test_an_interrupted_install_leaves_the_environment_as_it_was(target):
    python, old, new_dir = target
    r = _pip(python, "install", "--no-deps", "--no-index", str(old))
    assert r.returncode == 0, r.stderr
    before = _state(python)
    start = time.monotonic()  # one whole run, to know where "part way" is
    p = _install(python, new_dir)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    whole = time.monotonic() - start
    assert _pip(python, "show", "mamba-kernels").stdout.count("Version: 0.2.0") == 1
    r = _pip(python, "install", "--no-deps", "--no-index", "--force-reinstall", str(old))
    assert r.returncode == 0 and _state(python) == before, r.stderr
    rng = random.Random(17)
    interrupted = 0
    for _ in range(3):
        p = _install(python, new_dir)
        line = ""
        while not line.startswith("running "):  # the pip step has begun
            line = p.stdout.readline()
            assert line, p.stderr.read()
        time.sleep(rng.uniform(0.0, 0.6) * whole)
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C at the terminal: the whole foreground group
        out, err = p.communicate(timeout=300)
        assert "Traceback" not in err, err
        if p.returncode == 0:  # it had finished: all, not nothing
            assert _pip(python, "show", "mamba-kernels").stdout.count("Version: 0.2.0") == 1
            r = _pip(python, "install", "--no-deps", "--no-index", "--force-reinstall", str(old))
            assert r.returncode == 0, r.stderr
            continue
        interrupted += 1
        assert p.returncode == 130 and "the environment is as it was before" in err, err
        assert _state(python) == before  # file for file
        assert _pip_check_ours(python)
    assert interrupted >= 1
    r = _pip(python, "uninstall", "-y", "mamba-kernels")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not list(python.parent.parent.glob("lib/python*/site-packages/mamba_kernels*"))
    p = _install(python, new_dir)  # and a re-install
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert _pip_check_ours(python)


def test_a_failing_installer_leaves_the_environment_as_it_was(target, tmp_path):
    python, old, _ = target
    r = _pip(python, "install", "--no-deps", "--no-index", "--force-reinstall", str(old))
    assert r.returncode == 0, r.stderr
    # The new wheel has mamba_kernels/zz/x.py; a plain file mamba_kernels/zz that no RECORD lists
    # makes pip fail half-way, after it removed the old files and wrote some new ones.
    _big_wheel(tmp_path / "new", f"0.3.0+{LABEL}", extra=("mamba_kernels/zz/x.py",))
    site = next(python.parent.parent.glob("lib/python*/site-packages"))
    (site / "mamba_kernels" / "zz").write_text("not a folder")
    before = _state(python)
    p = _install(python, tmp_path / "new")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 6 and "put back as it was before" in err, out + err
    assert _state(python) == before
    assert _pip_check_ours(python)


def test_a_sigkilled_install_is_tidied_by_the_next_one(target, tmp_path):
    """SIGKILL to the command's process group (the installer is in it) at several points of an
    install; the next install finds what was left by name, puts it back or removes it, and the
    environment ends with one version and no folder of ours or pip's left behind."""
    python, old, new_dir = target
    r = _pip(python, "install", "--no-deps", "--no-index", "--force-reinstall", str(old))
    assert r.returncode == 0, r.stderr
    site = next(python.parent.parent.glob("lib/python*/site-packages"))
    temp = tmp_path / "temp"  # the commands' temporary directory: the download folders go there
    temp.mkdir()
    for delay in (0.3, 1.5):  # while the copy is made / pip runs
        p = _install(python, new_dir, temp)
        line = ""
        while not line.startswith("running "):
            line = p.stdout.readline()
            if not line:
                break
        time.sleep(delay)
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate(timeout=60)
        left = [d.name for d in temp.iterdir()]
        assert any(n.startswith("mamba-kernels-install-") for n in left), left  # the kill left one
        p = _install(python, old.parent, temp)  # the next run tidies, then installs the old version
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, out + err
        assert list(temp.iterdir()) == [], list(temp.iterdir())
        assert "the download folder of an install that was stopped" in out + err, out + err
        assert not (site / ".mamba-kernels-install").exists() and not list(site.glob("~*")), delay
        assert [d.name for d in site.glob("mamba_kernels-*.dist-info")] == \
            [f"mamba_kernels-0.1.0+{LABEL}.dist-info"]
        assert _pip_check_ours(python)
