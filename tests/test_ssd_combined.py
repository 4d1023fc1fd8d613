"""selective_scan.ssd_combined (Mamba-2's SSD scan) against a float64 per-step recurrence
written here: chunk boundaries, groups, D, z, dt processing, initial states, seq_idx, the
varlen states, dtypes, strides, gradients, NaN causality, empty sizes and bad arguments."""

from __future__ import annotations

import inspect
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from selective_scan import ssd_pytorch
from selective_scan.ssd_combined import (
    mamba_chunk_scan,
    mamba_chunk_scan_combined,
    ssd_chunk_scan_combined_ref,
    ssd_forward,
    ssd_selective_scan,
)

F64 = torch.float64


def process(dt, dt_bias=None, softplus=False, limit=(0.0, math.inf)):
    d = dt.to(F64)
    if dt_bias is not None:
        d = d + dt_bias.to(F64)
    if softplus:
        d = torch.where(d <= 20, torch.log1p(torch.exp(torch.clamp(d, max=20))), d)
    return d.clamp(min=limit[0], max=limit[1])


def recurrence(x, dt, A, B, C, D=None, z=None, init=None, seq_idx=None, d=None):
    """h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T per head (h restarts where seq_idx changes;
    the number before the first step is 0), y_t = h_t C_t + D x_t, out = y silu(z); float64.
    ``d`` is the processed dt (batch, seqlen, nheads). Returns (out, states after each step)."""
    x, A, B, C = (t.to(F64) for t in (x, A, B, C))
    batch, seqlen, nheads, headdim = x.shape
    rep = nheads // B.shape[2]
    Bh, Ch = B.repeat_interleave(rep, 2), C.repeat_interleave(rep, 2)
    h = init.to(F64).clone() if init is not None else x.new_zeros(batch, nheads, headdim, B.shape[3])
    prev = torch.zeros(batch, dtype=torch.int64)
    ys, hs = [], []
    for t in range(seqlen):
        kept = torch.exp(d[:, t] * A)[:, :, None, None] * h
        if seq_idx is not None:
            same = seq_idx[:, t].to(torch.int64) == prev
            kept = torch.where(same[:, None, None, None], kept, torch.zeros((), dtype=F64))
            prev = seq_idx[:, t].to(torch.int64)
        h = kept + (d[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        hs.append(h)
        y = (h * Ch[:, t, :, None, :]).sum(-1)
        if D is not None:
            Dd = D.to(F64)
            y = y + x[:, t] * (Dd[:, None] if Dd.dim() == 1 else Dd)
        ys.append(y)
    y = torch.stack(ys, 1) if ys else x.new_zeros(x.shape)
    if z is not None:
        y = y * F.silu(z.to(F64))
    return y, hs


def make(batch=2, seqlen=37, nheads=4, headdim=3, ngroups=2, dstate=5, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=F64) * scale).to(dtype)

    x = r(batch, seqlen, nheads, headdim)
    dt = (torch.rand(batch, seqlen, nheads, generator=g, dtype=F64) * 0.5 + 0.05).to(dtype)
    A = -(torch.rand(nheads, generator=g, dtype=F64) + 0.3)
    B, C = r(batch, seqlen, ngroups, dstate), r(batch, seqlen, ngroups, dstate)
    return x, dt, A, B, C, g


def packed_seq_idx(batch, seqlen, g, first=0):
    """Non-decreasing sequence numbers with a few random restarts per row."""
    rows = []
    for _ in range(batch):
        cuts = torch.rand(seqlen, generator=g) < 0.12
        rows.append(first + torch.cumsum(cuts.to(torch.int32), 0).to(torch.int32))
    return torch.stack(rows)


CASES = {
    "tail": dict(seqlen=37, chunk=8),  # seqlen not a multiple of the chunk
    "short": dict(seqlen=5, chunk=16),  # seqlen < chunk
    "boundaries": dict(seqlen=32, chunk=8),  # whole chunks
    "one_step": dict(seqlen=1, chunk=4),
    "chunk_1": dict(seqlen=9, chunk=1),
    "ngroups_1": dict(seqlen=20, chunk=8, ngroups=1),
    "ngroups_4": dict(seqlen=20, chunk=8, ngroups=4),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("extras", ["plain", "D_head", "D_dim_z", "bias_softplus_limit", "init_seq_idx"])
def test_matches_recurrence_float64(case, extras):
    c = dict(CASES[case])
    chunk = c.pop("chunk")
    x, dt, A, B, C, g = make(**c)
    batch, seqlen, nheads, headdim = x.shape
    kw, ref_kw, dkw = {}, {}, {}
    if extras == "D_head":
        kw["D"] = ref_kw["D"] = torch.randn(nheads, generator=g, dtype=F64)
    if extras == "D_dim_z":
        kw["D"] = ref_kw["D"] = torch.randn(nheads, headdim, generator=g, dtype=F64)
        kw["z"] = ref_kw["z"] = torch.randn(x.shape, generator=g, dtype=F64)
    if extras == "bias_softplus_limit":
        dt = torch.randn(dt.shape, generator=g, dtype=F64) * 2  # negatives too
        kw["dt_bias"] = dkw["dt_bias"] = torch.randn(nheads, generator=g, dtype=F64)
        kw["dt_softplus"] = dkw["softplus"] = True
        kw["dt_limit"] = dkw["limit"] = (0.2, 1.5)
    if extras == "init_seq_idx":
        kw["initial_states"] = ref_kw["init"] = torch.randn(batch, nheads, headdim, B.shape[3], generator=g,
                                                            dtype=F64)
        kw["seq_idx"] = ref_kw["seq_idx"] = packed_seq_idx(batch, seqlen, g)
    want, hs = recurrence(x, dt, A, B, C, d=process(dt, **dkw), **ref_kw)
    out, final = mamba_chunk_scan_combined(x, dt, A, B, C, chunk, return_final_states=True, **kw)
    assert out.dtype == F64 and final.dtype == F64
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, hs[-1], rtol=1e-10, atol=1e-10)


def test_dt_limit_default_clamps_negative_dt_to_zero():
    x, dt, A, B, C, g = make(seqlen=12)
    dt = torch.randn(dt.shape, generator=g, dtype=F64)
    want, _ = recurrence(x, dt, A, B, C, d=dt.clamp(min=0))
    torch.testing.assert_close(mamba_chunk_scan_combined(x, dt, A, B, C, 4), want)
    # the unfused form and the reference do not clamp
    raw, _ = recurrence(x, dt, A, B, C, d=dt)
    torch.testing.assert_close(mamba_chunk_scan(x, dt, A, B, C, 4), raw)
    torch.testing.assert_close(ssd_chunk_scan_combined_ref(x, dt, A, B, C, 4), raw)
    assert not torch.allclose(raw, want)


def test_seq_idx_not_starting_at_zero_drops_initial_states():
    x, dt, A, B, C, g = make(seqlen=19)
    init = torch.randn(2, 4, 3, 5, generator=g, dtype=F64)
    seq_idx = packed_seq_idx(2, 19, g, first=1)
    with_init = mamba_chunk_scan_combined(x, dt, A, B, C, 8, initial_states=init, seq_idx=seq_idx)
    without = mamba_chunk_scan_combined(x, dt, A, B, C, 8, seq_idx=seq_idx)
    torch.testing.assert_close(with_init, without)
    want, _ = recurrence(x, dt, A, B, C, init=init, seq_idx=seq_idx, d=process(dt))
    torch.testing.assert_close(with_init, want)


def test_growing_states_and_negative_seq_idx_follow_the_recurrence():
    x, dt, A, B, C, g = make(seqlen=30)
    A = torch.tensor([0.2, -0.5, 0.05, -1.0], dtype=F64)  # A > 0: the state grows inside a chunk
    init = torch.randn(2, 4, 3, 5, generator=g, dtype=F64)
    # negative numbers are ordinary sequences (non-decreasing here: a restart at each change)
    rows = [[-3] * 4 + [-1] * 12 + [3] * 14, [-5] * 11 + [-2] * 9 + [5] * 10]
    seq_idx = torch.tensor(rows, dtype=torch.int32)
    want, hs = recurrence(x, dt, A, B, C, init=init, seq_idx=seq_idx, d=process(dt))
    out, final = mamba_chunk_scan_combined(x, dt, A, B, C, 8, initial_states=init, seq_idx=seq_idx,
                                           return_final_states=True)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, hs[-1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.float16, 4e-3), (torch.bfloat16, 3e-2)])
