"""The static wheel index: files, hashes, checks, and real installs with pip and uv over HTTP."""

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
import zipfile
from pathlib import Path

import pytest
from wheel_files import write_wheel

from mamba_kernels.cli import main as cli
from mamba_kernels.install import wheel_metadata
from mamba_kernels.release import fatbin, index, site_swap

BIN = Path(sys.executable).parent
CUDA_HOME = Path("/usr/local/cuda")


def make_wheel(
    folder: Path,
    version: str = "0.1.0+cu130torch2.14",
    py: str = "cp311",
    plat: str = "manylinux_2_28_x86_64",
    requires: str = "torch==2.14.*",
    meta_version: str = "",
    payload: bytes = b"",
    dist: str = "mamba_kernels",
    meta_name: str = "mamba-kernels",
    more_requires: tuple = (),
    abi: str = "",
) -> Path:
    """A minimal valid wheel of this project (installable with --no-deps); ``abi`` "abi3" makes
    a stable-ABI wheel's tags (cp310-abi3)."""
    abi = abi or py
    name = f"{dist}-{version}-{py}-{abi}-{plat}.whl"
    di = f"{dist}-{version}.dist-info"
    more = "".join(f"Requires-Dist: {r}\n" for r in more_requires)
    files = {
        "mamba_kernels/_test_probe.py": b"VALUE = 42\n",
        f"{di}/METADATA": (
            f"Metadata-Version: 2.1\nName: {meta_name}\nVersion: {meta_version or version}\n"
            f"Requires-Python: >=3.9\nRequires-Dist: {requires}\n{more}"
            "Requires-Dist: packaging>=23\n\n"
        ).encode(),
        f"{di}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {py}-{abi}-{plat}\n"
        ).encode(),
    }
    if payload:
        files["causal_conv1d/_cuda.cpython-311-x86_64-linux-gnu.so"] = payload
    return write_wheel(folder / name, files, di)


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
    assert fatbin.fatbin_archs(blob) == (["sm_80", "sm_90"], ["compute_90"])
    assert fatbin.fatbin_archs(b"no fat binary \x50\xed\x55\xba here") == ([], [])


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
    assert fatbin.fatbin_archs(so.read_bytes()) == (sass, ptx)


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
        r'<a href="([^"]+)#sha256=([0-9a-f]{64})" data-requires-python="==(3.1\d).\*">([^<]+)</a>', page
    )  # cpXY wheels: what their tag says, not METADATA's wider >=3.9
    assert sorted(a[3] for a in anchors) == sorted([w1.name, w2.name])
    for href, sha, py, fname in anchors:
        assert f"-cp{py.replace('.', '')}-" in fname
        assert href.startswith("../../../wheels/") and sha == by_name[fname]["sha256"]
    flat = (out / "cu130torch2.14" / "find-links.html").read_text()
    assert flat.count("#sha256=") == 2 and 'href="../wheels/' in flat
    assert "mamba-kernels/" in (out / "cu130torch2.14" / "simple" / "index.html").read_text()
    assert "cu126torch2.6cxx11/simple/" in (out / "index.html").read_text()


STABLE = {"version": "0.1.0+cu130stable2.10", "py": "cp310", "abi": "abi3", "requires": "torch>=2.10"}


