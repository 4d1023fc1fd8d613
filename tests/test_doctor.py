"""The doctor on real broken installs the tests make (the helpers of test_runtime_guard build
them with gcc): an extension built with other metadata, a deleted .so, a missing
libc10_cuda.so, an undefined torch symbol, and a shadowing distribution."""

import dataclasses
import importlib
import json
import platform
import sys
import sysconfig

import pytest
import torch
from test_runtime_guard import (
    BUILT_ELSEWHERE,
    EXT_SUFFIX,
    _package,
    compiled_extension,
    info,
    needs_gcc,
    needs_python_h,
    unloadable_extension,
)

from mamba_kernels.cli import main as cli
from mamba_kernels.facts import support
from mamba_kernels.facts.version import __version__
from mamba_kernels.install import doctor, environment
from mamba_kernels.runtime import dispatch, install_record, installed

NO_GPU = environment.detect(toolchain=False, gpu_archs=[])


def gpus(*caps, driver="580.65.06"):
    return dataclasses.replace(
        NO_GPU, gpus=tuple(environment.Gpu(i, c, f"Fake {c}") for i, c in enumerate(caps)), driver=driver
    )


def whats(report):
    return [p["what"] for p in report["problems"]]


def test_pure_python_install_without_gpu_is_not_broken(fresh, capsys):
    _package(fresh, "mkd_none")
    dispatch.EXTENSIONS["causal_conv1d"] = "mkd_none._cuda"
    report = doctor.diagnose(NO_GPU)
    assert not report["broken"] and report["kernels"]["causal_conv1d"]["backend"] == "reference"
    p = [p for p in report["problems"] if p["what"] == "causal_conv1d: the extension is missing"][0]
    assert not p["broken"] and "PyTorch implementation runs" in p["why"] and "pip install" in p["fix"]


def test_pure_python_install_with_gpu_is_broken(fresh):
    _package(fresh, "mkd_none2")
    dispatch.EXTENSIONS["causal_conv1d"] = "mkd_none2._cuda"
    report = doctor.diagnose(gpus("9.0"))
    assert report["broken"] == bool(torch.version.cuda)


@needs_python_h
def test_extension_built_with_other_metadata(fresh, capsys, monkeypatch):
    name = compiled_extension(fresh, "mkd_meta", info(torch_version="2.13.0+cu126", torch_cuda="12.6"))
    dispatch.EXTENSIONS["causal_conv1d"] = name
    monkeypatch.setattr(environment, "detect", lambda **kw: NO_GPU)
    assert cli.main(["doctor", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert set(report) >= {"environment", "kernels", "problems"}
    p = [p for p in report["problems"] if p["what"] == "causal_conv1d: built for another torch"][0]
    assert "torch 2.13.0+cu126" in p["why"] and p["fix"].startswith("pip install --no-deps")
    assert p["broken"] and report["kernels"]["causal_conv1d"]["backend"] == "reference"


@needs_python_h
@pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 10),
                    reason="the running torch is older than the stable ABI's target: every refusal names it")
def test_stable_binary_refusals_are_named_for_their_cause(fresh, monkeypatch):
    # a stable binary serves every torch from its target on: its heading names the cause
    monkeypatch.setattr(environment, "detect", lambda **kw: NO_GPU)
    stable = dict(binding="stable", stable_target="2.10", torch_version="2.14.1+cu130")
    cuda12 = compiled_extension(fresh, "mkd_st12", info(**stable, cuda_major=12, torch_cuda="12.8",
                                                        nvcc_version="12.8"))
    dispatch.EXTENSIONS["causal_conv1d"] = cuda12
    want = "causal_conv1d: " + ("needs a CUDA build of torch" if torch.version.cuda is None
                                else "built for another CUDA major")
    assert want in whats(doctor.diagnose(NO_GPU))
    newer = compiled_extension(fresh, "mkd_st99", info(**dict(stable, stable_target="99.0"), cuda_major=13,
                                                       torch_cuda=torch.version.cuda or "13.0"))
    dispatch.EXTENSIONS["causal_conv1d"] = newer
    dispatch._status.clear()  # the first binary's verdict is cached per kernel
    assert "causal_conv1d: needs a newer torch" in whats(doctor.diagnose(NO_GPU))


