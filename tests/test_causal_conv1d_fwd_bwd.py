"""causal_conv1d_fn / CausalConv1dFn / cpp_functions fwd+bwd / causal_conv1d_ref on CPU,
against a float64 per-step loop written here from the definition."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

from causal_conv1d import causal_conv1d_fn
from causal_conv1d.causal_conv1d_interface import CausalConv1dFn, causal_conv1d_ref
from causal_conv1d.cpp_functions import causal_conv1d_bwd_function, causal_conv1d_fwd_function

F64 = torch.float64
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, F64: 1e-12}


# --- independent reference --------------------------------------------------------------------


def loop_conv(x, w, b=None, seq_idx=None, init=None, silu=False):
    """Per time step: out[:, :, t] = act(b + sum_k w[:, k] * src(t - (W-1) + k)).

    src(j) is x[:, :, j] for j >= 0, else init[:, :, W - 1 + j] (or 0), tagged seq_idx[:, 0].
    With seq_idx a source counts only when its tag equals token t's; tokens with
    seq_idx < 0 output 0. Final states: the last W - 1 sources, kept when their tag is the
    last token's and not padding. Returns (out, final_states), float64, differentiable.
    """
    bsz, dim, length = x.shape
    width = w.shape[1]

    def src(j):
        if j >= 0:
            val = x[:, :, j]
        elif init is not None:
            val = init[:, :, width - 1 + j]
        else:
            val = torch.zeros(bsz, dim, dtype=x.dtype)
        tag = None if seq_idx is None else seq_idx[:, max(j, 0)]
        return val, tag

    outs = []
    for t in range(length):
        acc = torch.zeros(bsz, dim, dtype=x.dtype) if b is None else b.expand(bsz, dim)
        for k in range(width):
            val, tag = src(t - (width - 1) + k)
            if seq_idx is not None:
                val = val * (tag == seq_idx[:, t]).to(x.dtype)[:, None]
            acc = acc + w[:, k] * val
        if silu:
            acc = acc * torch.sigmoid(acc)
        if seq_idx is not None:
            acc = acc * (seq_idx[:, t] >= 0).to(x.dtype)[:, None]
        outs.append(acc)
    finals = []
    for j in range(length - (width - 1), length):
        val, tag = src(j)
        if seq_idx is not None:
            val = val * ((tag == seq_idx[:, -1]) & (tag >= 0)).to(x.dtype)[:, None]
        finals.append(val)
    return torch.stack(outs, -1), torch.stack(finals, -1)


def loop_grads(x, w, b, seq_idx, init, silu, dout, dfinal=None):
    """Gradients of sum(out * dout) + sum(final * dfinal) through loop_conv, in float64."""
    leaves = [t.detach().to(F64).requires_grad_() for t in (x, w)]
    if b is not None:
        leaves.append(b.detach().to(F64).requires_grad_())
    if init is not None:
        leaves.append(init.detach().to(F64).requires_grad_())
    xx, ww = leaves[0], leaves[1]
    bb = leaves[2] if b is not None else None
    ii = leaves[-1] if init is not None else None
    out, final = loop_conv(xx, ww, bb, seq_idx, ii, silu)
    loss = (out * dout.to(F64)).sum()
    if dfinal is not None:
        loss = loss + (final * dfinal.to(F64)).sum()
    grads = torch.autograd.grad(loss, leaves)
    named = {"x": grads[0], "weight": grads[1]}
    if b is not None:
        named["bias"] = grads[2]
    if init is not None:
        named["init"] = grads[-1]
    return named


def assert_close(got, ref, dtype, what):
    tol = TOL[dtype]
    got = got.detach().to(F64)
    ref = ref.detach().to(F64)
    scale = max(1.0, ref.abs().max().item()) if ref.numel() else 1.0
    err = (got - ref).abs()
    bound = tol * scale + tol * ref.abs()
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    assert (err <= bound).all(), f"{what}: max err {err.max().item():.3g} (tol {tol}, scale {scale:.3g})"


# --- inputs ------------------------------------------------------------------------------------


def make_x(bsz, dim, length, dtype=torch.float32, layout="cf"):
    """x in a given layout: cf / cl dense, cf_slice / cl_slice channel slices of a wider
    tensor, strided (no unit stride anywhere)."""
    if layout == "cf":
        x = torch.randn(bsz, dim, length)
    elif layout == "cl":
        x = torch.randn(bsz, length, dim).transpose(1, 2)
    elif layout == "cf_slice":
        x = torch.randn(bsz, dim + 7, length)[:, 3:3 + dim]
    elif layout == "cl_slice":
        x = torch.randn(bsz, length, dim + 7)[:, :, 3:3 + dim].transpose(1, 2)
    elif layout == "strided":
        x = torch.randn(bsz, dim, 2 * length)[:, :, ::2]
    else:
        raise AssertionError(layout)
    return x.to(dtype)


def family(t):
    if t.stride(1) == 1 and t.stride(2) > 1:
        return "cl"
    assert t.stride(2) == 1, t.stride()
    return "cf"


def expected_family(layout):
    return "cl" if layout.startswith("cl") else "cf"


def random_seq_idx(bsz, length, pad=True, gen_max_segments=4):
    """Sorted random segment ids per row; row 0 gets a padded tail and row 1 (if any) a
    padded stretch in the middle when ``pad``."""
    rows = []
    for _ in range(bsz):
        n_breaks = int(torch.randint(0, gen_max_segments, ()).item())
        breaks = torch.zeros(length, dtype=torch.int32)
        if n_breaks and length > 1:
            breaks[torch.randint(1, length, (n_breaks,))] = 1
        rows.append(breaks.cumsum(0).to(torch.int32))
    seq = torch.stack(rows)
    if pad and length >= 4:
        seq[0, -(length // 3 + 1):] = -1
        if bsz > 1:
            seq[1, length // 3: length // 3 + 2] = -1
    return seq


# --- forward and backward against the loop -----------------------------------------------------


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("wtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("itype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", [2, 3, 4])
def test_matrix_against_loop(width, itype, wtype, has_bias, silu, layout):
    bsz, dim, length = 2, 16, 37
    x = make_x(bsz, dim, length, itype, layout).requires_grad_()
    w = torch.randn(dim, width).to(wtype).requires_grad_()
    b = torch.randn(dim).to(wtype).requires_grad_() if has_bias else None
    out = causal_conv1d_fn(x, w, b, activation="silu" if silu else None)
    assert out.dtype == itype and out.shape == x.shape and family(out) == layout
    ref, _ = loop_conv(x.detach().to(F64), w.detach().to(F64), None if b is None else b.detach().to(F64),
                       silu=silu)
    assert_close(out, ref, itype, "out")

    dout = make_x(bsz, dim, length, itype, layout)
    out.backward(dout)
    grads = loop_grads(x, w, b, None, None, silu, dout)
    assert x.grad.dtype == itype and w.grad.dtype == wtype
    assert family(x.grad) == layout
    assert_close(x.grad, grads["x"], itype, "dx")
    assert_close(w.grad, grads["weight"], wtype, "dweight")
    if b is not None:
        assert b.grad.dtype == wtype
        assert_close(b.grad, grads["bias"], wtype, "dbias")


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("length", [1, 2, 3, 2047, 2049, 4097])
def test_lengths_with_states(length, layout):
    """Odd lengths and lengths around multiples of 2048, with initial and final states."""
    bsz, dim, width = 2, 3, 4
    x = make_x(bsz, dim, length, layout=layout).requires_grad_()
    w = torch.randn(dim, width, requires_grad=True)
    b = torch.randn(dim, requires_grad=True)
    init = make_x(bsz, dim, width - 1, layout=layout).requires_grad_()
    out, final = causal_conv1d_fn(x, w, b, initial_states=init, return_final_states=True, activation="swish")
    ref, ref_final = loop_conv(x.detach().double(), w.detach().double(), b.detach().double(),
                               init=init.detach().double(), silu=True)
    assert_close(out, ref, torch.float32, "out")
    assert torch.equal(final.double(), ref_final)  # copies, so exact
    dout = torch.randn_like(out)
    dfinal = torch.randn_like(final)
    torch.autograd.backward([out, final], [dout, dfinal])
    grads = loop_grads(x, w, b, None, init, True, dout, dfinal)
    assert_close(x.grad, grads["x"], torch.float32, "dx")
    assert_close(w.grad, grads["weight"], torch.float32, "dweight")
    assert_close(b.grad, grads["bias"], torch.float32, "dbias")
    assert_close(init.grad, grads["init"], torch.float32, "dinitial_states")


@pytest.mark.parametrize("layout", ["cf_slice", "cl_slice", "strided"])
@pytest.mark.parametrize("itype", [torch.float32, torch.bfloat16])
def test_strided_views(layout, itype):
    """Channel slices of wider tensors and tensors with no unit stride; out keeps x's family."""
    bsz, dim, length, width = 2, 8, 29, 4
    base = make_x(bsz, dim, length, itype, layout)
    x = base.requires_grad_()
    w = torch.randn(dim, width, requires_grad=True)
    b = torch.randn(dim, requires_grad=True)
    seq = random_seq_idx(bsz, length)
    init = torch.randn(bsz, dim, width - 1).to(itype).requires_grad_()
    out = causal_conv1d_fn(x, w, b, seq_idx=seq, initial_states=init, activation="silu")
    assert family(out) == expected_family(layout)
    ref, _ = loop_conv(x.detach().double(), w.detach().double(), b.detach().double(), seq,
                       init.detach().double(), True)
    assert_close(out, ref, itype, "out")
    dout = torch.randn(bsz, dim, length).to(itype)
    out.backward(dout)
    grads = loop_grads(x, w, b, seq, init, True, dout)
    assert_close(x.grad, grads["x"], itype, "dx")
    assert_close(w.grad, grads["weight"], torch.float32, "dweight")
    assert_close(init.grad, grads["init"], itype, "dinitial_states")


