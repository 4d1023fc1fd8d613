"""GPU tests of the compatibility module selective_scan_cuda on the compiled kernels: both forms
of the scan-state tensor x (MAMBA_KERNELS_SCAN_STATES), against float64 autograd through the
per-step reference, with allocator blocks poisoned with NaN first. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

F64 = torch.float64


@pytest.fixture(autouse=True)
def _strict_backend(monkeypatch):
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "cuda")  # never a silent fallback here


def _poison() -> None:
    t = torch.full((1 << 26,), float("nan"), device="cuda")
    del t


def inputs(L, dtype, complex_a, z, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, d, n = 2, 24, 8

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=g)

    A = -0.5 * torch.rand(d, n, device="cuda", generator=g) - 0.05
    if complex_a:
        A = torch.complex(A, rnd(d, n))
    lb = 2 * L if complex_a else L
    return [
        rnd(b, d, L).to(dtype),
        (0.3 * torch.rand(b, d, L, device="cuda", generator=g)).to(dtype),
        A,
        rnd(b, 1, n, lb).to(dtype),
        rnd(b, 1, n, lb).to(dtype),
        rnd(d),
        rnd(b, d, L).to(dtype) if z else None,
        0.3 * torch.rand(d, device="cuda", generator=g),
    ]


def reference(args, dout):
    """Output without the z gate, gated output, last state and gradients (of the gated output) in
    float64 through the per-step reference."""
    from selective_scan import selective_scan_ref

    def leaf(t):
        return None if t is None else t.to(torch.complex128 if t.is_complex() else F64).requires_grad_()

    leaves = [leaf(t) for t in args]
    out, last = selective_scan_ref(*leaves, delta_softplus=True, return_last_state=True)
    out.backward(dout.to(F64))
    with torch.no_grad():
        plain = selective_scan_ref(*leaves[:6], None, leaves[7], delta_softplus=True)
    return plain, out.detach(), last.detach(), [None if t is None else t.grad for t in leaves]


@pytest.mark.parametrize("form", ["keep", "recompute"])
@pytest.mark.parametrize("dtype,complex_a", [(torch.float32, False), (torch.bfloat16, False),
                                             (torch.float32, True)])
@pytest.mark.parametrize("z", [False, True])
def test_fwd_bwd_against_float64(form, dtype, complex_a, z, monkeypatch):
    import selective_scan_cuda

    monkeypatch.setenv("MAMBA_KERNELS_SCAN_STATES", form)
    L = 2049  # 33 checkpoints of 64 steps (an odd count) and two 2048-step rows
    args = inputs(L, dtype, complex_a, z)
    dout = torch.randn(args[0].shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(5))
    _poison()
    res = selective_scan_cuda.fwd(*args, True)
    out, x = res[:2]
    want, gated, last, grads_want = reference(args, dout)
    rows = 2 if form == "recompute" else 17
    assert x.shape == (2, 24, rows, 16) and x.dtype == args[2].dtype
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(x[:, :, -1, 1::2].to(last.dtype), last, **tol)
    torch.testing.assert_close(out.to(F64), want, **tol)
    if z:
        torch.testing.assert_close(res[2].to(F64), gated, **tol)
    dz = torch.empty_like(args[6]) if z else None
    grads = selective_scan_cuda.bwd(*args, dout, x, out, dz, True, False)
    names = ["du", "ddelta", "dA", "dB", "dC", "dD", "ddelta_bias", "dz"]
    for name, got, exp in zip(names, grads, grads_want[:6] + [grads_want[7], grads_want[6]]):
        if exp is None:
            continue
        assert torch.isfinite(torch.view_as_real(got) if got.is_complex() else got).all(), name
        scale = exp.abs().max().item()
        atol = tol["atol"] * scale
        torch.testing.assert_close(got.to(exp.dtype), exp, rtol=tol["rtol"], atol=atol, msg=name)
    if z:
        assert grads[7] is dz


def test_both_forms_give_the_same_gradients(monkeypatch):
    # recompute reruns the same forward kernel: the gradients are bitwise equal
    import selective_scan_cuda

    args = inputs(4096, torch.bfloat16, False, True, seed=1)
    dout = torch.randn(args[0].shape, device="cuda")
    grads, xs = {}, {}
    for form in ("keep", "recompute"):
        monkeypatch.setenv("MAMBA_KERNELS_SCAN_STATES", form)
        out, x, _ = selective_scan_cuda.fwd(*args, True)
        xs[form] = x
        grads[form] = selective_scan_cuda.bwd(*args, dout, x, out, None, True, False)
    assert xs["recompute"].shape[2] == 2 and xs["keep"].shape[2] == 32  # 16 times the rows
    assert torch.equal(xs["recompute"][:, :, -1, 1::2], xs["keep"][:, :, -1, 1::2])
    # the recompute form's x holds the state after every 1024 steps: row r's even slots after
    # 2048 r + 1024 steps, its odd ones after 2048 (r + 1), bitwise the keep form's states there
    from selective_scan import cuda_compat

    kept = cuda_compat._unpack(xs["keep"], 64)  # after 64, 128, ..., 4096 steps
    assert torch.equal(xs["recompute"][:, :, :, 0::2], kept[:, :, 15::32])
    assert torch.equal(xs["recompute"][:, :, :, 1::2], kept[:, :, 31::32])
    for a, b in zip(grads["keep"], grads["recompute"]):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize("form", ["recompute", "keep"])
def test_bad_arguments_on_the_compiled_path_are_named(form, monkeypatch):
    """On CUDA the compatibility module hands the arguments to our op without checks of its own
    (the op checks every rule): a bad one still gets an error naming it and the rule, and the
    form's x is still checked by name."""
    import selective_scan_cuda

    monkeypatch.setenv("MAMBA_KERNELS_SCAN_STATES", form)
    args = inputs(40, torch.bfloat16, False, True)
    out, x, _ = selective_scan_cuda.fwd(*args, True)
    dout = torch.ones_like(out)
    op_error = (RuntimeError, ValueError, TypeError)  # the binding's error kinds differ
    cases = [
        (5, args[5].to(torch.bfloat16), op_error, "D must be float32"),
        (1, args[1][:, :, :-1], op_error, "delta must have shape"),
        (3, args[3][:, :, :4], op_error, "variable B must have shape"),
        (4, "C", op_error, "argument 'C'"),  # torch's parsing of the op's arguments
        (7, args[7].cpu(), op_error, "delta_bias must be on u's device cuda:0, got cpu"),
    ]
    for i, value, error, match in cases:
        bad = list(args)
        bad[i] = value
        with pytest.raises(error, match=match):
            selective_scan_cuda.fwd(*bad, True)
        with pytest.raises(error, match=match):
            selective_scan_cuda.bwd(*bad, dout, x, out, None, True, False)
    with pytest.raises(TypeError, match="delta_softplus must be a bool"):
        selective_scan_cuda.fwd(*args, 1)
    with pytest.raises(op_error, match="dout must have shape"):
        selective_scan_cuda.bwd(*args, dout[:, :, :5], x, out, None, True, False)
    with pytest.raises(op_error, match="dz must have shape"):
        selective_scan_cuda.bwd(*args, dout, x, out, torch.empty_like(out)[:, :3], True, False)
    with pytest.raises(ValueError, match="x must be the second output of selective_scan_cuda.fwd"):
        selective_scan_cuda.bwd(*args, dout, x[..., :2], out, None, True, False)
    with pytest.raises(TypeError, match="recompute_out_z must be a bool"):
        selective_scan_cuda.bwd(*args, dout, x, out, None, True, None)