def test_low_precision_inputs(dtype, tol):
    x, dt, A, B, C, g = make(seqlen=40, dtype=dtype)
    D = torch.randn(4, generator=g)
    z = torch.randn(x.shape, generator=g).to(dtype)
    init = torch.randn(2, 4, 3, 5, generator=g)
    out, final = mamba_chunk_scan_combined(x, dt, A.float(), B, C, 16, D=D, z=z, initial_states=init,
                                           return_final_states=True)
    assert out.dtype == dtype and final.dtype == torch.float32
    want, hs = recurrence(x, dt, A.float(), B, C, D=D, z=z, init=init, d=process(dt))
    scale = want.abs().max()
    assert ((out.to(F64) - want).abs().max() / scale) < tol
    assert ((final.to(F64) - hs[-1]).abs().max() / hs[-1].abs().max()) < tol


@pytest.mark.parametrize("seqlen", [21, 24])  # a padded last chunk, whole chunks
def test_strided_inputs_equal_contiguous_ones(seqlen):
    x, dt, A, B, C, g = make(seqlen=seqlen)
    D = torch.randn(4, 3, generator=g, dtype=F64)
    z = torch.randn(x.shape, generator=g, dtype=F64)
    init = torch.randn(2, 4, 3, 5, generator=g, dtype=F64)

    def strided(t):  # same values, other layout: time-major storage, then every other element
        wide = torch.zeros(tuple(reversed(t.shape)) + (2,), dtype=t.dtype)
        view = wide[..., 0].permute(*reversed(range(t.dim())))
        view.copy_(t)
        assert not view.is_contiguous()
        return view

    seq_idx = packed_seq_idx(2, seqlen, g).to(torch.int64)
    args = [x, dt, A, B, C]
    kw = dict(D=D, z=z, initial_states=init, dt_bias=torch.randn(4, generator=g, dtype=F64), seq_idx=seq_idx)
    want = mamba_chunk_scan_combined(*args, 8, **kw, dt_softplus=True)
    got = mamba_chunk_scan_combined(*[strided(t) for t in args], 8, dt_softplus=True,
                                    **{k: strided(v) for k, v in kw.items()})
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # dt used as given (no bias, softplus or clamp) keeps its strides into the chunk layout
    torch.testing.assert_close(mamba_chunk_scan(*[strided(t) for t in args], 8), mamba_chunk_scan(*args, 8))
    # broadcast (stride 0) B and C
    Bb = B[:, :1].expand(B.shape)
    torch.testing.assert_close(mamba_chunk_scan_combined(x, dt, A, Bb, C, 8),
                               mamba_chunk_scan_combined(x, dt, A, Bb.contiguous(), C, 8))


