"""The runtime guard on real broken installs the tests make: compiled extension modules
(gcc) and Python modules in a temp package dir on sys.path, standing in for a kernel's
``<kernel>._cuda``. The GPU's compute capability is the one thing faked (through torch's
own query functions): this machine need not have a GPU."""

import importlib
import json
import shutil
import subprocess
import sys
import sysconfig
import warnings
from pathlib import Path

import pytest
import torch

from mamba_kernels import __version__
from mamba_kernels.runtime import buildinfo, dispatch, knobs

HAVE_GCC = shutil.which("gcc") is not None
HAVE_PYTHON_H = (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()
needs_gcc = pytest.mark.skipif(not HAVE_GCC, reason="needs gcc")
needs_python_h = pytest.mark.skipif(not (HAVE_GCC and HAVE_PYTHON_H), reason="needs gcc and Python.h")

EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
RUNNING = (
    torch.__version__,
    torch.version.cuda,
    None if sys.platform == "win32" else bool(torch._C._GLIBCXX_USE_CXX11_ABI),
)
# What `pip install` would pin for the running torch: the specific fix every reason names.
RUNNING_PIN = buildinfo.fix_command(*RUNNING, __version__).split("'")[1]


def info(**over):
    """BUILD_INFO fields as a build for the running torch records them, with ``over``."""
    data = json.loads(buildinfo.matching_build_info())
    data.update(over)
    return data


def _package(root: Path, pkg: str) -> Path:
    d = root / pkg
    d.mkdir()
    (d / "__init__.py").write_text("")
    for name in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
        del sys.modules[name]
    return d


def python_extension(root: Path, pkg: str, body: str) -> str:
    """``<pkg>._cuda`` as a Python module with ``body``; its import name."""
    (_package(root, pkg) / "_cuda.py").write_text(body)
    importlib.invalidate_caches()
    return f"{pkg}._cuda"


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def compiled_extension(root: Path, pkg: str, build_info: dict) -> str:
    """``<pkg>._cuda`` as a real CPython extension module (a .so) exposing ``BUILD_INFO``, the
    metadata also lying in its bytes, as mamba_kernels/build/build_info.py's header puts it there."""
    d = _package(root, pkg)
    src = d / "ext.c"
    src.write_text(
        "#include <Python.h>\n"
        f"__attribute__((used)) static const char build_info[] = {_c_string(json.dumps(build_info))};\n"
        'static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_cuda", NULL, -1, NULL};\n'
        "PyMODINIT_FUNC PyInit__cuda(void) {\n"
        "  PyObject *m = PyModule_Create(&def);\n"
        '  if (m && PyModule_AddStringConstant(m, "BUILD_INFO", build_info) < 0) {\n'
        "    Py_DECREF(m);\n    return NULL;\n  }\n"
        "  return m;\n}\n"
    )
    include = sysconfig.get_paths()["include"]
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-I", include, str(src), "-o", str(d / f"_cuda{EXT_SUFFIX}")], check=True
    )
    importlib.invalidate_caches()
    return f"{pkg}._cuda"


def unloadable_extension(
    root: Path, pkg: str, build_info: dict, *, needs_lib: str = "", symbol: str = ""
) -> str:
    """``<pkg>._cuda`` as a shared object the loader refuses: linked against a library that is
    gone by the time it is imported (``needs_lib``), or calling a function nothing defines
    (``symbol``), as a binary built against another torch does. Its BUILD_INFO is in its bytes."""
    d = _package(root, pkg)
    src = d / "ext.c"
    lines = [f"__attribute__((used)) static const char build_info[] = {_c_string(json.dumps(build_info))};"]
    cmd = ["gcc", "-shared", "-fPIC", str(src), "-o", str(d / f"_cuda{EXT_SUFFIX}")]
    if symbol:
        lines += [f"extern void {symbol}(void);", f"void mk_call(void) {{ {symbol}(); }}"]
    if needs_lib:
        stub = root / "stub"
        stub.mkdir()
        (stub / "stub.c").write_text("void mk_stub_function(void) {}\n")
        subprocess.run(
            ["gcc", "-shared", "-fPIC", str(stub / "stub.c"), "-o", str(stub / f"lib{needs_lib}.so")],
            check=True,
        )
        lines += ["extern void mk_stub_function(void);", "void mk_call_stub(void) { mk_stub_function(); }"]
        cmd += ["-Wl,--no-as-needed", f"-L{stub}", f"-l{needs_lib}"]
    src.write_text("\n".join(lines) + "\n")
    subprocess.run(cmd, check=True)
    if needs_lib:
        shutil.rmtree(root / "stub")  # the library the binary needs is not installed
    importlib.invalidate_caches()
    return f"{pkg}._cuda"


