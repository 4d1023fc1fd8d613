"""The static wheel index: files, hashes, checks, and real installs with pip and uv over HTTP."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from mamba_kernels import cli, index

BIN = Path(sys.executable).parent
CUDA_HOME = Path("/usr/local/cuda")


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(
    folder: Path,
    version: str = "0.1.0+cu130torch2.14",
    py: str = "cp311",
    plat: str = "manylinux_2_28_x86_64",
    requires: str = "torch==2.14.*",
    meta_version: str = "",
    payload: bytes = b"",
) -> Path:
    """A minimal valid wheel of this project (installable with --no-deps)."""
    name = f"mamba_kernels-{version}-{py}-{py}-{plat}.whl"
    di = f"mamba_kernels-{version}.dist-info"
    files = {
        "mamba_kernels_probe/__init__.py": b"VALUE = 42\n",
        f"{di}/METADATA": (
            f"Metadata-Version: 2.1\nName: mamba-kernels\nVersion: {meta_version or version}\n"
            f"Requires-Python: >=3.9\nRequires-Dist: {requires}\n"
            "Requires-Dist: packaging>=23\n\n"
        ).encode(),
        f"{di}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {py}-{py}-{plat}\n"
        ).encode(),
    }
    if payload:
        files["causal_conv1d/_cuda.cpython-311-x86_64-linux-gnu.so"] = payload
    record = [_record_line(n, d) for n, d in files.items()] + [f"{di}/RECORD,,"]
    files[f"{di}/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
    return path


def fatbin_blob(entries) -> bytes:
    """A fat-binary container as nvcc lays it out: 16-byte header, then 64-byte entry headers."""
    body = b""
    for kind, arch, payload in entries:
        head = bytearray(64)
        head[0:2] = kind.to_bytes(2, "little")
        head[2:4] = (0x0101).to_bytes(2, "little")
        head[4:8] = (64).to_bytes(4, "little")
        head[8:16] = len(payload).to_bytes(8, "little")
        head[28:32] = arch.to_bytes(4, "little")
        body += bytes(head) + payload
    return (
        (0xBA55ED50).to_bytes(4, "little")
        + (1).to_bytes(2, "little")
        + (16).to_bytes(2, "little")
        + len(body).to_bytes(8, "little")
        + body
    )


def test_fatbin_reader_on_a_synthetic_container():
    blob = b"\x7fELF junk" + fatbin_blob([(2, 80, b"x" * 10), (2, 90, b"y" * 7), (1, 90, b"ptx")]) + b"tail"
    blob += fatbin_blob([(2, 80, b"z")])  # a second container repeating sm_80
    assert index.fatbin_archs(blob) == (["sm_80", "sm_90"], ["compute_90"])
    assert index.fatbin_archs(b"no fat binary \x50\xed\x55\xba here") == ([], [])


def _cuobjdump() -> str:
    cands = [CUDA_HOME / "bin" / "cuobjdump", shutil.which("cuobjdump")]
    import importlib.util

    spec = importlib.util.find_spec("triton")
    if spec and spec.origin:
        cands.append(Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    found = [str(c) for c in cands if c and Path(c).is_file()]
    assert found, "cuobjdump not found (CUDA toolkit, PATH, or torch's triton package)"
    return found[0]


def test_fatbin_reader_agrees_with_nvcc_and_cuobjdump(tmp_path):
    nvcc = CUDA_HOME / "bin" / "nvcc"
    assert nvcc.is_file(), f"{nvcc} is needed to build the test binary"
    (tmp_path / "k.cu").write_text(
        "__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n"
        'extern "C" void run(float* x) { k<<<1, 32>>>(x); }\n'
    )
    so = tmp_path / "k.so"
    subprocess.run(
        [
            str(nvcc),
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-gencode",
            "arch=compute_75,code=sm_75",
            "-gencode",
            "arch=compute_90,code=sm_90",
            "-gencode",
            "arch=compute_90,code=compute_90",
            "-o",
            str(so),
            str(tmp_path / "k.cu"),
        ],
        check=True,
        capture_output=True,
    )
    out = subprocess.run(
        [_cuobjdump(), "--list-elf", "--list-ptx", str(so)], capture_output=True, text=True, check=True
    ).stdout
    sass = sorted(set(re.findall(r"\.(sm_\d+)\.cubin", out)))
    ptx = sorted({"compute_" + a for a in re.findall(r"\.sm_(\d+)\.ptx", out)})
    assert (sass, ptx) == (["sm_75", "sm_90"], ["compute_90"])
    assert index.fatbin_archs(so.read_bytes()) == (sass, ptx)


def test_index_files_manifest_and_hashes(tmp_path):
    wheels = tmp_path / "in"
    payload = fatbin_blob([(2, 80, b"a"), (2, 90, b"b"), (1, 90, b"c")])
    w1 = make_wheel(wheels / "a", payload=payload)
    w2 = make_wheel(wheels / "b", py="cp312")
    w3 = make_wheel(wheels, version="0.1.0+cu126torch2.6cxx11", py="cp310", requires="torch==2.6.*")
    (wheels / "notes.txt").write_text("ignored")
    out = tmp_path / "site"
    m = index.write_index(wheels, out)
    assert m["variants"] == ["cu126torch2.6cxx11", "cu130torch2.14"]
    by_name = {e["filename"]: e for e in m["wheels"]}
    assert set(by_name) == {w1.name, w2.name, w3.name}
    e1 = by_name[w1.name]
    assert e1["sha256"] == hashlib.sha256(w1.read_bytes()).hexdigest() and e1["size"] == w1.stat().st_size
    assert (e1["torch"], e1["cuda"], e1["cxx11_abi"], e1["python"], e1["platform"]) == (
        "2.14",
        "13.0",
        None,
        "3.11",
        "linux_x86_64",
    )
    assert by_name[w3.name]["cxx11_abi"] is True
    assert e1["archs"] == {
        "causal_conv1d/_cuda.cpython-311-x86_64-linux-gnu.so": {
            "sass": ["sm_80", "sm_90"],
            "ptx": ["compute_90"],
        }
    }
    assert e1["url"] == "wheels/mamba_kernels-0.1.0%2Bcu130torch2.14-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert json.loads((out / "manifest.json").read_text()) == m
    assert (out / "wheels" / w1.name).read_bytes() == w1.read_bytes()
    page = (out / "cu130torch2.14" / "simple" / "mamba-kernels" / "index.html").read_text()
    anchors = re.findall(
        r'<a href="([^"]+)#sha256=([0-9a-f]{64})" data-requires-python="&gt;=3.9">([^<]+)</a>', page
    )
    assert sorted(a[2] for a in anchors) == sorted([w1.name, w2.name])
    for href, sha, fname in anchors:
        assert href.startswith("../../../wheels/") and sha == by_name[fname]["sha256"]
    flat = (out / "cu130torch2.14" / "find-links.html").read_text()
    assert flat.count("#sha256=") == 2 and 'href="../wheels/' in flat
    assert "mamba-kernels/" in (out / "cu130torch2.14" / "simple" / "index.html").read_text()
    assert "cu126torch2.6cxx11/simple/" in (out / "index.html").read_text()


def test_base_url_links_release_assets_without_copying(tmp_path):
    w = make_wheel(tmp_path / "in")
    m = index.write_index(tmp_path / "in", tmp_path / "site", base_url="https://example.invalid/dl/v0.1.0")
    assert m["wheels"][0]["url"] == "https://example.invalid/dl/v0.1.0/" + w.name.replace("+", "%2B")
    assert not (tmp_path / "site" / "wheels").exists()
    page = (tmp_path / "site" / "cu130torch2.14" / "simple" / "mamba-kernels" / "index.html").read_text()
    assert 'href="https://example.invalid/dl/v0.1.0/mamba_kernels-0.1.0%2Bcu130torch2.14' in page


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"meta_version": "0.1.0"}, "METADATA Version '0.1.0' must equal the file name's version"),
        ({"requires": "torch>=2.1"}, "Requires-Dist must pin 'torch==2.14.\\*', got 'torch>=2.1'"),
        ({"version": "0.1.0"}, "has no variant label"),
    ],
)
def test_inconsistent_wheels_are_refused(tmp_path, kwargs, message):
    make_wheel(tmp_path / "in", **kwargs)
    with pytest.raises(ValueError, match=message):
        index.write_index(tmp_path / "in", tmp_path / "site")


def test_bad_directories_are_refused(tmp_path):
    with pytest.raises(ValueError, match="WHEEL_DIR must be a directory"):
        index.write_index(tmp_path / "missing", tmp_path / "site")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .whl file"):
        index.write_index(tmp_path / "empty", tmp_path / "site")
    make_wheel(tmp_path / "in" / "x")
    make_wheel(tmp_path / "in" / "y")
    with pytest.raises(ValueError, match="appears twice"):
        index.write_index(tmp_path / "in", tmp_path / "site")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="OUT_DIR must be an empty or new directory"):
        index.write_index(tmp_path / "in" / "x", tmp_path / "full")


def test_cli_index_verb(tmp_path, capsys):
    make_wheel(tmp_path / "in")
    assert cli.main(["index", str(tmp_path / "in"), str(tmp_path / "site")]) == 0
    assert "cu130torch2.14: 1 wheel(s)" in capsys.readouterr().out
    assert cli.main(["index", str(tmp_path / "in"), str(tmp_path / "site")]) == 2
    assert "OUT_DIR must be an empty or new directory" in capsys.readouterr().err


@pytest.fixture
def served(tmp_path):
    """OUT_DIR of a fresh index, served over plain HTTP on 127.0.0.1 (an ephemeral port)."""
    wheel = make_wheel(tmp_path / "in")
    site = tmp_path / "site"
    index.write_index(tmp_path / "in", site)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))

    class Quiet(handler.func):  # type: ignore[misc, name-defined]
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", site, wheel
    server.shutdown()
    server.server_close()


def _installed(target: Path) -> list:
    return sorted(p.name for p in target.glob("*.dist-info"))


def test_pip_installs_from_the_variant_index(served, tmp_path):
    url, _, wheel = served
    target = tmp_path / "t"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-cache-dir",
            "--isolated",
            "--target",
            str(target),
            "--index-url",
            f"{url}/cu130torch2.14/simple/",
            "mamba-kernels==0.1.0+cu130torch2.14",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert _installed(target) == ["mamba_kernels-0.1.0+cu130torch2.14.dist-info"]
    assert (target / "mamba_kernels_probe" / "__init__.py").read_text() == "VALUE = 42\n"
    # The flat find-links page works too.
    target2 = tmp_path / "t2"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-cache-dir",
            "--isolated",
            "--no-index",
            "--target",
            str(target2),
            "--find-links",
            f"{url}/cu130torch2.14/find-links.html",
            "mamba-kernels",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert _installed(target2) == ["mamba_kernels-0.1.0+cu130torch2.14.dist-info"]


def test_uv_installs_from_the_variant_index(served, tmp_path):
    url, _, _ = served
    uv = BIN / "uv" if (BIN / "uv").exists() else shutil.which("uv")
    assert uv, "uv is not installed: scripts/setup.sh installs it (pip install uv)"
    target = tmp_path / "t"
    r = subprocess.run(
        [
            str(uv),
            "pip",
            "install",
            "--no-deps",
            "--no-cache",
            "--python",
            sys.executable,
            "--target",
            str(target),
            "--index-url",
            f"{url}/cu130torch2.14/simple/",
            "mamba-kernels",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert _installed(target) == ["mamba_kernels-0.1.0+cu130torch2.14.dist-info"]


def test_pip_refuses_a_wheel_whose_hash_changed(served, tmp_path):
    url, site, wheel = served
    served_copy = site / "wheels" / wheel.name
    with zipfile.ZipFile(served_copy, "a") as zf:  # tamper after indexing
        zf.writestr("extra.txt", "x")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-cache-dir",
            "--isolated",
            "--target",
            str(tmp_path / "t"),
            "--index-url",
            f"{url}/cu130torch2.14/simple/",
            "mamba-kernels",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0
    assert "hash" in (r.stdout + r.stderr).lower()