def _varlen_setup(with_seq_idx, init):
    x, dt, A, B, C, g = make(batch=1, seqlen=37)
    cu = torch.tensor([0, 5, 5, 17, 30, 37], dtype=torch.int32)
    seq_idx = None
    if with_seq_idx:
        seq_idx = torch.zeros(1, 37, dtype=torch.int32)
        for s in range(5):
            seq_idx[0, cu[s]:cu[s + 1]] = s
    states0 = torch.randn(1, 4, 3, 5, generator=g, dtype=F64) if init else None
    return x, dt, A, B, C, cu, seq_idx, states0


@pytest.mark.parametrize("with_seq_idx", [True, False])
@pytest.mark.parametrize("init", [True, False])
def test_varlen_states_are_each_sequences_last_state(with_seq_idx, init):
    x, dt, A, B, C, cu, seq_idx, states0 = _varlen_setup(with_seq_idx, init)
    out, final, varlen = mamba_chunk_scan_combined(
        x, dt, A, B, C, 8, initial_states=states0, seq_idx=seq_idx, cu_seqlens=cu,
        return_final_states=True, return_varlen_states=True)
    assert varlen.shape == (5, 4, 3, 5) and varlen.dtype == C.dtype
    for s in range(5):
        a, e = int(cu[s]), int(cu[s + 1])
        start = states0 if s == 0 else None
        if e == a:
            want = start[0] if start is not None else torch.zeros(4, 3, 5, dtype=F64)
        else:
            sl = slice(a, e)
            _, hs = recurrence(x[:, sl], dt[:, sl], A, B[:, sl], C[:, sl], init=start, d=process(dt[:, sl]))
            want = hs[-1][0]
        torch.testing.assert_close(varlen[s], want, rtol=1e-10, atol=1e-10)
    # the outputs and the final state are those without cu_seqlens
    o2, f2 = mamba_chunk_scan_combined(x, dt, A, B, C, 8, initial_states=states0, seq_idx=seq_idx,
                                       return_final_states=True)
    torch.testing.assert_close(out, o2)
    torch.testing.assert_close(final, f2)
    o3, v3 = mamba_chunk_scan_combined(x, dt, A, B, C, 8, initial_states=states0, seq_idx=seq_idx,
                                       cu_seqlens=cu, return_varlen_states=True)
    torch.testing.assert_close(v3, varlen)


