"""``resolve``, ``install`` and ``download`` where things go wrong around them (issue 42): the
hints they end with work where the user stands; an index that refuses connections or fails for a
moment is retried, then named with the ways forward; a page that is not an index is exit 4 (2
for ``resolve``); a truncated file says so; two installs into one environment take turns; an
install killed with SIGKILL is finished or undone by the next one; a read-only site-packages is
one line with a documented status.

Indexes are served on 127.0.0.1 and the wheels are the small real ones of tests/test_install.py
(its fixtures: a venv of this interpreter that sees this environment's torch)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_index import make_wheel
from test_install import MACHINE, PY, _ours, _venv, scratch, torch_env  # noqa: F401 (fixtures)

from mamba_kernels.cli import main as cli
from mamba_kernels.install import installer as install
from mamba_kernels.install import resolve

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
