"""selective_scan.layer_norm, the pure-PyTorch stand-in for mamba_ssm's ops/triton/layer_norm:
every option against a float64 reference written here, the gradients, the dropout masks, the
return tuples mamba_ssm's callers unpack, the RMSNorm state dict, bad arguments, and no Triton."""

from __future__ import annotations

import inspect
import itertools
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import selective_scan.layer_norm as LN
from selective_scan.layer_norm import (
    LayerNormFn,
    LayerNormLinearFn,
    RMSNorm,
    _layer_norm_bwd,
    _layer_norm_fwd,
    layer_norm_fn,
    layer_norm_linear_fn,
    layer_norm_ref,
    rms_norm_fn,
    rms_norm_ref,
)
from selective_scan.selective_scan_interface import rms_norm_forward

ROOT = Path(__file__).resolve().parent.parent
N = 8
SHAPE = (2, 3, N)


def d(t):
    return None if t is None else t.detach().double()


def ref64(x, w, b, residual=None, x1=None, w1=None, b1=None, eps=1e-6, p=0.0, keep=None, keep1=None,
          rowscale=None, rms=False):
    """(y, y1, h) in float64, differentiable: h = drop(x * rowscale) + drop(x1) + residual."""
    h = x
    if rowscale is not None:
        h = h * rowscale[..., None]
    if keep is not None:
        h = torch.where(keep, h / (1 - p), torch.zeros_like(h))
    if x1 is not None:
        h = h + (x1 if keep1 is None else torch.where(keep1, x1 / (1 - p), torch.zeros_like(x1)))
    if residual is not None:
        h = h + residual
    c = h if rms else h - h.mean(-1, keepdim=True)
    xhat = c / torch.sqrt(c.square().mean(-1, keepdim=True) + eps)
    y = xhat * w + (0 if b is None else b)
    y1 = None if w1 is None else xhat * w1 + (0 if b1 is None else b1)
    return y, y1, h


def tol(dtype):
    return {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-5),
            torch.float16: dict(rtol=5e-3, atol=5e-3), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}[dtype]


def close(got, want, dtype):
    torch.testing.assert_close(got.double(), want.double(), **tol(dtype))


def make(dtype, residual=False, x1=False, w1=False, bias=True, rowscale=False, residual_dtype=None,
         shape=SHAPE):
    n = shape[-1]
    t = dict(
        x=torch.randn(shape, dtype=dtype),
        weight=torch.randn(n),
        bias=torch.randn(n) if bias else None,
        residual=torch.randn(shape, dtype=residual_dtype or dtype) if residual else None,
        x1=torch.randn(shape, dtype=dtype) if x1 else None,
        weight1=torch.randn(n) if w1 else None,
        bias1=torch.randn(n) if (w1 and bias) else None,
        rowscale=torch.rand(shape[:-1]) + 0.5 if rowscale else None,
    )
    return t


def as_ref(t):
    return dict(x=d(t["x"]), w=d(t["weight"]), b=d(t["bias"]), residual=d(t["residual"]), x1=d(t["x1"]),
                w1=d(t["weight1"]), b1=d(t["bias1"]), rowscale=d(t["rowscale"]))


# --- forward: every option against the float64 reference ---------------------------------------

OPTIONS = list(itertools.product(
    [False, True],  # rms
    [False, True],  # residual
    [False, True],  # prenorm
    [False, True],  # residual_in_fp32
    ["none", "x1", "w1", "x1w1", "rowscale"],
))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_forward_every_option_against_float64(dtype):
    for rms, residual, prenorm, fp32, branch in OPTIONS:
        t = make(dtype, residual=residual, x1="x1" in branch, w1="w1" in branch,
                 rowscale=branch == "rowscale", bias=not rms)
        fn = rms_norm_fn if rms else layer_norm_fn
        kw = {} if rms else {"is_rms_norm": False}
        out = fn(**t, prenorm=prenorm, residual_in_fp32=fp32, eps=1e-5, **kw)
        out = out if isinstance(out, tuple) else (out,)
        want_y, want_y1, want_h = ref64(**as_ref(t), eps=1e-5, rms=rms)
        what = f"{dtype} rms={rms} residual={residual} prenorm={prenorm} fp32={fp32} {branch}"
        assert len(out) == 1 + (t["weight1"] is not None) + prenorm, what
        assert out[0].dtype == dtype and out[0].shape == SHAPE, what
        close(out[0], want_y, dtype)
        if t["weight1"] is not None:
            assert out[1].dtype == dtype, what
            close(out[1], want_y1, dtype)
        if prenorm:
            res = out[-1]
            want_dtype = dtype if residual else (torch.float32 if fp32 else dtype)
            assert res.dtype == want_dtype, what
            close(res, want_h, res.dtype)
            if branch == "none" and not residual and want_dtype == dtype:
                assert res.data_ptr() == t["x"].data_ptr(), what  # x itself, as the original