def test_cu_seqlens_ignored_without_return_varlen_states():
    x, dt, A, B, C, *_ = make(batch=2)
    bogus = torch.tensor([3, 1])  # would be refused if it were used
    torch.testing.assert_close(mamba_chunk_scan_combined(x, dt, A, B, C, 8, cu_seqlens=bogus),
                               mamba_chunk_scan_combined(x, dt, A, B, C, 8))


def test_ssd_forward_decomposition():
    x, dt, A, B, C, g = make(seqlen=21)
    z = torch.randn(x.shape, generator=g, dtype=F64)
    init = torch.randn(2, 4, 3, 5, generator=g, dtype=F64)
    bias = torch.randn(4, generator=g, dtype=F64)
    Q = 8
    out, out_x, dt_out, dA_cumsum, states, final, varlen = ssd_forward(
        x, dt, A, B, C, Q, z=z, dt_bias=bias, initial_states=init, dt_softplus=True)
    assert varlen is None
    assert dt_out.shape == dA_cumsum.shape == (2, 4, 3, Q)
    assert states.shape == (2, 3, 4, 3, 5) and final.shape == (2, 4, 3, 5)
    d = process(dt, bias, True)
    flat = dt_out.permute(0, 2, 3, 1).reshape(2, 3 * Q, 4)
    torch.testing.assert_close(flat[:, :21], d)
    assert (flat[:, 21:] == 0).all()
    torch.testing.assert_close(dA_cumsum, torch.cumsum(dt_out * A[:, None, None], -1))
    want, hs = recurrence(x, dt, A, B, C, z=z, init=init, d=d)
    pre, _ = recurrence(x, dt, A, B, C, init=init, d=d)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(out_x, pre)
    torch.testing.assert_close(states[:, 0], init)  # the state entering each chunk
    for c in (1, 2):
        torch.testing.assert_close(states[:, c], hs[c * Q - 1])
    torch.testing.assert_close(final, hs[-1])
    assert ssd_forward(x, dt, A, B, C, Q)[1] is None  # no z: no out_x


def test_states_dtype_follows_C():
    x, dt, A, B, C, _ = make(seqlen=10, dtype=torch.float32)
    _, _, dt_out, dA, states, final, _ = ssd_forward(x, dt, A.float(), B, C.to(torch.bfloat16), 4)
    assert states.dtype == torch.bfloat16 and final.dtype == torch.float32
    assert dt_out.dtype == dA.dtype == torch.float32


def test_references_agree():
    x, dt, A, B, C, g = make(seqlen=17)
    D = torch.randn(4, generator=g, dtype=F64)
    z = torch.randn(x.shape, generator=g, dtype=F64)
    bias = torch.randn(4, generator=g, dtype=F64)
    d = process(dt, bias, True, (-math.inf, math.inf))
    want, _ = recurrence(x, dt, A, B, C, D=D, z=z, d=d)
    kw = dict(D=D, z=z, dt_bias=bias, dt_softplus=True)
    torch.testing.assert_close(ssd_chunk_scan_combined_ref(x, dt, A, B, C, 4, **kw), want)
    torch.testing.assert_close(ssd_selective_scan(x, dt, A, B, C, **kw), want)
    torch.testing.assert_close(mamba_chunk_scan(x, dt, A, B, C, 4, **kw), want)
    lim = (0.3, 0.9)
    want_lim, _ = recurrence(x, dt, A, B, C, D=D, z=z, d=process(dt, bias, True, lim))
    torch.testing.assert_close(ssd_selective_scan(x, dt, A, B, C, dt_limit=lim, **kw), want_lim)


# --- gradients ----------------------------------------------------------------------------