# --- seq_idx, padding, states ---------------------------------------------------------------------


@pytest.mark.parametrize("with_init", [False, True])
@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("width", [2, 3, 4])
def test_seq_idx_against_loop(width, layout, with_init):
    """Tokens see only earlier tokens of their segment; initial states belong to the first
    segment (causal-conv1d 1.7.0); channel-first is our superset."""
    bsz, dim, length = 3, 8, 41
    x = make_x(bsz, dim, length, layout=layout).requires_grad_()
    w = torch.randn(dim, width, requires_grad=True)
    b = torch.randn(dim, requires_grad=True)
    seq = random_seq_idx(bsz, length)
    init = torch.randn(bsz, dim, width - 1, requires_grad=True) if with_init else None
    out = causal_conv1d_fn(x, w, b, seq, init, activation="silu")
    ref, _ = loop_conv(x.detach().double(), w.detach().double(), b.detach().double(), seq,
                       None if init is None else init.detach().double(), True)
    assert_close(out, ref, torch.float32, "out")
    dout = torch.randn_like(out)
    out.backward(dout)
    grads = loop_grads(x, w, b, seq, init, True, dout)
    assert_close(x.grad, grads["x"], torch.float32, "dx")
    assert_close(w.grad, grads["weight"], torch.float32, "dweight")
    assert_close(b.grad, grads["bias"], torch.float32, "dbias")
    if with_init:
        assert_close(init.grad, grads["init"], torch.float32, "dinitial_states")