def fake_gpus(monkeypatch, *caps, current=0):
    """torch's GPU queries answer for GPUs of these compute capabilities; returns the list of
    devices whose capability was asked, to count the queries."""
    asked = []

    def capability(device=None):
        asked.append(device)
        return caps[device]

    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"Fake GPU {caps[device]}")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    return asked


def no_gpu_queries(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the GPU was queried")

    for name in ("device_count", "get_device_capability", "get_device_name", "current_device"):
        monkeypatch.setattr(torch.cuda, name, boom)


# ----------------------------------------------------------------------------- no import for CPU


def test_cpu_tensors_never_import_the_extension(fresh, monkeypatch):
    marker = fresh / "imported"
    name = python_extension(fresh, "mkg_cpu", f"open({str(marker)!r}, 'w').close()\nraise SystemExit(3)\n")
    dispatch.EXTENSIONS["causal_conv1d"] = name
    no_gpu_queries(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dispatch.use_cuda("causal_conv1d", "cpu") is False
        assert dispatch.use_cuda("causal_conv1d", "meta") is False
    assert not marker.exists() and name not in sys.modules
    assert "causal_conv1d" not in dispatch._status


def test_plain_cpu_call_works_with_an_extension_that_raises_on_import(fresh):
    from causal_conv1d.causal_conv1d_interface import causal_conv1d_fn, causal_conv1d_ref

    dispatch.EXTENSIONS["causal_conv1d"] = python_extension(
        fresh, "mkg_cpu_call", "raise RuntimeError('The causal_conv1d CUDA extension is incompatible')\n"
    )
    x, w = torch.randn(1, 4, 8), torch.randn(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.allclose(causal_conv1d_fn(x, w), causal_conv1d_ref(x, w))


# ----------------------------------------------------------------------------- every import error


@pytest.mark.parametrize(
    "body, shown",
    [
        (
            "raise RuntimeError('The causal_conv1d CUDA extension is incompatible')\n",
            "RuntimeError: The causal",
        ),
        ("raise SystemExit('extension exits')\n", "SystemExit: extension exits"),
        ("raise AttributeError('no attribute _ZN3c10')\n", "AttributeError: no attribute _ZN3c10"),
        ("import mk_guard_no_such_dependency\n", "No module named 'mk_guard_no_such_dependency'"),
    ],
)
def test_any_exception_on_import_is_caught_and_explained(fresh, monkeypatch, body, shown):
    dispatch.EXTENSIONS["selective_scan"] = python_extension(fresh, f"mkg_raise{abs(hash(body))}", body)
    report = dispatch.backends()["selective_scan"]  # what `info` prints: must not raise
    assert report["backend"] == "reference"
    assert "failed to load" in report["reason"] and shown in report["reason"]
    assert f"running torch {torch.__version__}" in report["reason"] and RUNNING_PIN in report["reason"]
    with pytest.warns(RuntimeWarning, match="failed to load") as record:
        assert dispatch.use_cuda("selective_scan", "cuda") is False
        assert dispatch.use_cuda("selective_scan", "cuda") is False
    assert len(record) == 1 and str(record[0].message).count("Fix:") == 1
    monkeypatch.setenv(knobs.BACKEND_VAR, "cuda")
    with pytest.raises(RuntimeError, match="CUDA kernel is unavailable: .*failed to load"):
        dispatch.use_cuda("selective_scan", "cuda")


# ----------------------------------------------------------------------------- BUILD_INFO schema


MALFORMED = [
    ("torch_cuda", "none"),
    ("torch_cuda", None),
    ("torch_cuda", 13.0),
    ("torch_cuda", "13.0.1"),
    ("torch_version", 2.14),
    ("torch_version", ""),
    ("nvcc_version", None),
    ("sass", "sm_90"),
    ("sass", [90]),
    ("ptx", {"compute_90": True}),
    ("ptx", ["sm_90"]),
    ("package_version", 1),
]


@pytest.mark.parametrize("field, value", MALFORMED)
def test_malformed_field_is_unreadable_metadata_with_the_fix(field, value):
    text = json.dumps(info(**{field: value}))
    with pytest.raises(ValueError, match=f"BUILD_INFO {field} must be"):
        buildinfo.parse(text)
    msg = buildinfo.check_text("m", text, *RUNNING)
    assert msg.startswith(f"m has unreadable build metadata: BUILD_INFO {field} must be")
    assert "Fix: " in msg and RUNNING_PIN in msg


def test_malformed_metadata_in_an_extension_is_reported_not_raised(fresh):
    body = f"BUILD_INFO = {json.dumps(info(torch_cuda=None, sass='sm_90'))!r}\n"
    dispatch.EXTENSIONS["causal_conv1d"] = python_extension(fresh, "mkg_malformed", body)
    report = dispatch.backends()["causal_conv1d"]
    assert report["backend"] == "reference" and "unreadable build metadata" in report["reason"]
    with pytest.warns(RuntimeWarning, match="unreadable build metadata"):
        assert dispatch.use_cuda("causal_conv1d", "cuda") is False


# ----------------------------------------------------------------------------- package version


@needs_python_h
def test_extension_built_with_other_metadata_a_stale_release_is_refused(fresh, monkeypatch):
    """A real compiled extension from mamba-kernels 0.0.9, otherwise built for the running
    torch: refused, naming what it was built for and the wheel that fixes it."""
    name = compiled_extension(fresh, "mkg_stale", info(package_version="0.0.9+cu130torch2.14"))
    dispatch.EXTENSIONS["causal_conv1d"] = name
    reason = dispatch.backends()["causal_conv1d"]["reason"]
    assert f"{name} was built for torch {torch.__version__}" in reason
    assert f"it is from mamba-kernels 0.0.9, the installed package is {__version__.split('+')[0]}" in reason
    assert f"Fix: pip install --no-deps --force-reinstall '{RUNNING_PIN}'" in reason
    monkeypatch.setenv(knobs.BACKEND_VAR, "cuda")
    with pytest.raises(RuntimeError, match="it is from mamba-kernels 0.0.9"):
        dispatch.use_cuda("causal_conv1d", "cuda")


def test_package_version_compared_on_its_public_part():
    running = RUNNING
    public = __version__.split("+")[0]
    assert (
        buildinfo.check_text("m", json.dumps(info(package_version=f"{public}+cu999torch9.9")), *running)
        is None
    )
    msg = buildinfo.check_text("m", json.dumps(info(package_version="9.9.9")), *running)
    assert f"it is from mamba-kernels 9.9.9, the installed package is {public}" in msg
    no_version = info()
    del no_version["package_version"]
    assert "records no mamba-kernels version" in buildinfo.check_text("m", json.dumps(no_version), *running)


# ----------------------------------------------------------------------------- GPU architecture


def _arch_extension(fresh, pkg, sass, ptx=()):
    body = f"BUILD_INFO = {json.dumps(info(sass=list(sass), ptx=list(ptx)))!r}\n"
    return python_extension(fresh, pkg, body)


def test_gpu_not_in_the_binary_falls_back_once_naming_both(fresh, monkeypatch):
    dispatch.EXTENSIONS["causal_conv1d"] = _arch_extension(fresh, "mkg_arch", ["sm_80", "sm_90"])
    asked = fake_gpus(monkeypatch, (7, 5))
    assert dispatch.backends()["causal_conv1d"]["backend"] == "cuda"  # info does not touch the GPU
    assert asked == []
    with pytest.warns(RuntimeWarning) as record:
        for _ in range(3):
            assert dispatch.use_cuda("causal_conv1d", "cuda") is False
    assert len(record) == 1 and asked == [0]  # one query per device, cached
    msg = str(record[0].message)
    assert "GPU cuda:0 (Fake GPU (7, 5)) (compute capability 7.5, sm_75)" in msg
    assert "SASS sm_80 sm_90 and PTX none" in msg
    assert "Fix: build it for this GPU: TORCH_CUDA_ARCH_LIST=7.5 MAMBA_KERNELS_FORCE_BUILD=1" in msg
    assert dispatch.backends()["causal_conv1d"]["backend"] == "reference"


def test_gpu_not_in_the_binary_is_an_error_in_cuda_mode(fresh, monkeypatch):
    dispatch.EXTENSIONS["selective_scan"] = _arch_extension(fresh, "mkg_arch_cuda", ["sm_90"], ["compute_90"])
    fake_gpus(monkeypatch, (8, 0))
    monkeypatch.setenv(knobs.BACKEND_VAR, "cuda")
    with pytest.raises(RuntimeError, match=r"unavailable: .*compute capability 8.0, sm_80\).*PTX compute_90"):
        dispatch.use_cuda("selective_scan", "cuda")


@pytest.mark.parametrize(
    "sass, ptx, cap", [(["sm_80"], [], (8, 6)), (["sm_90"], [], (9, 0)), ([], ["compute_80"], (9, 0))]
)
def test_gpu_the_binary_runs_on_takes_the_compiled_path(fresh, monkeypatch, sass, ptx, cap):
    dispatch.EXTENSIONS["causal_conv1d"] = _arch_extension(
        fresh, f"mkg_arch_ok{len(sass)}{cap[0]}", sass, ptx
    )
    asked = fake_gpus(monkeypatch, cap)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            assert dispatch.use_cuda("causal_conv1d", "cuda") is True
    assert asked == [0] and dispatch._status["causal_conv1d"].cuda_ready


def test_mixed_gpus_only_the_current_one_decides(fresh, monkeypatch):
    dispatch.EXTENSIONS["causal_conv1d"] = _arch_extension(fresh, "mkg_arch_mixed", ["sm_90"])
    fake_gpus(monkeypatch, (9, 0), (7, 5), current=0)
    assert dispatch.use_cuda("causal_conv1d", "cuda") is True
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    with pytest.warns(RuntimeWarning, match="GPU cuda:1 .*compute capability 7.5"):
        assert dispatch.use_cuda("causal_conv1d", "cuda") is False


# ----------------------------------------------------------------------------- load failures


BUILT_ELSEWHERE = {"torch_version": "2.13.0+cu126", "torch_cuda": "12.6", "nvcc_version": "12.6"}


@needs_gcc
def test_undefined_symbol_is_explained_with_built_for_and_the_fix(fresh, monkeypatch):
    name = unloadable_extension(
        fresh, "mkg_undef", info(**BUILT_ELSEWHERE), symbol="_ZN3c1017mk_test_gone_apiEv"
    )
    dispatch.EXTENSIONS["selective_scan"] = name
    reason = dispatch.backends()["selective_scan"]["reason"]
    assert f"{name} failed to load (ImportError: " in reason and "undefined symbol" in reason
    assert "it was built for torch 2.13.0+cu126, CUDA 12.6 (nvcc 12.6)" in reason
    assert f"running torch {torch.__version__}, CUDA {torch.version.cuda}" in reason
    assert "torch 2.13 != running torch" in reason
    assert f"Fix: pip install --no-deps --force-reinstall '{RUNNING_PIN}'" in reason
    with pytest.warns(RuntimeWarning, match="undefined symbol.*built for torch 2.13.0"):
        assert dispatch.use_cuda("selective_scan", "cuda") is False


@needs_gcc
def test_missing_library_is_explained_with_built_for_and_the_fix(fresh, monkeypatch):
    """A binary that needs a torch library this torch does not have (a CUDA wheel under a CPU
    torch: libc10_cuda.so). Here torch, a CUDA build, has libc10_cuda.so loaded already and
    the loader would reuse it, so the library the binary needs has another name."""
    name = unloadable_extension(fresh, "mkg_nolib", info(**BUILT_ELSEWHERE), needs_lib="c10_cuda_mk_gone")
    dispatch.EXTENSIONS["causal_conv1d"] = name
    monkeypatch.setenv(knobs.BACKEND_VAR, "cuda")
    with pytest.raises(RuntimeError) as caught:
        dispatch.use_cuda("causal_conv1d", "cuda")
    msg = str(caught.value)
    assert "libc10_cuda_mk_gone.so: cannot open shared object file" in msg
    assert "it was built for torch 2.13.0+cu126, CUDA 12.6" in msg
    assert f"running torch {torch.__version__}" in msg and RUNNING_PIN in msg
    assert msg.count("Fix:") == 1


@needs_gcc
def test_load_failure_of_a_binary_without_metadata_still_names_the_fix(fresh):
    d = _package(fresh, "mkg_bare")
    (d / "ext.c").write_text("extern void mk_gone(void);\nvoid f(void) { mk_gone(); }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", str(d / "ext.c"), "-o", str(d / f"_cuda{EXT_SUFFIX}")], check=True
    )
    importlib.invalidate_caches()
    dispatch.EXTENSIONS["causal_conv1d"] = "mkg_bare._cuda"
    reason = dispatch.backends()["causal_conv1d"]["reason"]
    assert "undefined symbol: mk_gone" in reason and "its build metadata could not be read from" in reason
    assert RUNNING_PIN in reason


@needs_python_h
def test_deleted_so_is_missing_with_the_specific_fix(fresh):
    name = compiled_extension(fresh, "mkg_deleted", info())
    dispatch.EXTENSIONS["causal_conv1d"] = name
    assert dispatch.backends()["causal_conv1d"]["backend"] == "cuda"  # the install was good
    (fresh / "mkg_deleted" / f"_cuda{EXT_SUFFIX}").unlink()
    sys.modules.pop(name, None)
    importlib.invalidate_caches()
    dispatch._status.clear()
    assert (
        dispatch.backends()["causal_conv1d"]["reason"]
        == f"the compiled extension {name} is not part of this install"
    )
    with pytest.warns(RuntimeWarning) as record:
        assert dispatch.use_cuda("causal_conv1d", "cuda") is False
    msg = str(record[0].message)
    assert (
        f"{name} is not part of this install. Fix: pip install --no-deps --force-reinstall '{RUNNING_PIN}'"
        in msg
    )


def test_build_info_is_read_from_a_file_without_loading_it(tmp_path):
    blob = b"\x7fELF" + b"\x00" * 20000 + json.dumps(info()).encode() + b"\x00" + b"\x01" * 20000
    (tmp_path / "x.so").write_bytes(blob)
    found = buildinfo.find_in_file(str(tmp_path / "x.so"))
    assert found is not None and found.raw == info()
    assert buildinfo.find_in_file(str(tmp_path / "absent.so")) is None


# ----------------------------------------------------------------------------- stable-ABI binaries


def stable_info(**over):
    """BUILD_INFO of a stable-ABI build for the running torch's CUDA, with ``over``."""
    return info(**{"binding": "stable", "stable_target": "2.10", **over})


@needs_python_h
def test_stable_binary_needing_a_newer_torch_falls_back_with_the_reason(fresh, monkeypatch):
    """A real compiled stable-ABI extension whose target is newer than the running torch is
    refused in one sentence and the PyTorch path runs (a warning once); with
    MAMBA_KERNELS_BACKEND=cuda it is an error with the same reason."""
    name = compiled_extension(fresh, "mkg_stable_new", stable_info(stable_target="2.99"))
    dispatch.EXTENSIONS["causal_conv1d"] = name
    with pytest.warns(RuntimeWarning) as record:
        assert dispatch.use_cuda("causal_conv1d", "cuda") is False
    msg = str(record[0].message)
    assert f"{name} was built for the stable ABI from torch 2.99" in msg
    running = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    assert f"it needs torch >= 2.99 (stable ABI), the running torch is {running}" in msg
    monkeypatch.setenv(knobs.BACKEND_VAR, "cuda")
    dispatch._status.clear()
    with pytest.raises(RuntimeError, match=r"needs torch >= 2.99 \(stable ABI\)"):
        dispatch.use_cuda("causal_conv1d", "cuda")


@needs_python_h
def test_stable_binary_for_another_cuda_major_is_refused(fresh):
    other = "12.8" if (torch.version.cuda or "13").split(".")[0] != "12" else "13.0"
    name = compiled_extension(fresh, "mkg_stable_cuda", stable_info(torch_cuda=other, nvcc_version=other))
    dispatch.EXTENSIONS["selective_scan"] = name
    reason = dispatch.backends()["selective_scan"]["reason"]
    assert f"CUDA {other} has another major version than torch's CUDA {torch.version.cuda}" in reason
    assert dispatch.backends()["selective_scan"]["backend"] == "reference"


@needs_python_h
@pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 10),
                    reason="the running torch is older than the stable ABI's target (refused: tested above)")
