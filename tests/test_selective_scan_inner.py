"""mamba_inner_fn / mamba_inner_ref against a float64 autograd reference built here from
F.conv1d, matmuls, explicit RMS norms and the per-step loop scan."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_selective_scan_loops import loop_scan, silu

from causal_conv1d import causal_conv1d_fn
from selective_scan import mamba_inner_fn, mamba_inner_ref, pytorch_scan, selective_scan_fn

F64 = torch.float64
ARG_NAMES = (
    "xz",
    "conv1d_weight",
    "conv1d_bias",
    "x_proj_weight",
    "delta_proj_weight",
    "out_proj_weight",
    "out_proj_bias",
    "A",
    "B",
    "C",
    "D",
    "delta_bias",
    "B_proj_bias",
    "C_proj_bias",
)


def rms(x, w, eps):
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w


def reference(
    xz,
    conv_w,
    conv_b,
    x_proj_w,
    delta_proj_w,
    out_proj_w,
    out_proj_b,
    A,
    B,
    C,
    D,
    delta_bias,
    B_proj_bias,
    C_proj_bias,
    softplus=True,
    b_rms=None,
    c_rms=None,
    dt_rms=None,
    eps=1e-6,
):
    args = [
        t.to(F64) if t is not None and not t.is_complex() else t
        for t in (xz, conv_w, conv_b, x_proj_w, delta_proj_w, out_proj_w, out_proj_b)
    ]
    xz, conv_w, conv_b, x_proj_w, delta_proj_w, out_proj_w, out_proj_b = args
    batch, _, L = xz.shape
    d = xz.shape[1] // 2
    x, z = xz[:, :d], xz[:, d:]
    width = conv_w.shape[-1]
    xc = silu(F.conv1d(F.pad(x, (width - 1, 0)), conv_w, conv_b, groups=d))
    x_dbl = xc.transpose(1, 2) @ x_proj_w.t()  # (b, L, rows)
    rank = delta_proj_w.shape[1]
    ds = A.shape[1] * (2 if A.is_complex() else 1)
    delta = x_dbl[..., :rank] @ delta_proj_w.t()
    if dt_rms is not None:
        delta = rms(delta, dt_rms.to(F64), eps)
    delta = delta.transpose(1, 2)

    def variable(cols, bias, w):
        if bias is not None:
            cols = cols + bias.to(F64)
        if w is not None:
            cols = rms(cols, w.to(F64), eps)
        if A.is_complex():  # (b, L, n, 2) -> (b, n, 2L) interleaved
            return cols.reshape(batch, L, -1, 2).permute(0, 2, 1, 3).reshape(batch, -1, 2 * L)
        return cols.transpose(1, 2)

    if B is None:
        B = variable(x_dbl[..., rank : rank + ds], B_proj_bias, b_rms)
    if C is None:
        C = variable(x_dbl[..., -ds:], C_proj_bias, c_rms)
    y, _ = loop_scan(xc, delta, A, B, C, D, z, delta_bias, softplus)
    return y.transpose(1, 2) @ out_proj_w.t() + (out_proj_b if out_proj_b is not None else 0)


def make(
    dtype=F64,
    complex_a=False,
    fixed_b=False,
    batch=2,
    d=6,
    L=13,
    n=3,
    rank=2,
    width=4,
    d_model=5,
    biases=True,
    seed=0,
):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=F64) * scale).to(dtype)

    ds = n * (2 if complex_a else 1)
    rows = rank + ds * (1 if fixed_b else 2)
    wtype = (
        (torch.complex128 if dtype == F64 else torch.complex64)
        if complex_a
        else (F64 if dtype == F64 else torch.float32)
    )
    ptype = F64 if dtype == F64 else torch.float32
    A = -0.5 * torch.rand(d, n, generator=g, dtype=F64) - 0.1
    if complex_a:
        A = torch.complex(A, torch.randn(d, n, generator=g, dtype=F64))
    B = (
        torch.randn(d, n, generator=g, dtype=torch.complex128 if complex_a else F64).to(wtype)
        if fixed_b
        else None
    )
    return [
        rnd(batch, 2 * d, L),
        rnd(d, 1, width, scale=0.5),
        rnd(d, scale=0.5) if biases else None,
        rnd(rows, d, scale=0.4),
        rnd(d, rank, scale=0.5),
        rnd(d_model, d, scale=0.3),
        rnd(d_model) if biases else None,
        A.to(wtype),
        B,
        None,
        torch.randn(d, generator=g, dtype=F64).to(ptype),
        (0.3 * torch.rand(d, generator=g, dtype=F64)).to(ptype),
        rnd(ds, scale=0.1) if biases and not fixed_b else None,
        rnd(ds, scale=0.1) if biases else None,
    ]


def run(fn, inputs, seed=1, **kw):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in inputs]
    out = fn(*leaves, **kw)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    (out.to(F64) * w).sum().backward()
    return out.detach(), [t.grad if t is not None else None for t in leaves]


def compare(inputs, rtol, ref_kw=None, **kw):
    ref_kw = dict(kw) if ref_kw is None else ref_kw
    ref_kw.pop("checkpoint_lvl", None)
    out, grads = run(mamba_inner_fn, inputs, **kw)
    want, ref_grads = run(reference, inputs, **ref_kw)
    scale = want.abs().max().item()
    assert out.dtype == inputs[0].dtype
    assert (out.to(F64) - want).abs().max().item() <= rtol * scale, "out"
    for name, t, got, exp in zip(ARG_NAMES, inputs, grads, ref_grads):
        if t is None:
            continue
        assert got is not None, name
        assert torch.isfinite(got).all(), name
        s = exp.abs().max().item() + 1e-12
        err = (got.to(exp.dtype) - exp).abs().max().item()
        assert err <= 5 * rtol * s, f"d{name}: {err:.3g} > {5 * rtol} * {s:.3g}"
    return grads


@pytest.mark.parametrize("checkpoint_lvl", [0, 1])
@pytest.mark.parametrize("complex_a", [False, True])
@pytest.mark.parametrize("with_rms", [False, True])
def test_float64_matches_reference(checkpoint_lvl, complex_a, with_rms):
    inputs = make(complex_a=complex_a)
    d = inputs[0].shape[1] // 2
    ds = inputs[7].shape[1] * (2 if complex_a else 1)
    g = torch.Generator().manual_seed(5)
    kw = dict(checkpoint_lvl=checkpoint_lvl)
    if with_rms:  # non-learnable weights: they get no gradient, the inputs do go through the norm
        kw.update(
            b_rms_weight=1 + torch.rand(ds, generator=g, dtype=F64),
            c_rms_weight=1 + torch.rand(ds, generator=g, dtype=F64),
            dt_rms_weight=1 + torch.rand(d, generator=g, dtype=F64),
            b_c_dt_rms_eps=1e-5,
        )
    ref_kw = {}
    if with_rms:
        ref_kw = dict(
            b_rms=kw["b_rms_weight"], c_rms=kw["c_rms_weight"], dt_rms=kw["dt_rms_weight"], eps=1e-5
        )
    compare(inputs, 1e-9, ref_kw=ref_kw, **kw)


@pytest.mark.parametrize("complex_a", [False, True])
def test_fixed_b_and_no_biases(complex_a):
    compare(make(complex_a=complex_a, fixed_b=True, biases=False, seed=3), 1e-9)


def test_float32_matches_reference():
    compare(make(dtype=torch.float32, d=8, L=40, n=4, seed=2), 2e-4)


def test_softplus_off():
    compare(make(seed=4), 1e-9, delta_softplus=False, ref_kw={"softplus": False})


def test_dxz_is_fully_written(monkeypatch):
    # poison every empty_like during the backward: any unwritten element of dxz shows up as NaN
    inputs = make(seed=6)
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in inputs]
    out = mamba_inner_fn(*leaves)
    real_empty_like = torch.empty_like

    def poisoned(*args, **kwargs):
        t = real_empty_like(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() or t.is_complex() else t

    monkeypatch.setattr(torch, "empty_like", poisoned)
    out.sum().backward()
    monkeypatch.undo()
    assert torch.isfinite(leaves[0].grad).all()
    ref_leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in inputs]
    reference(*ref_leaves).sum().backward()
    torch.testing.assert_close(leaves[0].grad, ref_leaves[0].grad)


def test_xz_with_strided_time_axis():
    inputs = make(seed=7)
    xz = inputs[0]
    wide = torch.zeros(xz.shape[0], xz.shape[1], 2 * xz.shape[2], dtype=xz.dtype)
    wide[..., ::2] = xz
    strided = wide[..., ::2]
    assert strided.stride(-1) != 1
    out = mamba_inner_fn(strided, *inputs[1:])
    torch.testing.assert_close(out, reference(*inputs))


@pytest.mark.parametrize("complex_a", [False, True])
def test_mamba_inner_ref(complex_a):
    inputs = make(dtype=torch.float32, complex_a=complex_a, seed=8)
    # the softplus is always applied, whatever delta_softplus says (like mamba_ssm)
    out, grads = run(mamba_inner_ref, inputs, delta_softplus=False)
    want, ref_grads = run(reference, inputs, softplus=True)
    assert (out.to(F64) - want).abs().max() <= 2e-4 * want.abs().max()
    for name, got, exp in zip(ARG_NAMES, grads, ref_grads):
        if exp is not None:
            assert (got.to(exp.dtype) - exp).abs().max() <= 1e-3 * (exp.abs().max() + 1e-12), name


def test_rms_weights_get_no_gradient():
    inputs = make(seed=9)
    ds, d = inputs[7].shape[1], inputs[0].shape[1] // 2
    w = [
        torch.ones(ds, dtype=F64, requires_grad=True),
        torch.ones(ds, dtype=F64, requires_grad=True),
        torch.ones(d, dtype=F64, requires_grad=True),
    ]
    out = mamba_inner_fn(*inputs, b_rms_weight=w[0], c_rms_weight=w[1], dt_rms_weight=w[2])
    out.sum().backward()
    assert all(t.grad is None for t in w)


def test_invalid_arguments():
    inputs = make(seed=10)
    with pytest.raises(ValueError, match="checkpoint_lvl"):
        mamba_inner_fn(*inputs, checkpoint_lvl=2)
    with pytest.raises(ValueError, match="x_proj_weight"):
        mamba_inner_fn(*inputs[:3], inputs[3][:-1], *inputs[4:])
    with pytest.raises(ValueError, match="xz"):
        mamba_inner_fn(inputs[0][:, :-1], *inputs[1:])
    with pytest.raises(ValueError, match="dt_rms_weight"):
        mamba_inner_fn(*inputs, dt_rms_weight=torch.ones(3, dtype=F64))


@pytest.mark.parametrize(
    "given,groups,complex_a",
    [("B", 1, False), ("C", 1, False), ("BC", 1, False), ("BC", 2, False), ("BC", 1, True)],
    ids=["B-3d", "C-3d", "BC-3d", "BC-4d-2-groups", "BC-3d-complex"],
)
def test_given_variable_b_c_get_gradients_in_their_own_shape(given, groups, complex_a):
    # a given (batch, [ngroups,] dstate, L) B or C: forward and backward, gradients shaped like it
    inputs = make(complex_a=complex_a, seed=12)
    g = torch.Generator().manual_seed(13)
    batch, L = inputs[0].shape[0], inputs[0].shape[2]
    n, rank = inputs[7].shape[1], inputs[4].shape[1]
    ds = n * (2 if complex_a else 1)
    shape = (batch, n, 2 * L if complex_a else L) if groups == 1 else (batch, groups, n, L)
    inputs[3] = inputs[3][: rank + ds * (2 - len(given))]  # x_proj rows: dt, then the B/C not given
    if given == "C":  # the x_proj rows after dt are B's
        inputs[3] = torch.cat([inputs[3][:rank], inputs[3][rank : rank + ds]])
    for name in given:
        inputs[ARG_NAMES.index(name)] = torch.randn(shape, generator=g, dtype=F64)
        inputs[ARG_NAMES.index(f"{name}_proj_bias")] = None
    grads = compare(inputs, 1e-9)
    for name in given:
        assert grads[ARG_NAMES.index(name)].shape == shape


@pytest.mark.parametrize("fn", [mamba_inner_fn, mamba_inner_ref], ids=["fn", "ref"])
@pytest.mark.parametrize("flag", ["no", 1, None])
def test_delta_softplus_must_be_a_bool(fn, flag):
    with pytest.raises(TypeError, match=f"delta_softplus must be a bool .*got {type(flag).__name__}"):
        fn(*make(seed=14), delta_softplus=flag)


def mamba_ssm_order(xz, conv_w, conv_b, x_proj_w, delta_proj_w, out_proj_w, out_proj_b, A, B, C, D, dt_bias):
    """The block composed in mamba_ssm 2.3.2's order and layouts, in the inputs' dtype, with our
    public conv and scan: x_dbl = (b*L, d) @ x_proj^T; delta = delta_proj @ x_dbl[:, :rank]^T, a
    (d, b*L) product seen as (b, d, L); variable B/C as contiguous (b, 1, n, L)."""
    batch, _, L = xz.shape
    rank = delta_proj_w.shape[1]
    ds = A.shape[1] * (2 if A.is_complex() else 1)
    x, z = xz.chunk(2, dim=1)
    xc = causal_conv1d_fn(x, conv_w[:, 0], conv_b, activation="silu")
    x_dbl = F.linear(xc.transpose(1, 2).reshape(-1, xc.shape[1]), x_proj_w)
    delta = (delta_proj_w @ x_dbl[:, :rank].t()).view(-1, batch, L).transpose(0, 1)

    def variable(cols):
        return cols.view(batch, L, -1).permute(0, 2, 1).unsqueeze(1).contiguous()

    B = variable(x_dbl[:, rank : rank + ds]) if B is None else B
    C = variable(x_dbl[:, -ds:]) if C is None else C
    y = selective_scan_fn(xc, delta, A, B, C, D, z, dt_bias, delta_softplus=True)
    return F.linear(y.transpose(1, 2), out_proj_w, out_proj_b)


@pytest.mark.parametrize("fixed_b", [False, True])
def test_composition_is_mamba_ssms(fixed_b, monkeypatch):
    # float32 with large values (randn weights, as mamba_ssm's own test uses): any other order
    # of the projections changes the output by far more than float32 rounding of this order
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "reference")
    g = torch.Generator().manual_seed(21)
    batch, d, L, n, rank = 2, 64, 48, 4, 8
    f32 = torch.float32
    xz = torch.randn(batch, 2 * d, L, generator=g)
    conv_w, conv_b = torch.randn(d, 1, 3, generator=g), torch.randn(d, generator=g)
    x_proj_w = torch.randn(rank + n * (1 if fixed_b else 2), d, generator=g)
    delta_proj_w = torch.randn(d, rank, generator=g)
    out_proj_w = torch.randn(d // 2, d, generator=g)
    A = -0.5 * torch.rand(d, n, generator=g)
    B = torch.randn(d, n, generator=g) if fixed_b else None
    D, delta_bias = torch.randn(d, generator=g), 0.5 * torch.rand(d, generator=g)
    args = [xz, conv_w, conv_b, x_proj_w, delta_proj_w, out_proj_w, None, A, B, None, D, delta_bias]
    # the layouts the scan sees decide which GEMM and scan variants run on a GPU: record them
    seen = {}
    make_problem, backward = pytorch_scan.make_problem, pytorch_scan.backward

    def recording_make_problem(u, delta, *rest):
        seen.setdefault("delta", delta.stride())
        return make_problem(u, delta, *rest)

    def recording_backward(p, dout, *rest, **kw):
        seen["dout"] = dout.stride()
        return backward(p, dout, *rest, **kw)

    monkeypatch.setattr(pytorch_scan, "make_problem", recording_make_problem)
    monkeypatch.setattr(pytorch_scan, "backward", recording_backward)
    leaves = [t.clone().requires_grad_() if t is not None else None for t in args]
    out = mamba_inner_fn(*leaves)
    out.backward(torch.randn(out.shape, generator=g))
    assert seen == {"delta": (L, batch * L, 1), "dout": (L, batch * L, 1)}  # (d, b*L) products
    want = mamba_ssm_order(*args)
    assert out.dtype == f32 and out.abs().max() > 1e3
    torch.testing.assert_close(out.detach(), want, rtol=1e-6, atol=1e-6 * want.abs().max().item())
    # the same block in float64 (the truth): both float32 compositions are as close to it
    truth = mamba_ssm_order(*[t.to(F64) if t is not None else None for t in args])
    assert (out.to(F64) - truth).abs().max() <= 1e-3 * truth.abs().max()