@needs_python_h
def test_abi_mismatch(fresh):
    name = compiled_extension(fresh, "mkd_abi", info(cxx11_abi=not torch._C._GLIBCXX_USE_CXX11_ABI))
    dispatch.EXTENSIONS["selective_scan"] = name
    assert "selective_scan: C++ ABI mismatch" in whats(doctor.diagnose(NO_GPU))


@needs_python_h
def test_deleted_so_recorded_by_the_distribution(fresh):
    name = compiled_extension(fresh, "mkd_deleted", info())
    dispatch.EXTENSIONS["causal_conv1d"] = name
    dist = fresh / "mkd_deleted-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mkd-deleted\nVersion: 1.0\n")
    (dist / "RECORD").write_text(f"mkd_deleted/__init__.py,,\nmkd_deleted/_cuda{EXT_SUFFIX},,\n")
    (fresh / "mkd_deleted" / f"_cuda{EXT_SUFFIX}").unlink()
    importlib.invalidate_caches()
    report = doctor.diagnose(NO_GPU)
    p = [p for p in report["problems"] if p["what"] == "causal_conv1d: the extension is missing"][0]
    assert p["broken"] and report["broken"]
    assert "file is gone" in p["why"] and f"_cuda{EXT_SUFFIX}" in p["why"]


@needs_gcc
def test_missing_libc10_cuda(fresh, capsys, monkeypatch):
    name = unloadable_extension(fresh, "mkd_nolib", info(**BUILT_ELSEWHERE), needs_lib="c10_cuda_mkd_gone")
    dispatch.EXTENSIONS["causal_conv1d"] = name
    monkeypatch.setattr(environment, "detect", lambda **kw: NO_GPU)
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "BROKEN: causal_conv1d: built for another torch" in out
    assert "libc10_cuda_mkd_gone.so" in out and "fix: pip install --no-deps --force-reinstall" in out


@needs_gcc
def test_undefined_symbol_is_demangled_and_named(fresh):
    name = unloadable_extension(
        fresh, "mkd_undef", info(**BUILT_ELSEWHERE), symbol="_ZN3c1016mk_test_gone_apiEv"
    )
    dispatch.EXTENSIONS["selective_scan"] = name
    p = [p for p in doctor.diagnose(NO_GPU)["problems"] if p["what"].startswith("selective_scan")][0]
    assert p["what"] == "selective_scan: built for another torch"
    if doctor.shutil.which("c++filt"):
        assert "c10::mk_test_gone_api()" in p["why"] and "c10 (libc10" in p["why"]


def test_torch_api_names():
    assert doctor.torch_api("at::native::add(at::Tensor const&)").startswith("ATen")
    assert doctor.torch_api("c10::cuda::getCurrentCUDAStream(signed char)").startswith("c10::cuda")
    assert doctor.torch_api("torch::Library::def(char const*)").startswith("torch::")
    assert doctor.torch_api("std::string::size() const") is None


def test_shadowing_distribution_and_stray_module(fresh):
    dist = fresh / "causal_conv1d-1.5.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: causal-conv1d\nVersion: 1.5.0\n")
    (dist / "RECORD").write_text("causal_conv1d/__init__.py,,\ncausal_conv1d_cuda.py,,\n")
    (fresh / "causal_conv1d_cuda.py").write_text("")
    importlib.invalidate_caches()
    report = doctor.diagnose(NO_GPU)
    found = {p["what"]: p for p in report["problems"]}
    p = found["another distribution shadows ours: causal-conv1d"]
    assert "causal-conv1d 1.5.0" in p["why"] and p["fix"].startswith("pip uninstall -y causal-conv1d")
    stray = found["a stray causal_conv1d_cuda module shadows ours"]
    assert stray["fix"] == "pip uninstall -y causal-conv1d" and report["broken"]
    sys.modules.pop("causal_conv1d_cuda", None)