def test_residual_keeps_its_own_dtype_and_block_usage():
    """mamba_ssm's Block: (hidden, residual) = layer_norm_fn(..., prenorm=True, residual_in_fp32)."""
    x = torch.randn(SHAPE, dtype=torch.bfloat16)
    w = torch.ones(N)
    hidden, residual = layer_norm_fn(x, w, None, residual=None, prenorm=True, residual_in_fp32=True,
                                     eps=1e-5, is_rms_norm=True)
    assert hidden.dtype == torch.bfloat16 and residual.dtype == torch.float32
    torch.testing.assert_close(residual, x.float())
    x2 = torch.randn(SHAPE, dtype=torch.bfloat16)
    hidden2, residual2 = layer_norm_fn(x2, w, None, residual=residual, prenorm=True, residual_in_fp32=True,
                                       eps=1e-5, is_rms_norm=True)
    assert residual2.dtype == torch.float32
    torch.testing.assert_close(residual2, x2.float() + residual)
    # the normalization reads the float32 sum, not a bf16 rounding of it
    want, _, _ = ref64(d(x2), d(w), None, residual=d(residual), eps=1e-5, rms=True)
    close(hidden2, want, torch.bfloat16)


def test_eps_default_and_eps_is_used():
    x = torch.randn(4, N) * 1e-3
    w = torch.ones(N)
    assert inspect.signature(layer_norm_fn).parameters["eps"].default == 1e-6
    for eps in (1e-6, 1e-2):
        y = rms_norm_fn(x, w, None, eps=eps)
        close(y, ref64(d(x), d(w), None, eps=eps, rms=True)[0], torch.float32)


def test_mixed_dtypes_upcast():
    """float64 anywhere computes in float64; 16-bit x with float32 weight computes in float32."""
    x = torch.randn(SHAPE, dtype=torch.float32)
    w = torch.randn(N, dtype=torch.float64)
    y, _, mean, rstd, *_ = _layer_norm_fwd(x.reshape(-1, N), w, None, 1e-6)
    assert y.dtype == torch.float32 and mean.dtype == rstd.dtype == torch.float64
    y, _, mean, rstd, *_ = _layer_norm_fwd(x.reshape(-1, N).half(), w.float(), None, 1e-6)
    assert y.dtype == torch.float16 and mean.dtype == rstd.dtype == torch.float32


def test_empty_rows_and_empty_features():
    for shape in ((0, N), (2, 0, N)):
        x = torch.randn(shape, requires_grad=True)
        w = torch.randn(N, requires_grad=True)
        y = layer_norm_fn(x, w, None)
        assert y.shape == shape
        y.sum().backward()
        assert x.grad.shape == shape and torch.equal(w.grad, torch.zeros(N))


def test_any_strides_equal_contiguous_copies():
    x = torch.randn(N, 6).t().requires_grad_(True)  # (6, N), column-major
    residual = torch.randn(1, N).expand(6, N)  # stride 0 along rows
    w = torch.randn(N)
    y, res = layer_norm_fn(x, w, None, residual=residual, prenorm=True)
    xc = x.detach().contiguous().requires_grad_(True)
    yc, resc = layer_norm_fn(xc, w, None, residual=residual.contiguous(), prenorm=True)
    torch.testing.assert_close(y, yc)
    torch.testing.assert_close(res, resc)
    (y.sum() + res.square().sum()).backward()
    (yc.sum() + resc.square().sum()).backward()
    torch.testing.assert_close(x.grad, xc.grad)


# --- dropout ----------------------------------------------------------------------------------


def test_dropout_p0_returns_no_masks():
    t = make(torch.float32, residual=True)
    y, res, m, m1 = layer_norm_fn(**t, prenorm=True, return_dropout_mask=True)
    assert m is None and m1 is None
    y, m, m1 = layer_norm_fn(**t, return_dropout_mask=True)
    assert m is None and m1 is None