@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_padding_is_exact_zero_forward_and_backward(layout):
    bsz, dim, length, width = 2, 8, 30, 4
    x = make_x(bsz, dim, length, layout=layout)
    w = torch.randn(dim, width)
    b = torch.randn(dim)
    seq = random_seq_idx(bsz, length)
    pad = (seq < 0).unsqueeze(1).expand(bsz, dim, length)
    assert pad.any()
    out = causal_conv1d_fwd_function(x, w, b, seq, None, None, True)
    assert torch.equal(out[pad], torch.zeros_like(out[pad]))

    dout = torch.randn(bsz, dim, length)
    noisy = dout.clone()
    noisy[pad] = 1e4 * torch.randn(int(pad.sum()))
    clean = dout.masked_fill(pad, 0)
    res_noisy = causal_conv1d_bwd_function(x, w, b, noisy, seq, None, None, None, False, True)
    res_clean = causal_conv1d_bwd_function(x, w, b, clean, seq, None, None, None, False, True)
    for got, want in zip(res_noisy[:3], res_clean[:3]):
        assert torch.equal(got, want)  # padded positions contribute nothing to dx, dweight, dbias
    dx = res_noisy[0]
    assert torch.equal(dx[pad], torch.zeros_like(dx[pad]))


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("length", [1, 2, 9])
def test_final_states_out_in_place(length, width, layout):
    """final_states_out is written in place and returned as the same object; for short
    sequences it holds initial-state columns."""
    bsz, dim = 2, 8
    x = make_x(bsz, dim, length, layout=layout).requires_grad_()
    w = torch.randn(dim, width, requires_grad=True)
    init = torch.randn(bsz, width - 1, dim).transpose(1, 2).requires_grad_()
    fso = torch.full((bsz, width - 1, dim), float("nan")).transpose(1, 2)
    out, final = causal_conv1d_fn(x, w, None, None, init, True, fso)
    assert final is fso
    ref_out, ref_final = loop_conv(x.detach().double(), w.detach().double(), init=init.detach().double())
    assert torch.equal(fso.double(), ref_final)
    assert_close(out, ref_out, torch.float32, "out")
    dout, dfinal = torch.randn_like(out), torch.randn(bsz, dim, width - 1)
    torch.autograd.backward([out, final], [dout, dfinal])
    grads = loop_grads(x, w, None, None, init, False, dout, dfinal)
    assert_close(x.grad, grads["x"], torch.float32, "dx")
    assert_close(init.grad, grads["init"], torch.float32, "dinitial_states")
    assert_close(w.grad, grads["weight"], torch.float32, "dweight")


