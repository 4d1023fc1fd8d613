"""selective_scan_fn and selective_scan_ref against the float64 per-step loop in
test_selective_scan_loops: forward, gradients, last state, lengths, layouts, extremes."""

from __future__ import annotations

import pytest
import torch
from test_selective_scan_loops import loop_scan

from selective_scan import selective_scan_fn, selective_scan_ref

F64 = torch.float64


def make_inputs(
    batch=2,
    dim=4,
    dstate=8,
    L=37,
    itype=torch.float32,
    complex_a=False,
    var_b=True,
    var_c=True,
    groups=1,
    B4d=None,
    has_d=True,
    has_z=True,
    has_bias=True,
    seed=0,
):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, dtype=F64, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=F64) * scale).to(dtype)

    wtype = torch.complex64 if complex_a else torch.float32
    if itype == F64:
        wtype = torch.complex128 if complex_a else F64
    u = rnd(batch, dim, L, dtype=itype)
    delta = (0.5 * torch.rand(batch, dim, L, generator=g, dtype=F64)).to(itype)
    if complex_a:
        A = torch.complex(
            -0.5 * torch.rand(dim, dstate, generator=g, dtype=F64),
            torch.randn(dim, dstate, generator=g, dtype=F64),
        ).to(wtype)
    else:
        A = (-0.5 * torch.rand(dim, dstate, generator=g, dtype=F64)).to(wtype)
    four_d = groups > 1 if B4d is None else B4d
    L_bc = 2 * L if complex_a else L

    def bc(var):
        if not var:
            t = torch.randn(dim, dstate, generator=g, dtype=torch.complex128 if complex_a else F64)
            return t.to(wtype)
        shape = (batch, groups, dstate, L_bc) if four_d else (batch, dstate, L_bc)
        return rnd(*shape, dtype=itype)

    B, C = bc(var_b), bc(var_c)
    ptype = F64 if itype == F64 else torch.float32
    D = rnd(dim, dtype=ptype) if has_d else None
    z = rnd(batch, dim, L, dtype=itype) if has_z else None
    bias = (0.5 * torch.rand(dim, generator=g, dtype=F64)).to(ptype) if has_bias else None
    return u, delta, A, B, C, D, z, bias


NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")


def grads_of(fn, inputs, softplus, seed=1):
    """Output and input gradients of sum(out * w) for a fixed random w."""
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in inputs]
    out = fn(*leaves, delta_softplus=softplus)
    out = out[0] if isinstance(out, tuple) else out
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    (out.to(F64) * w).sum().backward()
    return out.detach(), [t.grad if t is not None else None for t in leaves]


def assert_close_scaled(actual, expected, rtol, name=""):
    """|actual - expected| <= rtol * max|expected| elementwise (scale-aware for fp32 sums)."""
    expected = expected.to(actual.dtype) if not actual.is_complex() else expected.to(torch.complex128)
    actual = actual.to(expected.dtype)
    scale = expected.abs().max().item() + 1e-12
    err = (actual - expected).abs().max().item()
    assert err <= rtol * scale, f"{name}: max error {err:.3g} > {rtol} * {scale:.3g}"


def check_against_loop(inputs, softplus, rtol=2e-4):
    out, grads = grads_of(selective_scan_fn, inputs, softplus)
    ref_out, ref_grads = grads_of(lambda *a, **k: loop_scan(*a, **k)[0], inputs, softplus)
    assert out.dtype == inputs[0].dtype
    assert_close_scaled(out, ref_out, rtol, "out")
    for name, got, want, t in zip(NAMES, grads, ref_grads, inputs):
        if t is None:
            continue
        assert got is not None and got.dtype == t.dtype and got.shape == t.shape, name
        assert_close_scaled(got, want, rtol * 5, "d" + name)


CONFIGS = [
    # (complex_a, var_b, var_c, groups, has_d, has_z, has_bias, softplus)
    (False, True, True, 1, True, True, True, True),
    (False, True, True, 1, False, False, False, False),
    (False, False, False, 1, True, False, True, True),
    (False, False, True, 1, False, True, False, True),
    (False, True, False, 1, True, True, True, False),
    (False, True, True, 2, True, True, True, True),
    (True, True, True, 1, True, True, True, True),
    (True, False, False, 1, True, True, False, False),
    (True, True, False, 1, False, False, True, True),
    (True, True, True, 2, True, False, True, True),
]


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("L", [1, 5, 37, 130])
def test_fp32_forward_and_grads_match_loop(cfg, L):
    complex_a, var_b, var_c, groups, has_d, has_z, has_bias, softplus = cfg
    inputs = make_inputs(
        L=L,
        complex_a=complex_a,
        var_b=var_b,
        var_c=var_c,
        groups=groups,
        has_d=has_d,
        has_z=has_z,
        has_bias=has_bias,
        seed=L,
    )
    check_against_loop(inputs, softplus)


