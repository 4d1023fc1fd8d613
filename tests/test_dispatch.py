"""Dispatch decisions, exercised with real (tiny) extension modules written to a temp dir."""

import sys
import warnings

import pytest

from mamba_kernels.runtime import buildinfo, dispatch, knobs


def _good_extension(tmp_path, name):
    """A module whose BUILD_INFO matches the running torch, as a fresh local build's does."""
    return _module(tmp_path, name, f"BUILD_INFO = {buildinfo.matching_build_info()!r}\n")


def _module(tmp_path, name, body):
    (tmp_path / f"{name}.py").write_text(body)
    sys.modules.pop(name, None)
    return name


def test_missing_extension_cpu_tensors_use_pytorch_silently(fresh):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dispatch.use_cuda("causal_conv1d", "cpu") is False


def test_missing_extension_cuda_tensors_warn_once_with_reason_and_fix(fresh):
    with pytest.warns(RuntimeWarning) as record:
        assert dispatch.use_cuda("causal_conv1d", "cuda") is False
        assert dispatch.use_cuda("causal_conv1d", "cuda") is False
    assert len(record) == 1
    msg = str(record[0].message)
    assert "causal_conv1d._cuda is not part of this install" in msg
    assert "MAMBA_KERNELS_FORCE_BUILD=1" in msg  # the fix


def test_cuda_mode_turns_missing_extension_into_error(fresh, monkeypatch):
    monkeypatch.setenv(knobs.BACKEND_VAR, "cuda")
    with pytest.raises(RuntimeError, match="MAMBA_KERNELS_BACKEND=cuda but the selective_scan CUDA"):
        dispatch.use_cuda("selective_scan", "cuda")


def test_reference_mode_never_imports_the_extension(fresh, monkeypatch):
    name = _module(fresh, "mk_test_boom", "raise SystemExit('must not be imported')\n")
    dispatch.EXTENSIONS["causal_conv1d"] = name
    monkeypatch.setenv(knobs.BACKEND_VAR, "reference")
    assert dispatch.use_cuda("causal_conv1d", "cuda") is False
    assert dispatch.backends()["causal_conv1d"]["backend"] == "reference"


def test_loaded_extension_is_used_for_cuda_tensors_only(fresh):
    dispatch.EXTENSIONS["causal_conv1d"] = _good_extension(fresh, "mk_test_ok")
    assert dispatch.use_cuda("causal_conv1d", "cuda") is True
    assert dispatch.use_cuda("causal_conv1d", "cpu") is False
    assert dispatch.backends()["causal_conv1d"]["backend"] == "cuda"


def test_cuda_mode_with_cpu_tensors_is_an_error(fresh, monkeypatch):
    dispatch.EXTENSIONS["causal_conv1d"] = _good_extension(fresh, "mk_test_ok2")
    monkeypatch.setenv(knobs.BACKEND_VAR, "cuda")
    with pytest.raises(RuntimeError, match="tensors are on 'cpu'"):
        dispatch.use_cuda("causal_conv1d", "cpu")


def test_extension_built_for_another_torch_is_not_used(fresh, monkeypatch):
    import json

    import torch

    other = "2.2.2" if torch.__version__.startswith("2.1.") else "2.1.2"  # not the running minor
    info = json.loads(buildinfo.matching_build_info())
    info["torch_version"] = other
    body = f"BUILD_INFO = {json.dumps(info)!r}\n"
    dispatch.EXTENSIONS["causal_conv1d"] = _module(fresh, "mk_test_old", body)
    with pytest.warns(RuntimeWarning, match=f"was built for torch {other}"):
        assert dispatch.use_cuda("causal_conv1d", "cuda") is False
    monkeypatch.setenv(knobs.BACKEND_VAR, "cuda")
    with pytest.raises(RuntimeError, match=f"was built for torch {other}.*Fix:"):
        dispatch.use_cuda("causal_conv1d", "cuda")


def test_broken_extension_reports_the_import_error(fresh):
    name = _module(fresh, "mk_test_broken", "raise ImportError('undefined symbol: _ZN3c104cuda')\n")
    dispatch.EXTENSIONS["selective_scan"] = name
    report = dispatch.backends()["selective_scan"]
    assert report["backend"] == "reference"
    assert "failed to load" in report["reason"] and "undefined symbol" in report["reason"]


def test_unknown_kernel_name():
    with pytest.raises(ValueError, match="kernel must be one of"):
        dispatch.extension_status("flash_attn")


def test_bad_backend_value_is_an_error(fresh, monkeypatch):
    monkeypatch.setenv(knobs.BACKEND_VAR, "fast")
    with pytest.raises(ValueError, match="MAMBA_KERNELS_BACKEND='fast'"):
        dispatch.use_cuda("causal_conv1d", "cuda")


def test_decision_does_not_break_a_torch_compile_graph(fresh):
    import torch

    def f(x):
        if dispatch.use_cuda("causal_conv1d", x.device.type):
            return x + 1
        return x - 1

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    x = torch.zeros(3)
    assert torch.equal(compiled(x), x - 1)


def test_first_cuda_decision_inside_torch_compile_keeps_one_graph(fresh, monkeypatch):
    """The first CUDA use (import, metadata check, GPU architecture check) may happen while
    torch.compile traces: it runs eagerly there and enters the graph as a constant."""
    import json

    import torch

    info = json.loads(buildinfo.matching_build_info())
    info["sass"] = ["sm_90"]
    body = f"BUILD_INFO = {json.dumps(info)!r}\n"
    dispatch.EXTENSIONS["causal_conv1d"] = _module(fresh, "mk_test_compile", body)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    asked = []
    capability = lambda device=None: asked.append(device) or (9, 0)  # noqa: E731
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)

    def f(x):
        if dispatch.use_cuda("causal_conv1d", "cuda"):
            return x + 1
        return x - 1

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    x = torch.zeros(3)
    assert torch.equal(compiled(x), x + 1)
    assert torch.equal(compiled(x), x + 1)
    assert asked == [0]  # the GPU was checked once, while tracing


def test_a_loaded_extension_with_no_gpu_visible_reports_what_runs(fresh, monkeypatch):
    """``info`` on a CUDA torch with no GPU: the PyTorch path runs (no tensor can be on CUDA), and
    the loaded kernel is named as ready; with the cuda backend forced every call is an error."""
    dispatch.EXTENSIONS["causal_conv1d"] = _good_extension(fresh, "mk_test_nogpu")
    report = dispatch.backends(gpus_visible=False)["causal_conv1d"]
    assert report["backend"] == "reference", report
    assert report["reason"].startswith(dispatch.NO_GPU_REASON) and "would run on a GPU" in report["reason"]
    assert dispatch.backends(gpus_visible=True)["causal_conv1d"]["backend"] == "cuda"
    monkeypatch.setenv(knobs.BACKEND_VAR, "cuda")
    forced = dispatch.backends(gpus_visible=False)["causal_conv1d"]
    assert forced["backend"] == "error"
    assert "MAMBA_KERNELS_BACKEND=cuda and no GPU is visible" in forced["reason"]


def test_info_reports_the_backend_for_the_gpus_it_sees(fresh):
    """The snapshot ``info`` prints passes what it saw of the GPUs to the report."""
    import torch

    from mamba_kernels.install import environment

    dispatch.EXTENSIONS["causal_conv1d"] = _good_extension(fresh, "mk_test_nogpu2")
    got = environment.snapshot()["backends"]["causal_conv1d"]["backend"]
    assert got == ("cuda" if torch.cuda.is_available() else "reference")