def test_stable_wheels_get_their_own_variant_index_and_manifest_fields(tmp_path, capsys):
    wheels = tmp_path / "in"
    lin = make_wheel(wheels, **STABLE)
    win = make_wheel(wheels, plat="win_amd64", **STABLE)
    classic = make_wheel(wheels, version="0.1.0+cu128torch2.8", requires="torch==2.8.*")
    assert cli.main(["index", str(wheels), str(tmp_path / "site")]) == 0
    assert ("cu130stable2.10 (stable ABI from torch 2.10, CUDA 13.0): 2 wheel(s)"
            in capsys.readouterr().out)
    m = json.loads((tmp_path / "site" / "manifest.json").read_text())
    assert m["variants"] == ["cu128torch2.8", "cu130stable2.10"]
    by = {e["filename"]: e for e in m["wheels"]}
    e = by[lin.name]
    assert lin.name == "mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-manylinux_2_28_x86_64.whl"
    assert {k: e[k] for k in ("label", "binding", "torch", "cuda", "cuda_major", "abi3", "python",
                              "platform", "requires_torch", "describe")} == {
        "label": "cu130stable2.10", "binding": "stable", "torch": "2.10", "cuda": "13.0", "cuda_major": 13,
        "abi3": True, "python": "3.10", "platform": "linux_x86_64", "requires_torch": "torch>=2.10",
        "describe": "stable ABI from torch 2.10, CUDA 13.0"}
    assert by[win.name]["platform"] == "win_amd64"
    c = by[classic.name]
    assert (c["binding"], c["abi3"], c["cuda_major"], c["describe"]) == (
        "classic", False, 12, "torch 2.8, CUDA 12.8")
    page = (tmp_path / "site" / "cu130stable2.10" / "simple" / "mamba-kernels" / "index.html").read_text()
    assert lin.name in page and win.name in page and classic.name not in page
    assert "cu130stable2.10/simple/" in (tmp_path / "site" / "index.html").read_text()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"requires": "torch==2.10.*"}, "Requires-Dist must pin 'torch>=2.10', got 'torch==2.10.\\*'"),
        ({"abi": "cp310"}, "must pair a stable label with the cpXY-abi3 tags"),
        ({"version": "0.1.0+cu130stable2.9"}, "target_torch must be at least 2.10"),
    ],
)
def test_inconsistent_stable_wheels_are_refused(tmp_path, kwargs, message):
    make_wheel(tmp_path / "in", **dict(STABLE, **kwargs))
    with pytest.raises(ValueError, match=message):
        index.write_index(tmp_path / "in", tmp_path / "site")


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
    with pytest.raises(ValueError, match="WHEEL_DIR '.*missing': must be a directory"):
        index.write_index(tmp_path / "missing", tmp_path / "site")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty': holds no .whl file"):
        index.write_index(tmp_path / "empty", tmp_path / "site")
    make_wheel(tmp_path / "in" / "x")
    make_wheel(tmp_path / "in" / "y")
    with pytest.raises(ValueError, match="appears twice"):
        index.write_index(tmp_path / "in", tmp_path / "site")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="OUT_DIR '.*full': must be an empty or new directory, or an index"):
        index.write_index(tmp_path / "in" / "x", tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "x"  # never replaced


def test_cli_index_verb(tmp_path, capsys):
    make_wheel(tmp_path / "in")
    assert cli.main(["index", str(tmp_path / "in"), str(tmp_path / "site")]) == 0
    assert "cu130torch2.14 (torch 2.14, CUDA 13.0): 1 wheel(s)" in capsys.readouterr().out
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    assert cli.main(["index", str(tmp_path / "in"), str(tmp_path / "full")]) == 2
    assert "must be an empty or new directory, or an index" in capsys.readouterr().err


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
    assert (target / "mamba_kernels" / "_test_probe.py").read_text() == "VALUE = 42\n"
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


# --- the index writer, probed with bad input: one line naming the file, exit 2 -----------------


def _run_cli(argv, capsys):
    """Exit status and the stderr lines of ``python -m mamba_kernels index ...`` (in-process: an
    uncaught exception would fail the test)."""
    rc = cli.main(["index", *map(str, argv)])
    err = capsys.readouterr().err
    return rc, err.splitlines()


def _one_error_line(rc, lines, *parts):
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith("mamba-kernels: error: ") and "Traceback" not in lines[0]
    for p in parts:
        assert p in lines[0], (p, lines[0])


_NAME = "mamba_kernels-0.1.0+cu130torch2.14-cp311-cp311-manylinux_2_28_x86_64.whl"


def _corrupt(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / _NAME
    p.write_bytes(b"PK\x03\x04 this is not a zip archive" * 10)
    return p


def _truncated(folder: Path) -> Path:
    w = make_wheel(folder)
    w.write_bytes(w.read_bytes()[:-40])  # the central directory cut short
    return w


def _zero(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / _NAME).write_bytes(b"")
    return folder / _NAME


def _bad_crc(folder: Path) -> Path:
    w = make_wheel(folder)
    data = bytearray(w.read_bytes())
    i = data.index(b"VALUE = 42")
    data[i] = ord("X")  # same length, stored (not deflated): only the CRC tells
    w.write_bytes(bytes(data))
    return w


def _symlink(folder: Path) -> Path:
    real = make_wheel(folder.parent / "elsewhere")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / real.name).symlink_to(real)
    return folder / real.name


def _symlinked_dir(folder: Path) -> Path:
    make_wheel(folder.parent / "elsewhere")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "linked").symlink_to(folder.parent / "elsewhere", target_is_directory=True)
    return folder / "linked"


