"""The GitHub workflows and the cibuildwheel configuration, checked offline.

Tools (the test extra installs them; a missing tool fails the test, it is never skipped):
check-jsonschema (GitHub's workflow schema, bundled), zizmor (--offline), cibuildwheel.

The workflows are read with a YAML parser, and the shell steps that decide something (the plan,
the index merge before a Pages deploy) run here under bash exactly as GitHub's ``shell: bash``
runs them (``bash --noprofile --norc -eo pipefail``), with ``gh`` replaced by a stub and the
published site served on 127.0.0.1.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
from ruamel.yaml import YAML
from wheel_files import write_wheel

from ci import build_cell, cell_fields, plan, platforms, release_assets
from mamba_kernels.facts import support
from mamba_kernels.release import matrix

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW_DIR = ROOT / ".github" / "workflows"
WORKFLOWS = sorted(WORKFLOW_DIR.glob("*.yml"))
BIN = Path(sys.executable).parent
GITHUB_MATRIX_LIMIT = 256  # jobs per matrix GitHub accepts (docs/RELEASING.md)


def tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert path, f"{name} is not installed: the test extra installs it (pip install {name})"
    return str(path)


def workflow(name: str) -> Dict[str, Any]:
    return YAML(typ="safe").load((WORKFLOW_DIR / name).read_text())


def step(wf: Dict[str, Any], job: str, name: str) -> Dict[str, Any]:
    """The step of ``job`` whose id or name is ``name``."""
    for s in wf["jobs"][job]["steps"]:
        if name in (s.get("id"), s.get("name")):
            return s
    raise AssertionError(f"job {job} has no step {name!r}")


def run_step(
    s: Dict[str, Any], tmp_path: Path, env: Dict[str, str], stubs: Optional[Dict[str, str]] = None
) -> subprocess.CompletedProcess:
    """Run a step's script the way GitHub's ``shell: bash`` does, in ``tmp_path``; ``python`` is
    this interpreter (importing this checkout), ``stubs`` replace commands (name -> script)."""
    script = s["run"]
    assert "${{" not in script, "expressions belong in env:, never inside a script"
    shim = tmp_path / "_bin"
    shim.mkdir(exist_ok=True)
    (shim / "python").unlink(missing_ok=True)
    (shim / "python").symlink_to(sys.executable)
    for name, body in (stubs or {}).items():
        (shim / name).write_text("#!/bin/bash\n" + body)
        (shim / name).chmod(0o755)
    (tmp_path / "_script.sh").write_text(script)
    for f in ("_output", "_summary"):
        (tmp_path / f).write_text("")
    (tmp_path / "_temp").mkdir(exist_ok=True)
    full = {
        "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PYTHONPATH": str(ROOT),
        "GITHUB_OUTPUT": str(tmp_path / "_output"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "_summary"),
        "RUNNER_TEMP": str(tmp_path / "_temp"),
        "GITHUB_WORKSPACE": str(ROOT),  # the checkout
        **env,
    }
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(tmp_path / "_script.sh")],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
    )


def outputs(tmp_path: Path) -> Dict[str, str]:
    lines = (tmp_path / "_output").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


# ------------------------------------------------------------------ GitHub's own checks


def test_workflows_exist():
    assert {p.name for p in WORKFLOWS} >= {"release.yml", "torch-watch.yml", "build-cells.yml"}


def test_workflows_match_github_schema():
    r = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_zizmor_reports_nothing_at_medium_or_above():
    r = subprocess.run(
        [tool("zizmor"), "--offline", "--min-severity", "medium", "--format", "plain", str(WORKFLOW_DIR)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


# ------------------------------------------------------------------ pins and permissions

_USES = re.compile(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$", re.M)


@pytest.mark.parametrize("wf", WORKFLOWS, ids=lambda p: p.name)
def test_actions_pinned_by_commit_with_a_version_comment(wf):
    found = _USES.findall(wf.read_text())
    assert found
    for ref, rest in found:
        if ref.startswith("./"):
            assert (ROOT / ref).is_file(), f"{wf.name}: {ref} does not exist"
            continue
        pinned = re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref)
        assert pinned, f"{wf.name}: {ref} is not pinned to a commit"
        assert re.fullmatch(r"\s*# v\d+\.\d+\.\d+\s*", rest), f"{wf.name}: {ref} lacks its '# vX.Y.Z' comment"


# The oldest major of each action known to run on Node 24 (Node 20 is retired on the runners), read
# off the actions' action.yml (`runs.using`) at their tags on 2026-12-04; where an older major may
# also, it is not claimed. Composite actions count by the actions they call: upload-pages-artifact
# v5 calls upload-artifact v7, v4 calls v4.6.2 and v3 a floating upload-artifact@v4 (Node 20).
NODE24_FROM = {
    "actions/checkout": 5, "actions/setup-python": 6, "actions/upload-artifact": 6,
    "actions/download-artifact": 7, "actions/cache": 5, "actions/deploy-pages": 5,
    "actions/upload-pages-artifact": 5, "actions/create-github-app-token": 3,
    "actions/attest-build-provenance": 4,
}


@pytest.mark.parametrize("wf", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_a_release_that_runs_on_node_24(wf):
    for ref, rest in _USES.findall(wf.read_text()):
        if ref.startswith("./") or ref.startswith("pypa/"):  # pypa's action is a container action
            continue
        name = "/".join(ref.split("@")[0].split("/")[:2])
        major = int(re.search(r"# v(\d+)\.", rest).group(1))
        assert name in NODE24_FROM, f"{wf.name}: {name}: add its first Node 24 release to NODE24_FROM"
        assert major >= NODE24_FROM[name], f"{wf.name}: {ref} (v{major}) still runs on Node 20"


@pytest.mark.parametrize("wf", WORKFLOWS, ids=lambda p: p.name)
def test_no_default_permissions_and_every_job_has_a_time_limit(wf):
    data = workflow(wf.name)
    assert data["permissions"] == {}, f"{wf.name}: top-level permissions must be {{}}"
    for name, job in data["jobs"].items():
        assert "permissions" in job, f"{wf.name}: job {name} states no permissions"
        # A job calling a reusable workflow has no steps; the called jobs carry the limit.
        assert "uses" in job or "timeout-minutes" in job, f"{wf.name}: job {name} has no timeout-minutes"


def _pip_requirements(script: str):
    """Every requirement a step's pip installs: its arguments, and the lines of a ``-r`` file."""
    for line in script.replace("\\\n", " ").splitlines():
        if "pip install" in line:
            toks = line.split("pip install", 1)[1].split()
            for i, tok in enumerate(toks):
                if i and toks[i - 1] == "-r":
                    for req in (ROOT / tok).read_text().splitlines():
                        if req.strip() and not req.startswith("#"):
                            assert "--hash=sha256:" in req, f"{tok}: {req} carries no hash"
                            yield req.split()[0]
                elif not tok.startswith("-") and tok != '"${tools[@]}"':
                    yield tok


