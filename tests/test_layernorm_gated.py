"""CPU tests of selective_scan.layernorm_gated (the PyTorch path and the public API).

Every result is compared with a float64 reference written here, group by group with plain
loops over the groups (independent of the module's reshapes); gradients with gradcheck on
tiny float64 problems and against autograd through that reference. The CUDA kernels' tests are
in test_layernorm_gated_cuda.py.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from selective_scan import layernorm_gated as lg
from selective_scan.layernorm_gated import (
    LayerNorm,
    LayerNormFn,
    RMSNorm,
    layer_norm_ref,
    layernorm_fn,
    rms_norm_ref,
    rmsnorm_fn,
)

F64 = torch.float64


def reference(x, w, b, z, eps, group_size, norm_before_gate, is_rms_norm):
    """The gated norm in float64, one group at a time."""
    x, w = x.double(), w.double()
    b = b.double() if b is not None else None
    z = z.double() if z is not None else None
    n = x.shape[-1]
    g = n if group_size is None else group_size
    if z is not None and not norm_before_gate:
        x = x * z * torch.sigmoid(z)
    parts = []
    for k in range(0, n, g) if g else []:
        xs = x[..., k : k + g]
        if not is_rms_norm:
            xs = xs - xs.mean(-1, keepdim=True)
        parts.append(xs / torch.sqrt(xs.pow(2).mean(-1, keepdim=True) + eps))
    y = torch.cat(parts, -1) if parts else x.clone()
    y = y * w
    if b is not None:
        y = y + b
    if z is not None and norm_before_gate:
        y = y * z * torch.sigmoid(z)
    return y


def _inputs(shape, dtype, has_z, has_bias, wtype=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = shape[-1]
    wtype = wtype or dtype
    x = torch.randn(shape, generator=gen, dtype=F64).to(dtype)
    z = torch.randn(shape, generator=gen, dtype=F64).to(dtype) if has_z else None
    w = (1 + 0.5 * torch.randn(n, generator=gen, dtype=F64)).to(wtype)
    b = (0.5 * torch.randn(n, generator=gen, dtype=F64)).to(wtype) if has_bias else None
    return x, w, b, z


COMBOS = [
    (gs, nbg, has_z, has_bias, rms)
    for gs, nbg, has_z, has_bias, rms in itertools.product(
        [None, 4, 8], [True, False], [True, False], [True, False], [True, False]
    )
    if has_z or nbg  # without z the gate order means nothing: one case
]


def _call(x, w, b, z, eps, gs, nbg, rms):
    if rms:
        return rmsnorm_fn(x, w, b, z=z, eps=eps, group_size=gs, norm_before_gate=nbg)
    return layernorm_fn(x, w, b, z=z, eps=eps, group_size=gs, norm_before_gate=nbg, is_rms_norm=False)


@pytest.mark.parametrize("gs,nbg,has_z,has_bias,rms", COMBOS)
def test_forward_and_grads_float32(gs, nbg, has_z, has_bias, rms):
    x, w, b, z = _inputs((3, 5, 16), torch.float32, has_z, has_bias)
    leaves = [t.requires_grad_() for t in (x, w, b, z) if t is not None]
    y = _call(x, w, b, z, 1e-5, gs, nbg, rms)
    assert y.dtype == torch.float32 and y.shape == x.shape
    ref_in = [t.detach().double().requires_grad_() for t in leaves]
    it = iter(ref_in)
    xr, wr = next(it), next(it)
    br = next(it) if b is not None else None
    zr = next(it) if z is not None else None
    ref = reference(xr, wr, br, zr, 1e-5, gs, nbg, rms)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(ref)
    grads = torch.autograd.grad(y, leaves, dy.float())
    ref_grads = torch.autograd.grad(ref, ref_in, dy)
    for got, want, t in zip(grads, ref_grads, leaves):
        assert got.dtype == t.dtype
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("gs,nbg,has_z,has_bias,rms", COMBOS)
def test_gradcheck_float64(gs, nbg, has_z, has_bias, rms):
    x, w, b, z = _inputs((2, 8), F64, has_z, has_bias, seed=1)
    args = [t.requires_grad_() for t in (x, w, b, z) if t is not None]

    def f(*a):
        it = iter(a)
        xx, ww = next(it), next(it)
        bb = next(it) if b is not None else None
        zz = next(it) if z is not None else None
        return _call(xx, ww, bb, zz, 1e-5, gs, nbg, rms)

    assert torch.autograd.gradcheck(f, args)
    # and equal to the reference in float64
    torch.testing.assert_close(f(*args), reference(x, w, b, z, 1e-5, gs, nbg, rms), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
@pytest.mark.parametrize("wtype", [torch.float32, None])
def test_half_inputs_compute_in_float32(dtype, tol, wtype):
    x, w, b, z = _inputs((4, 32), dtype, True, True, wtype=wtype)
    y = rmsnorm_fn(x, w, b, z=z, group_size=8)
    assert y.dtype == dtype
    ref = reference(x, w, b, z, 1e-6, 8, True, True)
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)
    # the float32 compute of the module equals the same maths in float32 rounded once
    want = lg._ref(x, w, b, z, 1e-6, 8, True, True, True)
    torch.testing.assert_close(y, want, rtol=0, atol=0)


def test_references_match_the_test_reference():
    x, w, b, z = _inputs((3, 12), torch.float32, True, True)
    for nbg in (True, False):
        got = rms_norm_ref(x, w, b, z=z, eps=1e-5, group_size=6, norm_before_gate=nbg)
        torch.testing.assert_close(
            got.double(), reference(x, w, b, z, 1e-5, 6, nbg, True), rtol=1e-5, atol=1e-5
        )
        got = layer_norm_ref(x, w, b, z=z, eps=1e-5, group_size=6, norm_before_gate=nbg)
        torch.testing.assert_close(
            got.double(), reference(x, w, b, z, 1e-5, 6, nbg, False), rtol=1e-5, atol=1e-5
        )
    # upcast=False computes in x's dtype
    xh = x.half()
    lo = rms_norm_ref(xh, w, None, eps=1e-5, upcast=False)
    assert lo.dtype == torch.float16


def test_strided_inputs():
    base = torch.randn(4, 40, 3, dtype=F64)
    x = base[:, :32, 1]  # row stride 120, channel stride 3
    zb = torch.randn(32, 4, dtype=F64)
    z = zb.t()  # channel stride 4: not unit
    w = torch.randn(64, dtype=F64)[::2]
    b = torch.randn(32, dtype=F64)
    for nbg in (True, False):
        got = rmsnorm_fn(x, w, b, z=z, group_size=8, norm_before_gate=nbg)
        want = rmsnorm_fn(
            x.contiguous(), w.contiguous(), b, z=z.contiguous(), group_size=8, norm_before_gate=nbg
        )
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(got, reference(x, w, b, z, 1e-6, 8, nbg, True), rtol=1e-12, atol=1e-12)
    xe = torch.randn(1, 16, dtype=F64).expand(3, 16)  # stride 0 rows
    got = layernorm_fn(xe, torch.ones(16, dtype=F64), None, group_size=4)
    torch.testing.assert_close(
        got, reference(xe, torch.ones(16, dtype=F64), None, None, 1e-6, 4, True, False)
    )


def test_private_forward_backward_helpers():
    """_layer_norm_fwd / _layer_norm_bwd (what Mamba-2's fused layer calls), with out= and dz=
    views into larger buffers (non-unit row strides)."""
    m, n, g = 6, 16, 8
    x, w, _, z = _inputs((m, n), torch.float32, True, False)
    big = torch.full((m, n + 5), float("nan"))
    out = big[:, 2 : 2 + n]
    y, mean, rstd = lg._layer_norm_fwd(x, w, None, 1e-5, z=z, out=out, group_size=g, is_rms_norm=True)
    assert y is out and mean is None and rstd.shape == (m * n // g,) and rstd.dtype == torch.float32
    torch.testing.assert_close(
        out.double(), reference(x, w, None, z, 1e-5, g, True, True), rtol=1e-5, atol=1e-5
    )
    assert big[:, :2].isnan().all() and big[:, 2 + n :].isnan().all()
    # rstd is group-major: entry (group k, row r) at k * rows + r
    want = 1 / torch.sqrt(x.double()[3, 8:16].pow(2).mean() + 1e-5)
    torch.testing.assert_close(rstd[1 * m + 3].double(), want, rtol=1e-6, atol=0)

    dy = torch.randn(m, n)
    dzbig = torch.full((m, n + 3), float("nan"))
    dz = dzbig[:, 1 : 1 + n]
    outbig = torch.full((m, n + 3), float("nan"))
    out2 = outbig[:, :n]
    dx, dw, db, dz_r, out_r = lg._layer_norm_bwd(
        dy,
        x,
        w,
        None,
        1e-5,
        None,
        rstd,
        z,
        group_size=g,
        is_rms_norm=True,
        recompute_output=True,
        dz=dz,
        out=out2,
    )
    assert db is None and dz_r is dz and out_r is out2
    torch.testing.assert_close(out2, out)
    xr, wr, zr = (t.double().requires_grad_() for t in (x, w, z))
    ref = reference(xr, wr, None, zr, 1e-5, g, True, True)
    gx, gw, gz = torch.autograd.grad(ref, (xr, wr, zr), dy.double())
    torch.testing.assert_close(dx.double(), gx, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dw.double(), gw, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dz.double(), gz, rtol=1e-4, atol=1e-4)
    assert dzbig[:, 0].isnan().all() and dzbig[:, 1 + n :].isnan().all()


def test_group_size_may_be_a_numpy_int():
    np = pytest.importorskip("numpy")
    x, w, _, _ = _inputs((2, 16), F64, False, False)
    got = rmsnorm_fn(x, w, None, group_size=np.int64(4))
    torch.testing.assert_close(got, reference(x, w, None, None, 1e-6, 4, True, True))


def test_layer_norm_mean_saved():
    x, w, b, _ = _inputs((5, 12), torch.float32, False, True)
    y, mean, rstd = lg._layer_norm_fwd(x, w, b, 1e-5, group_size=4)
    assert mean.shape == (15,)
    torch.testing.assert_close(mean[2 * 5 + 1], x[1, 8:12].mean())


def test_modules_mirror_the_original():
    n = RMSNorm(24, group_size=8, dtype=torch.float32)
    assert n.eps == 1e-5 and n.bias is None and torch.equal(n.weight, torch.ones(24))
    assert list(dict(n.named_parameters())) == ["weight"]
    assert list(n.state_dict()) == ["weight"]
    ln = LayerNorm(24, eps=1e-6, norm_before_gate=False)
    assert list(ln.state_dict()) == ["weight", "bias"] and torch.equal(ln.bias, torch.zeros(24))
    x = torch.randn(2, 3, 24)
    z = torch.randn(2, 3, 24)
    with torch.no_grad():
        n.weight.uniform_(0.5, 1.5)
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)
    torch.testing.assert_close(
        n(x, z).double(), reference(x, n.weight, None, z, 1e-5, 8, True, True), rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(
        ln(x, z).double(), reference(x, ln.weight, ln.bias, z, 1e-6, None, False, False), rtol=1e-5, atol=1e-5
    )
    # a state dict saved from one loads into the other's twin
    twin = RMSNorm(24, group_size=8)
    twin.load_state_dict(n.state_dict())
    torch.testing.assert_close(twin(x), n(x))
    loss = ln(x, z).square().sum()
    loss.backward()
    assert ln.weight.grad is not None and ln.bias.grad is not None


def test_autograd_function_apply():
    x, w, b, z = _inputs((2, 8), F64, True, True)
    y = LayerNormFn.apply(x, w, b, z, 1e-5, 4, False, True)
    torch.testing.assert_close(y, reference(x, w, b, z, 1e-5, 4, False, True))


@pytest.mark.parametrize("shape,gs", [((0, 8), 4), ((3, 0), None), ((3, 0), 4), ((2, 0, 8), None)])
def test_empty_inputs(shape, gs):
    x, w, b, z = _inputs(shape, torch.float32, True, True)
    leaves = [t.requires_grad_() for t in (x, w, b, z)]
    y = rmsnorm_fn(x, w, b, z=z, group_size=gs)
    assert y.shape == x.shape
    y.sum().backward()
    for t in leaves:
        assert t.grad is not None and t.grad.shape == t.shape
        assert not t.grad.any()  # sums over nothing are zeros


def _bad_cases():
    x = torch.randn(3, 8)
    w = torch.ones(8)
    return (
        [
            ("x not a tensor", dict(x=[1.0]), TypeError, "x must be a torch.Tensor, got list"),
            (
                "weight shape",
                dict(weight=torch.ones(7)),
                ValueError,
                r"weight must have shape \(8,\).*got \(7,\)",
            ),
            ("bias shape", dict(bias=torch.ones(4)), ValueError, r"bias must have shape \(8,\).*got \(4,\)"),
            ("z shape", dict(z=torch.randn(3, 4)), ValueError, r"z must have shape \(3, 8\).*got \(3, 4\)"),
            (
                "x int",
                dict(x=torch.ones(3, 8, dtype=torch.int32)),
                TypeError,
                "x must be float32.*got torch.int32",
            ),
            (
                "z complex",
                dict(z=torch.ones(3, 8, dtype=torch.complex64)),
                TypeError,
                "z must be float32.*complex64",
            ),
            (
                "weight int",
                dict(weight=torch.ones(8, dtype=torch.int64)),
                TypeError,
                "weight must be float32.*int64",
            ),
            (
                "group_size not dividing",
                dict(group_size=3),
                ValueError,
                r"group_size must be >= 1 and divide x.shape\[-1\] = 8, got 3",
            ),
            ("group_size 0", dict(group_size=0), ValueError, "group_size must be >= 1.*got 0"),
            (
                "group_size float",
                dict(group_size=4.0),
                TypeError,
                "group_size must be None or an int, got float 4.0",
            ),
            (
                "group_size bool",
                dict(group_size=True),
                TypeError,
                "group_size must be None or an int, got bool True",
            ),
            ("eps negative", dict(eps=-1e-5), ValueError, "eps must be finite and >= 0, got -1e-05"),
            ("eps nan", dict(eps=float("nan")), ValueError, "eps must be finite and >= 0, got nan"),
            ("eps str", dict(eps="1e-5"), TypeError, "eps must be a real number, got str '1e-5'"),
            (
                "flag str",
                dict(norm_before_gate="no"),
                TypeError,
                "norm_before_gate must be a bool.*got str 'no'",
            ),
            ("x 0-d", dict(x=torch.tensor(1.0)), ValueError, "x must have at least one dimension"),
            (
                "device",
                dict(weight=torch.ones(8, device="meta")),
                ValueError,
                "x is on cpu but weight is on meta",
            ),
        ],
        x,
        w,
    )


@pytest.mark.parametrize("case", range(len(_bad_cases()[0])), ids=[c[0] for c in _bad_cases()[0]])
def test_bad_inputs(case):
    cases, x, w = _bad_cases()
    _, over, exc, pattern = cases[case]
    kw = dict(x=x, weight=w, bias=None, z=None, eps=1e-6, group_size=None, norm_before_gate=True)
    kw.update(over)
    with pytest.raises(exc, match=pattern):
        rmsnorm_fn(kw.pop("x"), kw.pop("weight"), kw.pop("bias"), **kw)


def test_bad_helper_arguments():
    x = torch.randn(3, 8)
    w = torch.ones(8)
    with pytest.raises(ValueError, match=r"x must be 2-D \(rows, channels\), got shape \(1, 3, 8\)"):
        lg._layer_norm_fwd(x[None], w, None, 1e-6)
    with pytest.raises(ValueError, match=r"out must have shape \(3, 8\)"):
        lg._layer_norm_fwd(x, w, None, 1e-6, out=torch.empty(3, 4))
    with pytest.raises(ValueError, match="out.*overlap"):
        lg._layer_norm_fwd(x, w, None, 1e-6, out=torch.empty(1, 8).expand(3, 8))
    _, _, rstd = lg._layer_norm_fwd(x, w, None, 1e-6, is_rms_norm=True)
    with pytest.raises(ValueError, match=r"rstd must have shape \(6,\)"):
        lg._layer_norm_bwd(x, x, w, None, 1e-6, None, rstd, group_size=4, is_rms_norm=True)
    with pytest.raises(ValueError, match="dz must be None without z"):
        lg._layer_norm_bwd(x, x, w, None, 1e-6, None, rstd, is_rms_norm=True, dz=torch.empty(3, 8))
    with pytest.raises(TypeError, match="mean must be a torch.Tensor, got NoneType"):
        lg._layer_norm_bwd(x, x, w, None, 1e-6, None, rstd, is_rms_norm=False)


def test_nan_is_data():
    x, w, b, z = _inputs((3, 16), torch.float32, True, False)
    x[1, 3] = float("nan")
    y = rmsnorm_fn(x, w, b, z=z, group_size=8)
    assert y[1, :8].isnan().all() and torch.isfinite(y[1, 8:]).all()
    assert torch.isfinite(y[0]).all() and torch.isfinite(y[2]).all()


def test_compile_fullgraph_cpu():
    x, w, b, z = _inputs((4, 16), torch.float32, True, True)
    x.requires_grad_()

    def f(x, w, b, z):
        return rmsnorm_fn(x, w, b, z=z, group_size=8, norm_before_gate=False)

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="eager")(x, w, b, z)
    torch.testing.assert_close(got, f(x, w, b, z))
    got.sum().backward()
    assert x.grad is not None


def test_silu_gate_convention():
    """norm_before_gate: norm(x) * silu(z); else norm(x * silu(z)) -- checked on one row by hand."""
    x = torch.tensor([[1.0, -2.0, 3.0, 0.5]], dtype=F64)
    z = torch.tensor([[0.3, -1.0, 2.0, 0.0]], dtype=F64)
    w = torch.ones(4, dtype=F64)

    def rms(v):
        return v / torch.sqrt(v.pow(2).mean() + 1e-6)

    torch.testing.assert_close(rmsnorm_fn(x, w, None, z=z), rms(x) * F.silu(z))
    torch.testing.assert_close(rmsnorm_fn(x, w, None, z=z, norm_before_gate=False), rms(x * F.silu(z)))