def _other_project(folder: Path) -> Path:
    return make_wheel(folder, dist="evil")


def _other_metadata_name(folder: Path) -> Path:
    return make_wheel(folder, meta_name="evil")


def _case(folder: Path) -> Path:
    return make_wheel(folder, dist="Mamba_Kernels")


def _dir_named_whl(folder: Path) -> Path:
    (folder / _NAME).mkdir(parents=True)
    return folder / _NAME


@pytest.mark.parametrize(
    "make_bad, reason",
    [
        (_zero, "is empty (0 bytes)"),
        (_corrupt, "not a readable wheel (zip archive)"),
        (_truncated, "not a readable wheel (zip archive)"),
        (_bad_crc, "fails its CRC check"),
        (_symlink, "is a symlink"),
        (_symlinked_dir, "is a symlink"),
        (_dir_named_whl, "is not a regular file"),
        (_other_project, "another project's wheel (distribution 'evil')"),
        (_other_metadata_name, "METADATA Name 'evil' is another project"),
        (_case, "must spell the distribution 'mamba_kernels', got 'Mamba_Kernels'"),
    ],
)
def test_each_bad_wheel_is_one_line_naming_it(tmp_path, capsys, make_bad, reason):
    make_wheel(tmp_path / "in", py="cp312")  # a good wheel next to it changes nothing
    bad = make_bad(tmp_path / "in")
    rc, lines = _run_cli([tmp_path / "in", tmp_path / "site"], capsys)
    _one_error_line(rc, lines, str(bad), reason)
    assert not (tmp_path / "site").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".site")] == []


def test_two_names_differing_only_in_case_are_not_both_listed(tmp_path, capsys):
    good = make_wheel(tmp_path / "in")
    upper = make_wheel(tmp_path / "in" / "x", dist="Mamba_Kernels")
    rc, lines = _run_cli([tmp_path / "in", tmp_path / "site"], capsys)
    _one_error_line(rc, lines, str(upper), "names that differ only in case")
    assert good.exists() and not (tmp_path / "site").exists()