def test_every_job_that_imports_the_checkout_installs_its_requirements_first():
    """setup-python's interpreter holds pip only: a job that runs ``python -m ci.*`` or ``python -m
    mamba_kernels`` from the checkout must install ci/jobs-requirements.txt before (packaging)."""
    install = "python -m pip install --require-hashes -r ci/jobs-requirements.txt"
    seen = 0
    for wf in WORKFLOWS:
        for name, job in workflow(wf.name)["jobs"].items():
            runs = [s.get("run", "") for s in job.get("steps", [])]
            users = [i for i, r in enumerate(runs) if re.search(r"(^|\s)python -m (ci\.|mamba_kernels)", r)]
            if not users:
                continue
            seen += 1
            first = next((i for i, r in enumerate(runs) if install in r), None)
            assert first is not None and first <= users[0], f"{wf.name} job {name} imports the checkout " \
                f"before installing ci/jobs-requirements.txt"
    assert seen >= 8


def test_every_tool_a_workflow_installs_is_pinned():
    env_pins: Dict[str, str] = {}
    seen = 0
    for wf in WORKFLOWS:
        data = workflow(wf.name)
        env_pins.update(data.get("env", {}))
        for job in data["jobs"].values():
            for s in job.get("steps", []):
                for req in _pip_requirements(s.get("run", "")):
                    seen += 1
                    assert "==" in req, f"{wf.name}: pip installs {req} without a pinned version"
        for m in re.finditer(r'tools\+?=\(([^)]*)\)', wf.read_text()):
            for req in m.group(1).split():
                seen += 1
                assert "==" in req, f"{wf.name}: {req} is not pinned"
    assert seen >= 2
    assert re.fullmatch(r"\d+\.\d+\.\d+", env_pins["CIBUILDWHEEL_VERSION"])
    assert re.fullmatch(r"\d+\.\d+\.\d+", env_pins["DELVEWHEEL_VERSION"])
    # The test extra checks the configuration with the same cibuildwheel the builds run.
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"cibuildwheel=={env_pins["CIBUILDWHEEL_VERSION"]}"' in pyproject


def test_pull_requests_get_no_write_permissions_or_secrets():
    data = workflow("release.yml")
    assert "${{ secrets." not in (WORKFLOW_DIR / "release.yml").read_text()
    writers = {n for n, j in data["jobs"].items() if "write" in (j.get("permissions") or {}).values()}
    assert writers == {"publish", "pages", "publish-testpypi", "publish-pypi"}
    for name in ("publish-testpypi", "publish-pypi"):  # trusted publishing: the OIDC token only
        assert data["jobs"][name]["permissions"] == {"id-token": "write"}
        assert "startsWith(github.ref, 'refs/tags/v')" in data["jobs"][name]["if"]
    assert "startsWith(github.ref, 'refs/tags/v')" in data["jobs"]["publish"]["if"]
    assert data["jobs"]["pages"]["needs"] == ["publish", "sdist"]
    assert "needs.publish.result == 'success'" in data["jobs"]["pages"]["if"]
    for job in workflow("build-cells.yml")["jobs"].values():
        assert job["permissions"] == {"contents": "read"}


# ------------------------------------------------------------------ the plan


