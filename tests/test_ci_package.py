"""ci/ is a package run as modules from the repository root: no module loads another by path or
edits sys.path, platform differences stay in ci/platforms/, and cibuildwheel's steps run the
modules, check-installed from a folder where only the check's own sources resolve."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci import build_cell
from mamba_kernels.facts import support

ROOT = Path(__file__).resolve().parent.parent
CI_MODULES = sorted((ROOT / "ci").rglob("*.py"))
SHARED = [p for p in CI_MODULES if "platforms" not in p.relative_to(ROOT / "ci").parts]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", CI_MODULES, ids=_rel)
def test_no_path_loading_and_no_sys_path_edits(path):
    siblings = {p.stem for p in (ROOT / "ci").glob("*.py")} | {"platforms"}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("path", "spec_from_file_location") and (
                node.attr != "path" or isinstance(node.value, ast.Name) and node.value.id == "sys"):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        found += [f"line {node.lineno}: import {n}" for n in names if n.split(".")[0] in siblings]
    assert found == []


@pytest.mark.parametrize("path", SHARED, ids=_rel)
def test_platform_names_stay_in_ci_platforms(path):
    """Outside ci/platforms/ no platform tag or sys.platform value, and no cell platform compared
    with a name: the Platform object (platforms.for_cell / for_tag) answers."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and (node.value in support.PLATFORMS or node.value == "win32"):
            found.append(f"line {node.lineno}: {node.value!r}")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if (any(isinstance(s, ast.Attribute) and s.attr == "platform" for s in sides)
                    and any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides)):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert found == []


def _cibuildwheel_config() -> dict:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads(build_cell.CIBW_CONFIG.read_text())["tool"]["cibuildwheel"]


def test_cibuildwheel_runs_the_module_and_checks_from_the_check_sources():
    cfg = _cibuildwheel_config()
    steps = [cfg["before-build"], cfg["before-test"], cfg["test-command"],
             cfg["linux"]["repair-wheel-command"], cfg["windows"]["repair-wheel-command"]]
    assert all(s.startswith("python -m ci.build_cell ") for s in steps), steps
    # cibuildwheel runs the test command in a folder holding only the test-sources
    assert cfg["test-sources"] == list(build_cell.CHECK_SOURCES)
    assert cfg["test-command"] == "python -m ci.build_cell check-installed"


def test_check_sources_let_the_installed_packages_win(tmp_path):
    """``python -m`` (like ``-c``) puts the working folder first on sys.path. From the folder
    stage_check_sources makes (as from cibuildwheel's test folder), ci is that copy, while
    mamba_kernels and the kernel packages come from the installed ones (a site folder here),
    never from the checkout; csrc/ still tells which kernels have sources."""
    check = build_cell.stage_check_sources(tmp_path / "check")
    assert sorted(p.name for p in check.iterdir()) == sorted(build_cell.CHECK_SOURCES)
    site = tmp_path / "site"
    site.mkdir()
    packages = ("mamba_kernels", "causal_conv1d", "selective_scan")
    for name in packages:
        (site / name).symlink_to(ROOT / name, target_is_directory=True)
    code = ("import sys, ci.build_cell as b, " + ", ".join(packages) + "; "
            "print(b.__file__); print(b.kernels_with_sources()); "
            + "; ".join(f"print({n}.__file__)" for n in packages))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    r = subprocess.run([sys.executable, "-c", code], cwd=check, env=dict(env, PYTHONPATH=str(site)),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert Path(lines[0]).parent == check / "ci"
    assert lines[1] == repr(build_cell.kernels_with_sources())
    assert [Path(f).parent.parent for f in lines[2:]] == [site] * len(packages)