def test_final_states_allocated_and_ignored():
    x = make_x(2, 8, 10, layout="cl")
    w = torch.randn(8, 3)
    out, final = causal_conv1d_fn(x, w, return_final_states=True)
    assert final.shape == (2, 8, 2) and family(final) == "cl"
    assert torch.equal(final, x[:, :, -2:])
    untouched = torch.full((2, 8, 2), 7.0)
    out2 = causal_conv1d_fn(x, w, final_states_out=untouched)  # ignored without return_final_states
    assert isinstance(out2, torch.Tensor) and torch.equal(untouched, torch.full((2, 8, 2), 7.0))
    assert torch.equal(out, out2)


@pytest.mark.parametrize("width", [2, 3, 4])
def test_seq_idx_final_states_continue_the_last_segment(width):
    """Superset: with seq_idx the final states keep only the last token's segment, so a
    sequence split into two calls gives the same output as one call."""
    bsz, dim, length = 3, 6, 40
    x = torch.randn(bsz, dim, length)
    w, b = torch.randn(dim, width), torch.randn(dim)
    seq = random_seq_idx(bsz, length, pad=False)
    seq[2, :] = torch.arange(length) // 3  # short segments straddling the split
    full = causal_conv1d_fn(x, w, b, seq, activation="silu")
    cut = 19
    first, states = causal_conv1d_fn(x[..., :cut], w, b, seq[:, :cut].contiguous(), return_final_states=True,
                                     activation="silu")
    # the second chunk's initial states belong to its first segment: that is the split
    # segment only where it continues across the cut
    cont = seq[:, cut] == seq[:, cut - 1]
    init = states * cont[:, None, None]
    second = causal_conv1d_fn(x[..., cut:], w, b, seq[:, cut:].contiguous(), init, activation="silu")
    torch.testing.assert_close(torch.cat([first, second], -1), full, rtol=1e-6, atol=1e-6)
    ref_out, ref_final = loop_conv(x.double()[..., :cut], w.double(), b.double(), seq[:, :cut], silu=True)
    assert torch.equal(states.double(), ref_final)


def test_padding_tail_final_states_are_zero():
    x, w = torch.randn(1, 4, 12), torch.randn(4, 4)
    seq = torch.zeros(1, 12, dtype=torch.int32)
    seq[0, -2:] = -1
    _, final = causal_conv1d_fn(x, w, seq_idx=seq, return_final_states=True)
    assert torch.equal(final, torch.zeros(1, 4, 3))


# --- gradcheck ---------------------------------------------------------------------------------


def _dbl(*shape):
    return torch.randn(*shape, dtype=F64, requires_grad=True)