@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("with_x1", [False, True])
def test_dropout_output_and_gradients_follow_the_returned_masks(rms, with_x1):
    p = 0.4
    t = make(torch.float64, residual=True, x1=with_x1, w1=with_x1, bias=True)
    for k in ("x", "weight", "bias", "residual", "x1", "weight1", "bias1"):
        if t[k] is not None:
            t[k].requires_grad_(True)
    outs = layer_norm_fn(**t, dropout_p=p, prenorm=True, is_rms_norm=rms, return_dropout_mask=True)
    *vals, m, m1 = outs
    assert m.dtype == torch.bool and m.shape == SHAPE and not m.requires_grad
    assert (m1 is not None) == with_x1
    if with_x1:
        assert m1.shape == SHAPE and not torch.equal(m, m1)
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in t.items() if v is not None}
    r = ref64(leaves["x"], leaves["weight"], leaves["bias"], leaves["residual"], leaves.get("x1"),
              leaves.get("weight1"), leaves.get("bias1"), p=p, keep=m, keep1=m1, rms=rms)
    want = [r[0]] + ([r[1]] if with_x1 else []) + [r[2]]
    assert len(vals) == len(want)
    for got, w in zip(vals, want):
        close(got, w, torch.float64)
    grads = [torch.randn_like(v) for v in vals]
    torch.autograd.backward(vals, grads)
    torch.autograd.backward(want, grads)
    for k, leaf in leaves.items():
        close(t[k].grad, leaf.grad, torch.float64)
    # dropped elements get no gradient
    assert torch.all(t["x"].grad[~m] == 0)


def test_dropout_mask_statistics_and_reproducibility():
    p, rows, n = 0.3, 512, 256
    x = torch.randn(rows, n)
    w = torch.ones(n)
    torch.manual_seed(1)
    _, m, _ = layer_norm_fn(x, w, None, dropout_p=p, return_dropout_mask=True)
    keep = m.double()
    count = rows * n
    sigma = math.sqrt(p * (1 - p) / count)
    assert abs(keep.mean().item() - (1 - p)) < 5 * sigma
    # rows and columns are independent: per-row and per-column keep rates spread as binomials do
    for rates, size in ((keep.mean(1), n), (keep.mean(0), rows)):
        spread = rates.std().item() / math.sqrt(p * (1 - p) / size)
        assert 0.8 < spread < 1.2, spread
    # neighbours are uncorrelated, along rows and along columns
    for a, b in ((keep[:, 1:], keep[:, :-1]), (keep[1:], keep[:-1])):
        corr = torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].item()
        assert abs(corr) < 5 / math.sqrt(a.numel()), corr
    torch.manual_seed(1)
    _, again, _ = layer_norm_fn(x, w, None, dropout_p=p, return_dropout_mask=True)
    assert torch.equal(m, again)
    _, other, _ = layer_norm_fn(x, w, None, dropout_p=p, return_dropout_mask=True)
    assert not torch.equal(m, other)
    # the kept values are scaled by 1 / (1 - p): the pre-norm sum shows it
    _, res, m2, _ = layer_norm_fn(x, w, None, dropout_p=p, prenorm=True, return_dropout_mask=True)
    torch.testing.assert_close(res, torch.where(m2, x / (1 - p), torch.zeros_like(x)))


def test_dropout_p1_drops_everything():
    t = make(torch.float32, residual=True)
    y, res, m, _ = layer_norm_fn(**t, dropout_p=1.0, prenorm=True, return_dropout_mask=True)
    assert not m.any()
    torch.testing.assert_close(res, t["residual"])
    assert torch.isfinite(y).all()


def test_rmsnorm_module_drops_only_in_training():
    norm = RMSNorm(N, dropout_p=0.5)
    x = torch.randn(64, N)
    norm.eval()
    torch.testing.assert_close(norm(x), rms_norm_fn(x, norm.weight, None, eps=1e-5))
    norm.train()
    assert not torch.allclose(norm(x), rms_norm_fn(x, norm.weight, None, eps=1e-5))


# --- gradients ----------------------------------------------------------------------------------