def test_stable_binary_on_the_running_torch_is_used(fresh):
    """Same CUDA major, running torch >= target, GIL build: the stable binary is accepted
    whatever torch minor it was compiled against."""
    name = compiled_extension(fresh, "mkg_stable_ok", stable_info(torch_version="2.10.0+cu130"))
    dispatch.EXTENSIONS["causal_conv1d"] = name
    assert dispatch.backends()["causal_conv1d"]["backend"] == "cuda"


@needs_gcc
def test_free_threaded_python_refuses_the_abi3_binary_it_cannot_see(fresh, monkeypatch):
    """A free-threaded CPython's import system skips abi3 files, so the stable binary looks
    absent: the guard finds it next to the package and says why it cannot load, with the fix."""
    pkg = _package(fresh, "mkg_stable_ft")
    src = pkg / "ext.c"
    text = _c_string(json.dumps(stable_info()))
    src.write_text(f"__attribute__((used)) static const char build_info[] = {text};\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(pkg / "_cuda.abi3.so")], check=True)
    name = "mkg_stable_ft._cuda"
    monkeypatch.setattr(buildinfo, "free_threaded", lambda: True)

    def import_module(n):  # what a free-threaded interpreter's import system does with abi3
        raise ModuleNotFoundError(f"No module named {n!r}", name=n)

    monkeypatch.setattr(dispatch.importlib, "import_module", import_module)
    dispatch.EXTENSIONS["causal_conv1d"] = name
    reason = dispatch.backends()["causal_conv1d"]["reason"]
    assert f"{name} ({pkg / '_cuda.abi3.so'}) was built for the stable ABI from torch 2.10" in reason
    assert "which a free-threaded CPython cannot load" in reason
    assert "Fix: use a CPython build with the GIL" in reason
    monkeypatch.setattr(buildinfo, "free_threaded", lambda: False)
    dispatch._status.clear()
    assert "is not part of this install" in dispatch.backends()["causal_conv1d"]["reason"]