def test_nvcc_on_another_cuda_major():
    target = dataclasses.replace(NO_GPU, torch_cuda="12.6", nvcc="13.0", cuda_home="/opt/cuda")
    p = [p for p in doctor.diagnose(target)["problems"] if p["what"].startswith("nvcc and torch")][0]
    assert "CUDA 13.0" in p["why"] and "CUDA_HOME" in p["fix"]


def test_gpu_arch_not_in_binary_and_old_driver(fresh):
    name = compiled_extension(fresh, "mkd_arch", info(sass=["sm_90"], ptx=[]))
    dispatch.EXTENSIONS["causal_conv1d"] = name
    report = doctor.diagnose(gpus("8.0", driver="450.80.02"))
    w = whats(report)
    assert "causal_conv1d: the GPU architecture is not in the binary" in w
    if torch.version.cuda and support.driver_runs("450.80.02", torch.version.cuda) is False:
        assert "causal_conv1d: the driver is too old for the wheel's CUDA" in w
    assert report["broken"]
    assert doctor.diagnose(NO_GPU)["broken"] is False or any(
        p["broken"] for p in doctor.diagnose(NO_GPU)["problems"])


def test_driver_table():
    assert support.driver_runs("525.60.13", "12.8") and not support.driver_runs("470.1", "12.1")
    assert support.min_driver("13.0") == "580.65.06" and support.driver_runs("1.0", "99.0") is None


def test_compat_modules_ours_are_not_reported_and_mamba_ssms_build_is(fresh):
    report = doctor.diagnose(NO_GPU)
    assert not [w for w in whats(report) if "selective_scan_cuda" in w or "shadows ours" in w]
    dist = fresh / "mamba_ssm-2.3.2.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mamba-ssm\nVersion: 2.3.2\n")
    (dist / "RECORD").write_text(f"mamba_ssm/__init__.py,,\nselective_scan_cuda{EXT_SUFFIX},,\n")
    (fresh / f"selective_scan_cuda{EXT_SUFFIX}").write_bytes(b"")
    importlib.invalidate_caches()
    found = {p["what"]: p for p in doctor.diagnose(NO_GPU)["problems"]}
    p = found["mamba_ssm's own extension shadows ours"]
    assert not p["broken"] and "MAMBA_SKIP_CUDA_BUILD=TRUE" in p["fix"] and str(fresh) in p["why"]
    sys.modules.pop("selective_scan_cuda", None)


@needs_python_h
def test_info_labels_a_local_stable_build_for_its_target(fresh):
    """A local stable-ABI build is labelled for its target (cu130stable2.10), not for the torch
    that compiled it."""
    name = compiled_extension(fresh, "mkd_stable", info(binding="stable", stable_target="2.10",
                                                        cuda_major=13, torch_cuda="13.0",
                                                        torch_version="2.14.1+cu130"))
    dispatch.EXTENSIONS["causal_conv1d"] = name
    build = installed.describe()
    if build["version"] and "+" in build["version"]:  # an installed release wheel answers first
        return
    assert build["label"] == "cu130stable2.10", build
    assert "local build" in build["how"]


def test_doctor_reports_the_installed_distribution_version(monkeypatch):
    """A release wheel's version carries its label, which the source's __version__ does not."""
    from importlib import metadata

    real = metadata.version
    labelled = f"{__version__}+cu130stable2.10"
    monkeypatch.setattr(metadata, "version", lambda name: labelled if name == "mamba-kernels" else real(name))
    report = doctor.diagnose(NO_GPU)
    assert report["mamba_kernels"] == labelled
    assert doctor.render(report).splitlines()[0] == f"mamba-kernels {labelled}"


# ----------------------------------------------------------------------------- one description
# info and doctor describe an install the same way (issue 17): the version with its label, the
# C++ ABI written one way, what was installed; the packages' __version__ is that version.