GRAD_CASES = [
    dict(rms=False),
    dict(rms=True),
    dict(rms=True, prenorm=True),  # residual_out is x itself
    dict(rms=False, residual=True, prenorm=True),
    dict(rms=True, residual=True, prenorm=True, fp32=True),
    dict(rms=False, x1=True, w1=True, prenorm=True),
    dict(rms=True, rowscale=True, residual=True),
    dict(rms=False, dropout=0.25, residual=True, prenorm=True),
    dict(rms=True, dropout=0.25, x1=True, w1=True),
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: ",".join(k for k in c if c[k]))
def test_gradcheck_float64(case):
    shape = (3, 5)
    t = make(torch.float64, residual=case.get("residual", False), x1=case.get("x1", False),
             w1=case.get("w1", False), rowscale=case.get("rowscale", False), shape=shape)
    t["weight"], t["bias"] = t["weight"].double(), t["bias"].double()
    for k in ("weight1", "bias1", "rowscale"):
        if t[k] is not None:
            t[k] = t[k].double()
    names = [k for k, v in t.items() if v is not None and k != "rowscale"]
    p = case.get("dropout", 0.0)

    def f(*args):
        torch.manual_seed(7)  # the same dropout masks at every evaluation
        kw = dict(t, **dict(zip(names, args)))
        return layer_norm_fn(**kw, dropout_p=p, prenorm=case.get("prenorm", False),
                             residual_in_fp32=case.get("fp32", False), is_rms_norm=case["rms"])

    inputs = [t[k].clone().requires_grad_(True) for k in names]
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rms", [False, True])
def test_gradients_in_low_precision_against_float64(dtype, rms):
    t = make(dtype, residual=True, x1=True, w1=True, residual_dtype=torch.float32)
    leaves = {k: v.clone().requires_grad_(True) for k, v in t.items() if v is not None}
    y, y1, res = layer_norm_fn(**leaves, prenorm=True, is_rms_norm=rms)
    assert res.dtype == torch.float32
    r = {k: d(v).requires_grad_(True) for k, v in leaves.items()}
    want = ref64(r["x"], r["weight"], r["bias"], r["residual"], r["x1"], r["weight1"], r["bias1"], rms=rms)
    gs = [torch.randn(SHAPE, dtype=torch.float64).to(v.dtype) for v in (y, y1, res)]
    torch.autograd.backward([y, y1, res], gs)
    torch.autograd.backward(list(want), [g.double() for g in gs])
    for k in leaves:
        assert leaves[k].grad.dtype == leaves[k].dtype, k
        close(leaves[k].grad, r[k].grad, leaves[k].dtype)


# --- the internal functions mamba_ssm's callers unpack ---------------------------------------


def test_layer_norm_fwd_tuple_as_mamba_ssm_unpacks_it():
    x = torch.randn(6, N)
    w = torch.randn(N)
    # selective_scan_interface.rms_norm_forward: _layer_norm_fwd(x, w, b, eps, None, residual_dtype=None,
    # is_rms_norm=...)[0]
    out = _layer_norm_fwd(x, w, None, 1e-6, None, residual_dtype=None, is_rms_norm=True)
    assert isinstance(out, tuple) and len(out) == 8
    y, y1, mean, rstd, residual_out, seeds, mask, mask1 = out
    close(y, ref64(d(x), d(w), None, rms=True)[0], torch.float32)
    assert y1 is None and mean is None and seeds is None and mask is None and mask1 is None
    assert rstd.shape == (6,) and rstd.dtype == torch.float32
    assert residual_out is x
    # LayerNormLinearFn: y, _, mean, rstd, residual_out, *rest = _layer_norm_fwd(...)
    y, _, mean, rstd, residual_out, *rest = _layer_norm_fwd(x, w, torch.randn(N), 1e-6, torch.randn(6, N),
                                                            out_dtype=torch.bfloat16, residual_dtype=None)
    assert y.dtype == torch.bfloat16 and mean.shape == (6,) and residual_out.dtype == torch.float32
    assert len(rest) == 3
    # dropout with x1: 2M seeds, masks split in two
    out = _layer_norm_fwd(x, w, None, 1e-6, x1=torch.randn(6, N), weight1=w, dropout_p=0.5,
                          return_dropout_mask=True)
    assert out[1].shape == (6, N) and out[5].shape == (12,) and out[5].dtype == torch.int64
    assert out[6].shape == out[7].shape == (6, N)