@pytest.mark.parametrize("width", [2, 4])
def test_gradcheck_plain(width):
    x = torch.randn(2, 7, 3, dtype=F64).transpose(1, 2).requires_grad_()
    w, b = _dbl(3, width), _dbl(3)
    assert gradcheck(lambda x, w, b: causal_conv1d_fn(x, w, b, activation="silu"), (x, w, b))


def test_gradcheck_states():
    x, w, b, init = _dbl(2, 3, 5), _dbl(3, 4), _dbl(3), _dbl(2, 3, 3)
    assert gradcheck(
        lambda x, w, b, i: causal_conv1d_fn(x, w, b, None, i, True, activation="silu"), (x, w, b, init)
    )
    short = _dbl(2, 3, 2)  # seqlen < width - 1: final states include initial-state columns
    assert gradcheck(lambda x, w, i: causal_conv1d_fn(x, w, None, None, i, True), (short, w, init))


def test_gradcheck_seq_idx():
    x, w, b, init = _dbl(2, 3, 9), _dbl(3, 3), _dbl(3), _dbl(2, 3, 2)
    seq = torch.tensor([[0, 0, 1, 1, 1, 2, 2, -1, -1], [3, 3, 3, -1, 3, 4, 4, 4, 4]], dtype=torch.int32)
    assert gradcheck(
        lambda x, w, b, i: causal_conv1d_fn(x, w, b, seq, i, True, activation="silu"), (x, w, b, init)
    )


# --- cpp_functions contracts --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_bwd_writes_dx_in_place_into_a_view(dtype):
    """mamba's split-conv path passes a channel-last dx that is a view into a bigger buffer."""
    bsz, dim, length, width = 2, 8, 21, 4
    x = make_x(bsz, dim, length, dtype, "cl")
    w, b = torch.randn(dim, width), torch.randn(dim)
    init = torch.randn(bsz, dim, width - 1).to(dtype)
    dout = torch.randn(bsz, length, dim).to(dtype).transpose(1, 2)
    dfinal = torch.randn(bsz, dim, width - 1).to(dtype)
    buf = torch.full((bsz, length, 3 * dim), float("nan"), dtype=dtype)
    dx = buf[:, :, dim:2 * dim].transpose(1, 2)
    got = causal_conv1d_bwd_function(x, w, b, dout, None, init, dfinal, dx, True, True)
    assert isinstance(got, tuple) and len(got) == 4
    gdx, gdw, gdb, gdi = got
    assert gdx is dx
    assert torch.isnan(buf[:, :, :dim]).all() and torch.isnan(buf[:, :, 2 * dim:]).all()
    grads = loop_grads(x, w, b, None, init, True, dout, dfinal)
    assert_close(dx, grads["x"], dtype, "dx")
    assert gdw.dtype == torch.float32 and gdb.dtype == torch.float32 and gdi.dtype == dtype
    assert_close(gdw, grads["weight"], torch.float32, "dweight")
    assert_close(gdb, grads["bias"], torch.float32, "dbias")
    assert_close(gdi, grads["init"], dtype, "dinitial_states")


@pytest.mark.parametrize("dout_kind", ["other_family", "slice", "expanded"])
@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_bwd_any_dout_strides(layout, dout_kind):
    bsz, dim, length, width = 2, 8, 17, 3
    x = make_x(bsz, dim, length, layout=layout)
    w = torch.randn(dim, width)
    if dout_kind == "other_family":
        dout = make_x(bsz, dim, length, layout="cl" if layout == "cf" else "cf")
    elif dout_kind == "slice":
        dout = make_x(bsz, dim, length, layout="cf_slice" if layout == "cf" else "cl_slice")
    else:
        dout = torch.ones(()).expand(bsz, dim, length)  # what .sum().backward() sends
    dx, dw, db, di = causal_conv1d_bwd_function(x, w, None, dout, None, None, None, None, False, False)
    assert db is None and di is None and family(dx) == layout
    grads = loop_grads(x, w, None, None, None, False, dout)
    assert_close(dx, grads["x"], torch.float32, "dx")
    assert_close(dw, grads["weight"], torch.float32, "dweight")


def test_sum_backward_through_fn():
    x = make_x(2, 4, 9, layout="cl").requires_grad_()
    w = torch.randn(4, 2, requires_grad=True)
    causal_conv1d_fn(x, w).sum().backward()
    grads = loop_grads(x, w, None, None, None, False, torch.ones(2, 4, 9))
    assert_close(x.grad, grads["x"], torch.float32, "dx")