@pytest.mark.parametrize("form", ["recompute", "keep"])
def test_compiled_calls_reach_the_op(form, monkeypatch):
    """torch.compile(fullgraph) of the compatibility fwd and bwd traces our op, not the PyTorch
    path: every output bitwise what the eager call gives (x's states included; torch 2.11's
    dynamo once read the softplus flag's class as something other than bool and took the
    PyTorch path, whose x holds only the last state). Under both bindings: the Python
    functions, which a classic build's C entry stands in for eagerly."""
    from selective_scan import cuda_compat

    monkeypatch.setenv("MAMBA_KERNELS_SCAN_STATES", form)
    torch._dynamo.reset()
    args = inputs(300, torch.bfloat16, False, True, seed=4)
    eager = cuda_compat.fwd(*args, True)
    compiled = torch.compile(lambda *a: cuda_compat.fwd(*a, True), fullgraph=True)(*args)
    assert len(compiled) == len(eager) == 3
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    u, delta, A, B, C, D, z, bias = args
    dout = torch.randn_like(u)

    def bwd(x, out, dout):
        return cuda_compat.bwd(u, delta, A, B, C, D, z, bias, dout, x, out, None, True, False)

    g_eager = bwd(eager[1], eager[0], dout)
    g_compiled = torch.compile(bwd, fullgraph=True)(eager[1], eager[0], dout)
    assert len(g_compiled) == len(g_eager)
    for got, want in zip(g_compiled, g_eager):
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want, rtol=0, atol=0)