@pytest.mark.parametrize("case", ["plain", "residual", "x1", "dropout_x1", "rowscale", "recompute"])
def test_layer_norm_bwd_matches_autograd(case):
    m = 5
    x = torch.randn(m, N, dtype=torch.float64)
    w, b = torch.randn(N, dtype=torch.float64), torch.randn(N, dtype=torch.float64)
    kw = {}
    if case == "residual":
        kw = dict(residual=torch.randn(m, N, dtype=torch.float64))
    if case in ("x1", "dropout_x1"):
        kw = dict(x1=torch.randn(m, N, dtype=torch.float64), weight1=torch.randn(N, dtype=torch.float64))
    if case == "dropout_x1":
        kw.update(dropout_p=0.3, return_dropout_mask=True)
    if case == "rowscale":
        kw = dict(rowscale=torch.rand(m, dtype=torch.float64) + 0.5)
    y, y1, mean, rstd, res, seeds, mask, mask1 = _layer_norm_fwd(x, w, b, 1e-6, **kw)
    dy = torch.randn_like(y)
    dy1 = None if y1 is None else torch.randn_like(y1)
    dres = torch.randn_like(res)
    got = _layer_norm_bwd(dy, res, w, b, 1e-6, mean, rstd, dresidual=dres, dy1=dy1,
                          weight1=kw.get("weight1"), seeds=seeds, dropout_p=kw.get("dropout_p", 0.0),
                          rowscale=kw.get("rowscale"), has_residual="residual" in kw, has_x1="x1" in kw,
                          recompute_output=case == "recompute")
    assert len(got) == (8 if case == "recompute" else 7)
    dx, dw, db, dres_in, dx1, dw1, db1 = got[:7]
    leaves = dict(x=x, w=w, b=b, **{k: v for k, v in kw.items() if isinstance(v, torch.Tensor)})
    leaves = {k: v.clone().requires_grad_(True) for k, v in leaves.items()}
    ry, ry1, rh = ref64(leaves["x"], leaves["w"], leaves["b"], leaves.get("residual"), leaves.get("x1"),
                        leaves.get("weight1"), None, p=kw.get("dropout_p", 0.0), keep=mask, keep1=mask1,
                        rowscale=leaves.get("rowscale"))
    outs, gs = [ry, rh], [dy, dres]
    if ry1 is not None:
        outs.append(ry1)
        gs.append(dy1)
    torch.autograd.backward(outs, gs)
    close(dx, leaves["x"].grad, torch.float64)
    close(dw, leaves["w"].grad, torch.float64)
    close(db, leaves["b"].grad, torch.float64)
    assert (dres_in is None) == ("residual" not in kw)
    if dres_in is not None:
        close(dres_in, leaves["residual"].grad, torch.float64)
        assert dres_in is dx  # one tensor, as the original, when the two are equal
    assert (dx1 is None) == ("x1" not in kw)
    if dx1 is not None:
        close(dx1, leaves["x1"].grad, torch.float64)
        assert (dx1 is dx) == (case == "x1")  # one tensor without dropout, as the original
        close(dw1, leaves["weight1"].grad, torch.float64)
    else:
        assert dw1 is None and db1 is None
    if case == "recompute":
        close(got[7], ry, torch.float64)


def test_mamba_inner_norms_agree_with_the_mirror():
    """selective_scan_interface.rms_norm_forward is _layer_norm_fwd(...)[0], as in mamba_ssm."""
    x = torch.randn(6, N, dtype=torch.bfloat16)
    w, b = torch.randn(N), torch.randn(N)
    for rms in (True, False):
        want = _layer_norm_fwd(x, w, b, 1e-5, None, residual_dtype=None, is_rms_norm=rms)[0]
        assert torch.equal(rms_norm_forward(x, w, b, 1e-5, is_rms_norm=rms), want)


def test_layer_norm_bwd_without_dy1_gives_zero_second_branch_gradients():
    x, w = torch.randn(4, N, dtype=torch.float64), torch.randn(N, dtype=torch.float64)
    y, y1, mean, rstd, *_ = _layer_norm_fwd(x, w, w, 1e-6, weight1=w, bias1=w)
    dy = torch.randn_like(y)
    full = _layer_norm_bwd(dy, x, w, w, 1e-6, mean, rstd, dy1=torch.zeros_like(y1), weight1=w, bias1=w)
    none = _layer_norm_bwd(dy, x, w, w, 1e-6, mean, rstd, weight1=w, bias1=w)
    for a, b in zip(full, none):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b)
    assert torch.equal(none[5], torch.zeros(N, dtype=torch.float64))


# --- layer_norm_linear_fn -------------------------------------------------------------------