def test_a_corrupt_wheel_gives_no_traceback_from_the_real_command(tmp_path):
    _corrupt(tmp_path / "in")
    r = subprocess.run(
        [sys.executable, "-m", "mamba_kernels", "index", str(tmp_path / "in"), str(tmp_path / "s")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and _NAME in r.stderr, r.stderr


def test_missing_wheel_dir(tmp_path, capsys):
    rc, lines = _run_cli([tmp_path / "nope", tmp_path / "site"], capsys)
    _one_error_line(rc, lines, str(tmp_path / "nope"), "must be a directory (it does not exist)")


def test_out_dir_that_is_a_file_or_inside_wheel_dir(tmp_path, capsys):
    make_wheel(tmp_path / "in")
    (tmp_path / "f").write_text("x")
    rc, lines = _run_cli([tmp_path / "in", tmp_path / "f"], capsys)
    _one_error_line(rc, lines, str(tmp_path / "f"), "exists and is not a folder")
    rc, lines = _run_cli([tmp_path / "in", tmp_path / "f" / "site"], capsys)
    _one_error_line(rc, lines, str(tmp_path / "f"), "is not a folder")
    rc, lines = _run_cli([tmp_path / "in", tmp_path / "in" / "site"], capsys)
    _one_error_line(rc, lines, str(tmp_path / "in" / "site"), "must not contain or lie inside WHEEL_DIR")


def test_out_dir_that_cannot_be_written(tmp_path, capsys, monkeypatch):
    """A read-only place for OUT_DIR: the operating system's refusal, as one line."""
    make_wheel(tmp_path / "in")

    def refuse(*args, dir=None, **kwargs):
        raise PermissionError(13, "Permission denied", str(dir))

    monkeypatch.setattr(index.tempfile, "mkdtemp", refuse)
    rc, lines = _run_cli([tmp_path / "in", tmp_path / "site"], capsys)
    _one_error_line(rc, lines, str(tmp_path), "Permission denied")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root ignores permission bits")
def test_read_only_out_dir_for_real(tmp_path, capsys):
    make_wheel(tmp_path / "in")
    assert cli.main(["index", str(tmp_path / "in"), str(tmp_path / "site")]) == 0
    capsys.readouterr()
    (tmp_path / "site").chmod(0o555)
    try:
        rc, lines = _run_cli([tmp_path / "in", tmp_path / "site"], capsys)
        _one_error_line(rc, lines, str(tmp_path / "site"), "not readable and writable")
        (tmp_path / "site").chmod(0o755)
        tmp_path.chmod(0o555)
        rc, lines = _run_cli([tmp_path / "in", tmp_path / "site"], capsys)
        _one_error_line(rc, lines, str(tmp_path / "site"), "is not writable")
    finally:
        tmp_path.chmod(0o755)
        (tmp_path / "site").chmod(0o755)


# --- atomic writes ------------------------------------------------------------------------------


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_rerun_replaces_the_index_as_a_whole(tmp_path, monkeypatch):
    make_wheel(tmp_path / "a")
    make_wheel(tmp_path / "b", version="0.2.0+cu126torch2.6cxx11", requires="torch==2.6.*")
    index.write_index(tmp_path / "a", tmp_path / "site")
    (tmp_path / "site").chmod(0o750)
    m = index.write_index(tmp_path / "b", tmp_path / "site")
    assert m["variants"] == ["cu126torch2.6cxx11"] and not (tmp_path / "site" / "cu130torch2.14").exists()
    assert (tmp_path / "site").stat().st_mode & 0o777 == 0o750  # the old folder's mode is kept
    # Where the OS cannot exchange two folders in one step: two renames.
    monkeypatch.setattr(site_swap, "_rename_exchange", lambda a, b: False)
    m = index.write_index(tmp_path / "a", tmp_path / "site")
    assert m["variants"] == ["cu130torch2.14"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "site"]


def test_an_interrupted_run_leaves_the_old_index(tmp_path, monkeypatch):
    make_wheel(tmp_path / "a")
    make_wheel(tmp_path / "b", py="cp312")
    index.write_index(tmp_path / "a", tmp_path / "site")
    before = _tree(tmp_path / "site")
    real = index._write_site

    def half(site, entries, manifest):
        (site / "manifest.json").write_text("{}")  # half a site, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(index, "_write_site", half)
    with pytest.raises(KeyboardInterrupt):
        index.write_index(tmp_path / "b", tmp_path / "site")
    assert _tree(tmp_path / "site") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "site"]
    monkeypatch.setattr(index, "_write_site", real)
    assert len(index.write_index(tmp_path / "b", tmp_path / "site")["wheels"]) == 1


def test_a_killed_run_leaves_the_old_index_and_the_rerun_works(tmp_path):
    """Killed (no clean-up at all) after the new site was written, before it was renamed."""
    make_wheel(tmp_path / "a")
    make_wheel(tmp_path / "b", py="cp312")
    index.write_index(tmp_path / "a", tmp_path / "site")
    before = _tree(tmp_path / "site")
    code = (
        "import os, sys\nfrom mamba_kernels.cli import main as cli\n"
        "from mamba_kernels.release import site_swap\n"
        "site_swap.swap_into_place = lambda new, out: os._exit(9)\n"
        "sys.exit(cli.main(['index', sys.argv[1], sys.argv[2]]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "b"), str(tmp_path / "site")])
    assert r.returncode == 9
    assert _tree(tmp_path / "site") == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".site.new-")]  # its leftover
    # Killed between the two renames of the fallback: the old index sits under a temporary name.
    site_swap.mark(tmp_path / "site")  # as swap_into_place marks it before the first rename
    (tmp_path / "site").rename(tmp_path / ".site.old-killed")
    m = index.write_index(
        tmp_path / "b", tmp_path / "site", previous=str(tmp_path / "site" / "manifest.json")
    )
    assert sorted(e["python"] for e in m["wheels"]) == ["3.11", "3.12"]  # old index found and merged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "site"]