def test_fwd_function_contract():
    bsz, dim, length, width = 2, 8, 6, 4
    x = make_x(bsz, dim, length, torch.bfloat16, "cl")
    w = torch.randn(dim, width, dtype=torch.bfloat16)
    init = torch.randn(bsz, dim, width - 1, dtype=torch.bfloat16)
    fso = torch.full((bsz, dim, width - 1), float("nan"), dtype=torch.bfloat16)
    out = causal_conv1d_fwd_function(x, w, None, None, init, fso, False)
    assert out.dtype == torch.bfloat16 and family(out) == "cl" and torch.isfinite(out.float()).all()
    assert torch.equal(fso, x[:, :, -3:])
    ref, _ = loop_conv(x.double(), w.double(), init=init.double())
    assert_close(out, ref, torch.bfloat16, "out")


def test_inputs_are_not_modified():
    bsz, dim, length, width = 2, 8, 13, 4
    x = make_x(bsz, dim, length, layout="cl").requires_grad_()
    w = torch.randn(dim, width, requires_grad=True)
    b = torch.randn(dim, requires_grad=True)
    seq = random_seq_idx(bsz, length)
    init = torch.randn(bsz, dim, width - 1, requires_grad=True)
    dout = torch.randn(bsz, dim, length)
    before = [t.detach().clone() for t in (x, w, b, seq, init, dout)]
    out, final = causal_conv1d_fn(x, w, b, seq, init, True, activation="silu")
    torch.autograd.backward([out, final], [dout, torch.randn_like(final)])
    for t, saved in zip((x, w, b, seq, init, dout), before):
        assert torch.equal(t.detach(), saved)


def test_autograd_function_apply_positional():
    x, w = make_x(1, 4, 5), torch.randn(4, 2)
    out = CausalConv1dFn.apply(x, w, None, None, None, False, None, "silu")
    ref, _ = loop_conv(x.double(), w.double(), silu=True)
    assert_close(out, ref, torch.float32, "out")


# --- the original's reference functions ---------------------------------------------------------


@pytest.mark.parametrize("case", ["plain", "states", "seq_idx", "seq_idx_states"])
def test_causal_conv1d_ref_against_loop(case):
    bsz, dim, length, width = 2, 8, 23, 4
    x = torch.randn(bsz, dim, length, requires_grad=True)
    w, b = torch.randn(dim, width, requires_grad=True), torch.randn(dim, requires_grad=True)
    init = torch.randn(bsz, dim, width - 1) if "states" in case else None
    seq = random_seq_idx(bsz, length) if "seq_idx" in case else None
    fso = torch.full((bsz, dim, width - 1), float("nan"))
    out, final = causal_conv1d_ref(x, w, b, init, True, fso, "silu", seq_idx=seq)
    assert final is fso
    ref, ref_final = loop_conv(x.detach().double(), w.detach().double(), b.detach().double(), seq,
                               None if init is None else init.double(), True)
    assert_close(out, ref, torch.float32, "out")
    assert torch.equal(final.double(), ref_final)
    dout = torch.randn_like(out)
    out.backward(dout)
    grads = loop_grads(x, w, b, seq, init, True, dout)
    assert_close(x.grad, grads["x"], torch.float32, "dx")
    assert_close(w.grad, grads["weight"], torch.float32, "dweight")
    single = causal_conv1d_ref(x, w, b, init, activation=None, seq_idx=seq)
    assert isinstance(single, torch.Tensor)


def test_channel_last_output_is_a_base_tensor_the_caller_may_modify_in_place():
    """The original's tests modify outputs in place; a view output of the autograd
    Function would refuse that."""
    wide = torch.randn(2, 16, 128).transpose(1, 2).requires_grad_()
    x = wide[:, 32:96]  # a channel-last channel slice: not dense, so not empty_like's case
    w = torch.randn(64, 4, requires_grad=True)
    out = causal_conv1d_fn(x, w, activation="silu")
    assert out.stride() == (16 * 64, 1, 64) and out._base is None
    out.mul_(2).sum().backward()
    assert torch.isfinite(wide.grad).all()
