"""ci/preflight.py, offline: each check fails when its rule is broken (a broken cell, table or
environment built here; the registry replaced by a fake fetcher or a JSON server on 127.0.0.1),
the real offline run over the real matrix passes, and the output has one line per failing cell
and one summary line."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import matrix_counts
import pytest

from ci import build_cell, cell_fields, disk, nvcc_lines, registries
from ci import preflight as pf
from ci.platforms import linux, windows
from mamba_kernels.facts import support
from mamba_kernels.release import matrix

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("cibuildwheel.environment")


def _cell(cell_id: str) -> support.Cell:
    return matrix.find_cell(cell_id)


LINUX_13 = "cu130torch2.9-cp312-linux_x86_64"
LINUX_12 = "cu126torch2.9-cp312-linux_x86_64"
WIN_OLD = "cu121torch2.4-cp311-win_amd64"
WIN_NEW = "cu130torch2.9-cp312-win_amd64"
STABLE_12 = "cu128stable2.10-cp310-linux_x86_64"
STABLE_13 = "cu130stable2.10-cp310-linux_x86_64"


def _wheel(name: str) -> dict:
    return {"filename": name, "yanked": False, "size": 1}


def _fake_pypi(**overrides):
    """A registry answering like PyPI for every project the real matrix pins (each with wheels
    for Linux x86_64/aarch64 and Windows), with ``overrides`` (name -> releases or None)."""
    projects = {}
    for cuda in ("13.0", "13.2", "13.4"):
        for req in support.pypi_toolkit(cuda).requirements() + [support.PYPI_CUOBJDUMP]:
            name, version = req.split("==")
            files = [_wheel(f"{name.replace('-', '_')}-{version}-py3-none-{t}.whl") for t in (
                "manylinux2014_x86_64.manylinux_2_17_x86_64", "manylinux2014_aarch64.manylinux_2_17_aarch64",
                "win_amd64")]
            projects.setdefault(name, {})[version] = files
    torch = {}
    for rel in support.RELEASES:
        files = []
        for py in sorted({p for plat in support.PLATFORMS for p in rel.pythons_on(plat)}):
            t = "cp" + py.replace(".", "")
            for plat in ("manylinux_2_17_x86_64.manylinux2014_x86_64", "manylinux_2_28_x86_64",
                         "manylinux_2_28_aarch64", "manylinux2014_aarch64"):
                files.append(_wheel(f"torch-{rel.torch}.0-{t}-{t}-{plat}.whl"))
            if py in rel.pythons_on("win_amd64"):
                files.append(_wheel(f"torch-{rel.torch}.0-{t}-{t}-win_amd64.whl"))
        torch[f"{rel.torch}.0"] = files
    projects["torch"] = torch
    projects.update(overrides)
    calls = []

    def fetch(name):
        calls.append(name)
        releases = projects.get(name)
        return None if releases is None else {"info": {"name": name}, "releases": releases}

    fetch.calls = calls
    return fetch


def _run(cells, registry=None, **kw):
    out = io.StringIO()
    rc = pf.preflight(cells, registry, out=out, **kw)
    return rc, out.getvalue().splitlines()


# ----------------------------------------------------------------------------- the real matrix


def test_real_matrix_offline_passes():
    rc, lines = _run(None)
    assert rc == 0, "\n".join(lines)
    assert len(lines) == 1
    n = len(support.cells())
    assert lines[0].startswith(f"preflight passed: {n} cells, {n} pass, 0 fail;")
    assert "registry checks skipped (--offline)" in lines[0]
    assert f"torch from download.pytorch.org for {n} cells (not checked)" in lines[0]


def test_real_matrix_with_a_registry_that_has_every_pin_passes():
    fetch = _fake_pypi()
    registry = registries.Registry(fetch)
    rc, lines = _run(None, registry)
    assert rc == 0, "\n".join(lines)
    # one request per project, however many cells pin it
    assert sorted(fetch.calls) == sorted(set(fetch.calls))


def test_main_offline_exit_status_and_one_summary_line(capsys):
    assert pf.main(["--offline", "--platform", "win_amd64"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("preflight passed:")


def test_main_unknown_filter_is_a_usage_error(capsys):
    assert pf.main(["--offline", "--torch", "1.9"]) == 2  # older than the table (newer: the stable cells)
    assert "torch must be one of" in capsys.readouterr().err


# ----------------------------------------------------------------------------- output format


def test_one_line_per_failing_cell_and_a_summary(monkeypatch):
    bad_py = dataclasses.replace(_cell(WIN_NEW), python="3.8")
    good = _cell(LINUX_13)
    bad_env = _cell(WIN_OLD)

    def env_of(cell):
        env = build_cell.cibuildwheel_env(cell)
        if cell == bad_env:  # two problems, still one line
            env = dict(env, CIBW_BUILD="cp39-win_amd64")
            env["CIBW_ENVIRONMENT_WINDOWS"] = env["CIBW_ENVIRONMENT_WINDOWS"].replace(
                'MAMBA_KERNELS_CI_MSVC_TOOLSET="14.29"', "")
        return env

    rc, lines = _run([bad_py, good, bad_env], env_of=env_of)
    assert rc == 1
    fails = [ln for ln in lines if ln.startswith("FAIL ")]
    assert [ln.split(":")[0] for ln in fails] == [
        f"FAIL {matrix.cell_id(bad_py)}", f"FAIL {matrix.cell_id(bad_env)}"]
    assert "compiler:" in fails[1] and "environment:" in fails[1]
    assert len(lines) == len(fails) + 1
    assert lines[-1].startswith("preflight FAILED: 3 cells, 1 pass, 2 fail;")


def test_verbose_prints_the_disk_estimate_of_every_cell():
    rc, lines = _run([_cell(LINUX_13), _cell(WIN_NEW)], verbose=True)
    assert rc == 0
    disk = [ln for ln in lines if "disk ~" in ln]
    assert len(disk) == 2 and all("GB of 14.0 GB" in ln for ln in disk)


# ----------------------------------------------------------------------------- environment


def test_environment_as_cibuildwheel_parses_it_is_checked():
    cell = _cell(WIN_NEW)
    env = build_cell.cibuildwheel_env(cell)
    home = build_cell.toolkit_home(cell)
    # The form issue 8 found: double quotes around a Windows path, which cibuildwheel reads the
    # way bash does (backslashes dropped).
    broken = dict(env, CIBW_ENVIRONMENT_WINDOWS=f'CUDA_HOME="{home}" CUDA_PATH="{home}" '
                  f'PATH="{home}\\bin;$PATH" MAMBA_KERNELS_RELEASE=1 DISTUTILS_USE_SDK=1')
    rep = pf.CellReport("x")
    pf.check_environment(cell, rep, broken)
    assert any("CUDA_HOME='C:Program Files" in p for p in rep.problems), rep.problems
    rep = pf.CellReport("x")
    pf.check_environment(cell, rep, env)
    assert rep.problems == []


def test_environment_linux_values_and_identifier():
    cell = _cell(LINUX_13)
    env = build_cell.cibuildwheel_env(cell)
    rep = pf.CellReport("x")
    got = pf.check_environment(cell, rep, env)
    assert rep.problems == [] and got["CUDA_HOME"] == build_cell.toolkit_home(cell)
    broken = dict(env, CIBW_ENVIRONMENT_LINUX=env["CIBW_ENVIRONMENT_LINUX"].replace("sccache ", ""),
                  CIBW_BUILD="cp312-musllinux_x86_64", CIBW_MANYLINUX_X86_64_IMAGE="manylinux_2_99")
    rep = pf.CellReport("x")
    pf.check_environment(cell, rep, broken)
    text = "; ".join(rep.problems)
    assert "PYTORCH_NVCC" in text and "CIBW_BUILD" in text and "manylinux_2_99" in text
    assert "does not select" in text  # the skip list of ci/cibuildwheel.toml drops musllinux


def test_environment_unparseable_is_one_reason():
    cell = _cell(LINUX_13)
    env = dict(build_cell.cibuildwheel_env(cell), CIBW_ENVIRONMENT_LINUX='CUDA_HOME="unterminated')
    rep = pf.check_cell(cell, env=env)
    assert rep.problems and rep.problems[0].startswith("environment: cibuildwheel cannot parse it")


def test_python_outside_the_platform_range_fails(monkeypatch):
    # torch 2.5 shipped no cp313 Windows wheel: a table that forgets it makes such a cell.
    cell = support.Cell("2.5", "12.4", "3.13", "win_amd64", None, None, 17)
    rep = pf.CellReport("x")
    pf.check_python(cell, rep)
    assert rep.problems == ["python: torch 2.5 on win_amd64 covers Python 3.9, 3.10, 3.11, 3.12, not 3.13"]
    rep = pf.CellReport("x")
    pf.check_python(dataclasses.replace(cell, python="3.12"), rep)
    assert rep.problems == []


# ----------------------------------------------------------------------------- compiler


def test_windows_old_nvcc_without_the_msvc_override_fails(monkeypatch):
    cell = _cell(WIN_OLD)
    parsed = pf.cibw_environment(cell)
    rep = pf.CellReport("x")
    pf.check_compiler(cell, rep, parsed)
    assert rep.problems == []
    monkeypatch.setattr(windows, "windows_compiler_env", lambda c: {})
    rep = pf.CellReport("x")
    pf.check_compiler(cell, rep, pf.cibw_environment(cell))
    assert len(rep.problems) == 1 and "nvcc 12.1 refuses windows-2022's MSVC 19.44" in rep.problems[0]
    assert "the STL of windows-2022's MSVC 19.44 refuses nvcc 12.1" in rep.problems[0]
    assert "must build with toolset 14.29" in rep.problems[0]


def test_windows_new_nvcc_needs_no_flags_until_its_msvc_limit(monkeypatch):
    cell = _cell(WIN_NEW)
    rep = pf.CellReport("x")
    pf.check_compiler(cell, rep, pf.cibw_environment(cell))
    assert rep.problems == []
    monkeypatch.setitem(pf.RUNNER_MSVC, "windows-2022", 1950)  # a runner with a newer MSVC
    pf.check_compiler(cell, rep, pf.cibw_environment(cell))
    assert rep.problems and "nvcc 13.0 refuses" in rep.problems[0]


def test_linux_gcc_newer_than_nvcc_accepts_fails(monkeypatch):
    cell = _cell(LINUX_12)  # manylinux_2_28: build_cell picks gcc-toolset-13 for CUDA 12.6
    rep = pf.CellReport("x")
    pf.check_compiler(cell, rep, pf.cibw_environment(cell))
    assert rep.problems == []
    # Without the gcc-toolset override the image's GCC 14 meets nvcc 12.6 (GCC <= 13).
    monkeypatch.setattr(linux, "host_compiler_env", lambda c: {})
    rep = pf.CellReport("x")
    pf.check_compiler(cell, rep, pf.cibw_environment(cell))
    assert rep.problems == ["compiler: nvcc 12.6 accepts GCC up to 13, the build uses GCC 14 "
                            "(manylinux_2_28's default)"]


def test_linux_mismatched_or_unreadable_compiler_names_fail():
    cell = _cell(LINUX_12)
    env = dict(pf.cibw_environment(cell))
    rep = pf.CellReport("x")
    pf.check_compiler(cell, rep, dict(env, CXX="/opt/rh/gcc-toolset-14/root/usr/bin/g++"))
    assert rep.problems and "different GCCs" in rep.problems[0]
    rep = pf.CellReport("x")
    # CC is nvcc's host compiler: torch passes it as -ccbin
    pf.check_compiler(cell, rep, dict(env, CC="/usr/bin/clang"))
    assert rep.problems and "cannot tell the GCC version of nvcc -ccbin (/usr/bin/clang)" in rep.problems[0]


# ----------------------------------------------------------------------------- nvcc command lines

# A gcc-toolset cell: CUDA 12.6 in manylinux_2_28 (issue 15's example was CUDA 12.8, which meets the
# image's own GCC 14 since the image went back to gcc-toolset-14).
MANYLINUX_2_28_12 = "cu126torch2.8-cp312-linux_x86_64"


def _old_host_compiler_env(cell):
    """host_compiler_env as it was at 922dab0: CC, CXX and a -ccbin in NVCC_PREPEND_FLAGS."""
    gcc = support.HOST_GCC.get(cell.cuda)
    if not gcc or cell.platform == "win_amd64" or cell.manylinux != "manylinux_2_28":
        return {}
    root = f"/opt/rh/gcc-toolset-{gcc}/root/usr/bin"
    return {"CC": f"{root}/gcc", "CXX": f"{root}/g++", "NVCC_PREPEND_FLAGS": f"-ccbin {root}/g++"}


def test_the_old_host_compiler_environment_gives_nvcc_two_host_compilers(monkeypatch):
    monkeypatch.setattr(linux, "host_compiler_env", _old_host_compiler_env)
    cell = _cell(MANYLINUX_2_28_12)
    rep = pf.check_cell(cell)
    nvcc = [p for p in rep.problems if p.startswith("nvcc:")]
    assert len(nvcc) == 2, rep.problems  # torch's compile and our probe
    assert "the build command gives nvcc --compiler-bindir 2 times" in nvcc[0]
    assert "/opt/rh/gcc-toolset-13/root/usr/bin/g++, /opt/rh/gcc-toolset-13/root/usr/bin/gcc" in nvcc[0]
    assert "NVCC_PREPEND_FLAGS" in nvcc[0] and "the probe command" in nvcc[1]
    # every manylinux_2_28 cell with a gcc-toolset fails, each on one line
    rc, lines = _run(None)
    fails = [ln for ln in lines if ln.startswith("FAIL ")]
    want = [c for c in support.cells() if c.manylinux == "manylinux_2_28" and c.cuda in support.HOST_GCC]
    assert rc == 1 and len(fails) == len(want) == 42
    assert all("--compiler-bindir 2 times" in ln for ln in fails)


def test_every_cell_gives_nvcc_one_host_compiler():
    for cell in support.cells():
        env = pf.cibw_environment(cell)
        lines = nvcc_lines.nvcc_command_lines(cell, env)
        for which, args in lines.items():
            assert nvcc_lines.repeated_options(args) == {}, (matrix.cell_id(cell), which, args)
        ccbins = nvcc_lines.option_values(lines["build"]).get("--compiler-bindir", [])
        if cell.manylinux == "manylinux_2_28" and cell.cuda in support.HOST_GCC:
            assert ccbins == [env["CC"]] and "NVCC_PREPEND_FLAGS" not in env, matrix.cell_id(cell)
        else:
            assert ccbins == [], matrix.cell_id(cell)  # nvcc's default: the image's gcc, or cl.exe


def test_torchs_additions_are_simulated_per_release():
    cell = _cell(MANYLINUX_2_28_12)
    env = {"CC": "/x/gcc", "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES": "1"}
    ours = ["-O3", "-std=c++17"]
    args = nvcc_lines.torch_nvcc_command(cell, ours, env)
    assert args[-2:] == ["-ccbin", "/x/gcc"] and args.count("-std=c++17") == 1
    assert "--dependency-output" not in args
    # torch leaves -ccbin and -std alone when the extension's flags carry them
    args = nvcc_lines.torch_nvcc_command(cell, ours + ["-ccbin", "/y/g++"], env)
    assert nvcc_lines.option_values(args)["--compiler-bindir"] == ["/y/g++"]
    # without the skip knob torch's ninja rule writes a dependency file
    assert "--dependency-output" in nvcc_lines.torch_nvcc_command(cell, ours, {})
    # Windows: no -ccbin from torch, whatever CC says
    win = _cell(WIN_NEW)
    assert "-ccbin" not in nvcc_lines.torch_nvcc_command(win, [], {"CC": "cl"})


@pytest.mark.parametrize("args, want", [
    (["-ccbin", "a", "--compiler-bindir=b"], {"--compiler-bindir": ["a", "b"]}),
    (["-std=c++17", "--std", "c++20"], {"--std": ["c++17", "c++20"]}),
    (["-O3", "--optimize=2"], {"--optimize": ["3", "2"]}),
    (["--threads=2", "-t", "4"], {"--threads": ["2", "4"]}),
    (["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90", "-DX", "-DY"], {}),
])
def test_repeated_single_valued_options(args, want):
    assert nvcc_lines.repeated_options(args) == want


def test_a_ccbin_in_nvcc_flags_from_the_environment_fails_the_preflight(monkeypatch):
    # What the issue asks to catch: NVCC_PREPEND_FLAGS carrying a -ccbin again.
    real = linux.host_compiler_env

    def again(cell):
        env = real(cell)
        return dict(env, NVCC_PREPEND_FLAGS=f"-ccbin {env['CXX']}") if env else env

    monkeypatch.setattr(linux, "host_compiler_env", again)
    rc, lines = _run([_cell(MANYLINUX_2_28_12), _cell(LINUX_13)])
    assert rc == 1
    (fail,) = [ln for ln in lines if ln.startswith("FAIL ")]
    assert fail.startswith(f"FAIL {MANYLINUX_2_28_12}: nvcc: the build command gives nvcc --compiler-bindir")


def test_linux_cxx20_needs_gcc_10(monkeypatch):
    cell = _cell(STABLE_13)  # built with torch 2.14's headers: C++20
    monkeypatch.setitem(pf.IMAGE_GCC, "manylinux_2_28", 9)
    rep = pf.CellReport("x")
    pf.check_compiler(cell, rep, pf.cibw_environment(cell))
    assert rep.problems and "needs C++20" in rep.problems[0]


# ----------------------------------------------------------------------------- registry


def test_pinned_toolkit_version_missing_from_the_registry_fails(monkeypatch):
    # The 13.4 defect of issue 8: nvidia-cuda-cccl==13.4.* does not exist on PyPI.
    registry = registries.Registry(_fake_pypi())  # PyPI as it is: every real pin
    release, versions = support._PYPI_TOOLKITS["13.4"]
    monkeypatch.setitem(support._PYPI_TOOLKITS, "13.4", (release, versions[:3] + ("13.4.92",) + versions[4:]))
    # No cell builds with CUDA 13.4 since the stable cells; its pins are still checked alike.
    cell = support.Cell("2.14", "13.4", "3.12", "linux_x86_64", True, "manylinux_2_28", 20)
    rep = pf.check_cell(cell, registry)
    assert rep.problems == ["registry: PyPI has no nvidia-cuda-cccl 13.4.92"]


def test_pin_without_a_wheel_for_the_platform_fails():
    cuo, version = support.PYPI_CUOBJDUMP.split("==")
    only_x86 = {version: [_wheel(f"nvidia_cuda_cuobjdump-{version}-py3-none-manylinux_2_17_x86_64.whl")]}
    registry = registries.Registry(_fake_pypi(**{cuo: only_x86}))
    assert pf.check_cell(_cell("cu130torch2.9-cp312-linux_x86_64"), registry).problems == []
    rep = pf.check_cell(_cell("cu130torch2.9-cp312-linux_aarch64"), registry)
    assert rep.problems == [f"registry: PyPI's {cuo} {version} has no wheel for linux_aarch64 cp312"]


def test_wheel_newer_than_the_image_glibc_does_not_count():
    tags = registries.supported_tags("3.11", "linux_x86_64", (2, 17))
    assert not registries.wheel_fits([_wheel("x-1-py3-none-manylinux_2_28_x86_64.whl")], tags)
    assert registries.wheel_fits([_wheel("x-1-py3-none-manylinux1_x86_64.whl")], tags)
    assert not registries.wheel_fits([dict(_wheel("x-1-py3-none-manylinux1_x86_64.whl"), yanked=True)], tags)
    assert not registries.wheel_fits([_wheel("x-1-cp312-cp312-manylinux1_x86_64.whl")], tags)


def test_torch_without_a_wheel_for_the_python_and_platform_fails():
    fetch = _fake_pypi()
    cell = support.Cell("2.5", "12.4", "3.13", "win_amd64", None, None, 17)
    rep = pf.CellReport("x")
    pf.check_registry(cell, rep, registries.Registry(fetch))
    assert rep.problems == ["registry: PyPI has no torch 2.5.* wheel for win_amd64 cp313"]


def test_unreadable_registry_is_one_line_per_cell_and_fails(monkeypatch):
    def down(name):
        raise registries.RegistryError(
            f"could not read https://pypi.invalid/pypi/{name}/json: timed out (2 tries)")

    cells = [_cell(LINUX_13), _cell(WIN_NEW)]
    rc, lines = _run(cells, registries.Registry(down))
    assert rc == 1
    assert [ln.split(":")[0] for ln in lines[:-1]] == [f"FAIL {matrix.cell_id(c)}" for c in cells]
    assert "timed out" in lines[0] and "Traceback" not in "\n".join(lines)
    assert lines[0].count("registry:") == 1 and "more projects" in lines[0]
    assert "7 unreadable (could not read" in lines[-1]  # torch and the six 13.0 toolkit pins


class _Handler(BaseHTTPRequestHandler):
    projects: dict = {}

    def do_GET(self):  # noqa: N802 (http.server's name)
        name = self.path.strip("/").split("/")[-2]
        if name == "broken":
            self.send_response(500)
            self.end_headers()
            return
        if name not in self.projects:
            self.send_response(404)
            self.end_headers()
            return
        body = json.dumps({"releases": self.projects[name]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def json_server():
    _Handler.projects = {"torch": {"2.9.0": [_wheel("torch-2.9.0-cp312-cp312-win_amd64.whl")]}}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/pypi"
    server.shutdown()
    server.server_close()


def test_http_fetcher_against_a_local_json_server(json_server):
    fetch = registries.http_fetcher(json_server, timeout=5)
    assert fetch("torch")["releases"]["2.9.0"]
    assert fetch("no-such-project") is None
    with pytest.raises(registries.RegistryError, match=r"HTTP 500 \(2 tries\)"):
        fetch("broken")
    rep = pf.check_cell(_cell(WIN_NEW), registries.Registry(fetch))
    assert rep.problems == []
    rep = pf.check_cell(_cell("cu130torch2.9-cp313-win_amd64"), registries.Registry(fetch))
    assert rep.problems == ["registry: PyPI has no torch 2.9.* wheel for win_amd64 cp313"]


def test_http_fetcher_unreachable_is_one_line():
    fetch = registries.http_fetcher("http://127.0.0.1:9/pypi", timeout=2)  # the discard port: refused
    with pytest.raises(registries.RegistryError) as e:
        fetch("torch")
    assert "\n" not in str(e.value) and "could not read http://127.0.0.1:9/pypi/torch/json" in str(e.value)


# ----------------------------------------------------------------------------- jobs and disk


def test_matrix_over_the_job_limit_fails():
    cells = support.cells(platform="linux_x86_64")
    problems, jobs = pf.check_matrices(cells, limit=len(cells) - 1)
    assert problems == [f"FAIL matrix linux_x86_64: {len(cells)} jobs, over GitHub's limit of "
                        f"{len(cells) - 1} per matrix"]
    rc, lines = _run(cells, limit=len(cells) - 1)
    assert rc == 1 and lines[-2].startswith("FAIL matrix linux_x86_64") and "(-1 left)" in lines[-1]


def test_matrix_split_is_read_from_the_release_workflow(tmp_path):
    wf = tmp_path / "release.yml"
    wf.write_text("jobs: {}\n")
    problems, _ = pf.check_matrices(support.cells(platform="win_amd64"), workflow=wf)
    assert len(problems) == 3 and all("no longer runs one build matrix" in p for p in problems)
    problems, jobs = pf.check_matrices(support.cells())
    assert problems == [] and sum(jobs.values()) == len(support.cells())


def test_disk_estimate_counts_a_pip_cache_and_fails_over_the_free_disk():
    cell = _cell(LINUX_13)
    parsed = pf.cibw_environment(cell)
    rep = pf.CellReport("x")
    pf.check_disk(cell, rep, parsed)
    assert rep.problems == [] and 0 < rep.disk_gb < disk.RUNNER_FREE_DISK_GB
    with_cache = {k: v for k, v in parsed.items() if k != "PIP_NO_CACHE_DIR"}
    rep2 = pf.CellReport("x")
    pf.check_disk(cell, rep2, with_cache)
    assert "pip cache" in rep2.disk_parts and rep2.disk_gb > rep.disk_gb
    assert rep2.problems and rep2.problems[0].startswith("disk: estimated")
    rep3 = pf.CellReport("x")
    pf.check_disk(cell, rep3, parsed, free_gb=5.0)
    assert rep3.problems and "5.0 GB free" in rep3.problems[0]


# ----------------------------------------------------------------------------- stable cells


def test_the_stable_cells_pass_and_force_their_binding():
    cells = matrix.select(binding="stable")
    rc, lines = _run(cells, registries.Registry(_fake_pypi()))
    assert rc == 0, "\n".join(lines)
    assert lines[-1].startswith("preflight passed: 9 cells, 9 pass, 0 fail;")
    cell = _cell(STABLE_12)
    env = build_cell.cibuildwheel_env(cell)
    broken = dict(env, CIBW_ENVIRONMENT_LINUX=env["CIBW_ENVIRONMENT_LINUX"].replace(
        'MAMBA_KERNELS_BINDING="stable"', 'MAMBA_KERNELS_BINDING="classic"'))
    rep = pf.CellReport("x")
    pf.check_environment(cell, rep, broken)
    assert rep.problems == [
        "environment: cibuildwheel reads MAMBA_KERNELS_BINDING='classic', intended 'stable'"]


def test_a_stable_cell_with_the_wrong_torches_fails():
    cell = _cell(STABLE_12)
    rep = pf.CellReport("x")
    pf.check_stable(cell, rep)
    assert rep.problems == []
    bad = dataclasses.replace(cell, torch="2.9", build_torch=("2.15", "13.2"), test_torch=("2.12", "12.6"))
    rep = pf.CellReport("x")
    pf.check_stable(bad, rep)
    assert rep.problems == [
        "stable: targets torch 2.9, the stable-ABI floor is 2.10",
        "stable: build torch 2.15's CUDA 13.2 is not nvcc 12.8's major (torch's extension builder "
        "refuses another major)",
        "stable: test torch 2.12's CUDA 12.6 cannot run a CUDA 12.8 binary (same major, minor not below "
        "the binary's)",
    ]
    rep = pf.CellReport("x")
    pf.check_stable(dataclasses.replace(cell, test_torch=("2.12", "12.8")), rep)
    assert rep.problems == ["stable: test torch 2.12 has no CUDA 12.8 build for linux_x86_64"]


def test_a_stable_cell_is_cp310_and_both_its_torches_ship_it():
    cell = _cell(STABLE_13)
    rep = pf.CellReport("x")
    pf.check_python(dataclasses.replace(cell, python="3.11"), rep)
    assert rep.problems == ["python: a stable cell is CPython 3.10 (cp310-abi3), not 3.11"]
    rep = pf.CellReport("x")
    pf.check_python(dataclasses.replace(cell, build_torch=("2.15", "13.2")), rep)
    assert rep.problems == ["python: build torch 2.15 on linux_x86_64 covers Python 3.11, 3.12, 3.13, 3.14, "
                            "3.15, not 3.10"]


def test_every_cuda_variant_from_2_10_on_needs_a_stable_cell():
    cells = matrix.select(binding="stable")
    assert pf.check_stable_coverage(cells) == []
    without = [c for c in cells if (c.platform, c.cuda) != ("linux_x86_64", "12.6")]
    problems = pf.check_stable_coverage(without)
    # torch 2.10 to 2.14 ship cu126 on Linux x86_64; the 12.8 cell cannot serve them.
    assert problems == [f"FAIL stable linux_x86_64: torch 2.{m} with CUDA 12.6 has no stable cell (CUDA 12.x "
                        f"with a minor not above 12.6)" for m in range(10, 15)]
    rc, lines = _run(without)
    assert rc == 1 and lines[-2].startswith("FAIL stable linux_x86_64: torch 2.14 with CUDA 12.6")


def test_a_stable_cell_checks_the_registry_for_its_build_and_its_test_torch():
    torch = dict(_fake_pypi()("torch")["releases"])
    del torch["2.10.0"]
    rep = pf.check_cell(_cell(STABLE_13), registries.Registry(_fake_pypi(torch=torch)))
    assert rep.problems == ["registry: PyPI has no torch 2.10.* wheel for linux_x86_64 cp310"]
    del torch["2.14.0"]
    rep = pf.check_cell(_cell(STABLE_13), registries.Registry(_fake_pypi(torch=torch)))
    assert rep.problems == ["registry: PyPI has no torch 2.14.* wheel for linux_x86_64 cp310",
                            "registry: PyPI has no torch 2.10.* wheel for linux_x86_64 cp310"]


# ----------------------------------------------------------------------------- disk


def test_disk_counts_the_checkout_the_clean_copies_and_the_compiler_cache():
    linux, win = _cell(LINUX_13), _cell(WIN_NEW)
    lp = disk.disk_estimate(linux, pf.cibw_environment(linux))
    wp = disk.disk_estimate(win, pf.cibw_environment(win))
    proj = disk.cached_project_sizes()  # measured once per run (other files may change while the suite runs)
    assert proj["checkout"] >= proj["copy"] > 0
    # Linux: the staged copy and cibuildwheel's copy of it into the container; Windows builds
    # from the staged copy itself
    assert lp["project copy"] == pytest.approx(2 * proj["copy"])
    assert wp["project copy"] == pytest.approx(proj["copy"])
    assert lp["compiler cache"] == pytest.approx(0.4) and "compiler cache" not in wp  # SCCACHE_CACHE_SIZE
    assert disk.cache_gb("2G") == 2.0 and disk.cache_gb("400M") == pytest.approx(0.4)


def test_disk_peak_is_the_largest_phase():
    stable, classic = _cell(STABLE_12), _cell(LINUX_12)
    parts = {"image": 3.0, "torch": 5.0, "download": 3.0, "toolkit": 1.0, "build": 1.0, "checkout": 0.1}
    # classic: torch is installed once; its downloads are gone before the toolkit and the build
    assert disk.disk_peak(classic, parts) == (pytest.approx(11.1), "torch install")
    # stable: the target torch is downloaded while the build's outputs are still there
    assert disk.disk_peak(stable, parts) == (pytest.approx(13.1), "stable test")


def test_the_build_runs_from_a_copy_without_git_cache_or_outputs(tmp_path):
    root = tmp_path / "repo"
    for rel in ("setup.py", "ci/build_cell.py", ".git/HEAD", ".sccache/a/b", "build/x.o", "wheelhouse/w.whl",
                "pkg/__pycache__/m.pyc", "pkg/m.py", "x.egg-info/PKG-INFO"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    dest = build_cell.stage_project(tmp_path / "stage", root)
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == ["SOURCE_REVISION", "ci/build_cell.py", "pkg/m.py", "setup.py"]


def test_the_staged_copy_of_this_checkout_holds_every_tracked_file(tmp_path):
    """The copy a cell builds from, made of this very checkout: every file git tracks is in it
    (mamba_kernels/build/ once went missing with the top-level build/ output folder), and no
    output folder, cache or compiled module is."""
    root = build_cell.ROOT
    tracked = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True)
    names = {n for n in tracked.stdout.decode().split("\0") if n and (root / n).is_file()}
    if not names:
        pytest.skip("not a git checkout")
    dest = build_cell.stage_project(tmp_path / "stage", root)
    got = {str(p.relative_to(dest)).replace(os.sep, "/") for p in dest.rglob("*") if p.is_file()}
    missing = sorted(names - got)
    assert not missing, f"the staged copy lacks {len(missing)} tracked files, e.g. {missing[:5]}"
    assert any(n.startswith("mamba_kernels/build/") for n in got)
    leaked = sorted(n for n in got - names - {"SOURCE_REVISION"}
                    if "__pycache__" in n or n.endswith((".so", ".pyd", ".whl")) or n.split("/")[0] in
                    build_cell.COPY_EXCLUDES_TOP)
    assert not leaked, leaked


# ----------------------------------------------------------------------------- MSVC toolset rule


def test_every_windows_cell_builds_with_an_msvc_its_nvcc_and_its_stl_accept():
    cells = matrix.select(platform="win_amd64")
    for cell in cells:
        env = pf.cibw_environment(cell)
        rep = pf.CellReport(matrix.cell_id(cell))
        pf.check_msvc(cell, rep, env)
        assert rep.problems == [], rep.problems
        chosen = env.get(windows.MSVC_TOOLSET_VAR)
        msvc = pf.MSVC_TOOLSETS[chosen].msc_ver if chosen else pf.RUNNER_MSVC["windows-2022"]
        assert msvc < pf.NVCC_MSVC_REFUSES[cell.cuda], matrix.cell_id(cell)
        assert (chosen == "14.29") == (cell.cuda in ("11.8", "12.1")), matrix.cell_id(cell)
    assert sum(1 for c in cells if c.cuda in ("11.8", "12.1")) == 48


def _toolset(monkeypatch, **changes):
    monkeypatch.setitem(pf.MSVC_TOOLSETS, "14.29", dataclasses.replace(pf.MSVC_TOOLSETS["14.29"], **changes))


def test_a_toolset_outside_nvccs_range_or_whose_stl_refuses_nvcc_fails(monkeypatch):
    cell = _cell(WIN_OLD)  # CUDA 12.1: accepts MSVC 19.10 to 19.39
    env = pf.cibw_environment(cell)
    _toolset(monkeypatch, msc_ver=1940)  # as if 14.29 were a 19.40 compiler
    rep = pf.CellReport("x")
    pf.check_msvc(cell, rep, env)
    assert rep.problems == ["compiler: nvcc 12.1 refuses MSVC 19.40 (toolset 14.29, Visual Studio 2019 "
                            "16.11) (it accepts MSVC below 19.40)"]
    _toolset(monkeypatch, msc_ver=1900)
    rep = pf.CellReport("x")
    pf.check_msvc(cell, rep, env)
    assert rep.problems and "it accepts MSVC 19.10 and newer" in rep.problems[0]
    _toolset(monkeypatch, msc_ver=1929, stl_min_cuda="12.4")  # an STL that wants CUDA 12.4
    rep = pf.CellReport("x")
    pf.check_msvc(cell, rep, env)
    assert rep.problems and "the STL of MSVC 19.29 (toolset 14.29" in rep.problems[0]
    assert "refuses nvcc 12.1 (it needs CUDA 12.4 or newer)" in rep.problems[0]


def test_an_unknown_toolset_or_a_missing_fact_fails(monkeypatch):
    cell = _cell(WIN_OLD)
    env = dict(pf.cibw_environment(cell))
    rep = pf.CellReport("x")
    pf.check_msvc(cell, rep, dict(env, **{windows.MSVC_TOOLSET_VAR: "14.16"}))
    assert rep.problems and "'14.16' is no toolset of msvc.toolsets" in rep.problems[0]
    monkeypatch.delitem(pf.NVCC_MSVC_OLDEST, "12.1")
    rep = pf.CellReport("x")
    pf.check_msvc(cell, rep, env)
    assert rep.problems and "no MSVC fact" in rep.problems[0]
    # a newer cell needs no toolset and no oldest-MSVC fact: the runner's default serves it
    rep = pf.CellReport("x")
    pf.check_msvc(_cell(WIN_NEW), rep, pf.cibw_environment(_cell(WIN_NEW)))
    assert rep.problems == []


# ----------------------------------------------------------------------------- PyTorch's index


def _fake_torch_index(drop=(), unreadable=()):
    """PyTorch's index as the preflight reads it (URL -> the torch page's file names): every
    release of the table built for the URL's CUDA variant, each Python and platform, patch 0,
    less the names in ``drop``; the URLs in ``unreadable`` raise RegistryError."""
    read = []

    def fetch(url):
        read.append(url)
        if url in unreadable:
            raise registries.RegistryError(f"could not read {url}/torch/: timed out (2 tries)")
        tag = url.rsplit("/", 1)[-1]
        names = []
        for rel in support.RELEASES:
            for plat, wheel_plat in (("linux_x86_64", f"{rel.manylinux}_x86_64"), ("win_amd64", "win_amd64"),
                                     ("linux_aarch64", f"{rel.manylinux}_aarch64")):
                if tag in {matrix.cuda_tag(c) for c in rel.cuda[plat]}:
                    for py in rel.pythons_on(plat):
                        t = "cp" + py.replace(".", "")
                        names.append(f"torch-{rel.torch}.0+{tag}-{t}-{t}-{wheel_plat}.whl")
        return [n for n in names if n not in drop]

    fetch.read = read
    return fetch


def test_every_cells_exact_torch_build_is_looked_up_on_pytorchs_index():
    fetch = _fake_torch_index()
    rc, lines = _run(None, registries.Registry(_fake_pypi()), torch_index=registries.Registry(fetch))
    assert rc == 0, "\n".join(lines)
    n = len(support.cells())
    urls = {cell_fields.torch_index(cuda)
            for c in support.cells() for cuda in (c.build_with[1], c.test_with[1])}
    assert sorted(fetch.read) == sorted(urls)  # one page per CUDA variant, however many cells need it
    assert (f"torch: the exact build (torch==X.Y.Z+cuXYZ) looked up on PyTorch's index for {n} of {n} cells "
            f"({len(urls)} index pages read)") in lines[-1]


def test_a_cell_whose_exact_torch_build_pytorchs_index_lacks_fails():
    # the one Windows cp313 build of torch 2.8 for CUDA 12.8, and the stable CUDA 13.0 aarch64
    # cell's test torch (2.10 for CUDA 13.0, cp310)
    fetch = _fake_torch_index(drop={"torch-2.8.0+cu128-cp313-cp313-win_amd64.whl",
                                    "torch-2.10.0+cu130-cp310-cp310-manylinux_2_28_aarch64.whl"})
    cells = [_cell(i) for i in ("cu128torch2.8-cp312-win_amd64", "cu128torch2.8-cp313-win_amd64",
                                "cu130stable2.10-cp310-linux_x86_64", "cu130stable2.10-cp310-linux_aarch64")]
    rc, lines = _run(cells, torch_index=registries.Registry(fetch))
    assert rc == 1
    assert [ln for ln in lines if ln.startswith("FAIL cu")] == [  # (a subset: the stable coverage fails too)
        "FAIL cu128torch2.8-cp313-win_amd64: torch-index: https://download.pytorch.org/whl/cu128 has no "
        "torch 2.8.*+cu128 wheel for win_amd64 cp313",
        "FAIL cu130stable2.10-cp310-linux_aarch64: torch-index: https://download.pytorch.org/whl/cu130 "
        "has no torch 2.10.*+cu130 wheel for linux_aarch64 cp310",
    ]


def test_an_unreadable_pytorch_index_is_said_and_pypi_stands_in():
    unreadable = {"https://download.pytorch.org/whl/cu128"}
    rc, lines = _run(None, registries.Registry(_fake_pypi()),
                     torch_index=registries.Registry(_fake_torch_index(unreadable=unreadable)))
    assert rc == 0, "\n".join(lines)
    cells = support.cells()
    rest = [c for c in cells if "12.8" in (c.build_with[1], c.test_with[1])]
    same = sum(1 for c in rest if pf.torch_on_pypi_is_same_build(c))
    assert (f"for {len(cells) - len(rest)} of {len(cells)} cells (7 index pages read, 1 unreadable: "
            f"could not read https://download.pytorch.org/whl/cu128/torch/: timed out (2 tries)); for the "
            f"other {len(rest)}, PyPI's wheel of the same release, Python and platform checked instead, "
            f"the very build for {same}") in lines[-1]


class _PageHandler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/whl/cu128/torch/":
            body = (b'<a href="/whl/cu128/torch-2.8.0%2Bcu128-cp311-cp311-win_amd64.whl#sha256=00">x</a>\n'
                    b'<a href="torch-2.8.1%2Bcu128-cp311-cp311-win_amd64.whl" data-yanked="">y</a>\n')
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(500 if "broken" in self.path else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_torch_index_fetcher_against_a_local_page(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PageHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/whl"
        fetch = registries.torch_index_fetcher(timeout=5)
        assert fetch(f"{base}/cu128") == ["torch-2.8.0+cu128-cp311-cp311-win_amd64.whl"]  # yanked: left out
        assert fetch(f"{base}/cu999") is None
        with pytest.raises(registries.RegistryError, match=r"HTTP 500 \(2 tries\)"):
            fetch(f"{base}/broken")
        # the cells' indexes, as the preflight's main reads them, pointed at this server
        monkeypatch.setattr(cell_fields, "TORCH_INDEX", base + "/{tag}")
        rep = pf.check_cell(_cell("cu128torch2.8-cp311-win_amd64"), torch_index=registries.Registry(fetch))
        assert rep.problems == [] and rep.exact_torch_checked
        rep = pf.check_cell(_cell("cu126torch2.8-cp311-win_amd64"), torch_index=registries.Registry(fetch))
        assert rep.problems == [f"torch-index: PyTorch has no index {base}/cu126 (HTTP 404), so no torch "
                                "2.8.*+cu126 for win_amd64 cp311"]
    finally:
        server.shutdown()
        server.server_close()


def test_main_reads_pytorchs_index_unless_told_not_to(capsys):
    fetch = _fake_torch_index()
    assert pf.main(["--platform", "win_amd64"], fetcher=_fake_pypi(), torch_fetcher=fetch) == 0
    n = matrix_counts.wheel_counts()["win_amd64"]
    assert n > 0 and f"looked up on PyTorch's index for {n} of {n} cells" in capsys.readouterr().out
    fetch.read.clear()
    assert pf.main(["--platform", "win_amd64", "--no-torch-index"], fetcher=_fake_pypi(),
                   torch_fetcher=fetch) == 0
    assert fetch.read == [] and "PyPI's wheel of the same release" in capsys.readouterr().out