def test_gradcheck_tiny():
    x, dt, A, B, C, g = make(batch=1, seqlen=7, nheads=2, headdim=2, ngroups=1, dstate=2)
    D = torch.randn(2, generator=g, dtype=F64)
    z = torch.randn(x.shape, generator=g, dtype=F64)
    bias = torch.randn(2, generator=g, dtype=F64) * 0.3
    init = torch.randn(1, 2, 2, 2, generator=g, dtype=F64)
    seq_idx = torch.tensor([[0, 0, 0, 0, 1, 1, 1]], dtype=torch.int32)
    inputs = [t.clone().requires_grad_() for t in (x, dt, A, B, C, D, z, bias, init)]

    def f(x, dt, A, B, C, D, z, bias, init):
        out, final = mamba_chunk_scan_combined(x, dt, A, B, C, 3, D=D, z=z, dt_bias=bias, initial_states=init,
                                               seq_idx=seq_idx, dt_softplus=True, return_final_states=True)
        return out, final

    assert torch.autograd.gradcheck(f, inputs)


def test_gradients_match_the_recurrence():
    x, dt, A, B, C, g = make(seqlen=29)
    D = torch.randn(4, 3, generator=g, dtype=F64)
    z = torch.randn(x.shape, generator=g, dtype=F64)
    bias = torch.randn(4, generator=g, dtype=F64)
    init = torch.randn(2, 4, 3, 5, generator=g, dtype=F64)
    dt = torch.randn(dt.shape, generator=g, dtype=F64)
    limit = (0.3, 1.2)  # some dt clamped on each side: their gradients are zero
    leaves = [t.clone().requires_grad_() for t in (x, dt, A, B, C, D, z, bias, init)]
    out, final = mamba_chunk_scan_combined(*leaves[:5], 8, D=leaves[5], z=leaves[6], dt_bias=leaves[7],
                                           initial_states=leaves[8], dt_softplus=True, dt_limit=limit,
                                           return_final_states=True)
    w1 = torch.randn(out.shape, generator=g, dtype=F64)
    w2 = torch.randn(final.shape, generator=g, dtype=F64)
    got = torch.autograd.grad((out * w1).sum() + (final * w2).sum(), leaves)
    refs = [t.clone().requires_grad_() for t in (x, dt, A, B, C, D, z, bias, init)]
    d = process(refs[1], refs[7], True, limit)
    want_out, hs = recurrence(*refs[:5], D=refs[5], z=refs[6], init=refs[8], d=d)
    want = torch.autograd.grad((want_out * w1).sum() + (hs[-1] * w2).sum(), refs)
    for name, a, b in zip(["x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states"], got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=name)
    sp = F.softplus(dt + bias)
    clamped = (sp < limit[0]) | (sp > limit[1])
    assert clamped.any() and (got[1][clamped] == 0).all()