@pytest.mark.parametrize("complex_a", [False, True])
@pytest.mark.parametrize(
    "var_b,var_c,groups", [(True, True, 1), (False, False, 1), (True, True, 2), (False, True, 1)]
)
def test_gradcheck_float64(complex_a, var_b, var_c, groups):
    inputs = make_inputs(
        batch=2,
        dim=2 * groups,
        dstate=3,
        L=11,
        itype=F64,
        complex_a=complex_a,
        var_b=var_b,
        var_c=var_c,
        groups=groups,
        B4d=True if groups > 1 else None,
    )
    leaves = [t.requires_grad_() for t in inputs]
    fn = lambda *a: selective_scan_fn(*a, delta_softplus=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, leaves, fast_mode=True)


def test_gradcheck_float64_full_jacobian():
    inputs = make_inputs(batch=1, dim=2, dstate=2, L=9, itype=F64)
    leaves = [t.requires_grad_() for t in inputs]
    assert torch.autograd.gradcheck(lambda *a: selective_scan_fn(*a, delta_softplus=True), leaves)


@pytest.mark.parametrize("L", [2047, 2048, 2049, 4097])
def test_lengths_around_chunk_multiples(L):
    inputs = make_inputs(batch=1, dim=2, dstate=2, L=L, seed=L)
    check_against_loop(inputs, softplus=True, rtol=5e-4)


@pytest.mark.parametrize("L", [3, 4, 16, 17, 63, 64, 65, 255, 257, 1023, 1025])
def test_lengths_around_internal_chunks(L):
    # forward + last state only (cheap), at lengths around powers of the chunk size
    u, delta, A, B, C, D, z, bias = make_inputs(batch=1, dim=2, dstate=3, L=L, itype=F64, seed=L)
    out, last = selective_scan_fn(u, delta, A, B, C, D, z, bias, True, True)
    ref_out, ref_last = loop_scan(u, delta, A, B, C, D, z, bias, True)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(last, ref_last, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("complex_a", [False, True])
@pytest.mark.parametrize("var_b", [False, True])
def test_last_state_is_true_state(complex_a, var_b):
    # fixed B included: the state is h itself, not h / B (state-spaces/mamba#371)
    u, delta, A, B, C, D, z, bias = make_inputs(L=70, complex_a=complex_a, var_b=var_b)
    out, last = selective_scan_fn(u, delta, A, B, C, D, z, bias, True, True)
    ref_out, ref_last = loop_scan(u, delta, A, B, C, D, z, bias, True)
    assert last.dtype == (torch.complex64 if complex_a else torch.float32)
    assert last.shape == (2, 4, 8)
    assert_close_scaled(last, ref_last, 1e-4, "last_state")
    out_ref, last_ref = selective_scan_ref(u, delta, A, B, C, D, z, bias, True, True)
    assert_close_scaled(last_ref, ref_last, 1e-4, "selective_scan_ref last_state")
    assert not last.requires_grad


def test_last_state_continues_with_a_second_scan():
    # splitting the sequence: the state after part 1 reproduces part 2's loop from that state
    u, delta, A, B, C, D, z, bias = make_inputs(batch=1, dim=3, dstate=4, L=40, itype=F64)
    _, last = selective_scan_fn(u, delta, A, B, C, D, None, bias, True, True)
    _, ref_last = loop_scan(u, delta, A, B, C, D, None, bias, True)
    torch.testing.assert_close(last, ref_last)


@pytest.mark.parametrize("itype,rtol", [(torch.float16, 3e-3), (torch.bfloat16, 2e-2)])
def test_half_inputs(itype, rtol):
    inputs = make_inputs(L=50, itype=itype)
    out, grads = grads_of(selective_scan_fn, inputs, True)
    ref_out, ref_grads = grads_of(lambda *a, **k: loop_scan(*a, **k)[0], inputs, True)
    assert out.dtype == itype
    assert_close_scaled(out, ref_out, rtol, "out")
    for name, got, want, t in zip(NAMES, grads, ref_grads, inputs):
        assert got.dtype == t.dtype, name
        assert_close_scaled(got, want, rtol * 5, "d" + name)


def test_gradient_dtypes_follow_the_contract():
    inputs = make_inputs(L=9, var_b=False, var_c=True, itype=torch.bfloat16)
    _, grads = grads_of(selective_scan_fn, inputs, True)
    du, ddelta, dA, dB, dC, dD, dz, dbias = grads
    assert du.dtype == ddelta.dtype == dz.dtype == dC.dtype == torch.bfloat16
    assert dA.dtype == dB.dtype == dD.dtype == dbias.dtype == torch.float32


def test_strided_views_and_out_layout():
    batch, dim, L, n = 2, 6, 33, 4
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(batch, 3 * dim, L, generator=g)
    u, z = wide[:, :dim], wide[:, 2 * dim :]  # channel slices of a wider tensor
    # delta as mamba_inner_fn makes it: a (d, b*l) matmul result viewed as (b, d, l)
    delta = (0.3 * torch.rand(dim, batch * L, generator=g)).view(dim, batch, L).permute(1, 0, 2)
    assert not u.is_contiguous() and not delta.is_contiguous()
    A = -torch.rand(dim, n, generator=g)
    B = torch.randn(batch, n, L, generator=g)
    C = torch.randn(batch, n, L, generator=g)
    D = torch.randn(dim, generator=g)
    inputs = (u, delta, A, B, C, D, z, None)
    out = selective_scan_fn(*inputs, delta_softplus=True)
    assert out.stride() == delta.stride()
    assert out.stride() != out.contiguous().stride()
    contiguous = tuple(t.contiguous() if t is not None else None for t in inputs)
    torch.testing.assert_close(out, selective_scan_fn(*contiguous, delta_softplus=True))
    check_against_loop(inputs, softplus=True)
    # channel-last-ish delta: out follows that layout too
    delta_cl = delta.contiguous().transpose(1, 2).contiguous().transpose(1, 2)
    assert selective_scan_fn(u, delta_cl, A, B, C).stride() == delta_cl.stride()


def test_noncontiguous_and_broadcast_dout():
    u, delta, A, B, C, D, z, bias = make_inputs(L=21, itype=F64)
    leaves = [t.requires_grad_() for t in (u, delta, A, B, C, D, z, bias)]
    out = selective_scan_fn(*leaves, delta_softplus=True)
    out.sum().backward()  # expanded (stride-0) dout
    got = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    ref = loop_scan(*leaves, delta_softplus=True)[0]
    ref.sum().backward()
    for name, a, t in zip(NAMES, got, leaves):
        torch.testing.assert_close(a, t.grad, msg=name)


@pytest.mark.parametrize("delta_value", [19.99, 20.0, 20.01, 60.0, 1e3])
def test_extreme_delta_no_nan(delta_value):
    # softplus threshold, huge steps: exp(delta*A) underflows to exactly 0, nothing NaN
    u, _, A, B, C, D, z, _ = make_inputs(L=45, itype=F64)
    A = A * 32
    delta = torch.full_like(u, delta_value)
    delta[:, :, ::3] = 0.01
    leaves = [t.requires_grad_() for t in (u, delta, A, B, C, D, z)]
    out, last = selective_scan_fn(*leaves, None, True, True)
    ref_out, ref_last = loop_scan(*leaves, None, True)
    assert torch.isfinite(out).all() and torch.isfinite(last).all()
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(last, ref_last)
    out.sum().backward()
    got = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    ref_out.sum().backward()
    for name, a, t in zip(NAMES, got, leaves):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, t.grad, msg=name)