PREBUILT = "mamba_kernels-0.1.0+cu130stable2.10-cp310-abi3-manylinux_2_28_x86_64.whl"


def _pretend(monkeypatch, dist_version, record=None):
    from importlib import metadata

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda n: dist_version if n == "mamba-kernels" else real(n))
    monkeypatch.setattr(install_record, "read_record", lambda: record)
    installed.cached_version.cache_clear()


def _heads(text):
    """The lines both reports share: the version, python, torch and build lines."""
    prefixes = ("mamba-kernels ", "python ", "torch ", "build ")
    return [line for line in text.splitlines() if line.startswith(prefixes)]


def test_a_release_wheel_is_described_once_for_info_doctor_and_the_packages(monkeypatch, capsys):
    import causal_conv1d
    import mamba_kernels
    import selective_scan

    labelled = f"{__version__}+cu130stable2.10"
    _pretend(monkeypatch, labelled)
    try:
        assert causal_conv1d.__version__ == selective_scan.__version__ == labelled
        assert mamba_kernels.__version__ == labelled
        assert cli.main(["info"]) == 0
        info_text = capsys.readouterr().out
        monkeypatch.setattr(environment, "detect", lambda **kw: NO_GPU)
        cli.main(["doctor"])
        doctor_text = capsys.readouterr().out
    finally:
        installed.cached_version.cache_clear()
    heads = _heads(info_text)
    assert heads == _heads(doctor_text) and len(heads) == 4, (info_text, doctor_text)
    assert heads[0] == f"mamba-kernels {labelled}"
    tag = sysconfig.get_platform().replace("-", "_")
    assert heads[1] == f"python        {platform.python_version()} ({tag})"
    abi = "cxx11" if torch.compiled_with_cxx11_abi() else "pre-cxx11"
    assert heads[2].endswith(f"(CUDA {torch.version.cuda or 'none'}, {abi} ABI)")
    assert heads[3].startswith("build         cu130stable2.10 (a release wheel")


def test_a_prebuilt_wheel_installed_through_the_sdist_is_not_a_local_build(monkeypatch):
    """The sdist keeps its own version in METADATA; the label comes from the install record."""
    _pretend(monkeypatch, __version__, {"path": "prebuilt", "wheel": PREBUILT, "index": "https://h.example/"})
    try:
        import causal_conv1d

        assert causal_conv1d.__version__ == f"{__version__}+cu130stable2.10"
        desc = installed.describe()
        report = doctor.diagnose(NO_GPU)
    finally:
        installed.cached_version.cache_clear()
    assert desc["label"] == "cu130stable2.10" and "local build" not in desc["how"]
    assert desc["how"] == (f"the prebuilt wheel {PREBUILT} from https://h.example/, "
                           "installed through the sdist")
    assert report["mamba_kernels"] == f"{__version__}+cu130stable2.10"
    assert report["build"] == {"label": desc["label"], "how": desc["how"]}


def test_an_unlabelled_install_keeps_the_plain_version(monkeypatch):
    _pretend(monkeypatch, __version__, {"path": "pure", "reasons": ["no GPU"]})
    try:
        assert installed.version() == __version__
        assert "through the sdist" in installed.describe()["how"]
    finally:
        installed.cached_version.cache_clear()


def test_the_compatibility_modules_are_found_as_a_new_process_imports_them(tmp_path):
    """The doctor calls a compatibility module missing only when a new process cannot import it:
    an editable install (scripts/setup.sh makes one) serves them through a finder after sys.path."""
    import subprocess

    code = "import causal_conv1d_cuda, selective_scan_cuda"
    importable = subprocess.run([sys.executable, "-c", code], cwd=tmp_path).returncode == 0
    r = subprocess.run([sys.executable, "-m", "mamba_kernels", "doctor", "--json"], cwd=tmp_path,
                       capture_output=True, text=True)
    missing = [p["what"] for p in json.loads(r.stdout)["problems"] if p["what"].endswith("is missing")
               and "compatibility module" in p["what"]]
    assert (missing == []) == importable, (importable, missing)
