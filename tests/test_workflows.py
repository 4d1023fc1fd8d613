"""The GitHub workflows and the cibuildwheel configuration, checked offline.

Tools (installed by scripts/setup.sh; a missing tool fails the test, it is never skipped):
check-jsonschema (GitHub's workflow schema, bundled), zizmor (--offline), cibuildwheel.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mamba_kernels import matrix

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert path, f"{name} is not installed: scripts/setup.sh installs it (pip install {name})"
    return str(path)


def _load(name: str, rel: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build_cell = _load("build_cell", "ci/build_cell.py")
torch_watch = _load("torch_watch", "ci/torch_watch.py")


def test_workflows_exist():
    assert {p.name for p in WORKFLOWS} >= {"release.yml", "torch-watch.yml"}


def test_workflows_match_github_schema():
    r = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_zizmor_reports_nothing_at_medium_or_above():
    r = subprocess.run(
        [
            tool("zizmor"),
            "--offline",
            "--min-severity",
            "medium",
            "--format",
            "plain",
            str(ROOT / ".github" / "workflows"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("wf", WORKFLOWS, ids=lambda p: p.name)
def test_actions_pinned_by_commit_and_no_default_permissions(wf):
    text = wf.read_text()
    uses = re.findall(r"uses:\s*([^\s#]+)", text)
    assert uses
    for u in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", u), f"{wf.name}: {u} is not pinned to a commit"
    assert re.search(r"^permissions: \{\}$", text, re.M), f"{wf.name}: top-level permissions must be {{}}"
    for job in re.split(r"\n  (?=[\w-]+:\n)", text.split("\njobs:\n", 1)[1]):
        assert "timeout-minutes:" in job, f"{wf.name}: a job without timeout-minutes"


def test_pull_requests_get_no_write_permissions_or_secrets():
    text = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert "${{ secrets." not in text
    # Only the publish and pages jobs write, and they run for tags only.
    assert text.count("contents: write") == 1 and text.count("pages: write") == 1
    publish = text.split("\n  publish:\n", 1)[1].split("\n  pages:\n", 1)[0]
    assert "startsWith(github.ref, 'refs/tags/v')" in publish


def _cibw_env_cases():
    """Distinct cibuildwheel environments over every cell of the matrix (the env depends only on
    the Python, platform and image, so this covers every cell)."""
    seen = {}
    for cell in matrix.select():
        env = build_cell.cibuildwheel_env(cell, "/tmp/sccache")
        key = (
            env["CIBW_BUILD"],
            env["CIBW_PLATFORM"],
            env["CIBW_ARCHS"],
            env.get("CIBW_MANYLINUX_X86_64_IMAGE"),
            env.get("CIBW_MANYLINUX_AARCH64_IMAGE"),
        )
        seen.setdefault(key, (cell, env))
    return list(seen.values())


def test_cibuildwheel_selects_exactly_each_cells_python():
    cases = _cibw_env_cases()
    assert len(cases) >= 10
    cibw = tool("cibuildwheel")
    base = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
    for cell, env in cases:
        r = subprocess.run(
            [
                cibw,
                "--config-file",
                str(ROOT / "ci" / "cibuildwheel.toml"),
                "--print-build-identifiers",
                str(ROOT),
            ],
            env={**base, **env},
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [matrix.cibuildwheel_identifier(cell)], (matrix.cell_id(cell), r.stdout)
        py = "cp" + cell.python.replace(".", "")
        assert r.stdout.startswith(py + "-")


def test_cibuildwheel_env_of_a_cell():
    (cell,) = matrix.select(torch="2.4", cuda="11.8", python="3.10", platform="linux_x86_64")
    env = build_cell.cibuildwheel_env(cell, "/tmp/cache")
    assert env["MAMBA_KERNELS_CI_CELL"] == "cu118torch2.4-cp310-linux_x86_64"
    assert env["CIBW_MANYLINUX_X86_64_IMAGE"] == "manylinux2014"
    assert 'CUDA_HOME="/usr/local/cuda-11.8"' in env["CIBW_ENVIRONMENT_LINUX"]
    assert 'MAMBA_KERNELS_RELEASE="1"' in env["CIBW_ENVIRONMENT_LINUX"]
    assert env["CIBW_CONTAINER_ENGINE"] == "docker; create_args: --volume /tmp/cache:/sccache"
    (win,) = matrix.select(torch="2.14", cuda="13.2", python="3.12", platform="win_amd64")
    wenv = build_cell.cibuildwheel_env(win)
    assert wenv["CIBW_BUILD"] == "cp312-win_amd64" and "CIBW_ENVIRONMENT_LINUX" not in wenv
    assert (
        r'CUDA_PATH="C:\Program Files\NVIDIA GPU Computing Toolkit\CUDA\v13.2"'
        in wenv["CIBW_ENVIRONMENT_WINDOWS"]
    )


def test_build_cell_cli_env_and_bad_cell():
    r = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "build_cell.py"), "env", "cu130torch2.14-cp311-linux_x86_64"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and json.loads(r.stdout)["CIBW_BUILD"] == "cp311-manylinux_x86_64"
    r = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "build_cell.py"), "env", "cu130torch9.9-cp311-linux_x86_64"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "cell must be a cell id" in r.stderr


def test_torch_watch_finds_a_new_release_and_proposes_a_line(tmp_path):
    newest = max((r.torch for r in torch_watch.support.RELEASES), key=lambda t: tuple(map(int, t.split("."))))
    major, minor = map(int, newest.split("."))
    new = f"{major}.{minor + 1}.0"
    files = [
        {"filename": f"torch-{new}-cp3{m}-cp3{m}-manylinux_2_28_x86_64.whl"} for m in (11, 12, 13, 14, 15)
    ]
    files.append({"filename": f"torch-{new}-cp312-cp312-win_amd64.whl"})
    pypi = {
        "info": {
            "requires_python": ">=3.11",
            "requires_dist": ["filelock", "cuda-toolkit[cublas,cudart]==13.2.1; platform_system == 'Linux'"],
        },
        "releases": {new: files, f"{newest}.0": [{"filename": "x.whl"}], f"{major}.{minor + 2}.0rc1": files},
    }
    assert torch_watch.newest_missing(pypi) == new
    f = torch_watch.facts(pypi, new)
    assert f["pythons"] == ["3.11", "3.12", "3.13", "3.14", "3.15"] and f["pypi_cuda"] == "13.2"
    src = tmp_path / "support.py"
    src.write_text("RELEASES: Tuple[TorchRelease, ...] = (\n    _release('2.1'),\n)\n# fmt: on\n")
    torch_watch.apply(torch_watch.table_line(f), src)
    text = src.read_text()
    assert text.index(f'_release("{major}.{minor + 1}", ("3.11", "3.15"), ("13.2",)') > text.index("'2.1'")
    assert text.rstrip().endswith(")\n# fmt: on")
    compile(text.replace("Tuple[TorchRelease, ...]", "tuple"), "support.py", "exec")
    assert torch_watch.newest_missing({"releases": {f"{newest}.1": files}}) is None