def test_fp32_extreme_decay_no_nan():
    u, _, A, B, C, D, z, bias = make_inputs(L=300)
    delta = torch.full_like(u, 500.0)
    leaves = [t.requires_grad_() for t in (u, delta, A * 100, B, C, D, z, bias)]
    out = selective_scan_fn(*leaves, delta_softplus=True)
    out.square().sum().backward()
    assert torch.isfinite(out).all()
    for t in leaves:
        if t.is_leaf:
            assert torch.isfinite(t.grad).all()


@pytest.mark.parametrize("complex_a", [False, True])
@pytest.mark.parametrize("var_b,groups", [(True, 1), (False, 1), (True, 2)])
def test_selective_scan_ref_matches_loop(complex_a, var_b, groups):
    inputs = make_inputs(L=23, complex_a=complex_a, var_b=var_b, var_c=True, groups=groups)
    out, grads = grads_of(selective_scan_ref, inputs, True)
    ref_out, ref_grads = grads_of(lambda *a, **k: loop_scan(*a, **k)[0], inputs, True)
    assert out.dtype == torch.float32
    assert_close_scaled(out, ref_out, 2e-4, "out")
    for name, got, want in zip(NAMES, grads, ref_grads):
        assert_close_scaled(got, want, 1e-3, "d" + name)


def test_dstate_256_works():
    inputs = make_inputs(batch=1, dim=2, dstate=256, L=12, itype=F64)
    out, last = selective_scan_fn(*inputs, delta_softplus=True, return_last_state=True)
    ref_out, ref_last = loop_scan(*inputs, delta_softplus=True)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(last, ref_last)


def test_backend_modes(monkeypatch):
    inputs = make_inputs(L=8)
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "reference")
    a = selective_scan_fn(*inputs)
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "cuda")
    with pytest.raises(RuntimeError, match="MAMBA_KERNELS_BACKEND=cuda"):
        selective_scan_fn(*inputs)
    monkeypatch.delenv("MAMBA_KERNELS_BACKEND")
    torch.testing.assert_close(selective_scan_fn(*inputs), a)
