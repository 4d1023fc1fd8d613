"""MAMBA_KERNELS_SCAN_STATES: with ``recompute`` selective_scan_fn and mamba_inner_fn keep less
between their forward and backward (measured with saved-tensor hooks) and give the same
gradients as with ``keep``, on the PyTorch path and on the compiled path's bookkeeping (the
kernels replaced by the reference-backed stand-in of scan_standin.py)."""

from __future__ import annotations

import header_values
import pytest
import torch
from scan_standin import StandInKernel
from test_compat_modules import scan_inputs
from test_selective_scan_inner import make

from mamba_kernels.runtime import dispatch, knobs
from selective_scan import mamba_inner_fn, selective_scan_fn, selective_scan_ref

VAR = knobs.SCAN_STATES_VAR


def run(fn, inputs, **kw):
    """(output, gradients, bytes the autograd graph holds for the backward)."""
    leaves = [t.clone().requires_grad_() if t is not None else None for t in inputs]
    held = []

    def pack(t):
        held.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*leaves, **kw)
    out = out[0] if isinstance(out, tuple) else out
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=out.dtype)
    out.backward(dout.to(out.device))
    return out.detach(), [t.grad if t is not None else None for t in leaves], sum(held)


def both(monkeypatch, fn, inputs, **kw):
    res = {}
    for form in knobs.SCAN_STATES:
        monkeypatch.setenv(VAR, form)
        res[form] = run(fn, inputs, **kw)
    return res


def assert_same(res, rtol):
    (out_k, grads_k, _), (out_r, grads_r, _) = res["keep"], res["recompute"]
    torch.testing.assert_close(out_r, out_k, rtol=0, atol=0)
    for a, b in zip(grads_k, grads_r):
        if a is not None:
            torch.testing.assert_close(b, a, rtol=rtol, atol=rtol * a.abs().max().item())


@pytest.fixture
def reference_backend(monkeypatch):
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "reference")


@pytest.mark.parametrize("z", [False, True])
@pytest.mark.parametrize("complex_a", [False, True])
def test_selective_scan_fn_pytorch_path(z, complex_a, monkeypatch, reference_backend):
    res = both(monkeypatch, selective_scan_fn, scan_inputs(z=z, complex_a=complex_a), delta_softplus=True,
               return_last_state=True)
    assert_same(res, 1e-5)
    assert res["recompute"][2] < res["keep"][2]


def nbytes(t):
    return t.numel() * t.element_size()


@pytest.mark.parametrize("z", [False, True])
@pytest.mark.parametrize("complex_a", [False, True])
def test_selective_scan_fn_compiled_path(z, complex_a, monkeypatch):
    inputs = scan_inputs(z=z, complex_a=complex_a)  # 150 steps: states after 64, 128 and 150
    monkeypatch.setattr(dispatch, "use_cuda", lambda kernel, device: kernel == "selective_scan")
    res, kernels = {}, {}
    for form in knobs.SCAN_STATES:
        monkeypatch.setenv(VAR, form)
        kernels[form] = StandInKernel.install(monkeypatch)
        res[form] = run(selective_scan_fn, inputs, delta_softplus=True)
    keep, recompute = kernels["keep"], kernels["recompute"]
    per = 2 if complex_a else 1
    assert keep.fwd_calls == 1 and keep.bwd_layout == (64, False)
    assert keep.bwd_states.shape == (2, 4, 3, 3 * per)
    assert_same(res, 0)
    inputs_bytes = sum(nbytes(t) for t in inputs if t is not None)
    y_bytes = nbytes(inputs[0]) if z else 0
    # keep holds the states every 64 steps (and y with z) on top of the inputs
    assert res["keep"][2] == inputs_bytes + nbytes(keep.bwd_states) + y_bytes
    if complex_a:  # recompute holds the inputs alone, and the backward reruns the forward scan
        assert recompute.fwd_calls == 2 and recompute.bwd_layout == (64, False)
        torch.testing.assert_close(recompute.bwd_states, keep.bwd_states, rtol=0, atol=0)
        assert res["recompute"][2] == inputs_bytes
    else:  # recompute holds a state every 1024 steps (a pair here), and y with z
        assert recompute.fwd_calls == 1 and recompute.bwd_layout == (1024, True)
        assert recompute.bwd_states.shape == (2, 4, 1, 6)  # one row of two slots, x's shape
        assert res["recompute"][2] == inputs_bytes + nbytes(recompute.bwd_states) + y_bytes
    assert res["recompute"][2] < res["keep"][2]


