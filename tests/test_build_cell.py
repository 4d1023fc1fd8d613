"""ci/build_cell.py, offline: the cibuildwheel environment as cibuildwheel itself parses it,
the toolkit pins, the Windows repair exclusions, verify's view of vendored libraries, and
how often a cell installs torch."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ci import build_cell, cell_fields, platforms
from ci.platforms import linux, windows
from ci.platforms.base import CellError, environment_string
from mamba_kernels.facts import support, variant
from mamba_kernels.release import matrix

ROOT = Path(__file__).resolve().parent.parent
environment = pytest.importorskip("cibuildwheel.environment")

WIN_PATH = r"C:\Windows\system32;C:\hostedtoolcache\windows\Python\3.12.8\x64;C:\Program Files\Git\bin"
LINUX_PATH = "/usr/local/bin:/usr/bin:/bin"


def _parsed(env_string: str, prev_path: str) -> dict:
    """What cibuildwheel's own parser makes of an environment string (PATH as the runner's)."""
    parsed = environment.parse_environment(env_string)
    return parsed.as_dictionary({"PATH": prev_path})


def _one_per_cuda(platform: str):
    seen = {}
    for cell in matrix.select(platform=platform):
        seen.setdefault(cell.cuda, cell)
    return list(seen.values())


@pytest.mark.parametrize("cell", _one_per_cuda("win_amd64"), ids=matrix.cell_id)
def test_windows_environment_as_cibuildwheel_parses_it(cell):
    env = build_cell.cibuildwheel_env(cell)
    got = _parsed(env["CIBW_ENVIRONMENT_WINDOWS"], WIN_PATH)
    home = rf"C:\Program Files\NVIDIA GPU Computing Toolkit\CUDA\v{cell.cuda}"
    assert got["CUDA_HOME"] == home
    assert got["CUDA_PATH"] == home
    assert got["PATH"] == home + r"\bin;" + WIN_PATH
    assert got["MAMBA_KERNELS_RELEASE"] == "1"
    assert got["MAMBA_KERNELS_BINDING"] == ("stable" if cell.stable else "classic")
    assert got["DISTUTILS_USE_SDK"] == "1"
    assert got["PIP_NO_CACHE_DIR"] == "1"
    old = cell.cuda in ("11.8", "12.1")
    # nvcc < 12.4 refuses windows-2022's MSVC 19.4x, and its STL refuses nvcc < 12.4: those cells
    # build with the older toolset 14.29 (named here, loaded by runner_env), with no override flags.
    assert got.get(windows.MSVC_TOOLSET_VAR) == ("14.29" if old else None)
    assert "NVCC_APPEND_FLAGS" not in got and "CL" not in got


def test_windows_cells_before_cuda_12_4_are_the_50_that_need_the_override():
    need = [c for c in matrix.select(platform="win_amd64") if support.nvcc_needs_msvc_override(c.cuda)]
    assert {c.cuda for c in need} == {"11.8", "12.1"}
    for c in need:
        assert windows.MSVC_TOOLSET_VAR in build_cell.cibuildwheel_env(c)["CIBW_ENVIRONMENT_WINDOWS"]


@pytest.mark.parametrize(
    "cell", _one_per_cuda("linux_x86_64") + _one_per_cuda("linux_aarch64"), ids=matrix.cell_id
)
def test_linux_environment_as_cibuildwheel_parses_it(cell):
    env = build_cell.cibuildwheel_env(cell, "/tmp/cache")
    got = _parsed(env["CIBW_ENVIRONMENT_LINUX"], LINUX_PATH)
    home = build_cell.toolkit_home(cell)
    assert got["CUDA_HOME"] == home
    assert got["PATH"] == f"{home}/bin:{LINUX_PATH}"
    assert got["PYTORCH_NVCC"] == f"sccache {home}/bin/nvcc"
    assert got["SCCACHE_DIR"] == "/sccache"
    assert got["MAMBA_KERNELS_RELEASE"] == "1"
    assert got["MAMBA_KERNELS_BINDING"] == ("stable" if cell.stable else "classic")
    assert got["PIP_NO_CACHE_DIR"] == "1"


@pytest.mark.parametrize("cell", matrix.select(binding="stable"), ids=matrix.cell_id)
def test_stable_cells_force_the_stable_binding_and_build_cp310_only(cell):
    env = build_cell.cibuildwheel_env(cell, "/tmp/cache")
    assert env["CIBW_BUILD"] in ("cp310-manylinux_x86_64", "cp310-manylinux_aarch64", "cp310-win_amd64")
    value = env.get("CIBW_ENVIRONMENT_LINUX") or env["CIBW_ENVIRONMENT_WINDOWS"]
    got = _parsed(value, LINUX_PATH)
    assert got["MAMBA_KERNELS_BINDING"] == "stable"
    assert got["CUDA_HOME"] == build_cell.toolkit_home(cell)


def test_environment_quoting_survives_awkward_values():
    values = {"A": r"C:\a b\$x `y` \"q\"", "B": "plain"}
    s = environment_string(values, path_prefix=r"C:\p q\bin", path_sep=";")
    got = _parsed(s, r"C:\w")
    assert got["A"] == values["A"] and got["B"] == "plain" and got["PATH"] == r"C:\p q\bin;C:\w"


def _patch_sh(monkeypatch, fake_sh):
    # build_cell's shared steps and the platform cell builders (ci/platforms/) run commands
    # through their own module's name.
    monkeypatch.setattr(build_cell, "sh", fake_sh)
    monkeypatch.setattr(platforms.base, "sh", fake_sh)


def _captured_sh(monkeypatch):
    calls = []

    def fake_sh(cmd, env=None, cwd=None):
        calls.append(list(cmd))

    _patch_sh(monkeypatch, fake_sh)
    return calls


def _pytorch_index(monkeypatch, patches=(0, 1, 2), drop=()):
    """PyTorch's index as build_cell reads it (index_files), which this machine cannot reach: per
    cuXYZ folder, every release of the table built for that variant, for each of its Pythons and
    platforms, at ``patches``, less the file names in ``drop``. Returns the URLs read."""
    read = []

    def files(url, project="torch"):
        read.append(url)
        tag = url.rstrip("/").rsplit("/", 1)[-1]
        names = []
        for rel in support.RELEASES:
            for plat, wheel_plat in (("linux_x86_64", f"{rel.manylinux}_x86_64"), ("win_amd64", "win_amd64"),
                                     ("linux_aarch64", f"{rel.manylinux}_aarch64")):
                if tag in {variant.cuda_tag(c) for c in rel.cuda[plat]}:
                    for py in rel.pythons_on(plat):
                        t = variant.python_tag(py)
                        names += [f"torch-{rel.torch}.{p}+{tag}-{t}-{t}-{wheel_plat}.whl" for p in patches]
        return [n for n in names if n not in drop]

    monkeypatch.setattr(build_cell, "index_files", files)
    return read


@pytest.mark.parametrize("cuda", ["13.0", "13.2", "13.4"])
def test_pypi_toolkit_installs_exact_existing_versions(cuda, monkeypatch, tmp_path):
    # 13.2 and 13.4 are no cell's toolkit since the stable cells (13.0 serves them); the local
    # driver still assembles them (--toolkit pypi).
    cell = support.Cell("2.14", cuda, "3.12", "linux_aarch64", True, "manylinux_2_28", 20)
    calls = _captured_sh(monkeypatch)
    with pytest.raises(CellError):  # nothing really installed: nvcc is missing
        linux.assemble_pypi_toolkit(cell, tmp_path)
    reqs = [a for c in calls for a in c if a.startswith("nvidia-")]
    assert all("==" in r and "*" not in r and ">" not in r for r in reqs), reqs
    assert set(support.pypi_toolkit(cuda).requirements()) <= set(reqs)
    if cuda == "13.4":
        assert "nvidia-cuda-cccl==13.3.4.3.1" in reqs  # PyPI has no 13.4 CCCL


# delvewheel lowercases each --exclude entry (split on ';' on Windows) and matches DLL names
# with fnmatch: what the repair must keep out of a Windows wheel.
MUST_NOT_BUNDLE = [
    "msvcp140.dll", "MSVCP140_1.dll", "msvcp140_2.dll", "vcruntime140.dll", "VCRUNTIME140_1.dll",
    "concrt140.dll", "vcomp140.dll", "c10.dll", "c10_cuda.dll", "torch.dll", "torch_cpu.dll",
    "torch_cuda.dll", "torch_python.dll", "cudart64_12.dll", "cudart64_110.dll", "cudart64_13.dll",
    "cublas64_12.dll", "cublasLt64_13.dll", "nvrtc64_120_0.dll", "libiomp5md.dll",
]


def test_windows_repair_excludes_msvc_runtime_torch_and_cuda(monkeypatch, tmp_path):
    (cell,) = matrix.select(torch="2.14", cuda="13.0", platform="win_amd64")
    calls = []

    def fake_sh(cmd, env=None, cwd=None):
        calls.append(list(cmd))
        (tmp_path / "out" / "x.whl").write_bytes(b"")

    _patch_sh(monkeypatch, fake_sh)
    build_cell.repair(cell, tmp_path / "in.whl", tmp_path / "out", torch_lib=r"C:\t\lib")
    (cmd,) = calls
    assert cmd[:2] == ["delvewheel", "repair"]
    patterns = [p.strip().lower() for p in cmd[cmd.index("--exclude") + 1].split(";") if p.strip()]
    for dll in MUST_NOT_BUNDLE:
        assert any(fnmatch.fnmatch(dll.lower(), p) for p in patterns), dll
    assert not any(fnmatch.fnmatch("python312.dll", p) or fnmatch.fnmatch("_cuda.pyd", p) for p in patterns)


def test_verify_accepts_our_extensions_and_names_each_vendored_library():
    ours = ["causal_conv1d/_cuda.cp312-win_amd64.pyd", "selective_scan/_cuda.cp312-win_amd64.pyd",
            "causal_conv1d/_cuda.cpython-312-x86_64-linux-gnu.so", "mamba_kernels/__init__.py"]
    assert build_cell.vendored_problems(ours) == []
    bad = ours + ["mamba_kernels.libs/msvcp140-0a1b.dll", "mamba_kernels.libs/c10.dll",
                  "mamba_kernels.libs/.load-order-mamba_kernels-0.1.0", "mamba_kernels.libs/zlib1.dll",
                  "mamba_kernels.libs/libcudart-1234abcd.so.12"]
    problems = build_cell.vendored_problems(bad)
    assert len(problems) == 5
    assert "MSVC runtime" in problems[0] and "msvcp140-0a1b.dll" in problems[0]
    assert "torch or CUDA" in problems[1]
    assert "delvewheel" in problems[2]
    assert "nothing should be" in problems[3]
    assert "torch or CUDA" in problems[4]


def test_a_cell_installs_torch_once_without_a_pip_cache(monkeypatch, tmp_path):
    (cell,) = matrix.select(torch="2.9", cuda="13.0", python="3.12", platform="linux_x86_64")
    calls = _captured_sh(monkeypatch)
    monkeypatch.setattr(build_cell, "check_torch", lambda cell, python, which="build": None)
    monkeypatch.setattr(build_cell, "provision_toolkit", lambda cell, python: None)
    shared = tmp_path / "torch"
    build_site, test_site = tmp_path / "build-site", tmp_path / "test-site"
    build_site.mkdir()
    test_site.mkdir()
    monkeypatch.setattr(build_cell, "site_packages", lambda python: str(build_site))
    _pytorch_index(monkeypatch)
    build_cell.provision(cell, "build-python", torch_dir=shared)
    monkeypatch.setattr(build_cell, "site_packages", lambda python: str(test_site))
    (shared / "torch").mkdir(parents=True)  # what the first install left
    build_cell.provision_test(cell, "test-python", torch_dir=shared)
    torch_installs = [c for c in calls if any(a.startswith("torch==") for a in c)]
    assert len(torch_installs) == 1
    assert all("--no-cache-dir" in c for c in calls if "pip" in c and "install" in c)
    for site in (build_site, test_site):
        (pth,) = site.glob("*.pth")
        assert pth.read_text().strip() == str(shared)


def test_a_stable_cell_builds_on_the_newest_torch_and_tests_on_its_target(monkeypatch, tmp_path):
    (cell,) = matrix.select(binding="stable", cuda="12.8", platform="linux_x86_64")
    calls = _captured_sh(monkeypatch)
    checked = []
    monkeypatch.setattr(build_cell, "check_torch", lambda cell, python, which="build": checked.append(which))
    monkeypatch.setattr(build_cell, "provision_toolkit", lambda cell, python: None)
    monkeypatch.setattr(build_cell, "site_packages", lambda python: str(tmp_path))
    _pytorch_index(monkeypatch)
    shared = tmp_path / "torch"
    build_cell.provision(cell, "build-python", torch_dir=shared)
    (shared / "torch").mkdir(parents=True)  # what the build's install left
    (shared / "stale-build-file").write_text("x")
    build_cell.provision_test(cell, "test-python", torch_dir=shared)
    installs = [c for c in calls if any(a.startswith("torch==") for a in c)]
    # torch 2.11's cu128 build for the headers (the newest with a cu128 build), then torch
    # 2.10's cu128 build for the smoke test, in place of the first: each the newest patch the
    # index has, from that index alone.
    got = [(c[c.index("--index-url") + 1], next(a for a in c if a.startswith("torch=="))) for c in installs]
    assert got == [
        ("https://download.pytorch.org/whl/cu128", "torch==2.11.2+cu128"),
        ("https://download.pytorch.org/whl/cu128", "torch==2.10.2+cu128"),
    ]
    assert not any("--extra-index-url" in c for c in installs)
    assert not (shared / "stale-build-file").exists()
    assert (shared / build_cell.TORCH_STAMP).read_text().split() == ["2.10", "12.8"]
    assert checked == ["build", "test"]


STABLE_BUILD_INFO = {
    "format": 1, "torch_version": "2.11.0+cu128", "torch_cuda": "12.8", "nvcc_version": "12.8.93",
    "cxx11_abi": True, "release": True, "package_version": "0.1.0+cu128stable2.10",
    "sass": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], "ptx": ["compute_120"],
    "platform": "linux_x86_64", "binding": "stable", "stable_target": "2.10", "cuda_major": 12,
}


def _fatbin(sass, ptx) -> bytes:
    """A fat-binary container (16-byte header, 64-byte entry headers) holding these targets."""
    body = b""
    for kind, arch in [(2, int(a[3:])) for a in sass] + [(1, int(a[8:])) for a in ptx]:
        head = bytearray(64)
        head[0:2] = kind.to_bytes(2, "little")
        head[4:8] = (64).to_bytes(4, "little")
        head[28:32] = arch.to_bytes(4, "little")
        body += bytes(head)
    return (0xBA55ED50).to_bytes(4, "little") + (1).to_bytes(2, "little") + (16).to_bytes(2, "little") + \
        len(body).to_bytes(8, "little") + body


def _stable_wheel(folder: Path, cell, info: dict, tags: str = "cp310-abi3", requires: str = "torch>=2.10"):
    name = variant.wheel_name("0.1.0", cell)
    version = variant.cell_release_version("0.1.0", cell)
    di = f"mamba_kernels-{version}.dist-info"
    plat = variant.platform_tag(cell)
    ext = (json.dumps(info).encode() + b"\x00" + _fatbin(info["sass"], info["ptx"]))
    files = {
        f"{di}/METADATA": f"Metadata-Version: 2.1\nName: mamba-kernels\nVersion: {version}\n"
                          f"Requires-Dist: {requires}\n\n",
        f"{di}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tags}-{plat}\n",
        "causal_conv1d/_cuda.abi3.so": ext,
        "selective_scan/_cuda.abi3.so": ext,
    }
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / name, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
    return folder / name


def test_verify_accepts_a_stable_wheel_and_names_each_wrong_field(tmp_path):
    (cell,) = matrix.select(binding="stable", cuda="12.8", platform="linux_x86_64")
    good = _stable_wheel(tmp_path / "good", cell, STABLE_BUILD_INFO)
    assert build_cell.verify(cell, good, "0.1.0", require_cuobjdump=False) == []
    assert build_cell.cell_of_wheel(good) == cell
    classic = dict(STABLE_BUILD_INFO, binding="classic", stable_target=None, nvcc_version="12.6.85",
                   torch_cuda="12.6")
    bad = _stable_wheel(tmp_path / "bad", cell, classic, tags="cp310-cp310", requires="torch==2.14.*")
    problems = build_cell.verify(cell, bad, "0.1.0", require_cuobjdump=False)
    text = "\n".join(problems)
    assert "METADATA torch requirement 'torch==2.14.*' != 'torch>=2.10'" in text
    assert "WHEEL tags ['cp310-cp310-manylinux_2_28_x86_64'] != ['cp310-abi3-manylinux_2_28_x86_64']" in text
    for kernel in ("causal_conv1d", "selective_scan"):
        assert f"{kernel}/_cuda.abi3.so: BUILD_INFO binding 'classic' != 'stable'" in text
        assert f"{kernel}/_cuda.abi3.so: BUILD_INFO stable_target None != '2.10'" in text
        assert f"{kernel}/_cuda.abi3.so: BUILD_INFO nvcc '12.6' != '12.8'" in text
        assert f"{kernel}/_cuda.abi3.so: BUILD_INFO torch_cuda '12.6' != '12.8'" in text
    assert len(problems) == 2 + 2 * 4


# ----------------------------------------------------------------------------- platforms


def test_each_platform_has_one_cell_builder_implementing_the_whole_interface():
    base = platforms.base.Platform
    interface = platforms.base.INTERFACE
    assert {"toolkit_home", "provision_toolkit", "cibuildwheel_env", "repair_command"} <= set(interface)
    for builder in platforms.PLATFORMS:
        missing = [m for m in interface if getattr(type(builder), m) is getattr(base, m)]
        assert missing == [], f"{builder.name} does not implement {missing}"
    for plat in support.PLATFORMS:
        cell = next(iter(matrix.select(platform=plat)))
        assert [b for b in platforms.PLATFORMS if b.handles(cell)] == [platforms.for_cell(cell)]


def test_build_cell_has_no_platform_name_branches():
    """build_cell.py dispatches through platforms.for_cell: no platform name in its code and no
    comparison of a cell's platform (sys.platform, the machine's, is not a cell's)."""
    import ast

    tree = ast.parse((ROOT / "ci" / "build_cell.py").read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in support.PLATFORMS:
            found.append(f"line {node.lineno}: {node.value!r}")
        if isinstance(node, ast.Compare):
            against_none = any(isinstance(c, ast.Constant) and c.value is None for c in node.comparators)
            for side in [node.left, *node.comparators]:
                if (isinstance(side, ast.Attribute) and side.attr == "platform" and not against_none
                        and not (isinstance(side.value, ast.Name) and side.value.id == "sys")):
                    found.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert found == []


# ----------------------------------------------------------------------------- toolkit installers


def test_windows_installer_is_asked_for_the_components_of_its_release(monkeypatch, tmp_path):
    for cuda in ("11.8", "12.8", "13.0"):
        cell = matrix.select(platform="win_amd64", cuda=cuda)[0]
        calls = _captured_sh(monkeypatch)
        monkeypatch.setattr(platforms.base, "download", lambda url, dest, **kw: dest)  # nothing downloaded
        monkeypatch.setattr(windows.WINDOWS, "toolkit_home", lambda c: str(tmp_path / "none"))
        with pytest.raises(CellError, match="did not create"):
            windows.install_windows_toolkit(cell)
        (cmd,) = calls
        assert cmd[1] == "-s" and cmd[-1] == "-n"
        assert tuple(cmd[2:-1]) == support.windows_components(cuda)


def _redist_archive(folder: Path, name: str, version: str, files: dict) -> Path:
    import io
    import tarfile

    top = f"{name}-linux-x86_64-{version}-archive"
    path = folder / f"{top}.tar.xz"
    with tarfile.open(path, "w:xz") as tar:
        for rel, data in files.items():
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size = len(data)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
    return path


def test_redist_toolkit_is_checked_and_shaped_like_a_toolkit(monkeypatch, tmp_path):
    import hashlib

    src = tmp_path / "src"
    src.mkdir()
    made = {
        "cuda_nvcc": _redist_archive(src, "cuda_nvcc", "12.4.131", {"bin/nvcc": b"#!/bin/sh\n"}),
        "cuda_cudart": _redist_archive(src, "cuda_cudart", "12.4.127",
                                       {"include/cuda_runtime.h": b"", "lib/libcudart.so": b""}),
    }
    tk = support.LinuxToolkit("12.4", "redist", release="12.4.1", archives={
        n: (p.name.split("-")[3], hashlib.sha256(p.read_bytes()).hexdigest()) for n, p in made.items()})
    # the real download (its sha256 check included), from the archives here instead of NVIDIA's
    real = platforms.base.download
    monkeypatch.setattr(platforms.base, "download", lambda url, dest, **kw: real(
        (src / url.rsplit("/", 1)[1]).as_uri(), dest, **kw))
    calls = _captured_sh(monkeypatch)
    cell = matrix.select(torch="2.5", cuda="12.4", platform="linux_x86_64")[0]
    home = linux.install_redist_toolkit(cell, tk, tmp_path / "cuda-12.4")
    assert (home / "bin" / "nvcc").is_file() and (home / "lib64" / "libcudart.so").exists()
    assert (home / "targets" / "x86_64-linux" / "include" / "cuda_runtime.h").exists()
    assert [c for c in calls if support.PYPI_CUOBJDUMP in c]  # cuobjdump from PyPI
    # a changed archive is refused before anything is unpacked from it
    bad = dict(tk.archives, cuda_nvcc=(tk.archives["cuda_nvcc"][0], "0" * 64))
    with pytest.raises(CellError, match="sha256"):
        linux.install_redist_toolkit(cell, support.LinuxToolkit("12.4", "redist", release="12.4.1",
                                                                archives=bad), tmp_path / "other")


# ----------------------------------------------------------------------------- downloads and pip


class _Scripted(BaseHTTPRequestHandler):
    """Answers the n-th GET with ``steps[n]`` (the last step repeats): ("status", code, headers),
    ("file", body), ("serve",) (the file ``files`` holds for the path), ("cut", body) (the
    headers promise the whole body, half of it comes, then the connection closes) or ("drop",)
    (the connection closes without an answer)."""

    steps: list = []
    files: dict = {}
    seen: list = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        step = self.steps[min(len(self.seen), len(self.steps) - 1)]
        self.seen.append(self.path)
        kind = step[0]
        if kind == "drop":
            self.close_connection = True
            return
        if kind == "status":
            self.send_response(step[1])
            for k, v in step[2].items():
                self.send_header(k, v)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = self.files[self.path.rsplit("/", 1)[-1]] if kind == "serve" else step[1]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if kind == "cut" else body)
        if kind == "cut":
            self.wfile.flush()
            self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def scripted():
    """A real HTTP server on 127.0.0.1 answering as _Scripted.steps says; yields its base URL."""
    _Scripted.steps, _Scripted.files, _Scripted.seen = [], {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


BODY = bytes(range(256)) * 64  # 16 KiB
BODY_SHA = hashlib.sha256(BODY).hexdigest()


def _left(folder: Path):
    return sorted(p.name for p in folder.iterdir())


def test_download_retries_http_503_honouring_retry_after(scripted, tmp_path, capsys):
    _Scripted.steps = [("status", 503, {"Retry-After": "7"}), ("status", 503, {}), ("file", BODY)]
    waits = []
    dest = tmp_path / "out" / "archive.tar.xz"
    got = platforms.base.download(f"{scripted}/a/archive.tar.xz", dest, sha256=BODY_SHA, backoff=0.01,
                                  sleep=waits.append)
    assert got == dest and dest.read_bytes() == BODY
    assert len(_Scripted.seen) == 3
    assert waits == [7.0, 0.02]  # the server's Retry-After, then the backoff (doubled for the second retry)
    retries = [ln for ln in capsys.readouterr().err.splitlines() if "retrying" in ln]
    assert len(retries) == 2
    assert all("HTTP 503" in ln and f"{scripted}/a/archive.tar.xz" in ln for ln in retries)
    assert _left(dest.parent) == ["archive.tar.xz"]  # no .part


def test_download_retries_a_connection_closed_early_or_without_an_answer(scripted, tmp_path, capsys):
    _Scripted.steps = [("cut", BODY), ("drop",), ("file", BODY)]
    waits = []
    dest = platforms.base.download(f"{scripted}/f.bin", tmp_path / "f.bin", sha256=BODY_SHA, backoff=0.001,
                                   sleep=waits.append)
    assert dest.read_bytes() == BODY and len(_Scripted.seen) == 3 and len(waits) == 2
    err = capsys.readouterr().err
    assert f"closed after {len(BODY) // 2} of {len(BODY)} bytes" in err
    assert "RemoteDisconnected" in err
    assert _left(tmp_path) == ["f.bin"]


def test_download_with_a_wrong_sha256_leaves_nothing(scripted, tmp_path):
    _Scripted.steps = [("file", BODY)]
    with pytest.raises(CellError) as e:
        platforms.base.download(f"{scripted}/f.bin", tmp_path / "f.bin", sha256="0" * 64,
                                sleep=lambda s: None)
    msg = str(e.value)
    assert "\n" not in msg and f"{scripted}/f.bin" in msg
    assert f"sha256 {BODY_SHA} is not the expected {'0' * 64}" in msg
    assert len(_Scripted.seen) == 1  # a pinned file that changed is not fetched again
    assert _left(tmp_path) == []


def test_download_that_always_fails_stops_with_one_line(scripted, tmp_path, capsys):
    _Scripted.steps = [("status", 500, {})]
    waits = []
    with pytest.raises(CellError) as e:
        platforms.base.download(f"{scripted}/f.bin", tmp_path / "f.bin", attempts=4, backoff=0.001,
                                sleep=waits.append)
    assert str(e.value) == (f"download {scripted}/f.bin failed after 4 attempts: "
                            "HTTP 500 Internal Server Error")
    assert len(_Scripted.seen) == 4 and waits == [0.001, 0.002, 0.004]
    assert len([ln for ln in capsys.readouterr().err.splitlines() if "retrying" in ln]) == 3
    assert _left(tmp_path) == []


def test_download_does_not_retry_a_missing_file_and_is_bounded_when_nothing_answers(scripted, tmp_path):
    _Scripted.steps = [("status", 404, {})]
    with pytest.raises(CellError, match=r"HTTP 404 Not Found \(attempt 1 of 5; not retried\)"):
        platforms.base.download(f"{scripted}/f.bin", tmp_path / "f.bin", sleep=lambda s: None)
    assert len(_Scripted.seen) == 1
    waits = []
    with pytest.raises(CellError) as e:  # the discard port: connection refused, every attempt
        platforms.base.download("http://127.0.0.1:9/f.bin", tmp_path / "f.bin", attempts=3, backoff=0.001,
                                sleep=waits.append)
    assert "\n" not in str(e.value) and "http://127.0.0.1:9/f.bin failed after 3 attempts" in str(e.value)
    assert len(waits) == 2 and _left(tmp_path) == []


def test_redist_archives_are_downloaded_with_retries(scripted, monkeypatch, tmp_path):
    import hashlib

    src = tmp_path / "src"
    src.mkdir()
    nvcc = _redist_archive(src, "cuda_nvcc", "12.4.131", {"bin/nvcc": b"#!/bin/sh\n"})
    _Scripted.files = {nvcc.name: nvcc.read_bytes()}
    _Scripted.steps = [("status", 503, {}), ("drop",), ("serve",)]
    monkeypatch.setattr(support, "REDIST_URL", scripted)  # NVIDIA's server, here
    monkeypatch.setattr(platforms.base, "DOWNLOAD_BACKOFF_S", 0.001, raising=False)
    _captured_sh(monkeypatch)
    tk = support.LinuxToolkit("12.4", "redist", release="12.4.1", archives={
        "cuda_nvcc": ("12.4.131", hashlib.sha256(nvcc.read_bytes()).hexdigest())})
    cell = matrix.select(torch="2.5", cuda="12.4", platform="linux_x86_64")[0]
    home = linux.install_redist_toolkit(cell, tk, tmp_path / "cuda-12.4")
    assert (home / "bin" / "nvcc").is_file() and len(_Scripted.seen) == 3


def test_every_pip_install_of_the_cell_drivers_has_retries_and_a_timeout(monkeypatch, tmp_path):
    # pip install is spelled in one place only: base.pip_install
    spelled = []
    for path in [ROOT / "ci" / "build_cell.py", *sorted((ROOT / "ci" / "platforms").glob("*.py"))]:
        text = path.read_text()
        spelled += [f"{path.name}:{text[:m.start()].count(chr(10)) + 1}"
                    for m in re.finditer(r'"pip",\s*"install"', text)]
    assert len(spelled) == 1 and spelled[0].startswith("base.py:"), spelled
    flags = ["--retries", str(platforms.base.PIP_RETRIES), "--timeout", str(platforms.base.PIP_TIMEOUT_S)]
    assert platforms.base.pip_install("py")[4:] == flags
    # and the installs a Linux cell's provision runs all carry them (torch, tools, PyPI's CUDA)
    (cell,) = matrix.select(torch="2.9", cuda="13.0", python="3.12", platform="linux_x86_64")
    calls = _captured_sh(monkeypatch)
    monkeypatch.setattr(build_cell, "check_torch", lambda cell, python, which="build": None)
    monkeypatch.setattr(build_cell, "site_packages", lambda python: str(tmp_path))
    monkeypatch.setattr(linux, "CONTAINER_TOOLKIT", str(tmp_path / "cuda"))
    _pytorch_index(monkeypatch)
    with pytest.raises(CellError, match="nvcc"):  # nothing really installed
        build_cell.provision(cell, "build-python", torch_dir=tmp_path / "torch")
    pips = [c for c in calls if c[1:4] == ["-m", "pip", "install"]]
    assert len(pips) >= 4 and all(c[4:8] == flags for c in pips), pips
    # cibuildwheel's own pip calls (the build frontend, the wheel into the test environment)
    for c in (cell, matrix.select(platform="win_amd64")[0]):
        env = build_cell.cibuildwheel_env(c, "/tmp/cache")
        got = _parsed(env.get("CIBW_ENVIRONMENT_LINUX") or env["CIBW_ENVIRONMENT_WINDOWS"], LINUX_PATH)
        assert (got["PIP_RETRIES"], got["PIP_TIMEOUT"]) == (flags[1], flags[3])


# ----------------------------------------------------------------------------- MSVC toolset


class _FakeRunner:
    """subprocess.run of ci/platforms/windows.py on a runner whose Visual Studio at ``vs`` lacks
    the older toolsets until the installer adds them; the prompt reports the toolset asked for."""

    def __init__(self, vs: Path, installer_status: int = 0, default: str = "14.44.35207"):
        self.vs, self.status, self.default = vs, installer_status, default
        self.calls: list = []

    def __call__(self, cmd, **kw):
        import subprocess

        self.calls.append(cmd)
        if isinstance(cmd, list) and cmd[0].endswith("vs_installer.exe"):
            if self.status in windows.VS_INSTALLER_OK:
                cl = self.vs / "VC" / "Tools" / "MSVC" / "14.29.30133" / "bin" / "Hostx64" / "x64" / "cl.exe"
                cl.parent.mkdir(parents=True, exist_ok=True)
                cl.write_text("")
            return subprocess.CompletedProcess(cmd, self.status)
        assert "vcvars64.bat" in cmd
        version = "14.29.30133" if "-vcvars_ver=14.29" in cmd else self.default
        out = f"VCToolsVersion={version}\nPath=C:\\x\n"
        return subprocess.CompletedProcess(cmd, 0, stdout=out, stderr="")

    def installer_calls(self):
        return [c for c in self.calls if isinstance(c, list)]

    def vcvars_calls(self):
        return [c for c in self.calls if isinstance(c, str)]


def _fake_runner(monkeypatch, tmp_path, **kw) -> _FakeRunner:
    fake = _FakeRunner(tmp_path, **kw)
    monkeypatch.setattr(windows, "visual_studio", lambda: tmp_path)
    monkeypatch.setattr(windows.subprocess, "run", fake)
    return fake


@pytest.mark.parametrize("cell", _one_per_cuda("win_amd64"), ids=matrix.cell_id)
def test_windows_cells_before_cuda_12_4_install_and_load_the_14_29_toolset(monkeypatch, tmp_path, cell):
    fake = _fake_runner(monkeypatch, tmp_path)
    env = windows.WINDOWS.runner_env(cell)
    if cell.cuda in ("11.8", "12.1"):
        # the installer step first (the toolset is missing here), then the prompt of that toolset
        assert fake.installer_calls() == [[
            str(windows._installer_dir() / "vs_installer.exe"), "modify", "--installPath", str(tmp_path),
            "--add", "Microsoft.VisualStudio.Component.VC.14.29.16.11.x86.x64", "--quiet", "--norestart",
            "--nocache"]]
        (vcvars,) = fake.vcvars_calls()
        assert str(tmp_path / "VC" / "Auxiliary" / "Build" / "vcvars64.bat") in vcvars
        assert " -vcvars_ver=14.29 " in vcvars
        assert env["VCToolsVersion"].startswith("14.29.")
    else:
        assert fake.installer_calls() == []
        (vcvars,) = fake.vcvars_calls()
        assert "-vcvars_ver" not in vcvars and env["VCToolsVersion"] == "14.44.35207"


def test_every_windows_cell_below_cuda_12_4_plans_the_toolset_and_no_other_does():
    cells = matrix.select(platform="win_amd64")
    old = [c for c in cells if c.cuda in ("11.8", "12.1")]
    assert len(old) == 48  # 29 with CUDA 11.8, 19 with 12.1 (torch 2.1 to 2.5)
    for c in cells:
        toolset = windows.cell_msvc_toolset(c)
        got = build_cell.cibuildwheel_env(c)["CIBW_ENVIRONMENT_WINDOWS"]
        if c in old:
            assert toolset is not None and toolset.vcvars_arg == "-vcvars_ver=14.29", matrix.cell_id(c)
            assert f'{windows.MSVC_TOOLSET_VAR}="14.29"' in got
        else:
            assert toolset is None and windows.MSVC_TOOLSET_VAR not in got, matrix.cell_id(c)
        assert "allow-unsupported-compiler" not in got and "_ALLOW_COMPILER_AND_STL" not in got
    # a Linux cell of the same CUDA selects nothing
    (linux_cell,) = matrix.select(torch="2.4", cuda="11.8", python="3.10", platform="linux_x86_64")
    assert windows.cell_msvc_toolset(linux_cell) is None and windows.windows_compiler_env(linux_cell) == {}


def test_an_installed_toolset_is_not_installed_again_and_installer_failures_stop(monkeypatch, tmp_path):
    (cell,) = matrix.select(torch="2.4", cuda="12.1", python="3.11", platform="win_amd64")
    fake = _fake_runner(monkeypatch, tmp_path)
    windows.WINDOWS.runner_env(cell)
    windows.WINDOWS.runner_env(cell)  # now present: only the prompt
    assert len(fake.installer_calls()) == 1 and len(fake.vcvars_calls()) == 2
    # 3010: done, a restart pending (the toolset is usable without one)
    fake = _fake_runner(monkeypatch, tmp_path / "b", installer_status=3010)
    assert windows.WINDOWS.runner_env(cell)["VCToolsVersion"].startswith("14.29.")
    _fake_runner(monkeypatch, tmp_path / "c", installer_status=1)
    with pytest.raises(CellError, match="Visual Studio installer failed"):
        windows.WINDOWS.runner_env(cell)


def test_a_prompt_of_another_toolset_is_refused_by_runner_env_and_by_provision(monkeypatch, tmp_path):
    (cell,) = matrix.select(torch="2.1", cuda="11.8", python="3.10", platform="win_amd64")
    fake = _fake_runner(monkeypatch, tmp_path)
    # vcvars64 printing another toolset's environment than the one asked for
    real = fake.__call__

    def wrong(cmd, **kw):
        r = real(cmd, **kw)
        if isinstance(cmd, str):
            r.stdout = "VCToolsVersion=14.44.35207\n"
        return r

    monkeypatch.setattr(windows.subprocess, "run", wrong)
    with pytest.raises(CellError, match="VCToolsVersion 14.44.35207, the cell builds with toolset 14.29"):
        windows.WINDOWS.runner_env(cell)
    # provision (inside cibuildwheel) stops before the toolkit when the prompt is not 14.29's
    installed = []
    monkeypatch.setattr(windows, "install_windows_toolkit", lambda c: installed.append(c))
    monkeypatch.setenv("VCToolsVersion", "14.44.35207")
    with pytest.raises(CellError, match="load vcvars64.bat -vcvars_ver=14.29"):
        windows.WINDOWS.provision_toolkit(cell, "python")
    assert installed == []
    monkeypatch.setenv("VCToolsVersion", "14.29.30133")
    windows.WINDOWS.provision_toolkit(cell, "python")
    (new,) = matrix.select(torch="2.9", cuda="13.0", python="3.12", platform="win_amd64")
    monkeypatch.setenv("VCToolsVersion", "14.44.35207")
    windows.WINDOWS.provision_toolkit(new, "python")  # the runner's default serves CUDA 13.0
    assert installed == [cell, new]


# ----------------------------------------------------------------------------- which torch


def test_torch_comes_from_the_cells_pytorch_index_alone():
    for cell in matrix.select():
        for which in (build_cell.BUILD, build_cell.TEST):
            torch, cuda = build_cell.torch_of(cell, which)
            assert build_cell.torch_install_args(cell, None, which) == [
                f"torch=={torch}.*", "--index-url", cell_fields.torch_index(cuda)], matrix.cell_id(cell)
    (cell,) = matrix.select(torch="2.8", cuda="12.8", python="3.11", platform="linux_x86_64")
    assert build_cell.torch_install_args(cell, None, version="2.8.1+cu128") == [
        "torch==2.8.1+cu128", "--index-url", "https://download.pytorch.org/whl/cu128"]
    assert build_cell.torch_install_args(cell, "http://mirror/cu128", version="2.8.1+cu128") == [
        "torch==2.8.1+cu128", "--index-url", "http://mirror/cu128"]
    for wrong in ("2.8.1", "2.8.1+cu126", "2.9.0+cu128", "2.8.1+cpu"):
        with pytest.raises(ValueError, match="is not a build of torch 2.8 for CUDA 12.8"):
            build_cell.torch_install_args(cell, None, version=wrong)
    # a developer's machine that reaches only PyPI: the plain release from there
    assert build_cell.torch_install_args(cell, "pypi") == ["torch==2.8.*"]


def test_the_exact_torch_build_is_the_newest_patch_of_the_cells_variant_python_and_platform():
    (cell,) = matrix.select(torch="2.8", cuda="12.8", python="3.11", platform="linux_x86_64")
    ok = "cp311-cp311-manylinux_2_28_x86_64.whl"
    names = [
        f"torch-2.8.0+cu128-{ok}", f"torch-2.8.1+cu128-{ok}", f"torch-2.8.10+cu128-{ok}",
        f"torch-2.8.20+cu126-{ok}",  # another CUDA variant
        f"torch-2.8.21+cpu-{ok}",  # a CPU build
        f"torch-2.8.22+cu128.with.pypi.cudnn-{ok}",  # not the plain cu128 build
        f"torch-2.8.23rc1+cu128-{ok}",  # a pre-release
        f"torch-2.9.24+cu128-{ok}",  # another release
        "torch-2.8.25+cu128-cp313-cp313-manylinux_2_28_x86_64.whl",  # another Python
        "torch-2.8.26+cu128-cp311-cp311t-manylinux_2_28_x86_64.whl",  # free-threaded
        "torch-2.8.27+cu128-cp311-cp311-manylinux_2_28_aarch64.whl",  # another platform
        "torch-2.8.28+cu128-cp311-cp311-win_amd64.whl",
        "torch-2.8.29+cu128-cp311-cp311-manylinux_2_34_x86_64.whl",  # newer glibc than the image's
        "torch-2.8.30+cu128-cp311-cp311-manylinux_2_28_x86_64.whl.metadata",
    ]
    assert build_cell.newest_torch_build(cell, build_cell.BUILD, names) == "2.8.10+cu128"
    assert build_cell.newest_torch_build(cell, build_cell.BUILD, names[3:]) is None
    # PyTorch's index tagged its older Linux wheels plain linux_x86_64, which pip takes on any glibc
    (old,) = matrix.select(torch="2.1", cuda="12.1", python="3.11", platform="linux_x86_64")
    assert build_cell.newest_torch_build(old, build_cell.BUILD, [
        "torch-2.1.2+cu121-cp311-cp311-linux_x86_64.whl"]) == "2.1.2+cu121"
    # a stable cell: its build torch and its test torch, each on its own variant's index
    (stable,) = matrix.select(binding="stable", cuda="12.6", platform="win_amd64")
    both = ["torch-2.14.1+cu126-cp310-cp310-win_amd64.whl", "torch-2.10.0+cu126-cp310-cp310-win_amd64.whl"]
    assert build_cell.newest_torch_build(stable, build_cell.BUILD, both) == "2.14.1+cu126"
    assert build_cell.newest_torch_build(stable, build_cell.TEST, both) == "2.10.0+cu126"


SIMPLE_PAGE = """<!DOCTYPE html><html><body><h1>Links for torch</h1>
<a href="/whl/cu128/torch-2.11.0%2Bcu128-cp310-cp310-manylinux_2_28_x86_64.whl#sha256=00">torch-2.11.0+cu128-cp310-cp310-manylinux_2_28_x86_64.whl</a><br/>
<a href="/whl/cu128/torch-2.11.1%2Bcu128-cp310-cp310-manylinux_2_28_x86_64.whl#sha256=11" data-yanked="">torch-2.11.1+cu128-cp310-cp310-manylinux_2_28_x86_64.whl</a><br/>
<a href="/whl/cu128/torch-2.11.2%2Bcu128-cp311-cp311-manylinux_2_28_x86_64.whl#sha256=22">torch-2.11.2+cu128-cp311-cp311-manylinux_2_28_x86_64.whl</a><br/>
</body></html>
"""  # noqa: E501 (one anchor per line, as PyTorch's index writes them)


def test_provision_pins_the_exact_build_the_index_page_lists(scripted, monkeypatch, tmp_path, capsys):
    (cell,) = matrix.select(binding="stable", cuda="12.8", platform="linux_x86_64")  # builds with 2.11
    _Scripted.files = {"": SIMPLE_PAGE.encode()}
    _Scripted.steps = [("status", 503, {}), ("serve",)]
    monkeypatch.setattr(platforms.base, "DOWNLOAD_BACKOFF_S", 0.001)
    calls = _captured_sh(monkeypatch)
    monkeypatch.setattr(build_cell, "check_torch", lambda cell, python, which="build": None)
    monkeypatch.setattr(build_cell, "provision_toolkit", lambda cell, python: None)
    monkeypatch.setattr(build_cell, "site_packages", lambda python: str(tmp_path))
    index = f"{scripted}/whl/cu128"
    build_cell.provision(cell, "build-python", torch_index=index, torch_dir=tmp_path / "torch")
    (install,) = [c for c in calls if any(a.startswith("torch==") for a in c)]
    # the yanked 2.11.1 and the cp311 2.11.2 are not the cell's
    assert install[-3:] == ["torch==2.11.0+cu128", "--index-url", index]
    assert _Scripted.seen == ["/whl/cu128/torch/"] * 2  # the page, read again after a 503
    assert f"torch torch==2.11.0+cu128 from {index} only" in capsys.readouterr().err


def test_an_unreadable_index_page_pins_the_release_from_that_index_alone(monkeypatch, capsys):
    (cell,) = matrix.select(torch="2.8", cuda="12.8", python="3.11", platform="linux_x86_64")

    def down(url, project="torch"):
        raise CellError(f"download {url}/{project}/ failed after 5 attempts: Name or service not known")

    monkeypatch.setattr(build_cell, "index_files", down)
    assert build_cell.torch_install(cell, None) == [
        "torch==2.8.*", "--index-url", "https://download.pytorch.org/whl/cu128"]
    assert "torch pinned to its release only, from https://download.pytorch.org/whl/cu128 alone" in \
        capsys.readouterr().err


def test_an_index_without_the_cells_build_fails_before_pip_runs(monkeypatch):
    (cell,) = matrix.select(torch="2.8", cuda="12.8", python="3.11", platform="win_amd64")
    _pytorch_index(monkeypatch, drop={"torch-2.8.0+cu128-cp311-cp311-win_amd64.whl",
                                      "torch-2.8.1+cu128-cp311-cp311-win_amd64.whl",
                                      "torch-2.8.2+cu128-cp311-cp311-win_amd64.whl"})
    with pytest.raises(CellError, match=r"https://download.pytorch.org/whl/cu128 has no torch 2.8.\*\+cu128 "
                                        r"wheel for CPython 3.11 on win_amd64"):
        build_cell.torch_install(cell, None)


def test_torch_index_pypi_installs_the_plain_release_from_pypi_and_says_so(monkeypatch, tmp_path, capsys):
    (cell,) = matrix.select(torch="2.8", cuda="12.8", python="3.11", platform="linux_x86_64")
    monkeypatch.setattr(build_cell, "index_files", lambda *a, **kw: pytest.fail("no index is read"))
    assert build_cell.torch_install(cell, "pypi") == ["torch==2.8.*"]
    assert "torch torch==2.8.* from PyPI (--torch-index pypi)" in capsys.readouterr().err
    # the local driver: build tools from PyPI, then torch alone, from PyPI
    calls = _captured_sh(monkeypatch)
    for name in ("check_torch", "_finish_local"):
        monkeypatch.setattr(build_cell, name, lambda *a, **kw: None)
    monkeypatch.setattr(build_cell, "stage_project", lambda dest, root=ROOT: dest)
    monkeypatch.setenv("PATH", os.environ["PATH"])  # the driver prepends its venv: restored after
    monkeypatch.setenv("CUOBJDUMP", str(tmp_path / "none"))
    args = build_cell.parser().parse_args(["local", matrix.cell_id(cell), "--torch-index", "pypi", "--python",
                                           sys.executable, "--work", str(tmp_path), "--cuda-home",
                                           str(tmp_path / "cuda"), "--wheelhouse", str(tmp_path / "w")])
    build_cell.local(cell, args)
    pips = [c[8:] for c in calls if c[1:4] == ["-m", "pip", "install"]]
    torch = [c for c in pips if any(a.startswith("torch") for a in c)]
    assert torch == [["--quiet", "torch==2.8.*"]], pips


def test_torch_env_brings_no_other_index(monkeypatch):
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://pypi.org/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    env = build_cell.torch_env()
    assert "PIP_EXTRA_INDEX_URL" not in env and "PIP_FIND_LINKS" not in env
    assert env["PIP_CONFIG_FILE"] == os.devnull