def _plan(tmp_path, event="workflow_dispatch", **filters):
    s = step(workflow("release.yml"), "plan", "plan")
    env = {"EVENT": event, **{f"IN_{k.upper()}": v for k, v in filters.items()}}
    return run_step(s, tmp_path, env)


@pytest.mark.parametrize(
    "filters",
    [
        {"torch": "2.0"},  # older than the support table (a newer one is served by the stable cells)
        {"cuda": "13"},  # not an exact CUDA variant
        {"torch": "2.1", "cuda": "13.0"},  # both exist, never together
        {"os": "macos"},
    ],
)
def test_a_dispatch_filter_matching_no_cell_fails_the_plan(tmp_path, filters):
    r = _plan(tmp_path, **filters)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "::error" in r.stdout
    assert not any(k.startswith(("linux", "win", "n_", "total")) for k in outputs(tmp_path))


def test_a_filtered_dispatch_is_split_per_platform(tmp_path):
    r = _plan(tmp_path, torch="2.14", os="windows")
    assert r.returncode == 0, r.stdout + r.stderr
    out = outputs(tmp_path)
    want = [matrix.cell_id(c) for c in matrix.select(torch="2.14", os="windows")]
    assert out["n_win_amd64"] == str(len(want)) == out["total"]
    assert out["n_linux_x86_64"] == out["n_linux_aarch64"] == "0"
    assert [c["id"] for c in json.loads(out["win_amd64"])["include"]] == want
    assert json.loads(out["linux_x86_64"]) == {"include": []}