def test_selective_scan_fn_last_state_from_spaced_states(monkeypatch):
    # with gradients under recompute the forward writes paired states: the last state returned
    # must still be the final one, not the last slot's first state
    monkeypatch.setattr(dispatch, "use_cuda", lambda kernel, device: kernel == "selective_scan")
    monkeypatch.setenv(VAR, "recompute")
    StandInKernel.install(monkeypatch)
    inputs = scan_inputs(L=2100)  # 2 rows of pairs: states after 1024, 2048, 2100 and 2100
    leaves = [t.clone().requires_grad_() for t in inputs]
    _, last = selective_scan_fn(*leaves, delta_softplus=True, return_last_state=True)
    _, expected = selective_scan_ref(*inputs, delta_softplus=True, return_last_state=True)
    torch.testing.assert_close(last, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("complex_a", [False, True])
def test_mamba_inner_fn_compiled_path(complex_a, monkeypatch):
    inputs = make(torch.float32, L=200, complex_a=complex_a)  # states after 64, 128, 192 and 200 steps
    monkeypatch.setattr(dispatch, "use_cuda", lambda kernel, device: kernel == "selective_scan")
    res, kernels = {}, {}
    for form in knobs.SCAN_STATES:
        monkeypatch.setenv(VAR, form)
        kernels[form] = StandInKernel.install(monkeypatch)
        res[form] = run(mamba_inner_fn, inputs)
    keep, recompute = kernels["keep"], kernels["recompute"]
    assert keep.fwd_calls == 1 and keep.bwd_layout == (64, False)
    if complex_a:  # the backward reruns the forward scan
        assert recompute.fwd_calls == 2 and recompute.bwd_layout == (64, False)
        torch.testing.assert_close(recompute.bwd_states, keep.bwd_states, rtol=0, atol=0)
    else:  # it starts from the forward's states 1024 steps apart (one pair here)
        assert recompute.fwd_calls == 1 and recompute.bwd_layout == (1024, True)
        assert recompute.bwd_states.shape[2] == 1  # one row: two slots
    assert_same(res, 0)
    assert res["recompute"][2] < res["keep"][2]


def test_inference_keeps_nothing(monkeypatch):
    # no gradients to come: the scan is not asked for y, and nothing is held, whatever the knob
    monkeypatch.setattr(dispatch, "use_cuda", lambda kernel, device: kernel == "selective_scan")
    kernel = StandInKernel.install(monkeypatch)
    inner = make(torch.float32, L=70)
    with torch.no_grad():
        mamba_inner_fn(*inner)
        selective_scan_fn(*scan_inputs(z=True), delta_softplus=True)
    assert kernel.keep_y == [False, False]
    leaves = [t.clone().requires_grad_() if t is not None else None for t in inner]
    monkeypatch.setenv(VAR, "keep")
    mamba_inner_fn(*leaves)
    assert kernel.keep_y[-1] is True


@pytest.mark.parametrize("setting", [None, "", "auto", "AUTO"])
def test_auto_is_each_apis_own_default(setting, monkeypatch):
    """Unset (or auto): selective_scan_fn keeps its states, mamba_inner_fn and the compatibility
    module recompute them (the original's memory), as the README says."""
    if setting is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, setting)
    monkeypatch.setattr(dispatch, "use_cuda", lambda kernel, device: kernel == "selective_scan")
    calls = {}
    for name, fn, inputs in (("scan", selective_scan_fn, scan_inputs(z=True)),
                             ("inner", mamba_inner_fn, make(torch.float32, L=70))):
        kernel = StandInKernel.install(monkeypatch)
        kw = {"delta_softplus": True} if name == "scan" else {}
        run(fn, inputs, **kw)
        calls[name] = kernel.bwd_layout
    # keep: states every 64 steps; recompute: a state every 1024 (the original's x)
    assert calls == {"scan": (64, False), "inner": (1024, True)}
    assert knobs.scan_states_for(knobs.KEEP) == "keep"
    assert knobs.scan_states_for(knobs.RECOMPUTE) == "recompute"
    import selective_scan_cuda

    u, delta, A, B, C, D, z, bias = scan_inputs(z=True)
    x = selective_scan_cuda.fwd(u, delta, A, B, C, D, z, bias, True)[1]
    assert x.shape[2] == 1  # the original's shape: one row per 2048 steps


def test_bad_value_is_named(monkeypatch, reference_backend):
    monkeypatch.setenv(VAR, "none")
    with pytest.raises(ValueError, match=r"SCAN_STATES='none' is not .*: use one of auto, keep, recompute"):
        run(selective_scan_fn, scan_inputs())