# --- merging the published index ---------------------------------------------------------------

REL = "https://github.com/o/r/releases/download/{tag}/{{filename}}"


def _release(tmp_path: Path, tag: str, wheels: list, previous=None, **kw):
    """One release's index: wheels made in a fresh folder, written into tmp_path/site."""
    d = tmp_path / f"dist-{tag}"
    made = [make_wheel(d, **w) for w in wheels]
    argv = ["index", str(d), str(tmp_path / "site"), "--asset-url", REL.format(tag=tag)]
    if previous is not None:
        argv += ["--previous", str(previous)]
    argv += [f"--{k.replace('_', '-')}" for k, v in kw.items() if v]
    return cli.main(argv), made


def test_every_earlier_release_and_variant_stays(tmp_path, capsys):
    rc, v1 = _release(
        tmp_path,
        "v0.1.0",
        [{}, {"version": "0.1.0+cu126torch2.6cxx11", "requires": "torch==2.6.*"}],
        previous=tmp_path / "published" / "manifest.json",
        allow_missing_previous=True,
    )
    assert rc == 0
    first = json.loads((tmp_path / "site" / "manifest.json").read_text())
    assert first["schema"] == 2 and all(
        e["url"].startswith("https://github.com/o/r/") for e in first["wheels"]
    )
    (tmp_path / "published").mkdir()
    shutil.copy(tmp_path / "site" / "manifest.json", tmp_path / "published" / "manifest.json")
    # The workflow's exact command line.
    rc, v2 = _release(
        tmp_path,
        "v0.2.0",
        [{"version": "0.2.0+cu130torch2.14"}],
        previous=tmp_path / "published" / "manifest.json",
    )
    assert rc == 0 and "1 wheels" not in capsys.readouterr().out
    m = json.loads((tmp_path / "site" / "manifest.json").read_text())
    assert m["variants"] == ["cu126torch2.6cxx11", "cu130torch2.14"]
    by = {e["filename"]: e for e in m["wheels"]}
    assert set(by) == {w.name for w in v1 + v2}
    for old in first["wheels"]:  # recorded URL and sha256, untouched
        assert by[old["filename"]] == old
    assert by[v2[0].name]["url"] == (
        "https://github.com/o/r/releases/download/v0.2.0/" + v2[0].name.replace("+", "%2B")
    )
    page = (tmp_path / "site" / "cu130torch2.14" / "simple" / "mamba-kernels" / "index.html").read_text()
    assert "releases/download/v0.1.0/mamba_kernels-0.1.0%2Bcu130torch2.14" in page
    assert "releases/download/v0.2.0/mamba_kernels-0.2.0%2Bcu130torch2.14" in page
    assert (tmp_path / "site" / "cu126torch2.6cxx11" / "find-links.html").exists()
    assert not (tmp_path / "site" / "wheels").exists()


def test_a_previous_manifest_without_the_label_fields_gets_them(tmp_path):
    # Manifests written before the stable wheels lack binding, cuda_major, abi3 and describe.
    make_wheel(tmp_path / "v1")
    m = index.write_index(tmp_path / "v1", tmp_path / "site", asset_url=REL.format(tag="v0.1.0"))
    added = ("binding", "cuda_major", "abi3", "describe")
    old = dict(m, wheels=[{k: v for k, v in e.items() if k not in added} for e in m["wheels"]])
    (tmp_path / "published").mkdir()
    (tmp_path / "published" / "manifest.json").write_text(json.dumps(old))
    make_wheel(tmp_path / "v2", **dict(STABLE, version="0.2.0+cu130stable2.10"))
    m2 = index.write_index(tmp_path / "v2", tmp_path / "site", asset_url=REL.format(tag="v0.2.0"),
                           previous=str(tmp_path / "published" / "manifest.json"))
    carried = next(e for e in m2["wheels"] if e["label"] == "cu130torch2.14")
    assert (carried["binding"], carried["cuda_major"], carried["abi3"]) == ("classic", 13, False)
    assert m2["variants"] == ["cu130stable2.10", "cu130torch2.14"]