def test_the_whole_matrix_fits_githubs_job_limit(tmp_path):
    r = _plan(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = outputs(tmp_path)
    assert int(out["total"]) == len(matrix.select())
    for p in support.PLATFORMS:
        cells = json.loads(out[p])["include"]
        assert len(cells) == int(out[f"n_{p}"]) <= GITHUB_MATRIX_LIMIT
        assert cells == [plan.build_entry(c) for c in matrix.select(platform=p)]
    # GitHub counts one job's outputs together, as UTF-16, against 1 MB (docs/RELEASING.md)
    size = sum(len((k + v).encode("utf-16-le")) for k, v in out.items())
    assert size == plan.output_bytes(out) < plan.OUTPUT_LIMIT_BYTES // 8, size


def test_the_release_workflow_has_a_build_job_per_platform_of_the_table():
    # the platform records (facts/support.json) are what the workflow must follow: per platform
    # the plan's two outputs, one build job that takes its matrix and runs only when it has cells,
    # and the check waits for every build job; the dispatch inputs name the table's platforms
    wf = workflow("release.yml")
    jobs = wf["jobs"]
    names = list(support.PLATFORMS)
    want_outputs = names + [f"n_{p}" for p in names] + ["total"]
    assert sorted(jobs["plan"]["outputs"]) == sorted(want_outputs)
    builds = {j: spec for j, spec in jobs.items() if j.startswith("build-")}
    fed = {}
    for job, spec in builds.items():
        m = re.fullmatch(r"\$\{\{ needs\.plan\.outputs\.(\w+) \}\}", spec["with"]["matrix"])
        assert m and spec["if"] == f"needs.plan.outputs.n_{m.group(1)} != '0'", job
        fed[m.group(1)] = job
    assert sorted(fed) == sorted(names) and len(builds) == len(names)
    assert set(builds) <= set(jobs["check"]["needs"])
    inputs = (wf["on"] if "on" in wf else wf[True])["workflow_dispatch"]["inputs"]  # YAML 1.1: on is True
    assert re.findall(r"\w+_\w+", inputs["platform"]["description"]) == names
    os_words = re.findall(r"\w+", inputs["os"]["description"].split("(")[0])
    assert [w for w in os_words if w != "or"] == list(matrix.OS_NAMES)


def test_build_jobs_read_only_the_fields_the_plan_hands_them():
    text = (WORKFLOW_DIR / "build-cells.yml").read_text()
    used = set(re.findall(r"\bmatrix\.(\w+)", text))
    assert used == set(plan.BUILD_FIELDS), used ^ set(plan.BUILD_FIELDS)


def _vkey(v: str):
    return tuple(int(x) for x in v.split("."))


def _toolkit_source(c) -> str:
    """Where the cell's CUDA toolkit comes from, read from the facts: cell_fields.toolkit_source, and for
    NVIDIA's Linux toolkits the source support.json's linux_toolkits picks for the image (a RHEL
    repository or the redistributable archives)."""
    source = cell_fields.toolkit_source(c)
    if source != "nvidia-repo":
        return source
    return support.linux_toolkit(c.cuda, c.manylinux, "linux-x86_64" if c.platform == "linux_x86_64"
                                 else "linux-sbsa").source


def _host_compiler(c) -> tuple:
    """The host-compiler setting of the cell's build: what its platform module's compiler_env sets
    (a gcc-toolset's CC/CXX, the MSVC toolset of an old CUDA on Windows; nothing: the image's or
    runner's own)."""
    return tuple(sorted(platforms.for_cell(c).compiler_env(c).items()))


def _family(c) -> tuple:
    """A toolchain family computed here from the facts (not with plan.family): platform, image, CUDA
    major, binding, toolkit source, host-compiler setting, and a stable cell's build torch."""
    return (c.platform, c.manylinux or "windows", c.cuda.split(".")[0], "stable" if c.stable else "classic",
            _toolkit_source(c), _host_compiler(c), c.build_with[0] if c.stable else "")


def test_pull_request_smoke_builds_one_cell_per_toolchain_family(tmp_path):
    r = _plan(tmp_path, event="pull_request", torch="2.1")  # inputs are ignored on pull requests
    assert r.returncode == 0, r.stdout + r.stderr
    out = outputs(tmp_path)
    planned = [c["id"] for p in support.PLATFORMS
               for c in json.loads(out[p])["include"]]
    cells = {matrix.cell_id(c): c for c in matrix.select()}
    families = {_family(c) for c in cells.values()}
    got = [_family(cells[i]) for i in planned]
    # every family the matrix contains, each exactly once, and nothing else
    assert sorted(got) == sorted(families) and len(got) == len(set(got)) == int(out["total"])
    # the families issue 15 names (platform, image, CUDA major, binding) are among them
    for fam in [("linux_x86_64", "manylinux_2_17", "11", "classic"),
                ("linux_x86_64", "manylinux_2_17", "12", "classic"),
                ("linux_x86_64", "manylinux_2_28", "12", "classic"),
                ("linux_aarch64", "manylinux_2_28", "12", "classic"),
                ("win_amd64", "windows", "12", "classic"), ("win_amd64", "windows", "13", "classic"),
                ("linux_x86_64", "manylinux_2_28", "13", "stable"), ("win_amd64", "windows", "12", "stable")]:
        assert fam in {g[:4] for g in got}, fam
    # within a family, the newest torch (the build torch of a stable cell), then CUDA, then Python
    for i in planned:
        c = cells[i]
        same = [d for d in cells.values() if _family(d) == _family(c)]
        key = lambda d: (_vkey(d.build_with[0]), _vkey(d.cuda), _vkey(d.python))  # noqa: E731
        assert key(c) == max(map(key, same)), i
    summary = (tmp_path / "_summary").read_text()
    assert all(f"- {i} (" in summary for i in planned) and "plan outputs:" in summary


def test_every_cell_has_a_smoke_cell_of_its_toolkit_source_host_compiler_and_build_torch():
    """Each cell's toolkit source (manylinux2014's CUDA 12.1 from NVIDIA's RHEL 7 repository, its
    12.4 from the redistributable archives), host-compiler setting (a gcc-toolset or the image's GCC,
    the MSVC toolset of Windows below CUDA 12.4) and build torch (the cu128 stable cells build with
    torch 2.11, the others with 2.14) is built by some smoke cell of its platform, image, CUDA major
    and binding."""
    cells = matrix.select()
    smoke = plan.smoke_cells(cells)
    have = {_family(s) for s in smoke}
    assert [matrix.cell_id(c) for c in cells if _family(c) not in have] == []
    assert len(have) == len(smoke)  # and one smoke cell each
    # plan.family tells the same families apart, no more, no fewer
    assert len({plan.family(c) for c in cells}) == len({_family(c) for c in cells}) == len(smoke)


def test_a_new_family_in_the_matrix_gets_its_own_smoke_cell():
    cells = matrix.select()
    extra = support.Cell("2.9", "12.8", "3.12", "linux_x86_64", True, "manylinux_2_34", 17)
    picked = plan.smoke_cells(cells + [extra])
    assert extra in picked and len(picked) == len(plan.smoke_cells(cells)) + 1


# ------------------------------------------------------------------ the build jobs


def test_build_jobs_are_one_reusable_workflow():
    called = workflow("build-cells.yml")
    assert set(called["on"]) == {"workflow_call"}
    assert called["on"]["workflow_call"]["inputs"]["matrix"]["required"] is True
    (job,) = called["jobs"].values()
    assert job["strategy"]["matrix"] == "${{ fromJSON(inputs.matrix) }}"
    release = workflow("release.yml")
    builds = {n: j for n, j in release["jobs"].items() if n.startswith("build")}
    assert set(builds) == {"build-linux-x86_64", "build-linux-aarch64", "build-windows"}
    for name, j in builds.items():
        assert j["uses"] == "./.github/workflows/build-cells.yml"
        plat = {"build-windows": "win_amd64"}.get(name, name.replace("build-", "").replace("-", "_"))
        assert j["with"]["matrix"] == f"${{{{ needs.plan.outputs.{plat} }}}}"
        assert j["if"] == f"needs.plan.outputs.n_{plat} != '0'"
    # No job of release.yml builds a cell itself.
    assert not [n for n, j in release["jobs"].items() if "matrix" in j.get("strategy", {})]
    assert set(release["jobs"]["check"]["needs"]) >= set(builds)


def _cache_steps():
    (job,) = workflow("build-cells.yml")["jobs"].values()
    restore = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/cache/restore@"))
    save = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/cache/save@"))
    return restore, save


def _expand(template: str, fields: Dict[str, Any]) -> str:
    def sub(m):
        expr = m.group(1).strip()
        if expr.startswith("matrix."):
            return str(fields[expr[len("matrix."):]])
        return {"github.sha": "SHA", "github.run_attempt": "2"}[expr]

    return re.sub(r"\$\{\{(.*?)\}\}", sub, template)


def test_compiler_cache_keys_are_per_attempt_and_shared_by_a_few_groups():
    restore, save = _cache_steps()
    key = restore["with"]["key"]
    assert save["with"]["key"] == key and "always()" in save["if"]
    assert "github.run_attempt" in key, "a re-run must be able to save its progress under a new key"
    assert "matrix.id" not in key, "one cache per cell churns the repository's 10 GB cache space"
    prefixes = [k.strip() for k in restore["with"]["restore-keys"].splitlines() if k.strip()]
    linux = [c for c in matrix.select() if c.platform != "win_amd64"]
    groups = set()
    for cell in linux:
        f = cell_fields.ci_fields(cell)
        k = _expand(key, f)
        assert all(k.startswith(_expand(p, f)) for p in prefixes)
        groups.add(_expand(prefixes[-1], f))
    # Each group is an independent toolkit + host compiler; a few dozen caches, not hundreds.
    assert len(groups) <= 32 < len(linux), len(groups)


def test_linux_nvcc_objects_are_cacheable():
    # torch's ninja rule gives nvcc -MD unless TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES=1, and
    # sccache does not cache such compiles.
    from cibuildwheel.environment import parse_environment

    (cell,) = matrix.select(torch="2.14", cuda="13.0", python="3.12", platform="linux_x86_64")
    env = build_cell.cibuildwheel_env(cell, "/tmp/sccache")
    parsed = parse_environment(env["CIBW_ENVIRONMENT_LINUX"]).as_dictionary({"PATH": "/usr/bin"})
    assert parsed.get("TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES") == "1"


# ------------------------------------------------------------------ publishing


def test_each_wheel_is_attested_and_attached_before_the_index_points_at_it():
    jobs = workflow("release.yml")["jobs"]
    pub = jobs["publish"]
    assert pub["permissions"] == {"contents": "write", "id-token": "write", "attestations": "write"}
    names = [s.get("uses", "").split("@")[0] or s.get("name") for s in pub["steps"]]
    attest = names.index("actions/attest-build-provenance")
    assert pub["steps"][attest]["with"]["subject-path"] == "wheels/*.whl"
    upload = next(i for i, s in enumerate(pub["steps"]) if "-m ci.release_assets" in s.get("run", ""))
    assert attest < upload
    assert pub["needs"] == ["check", "sdist"] and "needs.sdist.result == 'success'" in pub["if"]
    assert pub["steps"][upload]["env"]["PRERELEASE"] == "${{ needs.sdist.outputs.prerelease }}"
    pages = jobs["pages"]
    assert pages["needs"] == ["publish", "sdist"]
    assert pages["environment"]["name"] == "github-pages"
    assert pages["concurrency"] == {"group": "pages-deploy", "cancel-in-progress": False}
    up = next(s for s in pages["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    dep = next(s for s in pages["steps"] if s.get("uses", "").startswith("actions/deploy-pages@"))
    assert up["with"]["name"] == dep["with"]["artifact_name"]
    assert up["with"]["path"] == "site"


def _wheel(folder: Path, label: str, py: str = "cp312") -> Path:
    """A minimal wheel of this project for the variant ``label`` (cu130torch2.14)."""
    torch = label.split("torch")[1]
    version = f"0.1.0+{label}"
    di = f"mamba_kernels-{version}.dist-info"
    plat = "manylinux_2_28_x86_64"
    files = {
        "mamba_kernels/_test_probe.py": b"VALUE = 1\n",
        f"{di}/METADATA": (
            f"Metadata-Version: 2.1\nName: mamba-kernels\nVersion: {version}\n"
            f"Requires-Python: >=3.9\nRequires-Dist: torch=={torch}.*\n\n"
        ).encode(),
        f"{di}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {py}-{py}-{plat}\n"
        ).encode(),
    }
    return write_wheel(folder / f"mamba_kernels-{version}-{py}-{py}-{plat}.whl", files, di)


@pytest.fixture
def site_server(tmp_path):
    """Serves tmp_path/published on 127.0.0.1; ``status`` forces an HTTP error for every GET."""
    root = tmp_path / "published"
    root.mkdir()
    state = {"status": None, "paths": []}

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            state["paths"].append(self.path)
            api = re.fullmatch(r"/api/(\w+)/repos/owner/repo/pages", self.path)
            if api:  # GitHub's Pages API, as _merge_step points GITHUB_API_URL here
                body = json.dumps({"html_url": f"http://127.0.0.1:{self.server.server_address[1]}/",
                                   "build_type": api.group(1)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif state["status"]:
                self.send_error(state["status"])
            else:
                super().do_GET()

        def log_message(self, *args):
            pass

    handler = functools.partial(Handler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", root, state
    server.shutdown()
    server.server_close()


ASSET = "https://github.com/owner/repo/releases/download/{tag}/{{filename}}"


def _merge_step(tmp_path, url, build_type="workflow", tag="v0.2.0", prerelease="false"):
    s = step(workflow("release.yml"), "pages", "index")
    env = {"REPO": "owner/repo", "GH_TOKEN": "x", "ASSET_URL": ASSET.format(tag=tag), "NONCE": "7-1",
           "PRERELEASE": prerelease, "GITHUB_API_URL": f"{url}api/{build_type}"}
    return run_step(s, tmp_path, env)


def _manifest(site: Path) -> Dict[str, str]:
    data = json.loads((site / "manifest.json").read_text())
    return {w["filename"]: w["url"] for w in data["wheels"]}


def test_a_deploy_keeps_every_published_wheel(tmp_path, site_server):
    url, published, state = site_server
    old = _wheel(tmp_path / "old", "cu126torch2.13")
    r = subprocess.run(
        [sys.executable, "-m", "mamba_kernels", "index", str(old.parent), str(published.parent / "p"),
         "--asset-url", ASSET.format(tag="v0.1.0")],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    published.rmdir()
    (published.parent / "p").rename(published)
    new = _wheel(tmp_path / "wheels", "cu130torch2.14")
    r = _merge_step(tmp_path, url)
    assert r.returncode == 0, r.stdout + r.stderr
    got = _manifest(tmp_path / "site")
    assert set(got) == {old.name, new.name}
    assert got[new.name].startswith("https://github.com/owner/repo/releases/download/v0.2.0/")
    assert got[old.name].startswith("https://github.com/owner/repo/releases/download/v0.1.0/")
    assert any(p.startswith("/manifest.json?") for p in state["paths"]), "the manifest is fetched past caches"


def _publish_index(folder: Path, wheels_dir: Path, tag: str) -> None:
    """What an earlier deploy left at ``folder``: the index of ``wheels_dir``'s wheels."""
    out = folder.parent / (folder.name + ".new")
    r = subprocess.run(
        [sys.executable, "-m", "mamba_kernels", "index", str(wheels_dir), str(out),
         "--asset-url", ASSET.format(tag=tag)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    if folder.exists():
        folder.rmdir()
    out.rename(folder)


def test_a_pre_release_goes_to_the_pre_release_index_only(tmp_path, site_server):
    url, published, state = site_server
    old = _wheel(tmp_path / "old", "cu126torch2.13")
    _publish_index(published, old.parent, "v0.1.0")
    rc = _wheel(tmp_path / "wheels", "cu130torch2.14")
    r = _merge_step(tmp_path, url, tag="v0.2.0rc1", prerelease="true")
    assert r.returncode == 0, r.stdout + r.stderr
    # the live index (the site's root, what pip's documented URLs and the resolver read) is as it was
    assert set(_manifest(tmp_path / "site")) == {old.name}
    pre = _manifest(tmp_path / "site" / "pre")
    assert set(pre) == {rc.name}
    assert pre[rc.name].startswith("https://github.com/owner/repo/releases/download/v0.2.0rc1/")
    assert any(p.startswith("/pre/manifest.json?") for p in state["paths"])
    assert not (tmp_path / "site" / "cu130torch2.14").exists()  # no live variant page for it


def test_a_release_after_its_pre_release_keeps_the_pre_release_index(tmp_path, site_server):
    url, published, _ = site_server
    old = _wheel(tmp_path / "old", "cu126torch2.13")
    _publish_index(published, old.parent, "v0.1.0")
    rc = _wheel(tmp_path / "rc", "cu128torch2.8")
    _publish_index(published / "pre", rc.parent, "v0.2.0rc1")
    new = _wheel(tmp_path / "wheels", "cu130torch2.14")
    r = _merge_step(tmp_path, url, tag="v0.2.0", prerelease="false")
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(_manifest(tmp_path / "site")) == {old.name, new.name}
    assert set(_manifest(tmp_path / "site" / "pre")) == {rc.name}


def test_the_first_pre_release_writes_no_live_index(tmp_path, site_server):
    url, _, _ = site_server  # nothing published: both manifests answer 404
    rc = _wheel(tmp_path / "wheels", "cu130torch2.14")
    r = _merge_step(tmp_path, url, tag="v0.1.0rc1", prerelease="true")
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(_manifest(tmp_path / "site" / "pre")) == {rc.name}
    assert not (tmp_path / "site" / "manifest.json").exists()


# ------------------------------------------------------------------ the Release (ci/release_assets.py)


@pytest.fixture
def github(tmp_path):
    """The GitHub API stand-in (ci/rehearsal/github_api.py) on 127.0.0.1, state in tmp_path/gh."""
    from ci.rehearsal.github_api import GitHubStandIn

    with GitHubStandIn(tmp_path / "gh") as standin:
        yield standin


def _publish_step(tmp_path, github, tag="v0.2.0", prerelease="false"):
    """The publish job's release step, as GitHub runs it, against the stand-in."""
    (s,) = [s for s in workflow("release.yml")["jobs"]["publish"]["steps"]
            if "python -m ci.release_assets --repo" in s.get("run", "")]
    env = {"REPO": "owner/repo", "TAG": tag, "PRERELEASE": prerelease, "GH_TOKEN": "x",
           "GITHUB_API_URL": github.url, "GITHUB_REPOSITORY_OWNER": "owner"}
    return run_step(s, tmp_path, env)


def _two_wheels(tmp_path):
    return [_wheel(tmp_path / "wheels", "cu130torch2.14"), _wheel(tmp_path / "wheels", "cu126torch2.13")]


def _release(github, tag="v0.2.0"):
    (rel,) = [r for r in github.state()["repos"]["owner/repo"]["releases"] if r["tag_name"] == tag]
    return rel


@pytest.mark.parametrize("pre", [True, False])
def test_wheels_go_to_a_draft_that_is_published_last(tmp_path, github, pre):
    wheels = _two_wheels(tmp_path)
    tag = "v0.2.0rc1" if pre else "v0.2.0"
    r = _publish_step(tmp_path, github, tag, "true" if pre else "false")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("pre-release" in r.stdout) is pre and "(2 uploaded, 0 kept, 0 replaced)" in r.stdout
    assert [m for m, _, _ in github.requests()] == ["GET", "POST", "POST", "POST", "GET", "PATCH"]
    uploads = [p for m, p, _ in github.requests() if "/assets?" in p]
    assert sorted(p.split("?", 1)[1] for p in uploads) == sorted(f"name={urllib.parse.quote(w.name)}"
                                                                  for w in wheels)
    rel = _release(github, tag)
    assert rel["draft"] is False and rel["prerelease"] is pre
    assert rel["make_latest"] == ("false" if pre else "true")
    assert rel["body"] == f"Wheels per variant; index: https://owner.github.io/repo/{'pre/' if pre else ''}"
    assert {a["name"]: a["digest"] for a in rel["assets"]} == {
        w.name: "sha256:" + hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels}


def test_a_rerun_completes_a_draft_and_accepts_a_published_release_with_the_same_wheels(tmp_path, github):
    wheels = _two_wheels(tmp_path)
    github.seed_release("owner/repo", "v0.2.0", [(wheels[0].name, wheels[0].read_bytes())])  # a run cut short
    r = _publish_step(tmp_path, github)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(1 uploaded, 1 kept, 0 replaced)" in r.stdout
    assert sorted(a["name"] for a in _release(github)["assets"]) == sorted(w.name for w in wheels)
    n = len(github.requests())
    api = release_assets.GitHubClient("x", github.url)
    assert "already published" in release_assets.attach(api, "owner/repo", "v0.2.0", wheels, False, "")
    assert [m for m, _, _ in github.requests()[n:]] == ["GET"]  # nothing changed


def test_a_published_release_is_never_changed(tmp_path, github):
    wheels = _two_wheels(tmp_path)
    api = release_assets.GitHubClient("x", github.url)
    release_assets.attach(api, "owner/repo", "v0.2.0", wheels[:1], False, "")
    n = len(github.requests())
    r = _publish_step(tmp_path, github)
    assert r.returncode == 1
    assert f"::error title=publish::release v0.2.0 is published and final; {wheels[1].name} is not on it: " \
           "a new wheel needs a new tag" in r.stdout
    wheels[0].write_bytes(wheels[0].read_bytes() + b"\0")  # rebuilt: same name, other bytes
    with pytest.raises(release_assets.ReleaseError, match="is not this run's"):
        release_assets.attach(api, "owner/repo", "v0.2.0", wheels[:1], False, "")
    assert [m for m, _, _ in github.requests()[n:]] == ["GET", "GET"]  # reads only


def test_the_first_release_has_no_published_index(tmp_path, site_server):
    url, _, _ = site_server  # an empty site: manifest.json answers 404
    new = _wheel(tmp_path / "wheels", "cu130torch2.14")
    r = _merge_step(tmp_path, url)
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(_manifest(tmp_path / "site")) == {new.name}


@pytest.mark.parametrize("status", [500, 403])
def test_an_unreadable_published_index_stops_the_deploy(tmp_path, site_server, status):
    url, _, state = site_server
    state["status"] = status
    _wheel(tmp_path / "wheels", "cu130torch2.14")
    r = _merge_step(tmp_path, url)
    assert r.returncode != 0 and "::error" in r.stdout
    assert not (tmp_path / "site").exists()


def test_pages_must_be_built_by_actions(tmp_path, site_server):
    url, _, _ = site_server
    _wheel(tmp_path / "wheels", "cu130torch2.14")
    r = _merge_step(tmp_path, url, build_type="legacy")
    assert r.returncode != 0 and "Source: GitHub Actions" in r.stdout


# ------------------------------------------------------------------ the settings a release needs


def _settings_section() -> str:
    text = (ROOT / "docs" / "RELEASING.md").read_text()
    m = re.search(r"^## Repository settings for a first release\n(.*?)(?=^## )", text, re.M | re.S)
    assert m, "docs/RELEASING.md has no '## Repository settings for a first release' section"
    return m.group(1)


def test_releasing_lists_the_repository_settings_in_order():
    section = _settings_section()
    items = re.findall(r"^(\d+)\. (.*?)(?=^\d+\. |\Z)", section, re.M | re.S)
    items = [(n, " ".join(body.split())) for n, body in items]
    assert [int(n) for n, _ in items] == list(range(1, len(items) + 1))
    order = [
        "Allow all actions",  # Actions may run (and run the pinned third-party actions)
        "Source: GitHub Actions",  # Pages built by the workflow
        "`github-pages`",  # its deployment rule for v* tags
        "`release`",  # the publish job's environment
        "TORCH_WATCH_APP_CLIENT_ID",  # torch-watch's app (or the GITHUB_TOKEN setting)
        "git tag",  # the first tag last
    ]
    where = []
    for phrase in order:
        hits = [i for i, (_, body) in enumerate(items) if phrase in body]
        assert hits, f"no setting mentions {phrase!r}"
        where.append(hits[0])
    assert where == sorted(where), where
    pages_rule = next(body for _, body in items if "`github-pages`" in body)
    assert "`v*`" in pages_rule and "tag" in pages_rule
    # Every environment, variable and secret a workflow names is set up in this section.
    for wf in WORKFLOWS:
        text = wf.read_text()
        for name in re.findall(r"\b(?:vars|secrets)\.(\w+)", text):
            assert name in section, f"{wf.name} uses {name}, which the settings list does not set"
        for job in workflow(wf.name)["jobs"].values():
            env = job.get("environment")
            if env:
                assert f"`{env['name'] if isinstance(env, dict) else env}`" in section


def test_releasing_states_the_github_facts_the_workflows_rely_on():
    text = (ROOT / "docs" / "RELEASING.md").read_text()
    for fact in (
        "256",  # jobs per matrix
        "10 GB",  # repository cache space
        "GITHUB_TOKEN",  # its pull requests start no workflow
        "Allow GitHub Actions to create and approve pull requests",
    ):
        assert fact in text, fact


# ------------------------------------------------------------------ cibuildwheel


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
            cell.stable,  # a stable cell's cp310 identifier is checked on its own
        )
        seen.setdefault(key, (cell, env))
    return list(seen.values())


def test_cibuildwheel_selects_exactly_each_cells_python():
    cases = _cibw_env_cases()
    assert len(cases) >= 10 and len([c for c, _ in cases if c.stable]) == 3  # one per platform
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
        want = [cell_fields.cibuildwheel_identifier(cell)]
        assert r.stdout.split() == want, (matrix.cell_id(cell), r.stdout)
        py = "cp" + cell.python.replace(".", "")
        assert r.stdout.startswith(py + "-")


def test_cibuildwheel_env_of_a_cell():
    from cibuildwheel.environment import parse_environment

    (cell,) = matrix.select(torch="2.4", cuda="11.8", python="3.10", platform="linux_x86_64")
    env = build_cell.cibuildwheel_env(cell, "/tmp/cache")
    assert env["MAMBA_KERNELS_CI_CELL"] == "cu118torch2.4-cp310-linux_x86_64"
    assert env["CIBW_MANYLINUX_X86_64_IMAGE"] == "manylinux2014"
    linux = parse_environment(env["CIBW_ENVIRONMENT_LINUX"]).as_dictionary({"PATH": "/usr/bin"})
    assert linux["CUDA_HOME"] == "/usr/local/cuda-11.8" and linux["MAMBA_KERNELS_RELEASE"] == "1"
    assert env["CIBW_CONTAINER_ENGINE"] == "docker; create_args: --volume /tmp/cache:/sccache"
    assert linux["MAMBA_KERNELS_BINDING"] == "classic"
    (win,) = matrix.select(torch="2.14", cuda="12.8", python="3.12", platform="win_amd64")
    wenv = build_cell.cibuildwheel_env(win)
    assert wenv["CIBW_BUILD"] == "cp310-win_amd64" and "CIBW_ENVIRONMENT_LINUX" not in wenv
    windows = parse_environment(wenv["CIBW_ENVIRONMENT_WINDOWS"]).as_dictionary({"PATH": r"C:\Windows"})
    assert windows["CUDA_PATH"] == r"C:\Program Files\NVIDIA GPU Computing Toolkit\CUDA\v12.8"
    assert windows["MAMBA_KERNELS_BINDING"] == "stable"


def test_build_cell_cli_env_and_bad_cell():
    def env(cell: str) -> subprocess.CompletedProcess:
        # as CI runs it: a module, from the repository's root
        return subprocess.run([sys.executable, "-m", "ci.build_cell", "env", cell],
                              capture_output=True, text=True, cwd=ROOT)

    r = env("cu130torch2.9-cp311-linux_x86_64")
    assert r.returncode == 0 and json.loads(r.stdout)["CIBW_BUILD"] == "cp311-manylinux_x86_64"
    r = env("cu130stable2.10-cp310-linux_aarch64")
    assert r.returncode == 0 and json.loads(r.stdout)["CIBW_BUILD"] == "cp310-manylinux_aarch64"
    # torch 2.14 is served by the stable cells, not a cell of its own; 9.9 is no release
    for bad in ("cu130torch2.14-cp311-linux_x86_64", "cu130torch9.9-cp311-linux_x86_64"):
        r = env(bad)
        assert r.returncode == 1 and "cell must be a cell id" in r.stderr