@pytest.mark.gpu
def test_cuda_kernels(monkeypatch):
    # the real kernels: recompute reruns the same deterministic forward, so every gradient is
    # bitwise the one keep gives, and less is held for the backward
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "cuda")
    low = {0, 1, 3, 4, 6}  # u, delta, B, C, z in bf16
    inputs = [t.to("cuda", torch.bfloat16 if i in low else t.dtype)
              for i, t in enumerate(scan_inputs(L=4100))]
    res = both(monkeypatch, selective_scan_fn, inputs, delta_softplus=True)
    assert_same(res, 0)
    assert res["recompute"][2] < res["keep"][2]
    # mamba_inner_fn's conv backward sums dweight and dbias with atomics unless deterministic
    # algorithms are on, so two runs can differ in their last bit whatever the knob (which
    # explains one element 1.9e-6 apart, seen with these sizes): the knob's promise is checked
    # with them on, where two keep runs must agree bitwise too (warn_only: torch would refuse
    # cuBLAS matmuls without CUBLAS_WORKSPACE_CONFIG; on one stream they are deterministic)
    inner = [t.cuda() if t is not None else None for t in make(torch.float32, L=300)]
    before = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        res = both(monkeypatch, mamba_inner_fn, inner)
        monkeypatch.setenv(VAR, "keep")
        again = run(mamba_inner_fn, inner)
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)
    assert_same({"keep": res["keep"], "recompute": again}, 0)
    assert_same(res, 0)
    assert res["recompute"][2] < res["keep"][2]


def test_spaced_states_rule_mirrors_the_backward_kernel():
    # the Python side asks for states 1024 steps apart exactly where the backward's lane kernel
    # takes them: real A, dstate up to its lanes per channel, at most 2^kMaxStateShift chunks apart
    from selective_scan.scan_fn import (
        SPACED_BWD_ARGS,
        SPACED_MAX_DSTATE,
        SPACED_STEPS,
        paired_fwd_args,
        spaced_fwd_args,
    )

    chunk = header_values.value("csrc/selective_scan/selective_scan.h", "kChunk")
    shift = header_values.policy("BwdLanesPolicy", "kMaxStateShift")
    lanes = header_values.policy("LanePolicy", "kLanes")
    assert SPACED_STEPS == chunk << shift and SPACED_BWD_ARGS == (SPACED_STEPS, True)
    assert SPACED_MAX_DSTATE == lanes
    real = torch.zeros(4, lanes)
    assert spaced_fwd_args(real, 2049) == paired_fwd_args(2049) == (1024, 4, True)
    assert spaced_fwd_args(torch.zeros(4, lanes + 1), 2049) == ()
    assert spaced_fwd_args(torch.zeros(4, 2, dtype=torch.complex64), 2049) == ()
    assert paired_fwd_args(1) == (1024, 2, True) and paired_fwd_args(2048) == (1024, 2, True)


def test_spaced_states_only_where_the_backward_fits_shared_memory(monkeypatch):
    # sm_75 (64 KB a block) cannot hold the spaced backward's block: the forward keeps a state
    # every 64 steps there, as for complex A, and the backward runs without the chunk starts
    from types import SimpleNamespace

    from selective_scan import scan_fn

    kernel_bytes = header_values.value("csrc/selective_scan/bwd_lanes.cu", "kSpacedSmemBytes")
    assert scan_fn.SPACED_BWD_SHARED_BYTES == kernel_bytes
    devices = {
        0: SimpleNamespace(major=7, minor=5, shared_memory_per_block_optin=65536),  # T4
        1: SimpleNamespace(major=8, minor=6, shared_memory_per_block_optin=101376),  # A10, RTX 30xx
        2: SimpleNamespace(major=9, minor=0, shared_memory_per_block_optin=232448),  # H100 / H200
        3: SimpleNamespace(major=7, minor=5),  # a torch without the field: by capability
        4: SimpleNamespace(major=8, minor=0),
    }
    asked = []

    def props(index):
        asked.append(index)
        return devices[index]

    monkeypatch.setattr(scan_fn, "_SPACED_DEVICE_FITS", {})
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    fits = {i: scan_fn.spaced_device_fits(torch.device("cuda", i)) for i in devices}
    assert fits == {0: False, 1: True, 2: True, 3: False, 4: True}
    assert scan_fn.spaced_device_fits(torch.device("cuda", 0)) is False and asked == [0, 1, 2, 3, 4]  # once