def test_a_published_file_name_with_new_content_is_an_error(tmp_path, capsys):
    make_wheel(tmp_path / "v1")
    index.write_index(tmp_path / "v1", tmp_path / "site", asset_url=REL.format(tag="v0.1.0"))
    again = make_wheel(tmp_path / "v2", payload=b"rebuilt")  # same name, other bytes
    rc, lines = _run_cli(
        [
            tmp_path / "v2",
            tmp_path / "site",
            "--previous",
            tmp_path / "site" / "manifest.json",
            "--asset-url",
            REL.format(tag="v0.1.0"),
        ],
        capsys,
    )
    _one_error_line(rc, lines, str(again), "differs from the published")
    # The same bytes again (a re-run of the same release) keep the published entry.
    shutil.copy(tmp_path / "v1" / again.name, again)
    m = index.write_index(
        tmp_path / "v2",
        tmp_path / "site",
        asset_url=REL.format(tag="v9"),
        previous=str(tmp_path / "site" / "manifest.json"),
    )
    assert [e["url"] for e in m["wheels"]] == [
        REL.format(tag="v0.1.0").replace("{filename}", again.name.replace("+", "%2B"))
    ]


def test_previous_manifest_missing_or_wrong(tmp_path, capsys):
    make_wheel(tmp_path / "in")
    gone = tmp_path / "previous" / "manifest.json"
    rc, lines = _run_cli([tmp_path / "in", tmp_path / "site", "--previous", gone], capsys)
    _one_error_line(rc, lines, str(gone), "not found (no such file)", "--allow-missing-previous")
    assert not (tmp_path / "site").exists()
    bad = tmp_path / "bad.json"
    for text, reason in [
        ("{", "is not a JSON manifest"),
        ('{"project": "other", "wheels": []}', "is not a manifest of mamba-kernels"),
        ('{"project": "mamba-kernels", "schema": 9, "wheels": []}', "has manifest schema 9"),
        (
            '{"project": "mamba-kernels", "schema": 2, "wheels": [{"filename": '
            '"evil-0.1.0+cu130torch2.14-cp311-cp311-linux_x86_64.whl", '
            '"sha256": "' + "0" * 64 + '", "url": "https://x/y"}]}',
            "another project's wheel",
        ),
        (
            '{"project": "mamba-kernels", "schema": 2, "wheels": [{"filename": "'
            + _NAME
            + '", "sha256": "x", '
            '"url": "https://x/y"}]}',
            "has no valid sha256",
        ),
    ]:
        bad.write_text(text)
        rc, lines = _run_cli(
            [tmp_path / "in", tmp_path / "site", "--previous", bad, "--allow-missing-previous"], capsys
        )
        assert rc == 2 and len(lines) == 1 and reason in lines[0], (text, lines)
    rc, lines = _run_cli([tmp_path / "in", tmp_path / "site", "--asset-url", "https://x/dl/"], capsys)
    _one_error_line(rc, lines, "https://x/dl/", "{filename}")


def test_a_local_index_grows_release_by_release(tmp_path):
    """Without --asset-url the wheels are copied; --previous inside OUT_DIR carries them over."""
    make_wheel(tmp_path / "v1")
    index.write_index(tmp_path / "v1", tmp_path / "site")
    make_wheel(tmp_path / "v2", version="0.2.0+cu130torch2.14")
    m = index.write_index(
        tmp_path / "v2", tmp_path / "site", previous=str(tmp_path / "site" / "manifest.json")
    )
    names = sorted(e["filename"] for e in m["wheels"])
    assert sorted(p.name for p in (tmp_path / "site" / "wheels").iterdir()) == names and len(names) == 2
    for e in m["wheels"]:
        assert (
            hashlib.sha256((tmp_path / "site" / "wheels" / e["filename"]).read_bytes()).hexdigest()
            == e["sha256"]
        )


@pytest.mark.parametrize(
    "requires, more, reason",
    [
        ('torch==2.14.*; sys_platform == "win32"', (), "never applies to a cp311 linux_x86_64 install"),
        ('torch==2.14.*; python_version < "3.9"', (), "never applies"),
        ('torch==2.14.*; extra == "cuda"', (), "never applies"),
        ('torch==2.14.*; platform_release >= "5"', (), "depends on platform_release"),
        ("torch==2.14.*", ('torch>=2.0; sys_platform == "linux"',), "got 'torch==2.14.* and torch>=2.0'"),
        ("torch==2.14.* ; os_name == 'nt'", ("torch==2.13.*",), "got 'torch==2.13.*'"),
    ],
)
def test_torch_pin_markers_that_do_not_pin_are_refused(tmp_path, requires, more, reason):
    make_wheel(tmp_path / "in", requires=requires, more_requires=more)
    with pytest.raises(ValueError, match=re.escape(reason)):
        index.write_index(tmp_path / "in", tmp_path / "site")