@pytest.mark.parametrize("prenorm", [False, True])
@pytest.mark.parametrize("rms", [False, True])
def test_layer_norm_linear_fn(prenorm, rms):
    t = make(torch.float64, residual=True)
    lw, lb = torch.randn(4, N, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    args = [t["x"], t["weight"].double(), t["bias"].double(), lw, lb, t["residual"]]
    args = [a.clone().requires_grad_(True) for a in args]
    out = layer_norm_linear_fn(*args, eps=1e-6, prenorm=prenorm, is_rms_norm=rms)
    outs = list(out) if prenorm else [out]
    r = [a.detach().clone().requires_grad_(True) for a in args]
    y, _, h = ref64(r[0], r[1], r[2], r[5], rms=rms)
    want = [torch.nn.functional.linear(y, r[3], r[4])] + ([h] if prenorm else [])
    for g, w in zip(outs, want):
        close(g, w, torch.float64)
    gs = [torch.randn_like(w) for w in want]
    torch.autograd.backward(outs, gs)
    torch.autograd.backward(want, gs)
    for a, b in zip(args, r):
        close(a.grad, b.grad, torch.float64)
    assert torch.autograd.gradcheck(
        lambda *a: layer_norm_linear_fn(*a, prenorm=prenorm, is_rms_norm=rms),
        [a.detach()[..., :2, :].clone().requires_grad_(True) if a.dim() == 3 else a.detach().clone()
         .requires_grad_(True) for a in args], atol=1e-6)


# --- the references -----------------------------------------------------------------------------


@pytest.mark.parametrize("ref,rms", [(layer_norm_ref, False), (rms_norm_ref, True)])
def test_refs(ref, rms):
    t = make(torch.float64, residual=True, x1=True, w1=True)
    t = {k: (v.double() if v is not None else None) for k, v in t.items()}
    t.pop("rowscale")
    keep, keep1 = torch.rand(SHAPE) > 0.3, torch.rand(SHAPE) > 0.3
    y, y1, h = ref(**t, dropout_p=0.3, prenorm=True, dropout_mask=keep, dropout_mask1=keep1)
    want = ref64(**as_ref(dict(t, rowscale=None)), p=0.3, keep=keep, keep1=keep1, rms=rms)
    for g, w in zip((y, y1, h), want):
        close(g, w, torch.float64)
    t16 = make(torch.bfloat16)
    out = ref(**t16, upcast=True)
    assert out.dtype == torch.bfloat16
    close(out, ref64(**as_ref(t16), rms=rms)[0], torch.bfloat16)
    # the fused function agrees with the reference in float32
    t32 = make(torch.float32, residual=True)
    fused = (rms_norm_fn if rms else layer_norm_fn)(**t32, prenorm=True)
    for g, w in zip(fused, ref(**t32, prenorm=True)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


# --- RMSNorm and the surface --------------------------------------------------------------------


def test_rmsnorm_module_state_dict_and_init():
    norm = RMSNorm(N)
    assert list(norm.state_dict()) == ["weight"]
    assert [n for n, _ in norm.named_parameters()] == ["weight"]
    assert norm.bias is None and norm.drop is None and norm.eps == 1e-5
    assert torch.equal(norm.weight, torch.ones(N))
    other = RMSNorm(N, eps=1e-6, dropout_p=0.1, dtype=torch.float64)
    assert isinstance(other.drop, torch.nn.Dropout) and other.drop.p == 0.1
    assert other.weight.dtype == torch.float64
    sd = {"weight": torch.randn(N)}
    norm.load_state_dict(sd)
    x, res = torch.randn(SHAPE), torch.randn(SHAPE)
    y, r = norm(x, residual=res, prenorm=True, residual_in_fp32=True)
    close(y, ref64(d(x), d(sd["weight"]), None, residual=d(res), eps=1e-5, rms=True)[0], torch.float32)
    close(r, d(x) + d(res), torch.float32)


def params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


E = inspect.Parameter.empty
FN = [("x", E), ("weight", E), ("bias", E), ("residual", None), ("x1", None), ("weight1", None),
      ("bias1", None), ("eps", 1e-6), ("dropout_p", 0.0), ("rowscale", None), ("prenorm", False)]
REF = FN + [("dropout_mask", None), ("dropout_mask1", None), ("upcast", False)]


def test_signatures_follow_mamba_ssm():
    assert params(layer_norm_fn) == FN + [("residual_in_fp32", False), ("is_rms_norm", False),
                                          ("return_dropout_mask", False)]
    assert params(rms_norm_fn) == FN + [("residual_in_fp32", False), ("return_dropout_mask", False)]
    assert params(layer_norm_ref) == REF and params(rms_norm_ref) == REF
    assert params(LayerNormFn.forward)[1:] == params(layer_norm_fn)
    assert params(_layer_norm_fwd) == [
        ("x", E), ("weight", E), ("bias", E), ("eps", E), ("residual", None), ("x1", None),
        ("weight1", None), ("bias1", None), ("dropout_p", 0.0), ("rowscale", None), ("out_dtype", None),
        ("residual_dtype", None), ("is_rms_norm", False), ("return_dropout_mask", False)]
    assert params(_layer_norm_bwd) == [
        ("dy", E), ("x", E), ("weight", E), ("bias", E), ("eps", E), ("mean", E), ("rstd", E),
        ("dresidual", None), ("dy1", None), ("weight1", None), ("bias1", None), ("seeds", None),
        ("dropout_p", 0.0), ("rowscale", None), ("has_residual", False), ("has_x1", False),
        ("is_rms_norm", False), ("x_dtype", None), ("recompute_output", False)]
    linear = [("x", E), ("norm_weight", E), ("norm_bias", E), ("linear_weight", E), ("linear_bias", E),
              ("residual", None), ("eps", 1e-6), ("prenorm", False), ("residual_in_fp32", False),
              ("is_rms_norm", False)]
    assert params(layer_norm_linear_fn) == linear
    assert params(LayerNormLinearFn.forward)[1:] == linear
    assert params(RMSNorm.__init__)[1:] == [("hidden_size", E), ("eps", 1e-5), ("dropout_p", 0.0),
                                            ("device", None), ("dtype", None)]
    assert params(RMSNorm.forward)[1:] == [("x", E), ("residual", None), ("prenorm", False),
                                           ("residual_in_fp32", False)]
    assert issubclass(LayerNormFn, torch.autograd.Function) and issubclass(LayerNormLinearFn,
                                                                            torch.autograd.Function)


def test_imports_no_triton():
    code = (
        "import sys\n"
        "sys.modules['triton'] = None\n"  # any import of triton now raises ImportError
        "import torch\n"
        "import selective_scan.layer_norm as m\n"
        "x = torch.randn(4, 8, requires_grad=True)\n"
        "y, r = m.layer_norm_fn(x, torch.ones(8), None, residual=torch.randn(4, 8), prenorm=True,\n"
        "                       dropout_p=0.1)\n"
        "(y.sum() + r.sum()).backward()\n"
        "m.RMSNorm(8)(x)\n"
        "loaded = sorted(k for k, v in sys.modules.items()\n"
        "                if k.split('.')[0] == 'triton' and v is not None)\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    src = (ROOT / "selective_scan" / "layer_norm.py").read_text(encoding="utf-8")
    assert "import triton" not in src and "from triton" not in src


# --- bad arguments ------------------------------------------------------------------------------

X, W = torch.randn(SHAPE), torch.randn(N)
X2 = X.reshape(-1, N)
M = X2.shape[0]
FWD = _layer_norm_fwd(X2, W, None, 1e-6, x1=torch.randn(M, N), weight1=W, dropout_p=0.5)

BAD = [
    # (id, call, exception, message start)
    ("x-list", lambda: layer_norm_fn([1.0], W, None), TypeError, "x must be a torch.Tensor"),
    ("x-int", lambda: layer_norm_fn(X.long(), W, None), TypeError, "x must be a floating tensor"),
    ("x-0d", lambda: layer_norm_fn(torch.tensor(1.0), W[:1], None), ValueError,
     "x must have at least one dim"),
    ("weight-none", lambda: layer_norm_fn(X, None, None), TypeError, "weight must be a torch.Tensor"),
    ("weight-shape", lambda: layer_norm_fn(X, W[:4], None), ValueError, "weight must have shape (8,)"),
    ("bias-shape", lambda: layer_norm_fn(X, W, W[:3]), ValueError, "bias must have shape (8,)"),
    ("residual-shape", lambda: layer_norm_fn(X, W, None, residual=X[0]), ValueError,
     "residual must have shape (2, 3, 8) (x's shape)"),
    ("x1-shape", lambda: layer_norm_fn(X, W, None, x1=X[:1]), ValueError, "x1 must have shape (2, 3, 8)"),
    ("weight1-shape", lambda: layer_norm_fn(X, W, None, weight1=W[:2]), ValueError,
     "weight1 must have shape"),
    ("bias1-alone", lambda: layer_norm_fn(X, W, None, bias1=W), ValueError,
     "bias1 must be None when weight1 is None"),
    ("rowscale-shape", lambda: layer_norm_fn(X, W, None, rowscale=torch.ones(6)), ValueError,
     "rowscale must have shape (2, 3)"),
    ("rowscale-x1", lambda: layer_norm_fn(X, W, None, x1=X, rowscale=torch.ones(2, 3)), ValueError,
     "rowscale must be None when x1 is given"),
    ("p-high", lambda: layer_norm_fn(X, W, None, dropout_p=1.5), ValueError, "dropout_p must be between 0"),
    ("p-neg", lambda: layer_norm_fn(X, W, None, dropout_p=-0.1), ValueError, "dropout_p must be between 0"),
    ("p-str", lambda: layer_norm_fn(X, W, None, dropout_p="0.1"), TypeError, "dropout_p must be a real"),
    ("eps-neg", lambda: rms_norm_fn(X, W, None, eps=-1e-5), ValueError, "eps must be finite and >= 0"),
    ("eps-nan", lambda: rms_norm_fn(X, W, None, eps=float("nan")), ValueError, "eps must be finite"),
    ("eps-none", lambda: rms_norm_fn(X, W, None, eps=None), TypeError, "eps must be a real number"),
    ("prenorm-str", lambda: layer_norm_fn(X, W, None, prenorm="no"), TypeError, "prenorm must be a bool"),
    ("fp32-int", lambda: layer_norm_fn(X, W, None, residual_in_fp32=1), TypeError,
     "residual_in_fp32 must be a bool"),
    ("rms-str", lambda: layer_norm_fn(X, W, None, is_rms_norm="yes"), TypeError,
     "is_rms_norm must be a bool"),
    ("device", lambda: layer_norm_fn(X, W.to("meta"), None), ValueError, "all tensors must be on one device"),
    ("module-dim", lambda: RMSNorm(16)(X), ValueError, "weight must have shape (8,)"),
    ("fwd-3d", lambda: _layer_norm_fwd(X, W, None, 1e-6), ValueError, "x must be 2-D (M, N)"),
    ("fwd-out-dtype", lambda: _layer_norm_fwd(X2, W, None, 1e-6, out_dtype=torch.int32), TypeError,
     "out_dtype must be None or a floating torch.dtype"),
    ("fwd-residual-dtype", lambda: _layer_norm_fwd(X2, W, None, 1e-6, residual_dtype="float32"), TypeError,
     "residual_dtype must be None"),
    ("bwd-dy-shape", lambda: _layer_norm_bwd(X2[:2], X2, W, None, 1e-6, None, FWD[3], is_rms_norm=True),
     ValueError, "dy must have shape (6, 8)"),
    ("bwd-mean-missing", lambda: _layer_norm_bwd(X2, X2, W, None, 1e-6, None, FWD[3]), TypeError,
     "mean must be a torch.Tensor"),
    ("bwd-rstd-shape", lambda: _layer_norm_bwd(X2, X2, W, None, 1e-6, None, FWD[3][:2], is_rms_norm=True),
     ValueError, "rstd must have shape (6,)"),
    ("bwd-seeds-missing", lambda: _layer_norm_bwd(X2, X2, W, None, 1e-6, FWD[2], FWD[3], dropout_p=0.5),
     ValueError, "seeds must be given when dropout_p > 0"),
    ("bwd-seeds-shape", lambda: _layer_norm_bwd(X2, X2, W, None, 1e-6, FWD[2], FWD[3], seeds=FWD[5],
                                                dropout_p=0.5), ValueError, "seeds must have shape (6,)"),
    ("bwd-seeds-dtype", lambda: _layer_norm_bwd(X2, X2, W, None, 1e-6, FWD[2], FWD[3], seeds=FWD[3],
                                                dropout_p=0.5), TypeError, "seeds must have the forward's"),
    ("bwd-dy1-alone", lambda: _layer_norm_bwd(X2, X2, W, None, 1e-6, FWD[2], FWD[3], dy1=X2), ValueError,
     "dy1 must be None when weight1 is None"),
    ("bwd-recompute-w1", lambda: _layer_norm_bwd(X2, X2, W, None, 1e-6, FWD[2], FWD[3], dy1=X2, weight1=W,
                                                 recompute_output=True), ValueError,
     "recompute_output must be False when weight1 is given"),
    ("bwd-flag", lambda: _layer_norm_bwd(X2, X2, W, None, 1e-6, FWD[2], FWD[3], has_residual="no"), TypeError,
     "has_residual must be a bool"),
    ("ref-mask-dtype", lambda: layer_norm_ref(X, W, None, dropout_p=0.5, dropout_mask=X), TypeError,
     "dropout_mask must have the bool dtype"),
    ("ref-mask-shape", lambda: rms_norm_ref(X, W, None, dropout_p=0.5,
                                            dropout_mask=torch.ones(3, dtype=torch.bool)), ValueError,
     "dropout_mask must have shape (2, 3, 8)"),
    ("ref-upcast", lambda: rms_norm_ref(X, W, None, upcast="yes"), TypeError, "upcast must be a bool"),
    ("linear-weight", lambda: layer_norm_linear_fn(X, W, None, torch.randn(4, 5), None), ValueError,
     "linear_weight must be 2-D (out_features, N) with N = 8"),
    ("linear-bias", lambda: layer_norm_linear_fn(X, W, None, torch.randn(4, N), torch.randn(3)), ValueError,
     "linear_bias must have shape (4,)"),
]


@pytest.mark.parametrize("call,exc,start", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_arguments_are_named(call, exc, start):
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert msg.startswith(start), msg
    assert ", got " in msg or msg.startswith("all tensors"), msg


def test_module_surface():
    for name in LN.__all__:
        assert hasattr(LN, name)
    for name in ("_layer_norm_fwd", "_layer_norm_bwd"):
        assert callable(getattr(LN, name))
