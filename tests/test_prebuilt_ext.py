"""bench/prebuilt_ext.sh: a build carried to the GPU machine is used only by a checkout whose
build sources are the ones it was made from (run in a copy of those sources, never in place)."""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKGS = ("causal_conv1d", "selective_scan")
SOURCES = ("csrc", "mamba_kernels/build", "mamba_kernels/facts", "mamba_kernels/runtime/buildinfo.py",
           "mamba_kernels/runtime/knobs.py", "build_backend", "setup.py", "pyproject.toml",
           "bench/prebuilt_ext.sh")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("sha256sum") is None,
                                reason="needs bash and coreutils")


@pytest.fixture
def tree(tmp_path):
    for rel in SOURCES:
        src, dst = os.path.join(ROOT, rel), tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if os.path.isdir(src):
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)
    for p in PKGS:
        (tmp_path / p).mkdir()
    return tmp_path


def run(tree, *args):
    return subprocess.run(["bash", "bench/prebuilt_ext.sh", *args], cwd=tree, capture_output=True, text=True)


def carried(tree, hash_: str):
    """A prebuilt directory as `make` leaves it, with stand-in extensions."""
    d = tree / ".device" / "prebuilt"
    for p in PKGS:
        (d / p).mkdir(parents=True)
        with lzma.open(d / p / "_cuda.abi3.so.xz", "wb") as f:
            f.write(f"stand-in for {p}".encode())
    (d / "SOURCES.sha256").write_text(hash_ + "\n")
    return d


def test_the_hash_follows_the_sources(tree):
    first = run(tree, "hash").stdout.strip()
    assert len(first) == 64 and run(tree, "hash").stdout.strip() == first
    (tree / "csrc" / "selective_scan" / "update.cu").write_text("// changed\n", encoding="utf-8")
    assert run(tree, "hash").stdout.strip() != first


def test_a_matching_prebuilt_is_unpacked_into_the_packages(tree):
    carried(tree, run(tree, "hash").stdout.strip())
    r = run(tree, "use", ".device/prebuilt")
    assert r.returncode == 0 and r.stdout.startswith("prebuilt: used"), r.stdout + r.stderr
    for p in PKGS:
        assert (tree / p / "_cuda.abi3.so").read_bytes() == f"stand-in for {p}".encode()


def test_a_prebuilt_from_other_sources_is_refused_and_nothing_is_copied(tree):
    carried(tree, run(tree, "hash").stdout.strip())
    with open(tree / "csrc" / "selective_scan" / "update.cu", "a", encoding="utf-8") as f:
        f.write("// one more line\n")
    r = run(tree, "use", ".device/prebuilt")
    assert r.returncode == 1 and "made from other sources" in r.stdout
    assert not any((tree / p / "_cuda.abi3.so").exists() for p in PKGS)


def test_a_missing_prebuilt_is_said_so(tree):
    r = run(tree, "use", ".device/prebuilt")
    assert r.returncode == 1 and "none in" in r.stdout