def test_torch_pin_markers_that_hold_are_kept(tmp_path):
    make_wheel(
        tmp_path / "in",
        requires='torch==2.14.*; sys_platform == "linux" and python_version >= "3.9"',
        more_requires=('torch==2.13.*; sys_platform == "win32"', 'torch>=1; extra == "dev"'),
    )
    (e,) = index.write_index(tmp_path / "in", tmp_path / "site")["wheels"]
    assert e["requires_torch"] == "torch==2.14.*"
    assert e["requires_torch_marker"] == 'sys_platform == "linux" and python_version >= "3.9"'
    assert (
        wheel_metadata.torch_pin(['torch==2.14.*; sys_platform == "linux"']) is None
    )  # no environment: unconditional only
    env = wheel_metadata.target_environment("3.12", "win_amd64")
    pin = wheel_metadata.torch_pin(['torch==2.14.*; sys_platform == "win32"', "numpy"], env)
    assert pin == "torch==2.14.*"


# --- pip against a merged index served over HTTP ------------------------------------------------


@pytest.fixture
def http_root(tmp_path):
    """tmp_path/www served on 127.0.0.1 (an ephemeral port); yields (URL, folder)."""
    root = tmp_path / "www"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


def test_pip_resolves_every_release_from_a_merged_index_over_http(http_root, tmp_path, capsys):
    url, www = http_root
    site = www / "site"
    prev_url = f"{url}/site/manifest.json"
    # First release: the published manifest is a 404, which --allow-missing-previous accepts.
    rc, lines = _run_cli([tmp_path / "nothing-yet", site], capsys)
    assert rc == 2
    make_wheel(tmp_path / "d1")
    rc, lines = _run_cli(
        [tmp_path / "d1", site, "--previous", prev_url, "--asset-url", f"{url}/releases/v0.1.0/{{filename}}"],
        capsys,
    )
    _one_error_line(rc, lines, prev_url, "not found (HTTP 404)")
    assert index.write_index(
        tmp_path / "d1",
        site,
        previous=prev_url,
        allow_missing_previous=True,
        asset_url=f"{url}/releases/v0.1.0/{{filename}}",
    )
    shutil.copytree(tmp_path / "d1", www / "releases" / "v0.1.0")  # the Release assets
    # Second release, merging the manifest fetched over HTTP.
    make_wheel(tmp_path / "d2", version="0.2.0+cu130torch2.14")
    m = index.write_index(
        tmp_path / "d2", site, previous=prev_url, asset_url=f"{url}/releases/v0.2.0/{{filename}}"
    )
    assert len(m["wheels"]) == 2
    shutil.copytree(tmp_path / "d2", www / "releases" / "v0.2.0")
    for version in ("0.1.0", "0.2.0"):
        dest = tmp_path / f"dl-{version}"
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-cache-dir",
                "--isolated",
                "--disable-pip-version-check",
                "--only-binary",
                ":all:",
                "--python-version",
                "3.11",
                "--platform",
                "manylinux_2_28_x86_64",
                "-d",
                str(dest),
                "--index-url",
                f"{url}/site/cu130torch2.14/simple/",
                f"mamba-kernels=={version}+cu130torch2.14",
            ],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        (got,) = dest.iterdir()
        assert got.name == f"mamba_kernels-{version}+cu130torch2.14-cp311-cp311-manylinux_2_28_x86_64.whl"
    # A manifest with relative links cannot be merged from a URL: those files would vanish.
    index.write_index(tmp_path / "d2", www / "local")
    rc, lines = _run_cli(
        [tmp_path / "d1", tmp_path / "x", "--previous", f"{url}/local/manifest.json"], capsys
    )
    _one_error_line(rc, lines, "has the relative URL")