@pytest.mark.parametrize("varlen", [False, True])
def test_blocks_of_one_head_and_row_equal_one_block(monkeypatch, varlen):
    """Small blocks (one batch row, one head each: the path of large problems, with its
    checkpointed backward) give the outputs, states and gradients of one block."""
    batch = 1 if varlen else 3
    x, dt, A, B, C, g = make(batch=batch, seqlen=26)
    extra = dict(D=torch.randn(4, 3, generator=g, dtype=F64), z=torch.randn(x.shape, generator=g, dtype=F64),
                 dt_bias=torch.randn(4, generator=g, dtype=F64),
                 initial_states=torch.randn(batch, 4, 3, 5, generator=g, dtype=F64))
    seq_idx = packed_seq_idx(batch, 26, g)
    cu = torch.tensor([0, 7, 20, 26]) if varlen else None

    def run():
        leaves = [t.clone().requires_grad_() for t in (x, dt, A, B, C, *extra.values())]
        res = mamba_chunk_scan_combined(*leaves[:5], 8, **dict(zip(extra, leaves[5:])), seq_idx=seq_idx,
                                        dt_softplus=True, cu_seqlens=cu, return_final_states=True,
                                        return_varlen_states=varlen)
        loss = sum((r * torch.linspace(-1, 1, r.numel(), dtype=F64).view(r.shape)).sum() for r in res)
        return res, torch.autograd.grad(loss, leaves)

    want = run()
    monkeypatch.setattr(ssd_pytorch, "BLOCK_ELEMENTS", 1)
    got = run()
    for a, b in zip(got[0] + got[1], want[0] + want[1]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert len(list(ssd_pytorch._blocks(batch, 2, 2, 4, 8))) == batch * 4


# --- NaN causality ------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["x", "dt", "B", "C"])
def test_nan_stays_in_its_future(where):
    x, dt, A, B, C, g = make(seqlen=40)
    D = torch.randn(4, generator=g, dtype=F64)
    t = 21  # inside the third chunk of 8
    clean = mamba_chunk_scan_combined(x, dt, A, B, C, 8, D=D)
    args = dict(x=x.clone(), dt=dt.clone(), B=B.clone(), C=C.clone())
    args[where][:, t] = math.nan
    out, final = mamba_chunk_scan_combined(args["x"], args["dt"], A, args["B"], args["C"], 8, D=D,
                                           return_final_states=True)
    assert torch.isfinite(out[:, :t]).all()
    torch.testing.assert_close(out[:, :t], clean[:, :t], rtol=1e-12, atol=1e-12)
    assert torch.isnan(out[:, t]).any()
    if where != "C":
        assert torch.isnan(out[:, t + 1:]).any(dim=(2, 3)).all() and torch.isnan(final).all()


def test_exact_product_equals_the_matmul():
    g = torch.Generator().manual_seed(3)
    for Q in (5, 16, 37):
        M = torch.randn(2, 3, Q, Q, generator=g, dtype=F64).tril()
        x = torch.randn(2, 3, Q, 4, generator=g, dtype=F64)
        torch.testing.assert_close(ssd_pytorch._causal_matmul(M, x, True), M @ x)


# --- empty sizes --------------------------------------------------------------------------


@pytest.mark.parametrize("batch,seqlen", [(0, 10), (2, 0), (0, 0)])
def test_empty_sizes(batch, seqlen):
    x, dt, A, B, C, g = make(batch=batch, seqlen=seqlen)
    init = torch.randn(batch, 4, 3, 5, generator=g, dtype=F64)
    leaves = [t.clone().requires_grad_() for t in (x, dt, A, B, C, init)]
    D = torch.ones(4, dtype=F64, requires_grad=True)
    bias = torch.ones(4, dtype=F64, requires_grad=True)
    out, final = mamba_chunk_scan_combined(*leaves[:5], 8, D=D, dt_bias=bias, initial_states=leaves[5],
                                           return_final_states=True)
    assert out.shape == x.shape and final.shape == init.shape
    torch.testing.assert_close(final, init)  # carried over zero steps
    grads = torch.autograd.grad(out.sum() + final.sum(), leaves + [D, bias])
    for leaf, grad in zip(leaves + [D, bias], grads):
        assert grad.shape == leaf.shape
    assert (grads[2] == 0).all() and (grads[6] == 0).all() and (grads[7] == 0).all()
    assert (grads[5] == 1).all()


def test_varlen_with_zero_tokens():
    x, dt, A, B, C, g = make(batch=1, seqlen=0)
    init = torch.randn(1, 4, 3, 5, generator=g, dtype=F64)
    out, varlen = mamba_chunk_scan_combined(x, dt, A, B, C, 8, initial_states=init,
                                            cu_seqlens=torch.tensor([0, 0, 0]), return_varlen_states=True)
    assert out.shape == x.shape and varlen.shape == (2, 4, 3, 5)
    torch.testing.assert_close(varlen[0], init[0])
    assert (varlen[1] == 0).all()


# --- argument checks ------------------------------------------------------------------------


def _good():
    x, dt, A, B, C, g = make(batch=1, seqlen=6)
    return dict(x=x, dt=dt, A=A, B=B, C=C, chunk_size=4)


BAD = [
    # (label, changes, exception, words the message must contain)
    ("x not tensor", dict(x=[1.0]), TypeError, ["x", "torch.Tensor"]),
    ("x 3-D", dict(x=torch.zeros(1, 6, 4)), ValueError, ["x", "4-D"]),
    ("x int", dict(x=torch.zeros(1, 6, 4, 3, dtype=torch.int32)), TypeError, ["x", "float32", "torch.int32"]),
    ("dt shape", dict(dt=torch.zeros(1, 6, 3, dtype=F64)), ValueError, ["dt", "(1, 6, 4)", "(1, 6, 3)"]),
    ("dt complex", dict(dt=torch.zeros(1, 6, 4, dtype=torch.complex64)), TypeError, ["dt", "complex64"]),
    ("A shape", dict(A=torch.zeros(4, 5, dtype=F64)), ValueError, ["A", "(nheads,)", "(4, 5)"]),
    ("B 3-D", dict(B=torch.zeros(1, 6, 5, dtype=F64)), ValueError, ["B", "(batch, seqlen, ngroups, dstate)"]),
    ("B seqlen", dict(B=torch.zeros(1, 5, 2, 5, dtype=F64)), ValueError, ["B", "seqlen=6"]),
    ("ngroups 3", dict(B=torch.zeros(1, 6, 3, 5, dtype=F64)), ValueError,
     ["ngroups", "divide nheads=4", "3"]),
    ("ngroups 0", dict(B=torch.zeros(1, 6, 0, 5, dtype=F64)), ValueError, ["ngroups", ">= 1"]),
    ("dstate 0", dict(B=torch.zeros(1, 6, 2, 0, dtype=F64)), ValueError, ["dstate", ">= 1"]),
    ("C shape", dict(C=torch.zeros(1, 6, 2, 4, dtype=F64)), ValueError, ["C", "same as B"]),
    ("chunk 0", dict(chunk_size=0), ValueError, ["chunk_size", ">= 1", "0"]),
    ("chunk float", dict(chunk_size=4.0), TypeError, ["chunk_size", "int", "4.0"]),
    ("chunk bool", dict(chunk_size=True), TypeError, ["chunk_size", "int"]),
    ("D shape", dict(D=torch.zeros(3, dtype=F64)), ValueError, ["D", "(nheads,)", "(3,)"]),
    ("D int", dict(D=torch.zeros(4, dtype=torch.int64)), TypeError, ["D", "torch.int64"]),
    ("z shape", dict(z=torch.zeros(1, 6, 4, 2, dtype=F64)), ValueError, ["z", "same as x"]),
    ("dt_bias shape", dict(dt_bias=torch.zeros(4, 3, dtype=F64)), ValueError, ["dt_bias", "(nheads,)"]),
    ("init shape", dict(initial_states=torch.zeros(1, 4, 3, dtype=F64)), ValueError,
     ["initial_states", "(batch, nheads, headdim, dstate)"]),
    ("seq_idx float", dict(seq_idx=torch.zeros(1, 6)), TypeError, ["seq_idx", "int32", "float32"]),
    ("seq_idx shape", dict(seq_idx=torch.zeros(1, 5, dtype=torch.int32)), ValueError, ["seq_idx", "(1, 6)"]),
    ("softplus str", dict(dt_softplus="no"), TypeError, ["dt_softplus", "bool", "'no'"]),
    ("limit scalar", dict(dt_limit=0.5), TypeError, ["dt_limit", "pair", "0.5"]),
    ("limit order", dict(dt_limit=(1.0, 0.5)), ValueError, ["dt_limit", "min <= max", "(1.0, 0.5)"]),
    ("limit nan", dict(dt_limit=(math.nan, 1.0)), ValueError, ["dt_limit"]),
    ("final str", dict(return_final_states="yes"), TypeError, ["return_final_states", "bool"]),
    ("varlen without cu", dict(return_varlen_states=True), ValueError,
     ["cu_seqlens", "return_varlen_states"]),
    ("cu float", dict(return_varlen_states=True, cu_seqlens=torch.tensor([0.0, 6.0])), TypeError,
     ["cu_seqlens", "int32"]),
    ("cu end", dict(return_varlen_states=True, cu_seqlens=torch.tensor([0, 5])), ValueError,
     ["cu_seqlens", "seqlen=6", "[0, 5]"]),
    ("cu start", dict(return_varlen_states=True, cu_seqlens=torch.tensor([1, 6])), ValueError,
     ["cu_seqlens", "[1, 6]"]),
    ("cu decreasing", dict(return_varlen_states=True, cu_seqlens=torch.tensor([0, 4, 3, 6])), ValueError,
     ["cu_seqlens", "non-decreasing"]),
    ("cu 2-D", dict(return_varlen_states=True, cu_seqlens=torch.tensor([[0, 6]])), ValueError,
     ["cu_seqlens", "1-D"]),
    ("device", dict(A=torch.zeros(4, dtype=F64, device="meta")), ValueError, ["one device", "A", "meta"]),
]


@pytest.mark.parametrize("label,changes,exc,words", BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_are_named(label, changes, exc, words):
    kw = _good()
    kw.update(changes)
    with pytest.raises(exc) as info:
        mamba_chunk_scan_combined(**kw)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_varlen_needs_batch_1():
    kw = _good()
    kw["x"], kw["dt"], kw["B"], kw["C"] = (torch.cat([t, t]) for t in (kw["x"], kw["dt"], kw["B"], kw["C"]))
    with pytest.raises(ValueError, match="x must have batch 1 with cu_seqlens"):
        mamba_chunk_scan_combined(**kw, cu_seqlens=torch.tensor([0, 6]), return_varlen_states=True)


def test_import_does_not_import_triton():
    code = ("import sys; import selective_scan.ssd_combined, selective_scan.ssd_pytorch; "
            "assert 'triton' not in sys.modules, 'triton imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
    # and the package alone does not import the SSD modules (its import costs nothing more)
    code = "import sys, selective_scan; assert 'selective_scan.ssd_combined' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def _params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


def test_signatures_follow_mamba_ssm():
    from selective_scan import ssd_combined as m

    E = inspect.Parameter.empty
    head = [("x", E), ("dt", E), ("A", E), ("B", E), ("C", E)]
    limit = ("dt_limit", (0.0, math.inf))
    assert _params(m.mamba_chunk_scan_combined) == head + [
        ("chunk_size", E), ("D", None), ("z", None), ("dt_bias", None), ("initial_states", None),
        ("seq_idx", None), ("cu_seqlens", None), ("dt_softplus", False), limit,
        ("return_final_states", False), ("return_varlen_states", False)]
    plain = head + [("chunk_size", E), ("D", None), ("z", None), ("dt_bias", None), ("dt_softplus", False)]
    assert _params(m.mamba_chunk_scan) == plain
    assert _params(m.ssd_chunk_scan_combined_ref) == plain
    assert _params(m.ssd_selective_scan) == head + [
        ("D", None), ("z", None), ("dt_bias", None), ("dt_softplus", False), limit]
    assert _params(m.mamba_conv1d_scan_ref) == [
        ("xBC", E), ("conv1d_weight", E), ("conv1d_bias", E), ("dt", E), ("A", E), ("chunk_size", E),
        ("D", None), ("z", None), ("dt_bias", None), ("dt_softplus", False), limit, ("activation", "silu"),
        ("headdim", None), ("ngroups", 1)]
    split = [("zxbcdt", E), ("conv1d_weight", E), ("conv1d_bias", E), ("dt_bias", E), ("A", E), ("D", E),
             ("chunk_size", E)]
    tail = [("activation", "silu"), ("rmsnorm_weight", None), ("rmsnorm_eps", 1e-6), ("outproj_weight", None),
            ("outproj_bias", None), ("headdim", None), ("ngroups", 1), ("norm_before_gate", True)]
    assert _params(m.mamba_split_conv1d_scan_combined) == split + [
        ("initial_states", None), ("seq_idx", None), limit, ("return_final_states", False)] + tail
    assert _params(m.mamba_split_conv1d_scan_ref) == split + [limit] + tail


REF_BAD = [
    ("selective dt", ssd_selective_scan, dict(dt=torch.zeros(1, 6, 3, dtype=F64)), ValueError, ["dt"]),
    ("selective A", ssd_selective_scan, dict(A=torch.zeros(4, 2, dtype=F64)), ValueError, ["A", "(4, 2)"]),
    ("selective B", ssd_selective_scan, dict(B=torch.zeros(1, 6, 3, 5, dtype=F64)), ValueError,
     ["B", "ngroups"]),
    ("selective D", ssd_selective_scan, dict(D=torch.zeros(5, dtype=F64)), ValueError, ["D", "(5,)"]),
    ("selective limit", ssd_selective_scan, dict(dt_limit=(2.0, 1.0)), ValueError, ["dt_limit"]),
    ("ref chunk", ssd_chunk_scan_combined_ref, dict(chunk_size=-1), ValueError, ["chunk_size"]),
    ("ref z", ssd_chunk_scan_combined_ref, dict(z=torch.zeros(1, 6, 4, dtype=F64)), ValueError, ["z"]),
    ("plain softplus", mamba_chunk_scan, dict(dt_softplus=None), TypeError, ["dt_softplus"]),
]


@pytest.mark.parametrize("label,fn,changes,exc,words", REF_BAD, ids=[b[0] for b in REF_BAD])
def test_references_name_bad_arguments(label, fn, changes, exc, words):
    kw = _good()
    if fn is ssd_selective_scan:
        kw.pop("chunk_size")
    kw.update(changes)
    with pytest.raises(exc) as info:
        fn(**kw)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
