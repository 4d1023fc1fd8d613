"""selective_scan.ssd_combined.mamba_split_conv1d_scan_combined (Mamba-2's fused layer body)
against a float64 composition written here: split, causal conv (F.conv1d), the per-step SSD
recurrence, the gated RMSNorm by groups, swiglu of the non-SSM part, the out projection."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from selective_scan.ssd_combined import (
    mamba_conv1d_scan_ref,
    mamba_split_conv1d_scan_combined,
    mamba_split_conv1d_scan_ref,
)

F64 = torch.float64
NHEADS, HEADDIM, NGROUPS, DSTATE, WIDTH = 4, 3, 2, 5, 4
DIM = NHEADS * HEADDIM
CONV_DIM = DIM + 2 * NGROUPS * DSTATE


def params(d_nonssm=0, out_dim=7, batch=2, seqlen=23, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=F64) * scale).to(dtype)

    return dict(
        zxbcdt=r(batch, seqlen, 2 * d_nonssm + 2 * DIM + 2 * NGROUPS * DSTATE + NHEADS),
        conv1d_weight=r(CONV_DIM, WIDTH, scale=0.5),
        conv1d_bias=r(CONV_DIM),
        dt_bias=r(NHEADS, scale=0.5),
        A=-(torch.rand(NHEADS, generator=g, dtype=F64) + 0.3),
        D=r(NHEADS),
        rmsnorm_weight=r(DIM),
        outproj_weight=r(out_dim, d_nonssm + DIM, scale=0.3),
        outproj_bias=r(out_dim),
        generator=g,
    )


def composed(
    zxbcdt,
    conv1d_weight,
    conv1d_bias,
    dt_bias,
    A,
    D,
    rmsnorm_weight=None,
    outproj_weight=None,
    outproj_bias=None,
    seq_idx=None,
    initial_states=None,
    norm_before_gate=True,
    eps=1e-6,
    dt_limit=(0.0, math.inf),
):
    """Everything in float64, step by step."""
    zxbcdt = zxbcdt.to(F64)
    batch, seqlen, channels = zxbcdt.shape
    d_nonssm = (channels - 2 * DIM - 2 * NGROUPS * DSTATE - NHEADS) // 2
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * d_nonssm, DIM, CONV_DIM, NHEADS], dim=-1)
    # causal conv per segment: a token only sees earlier tokens of its own seq_idx
    w = conv1d_weight.to(F64)
    conv = torch.zeros_like(xBC)
    for t in range(seqlen):
        acc = conv1d_bias.to(F64).expand(batch, CONV_DIM).clone()
        for k in range(WIDTH):
            s = t - (WIDTH - 1 - k)
            if s < 0:
                continue
            term = xBC[:, s] * w[:, k]
            if seq_idx is not None:
                term = torch.where(
                    (seq_idx[:, s] == seq_idx[:, t])[:, None], term, torch.zeros((), dtype=F64)
                )
            acc = acc + term
        conv[:, t] = F.silu(acc)
    x, B, C = torch.split(conv, [DIM, NGROUPS * DSTATE, NGROUPS * DSTATE], dim=-1)
    x = x.unflatten(-1, (NHEADS, HEADDIM))
    B, C = B.unflatten(-1, (NGROUPS, DSTATE)), C.unflatten(-1, (NGROUPS, DSTATE))
    d = F.softplus(dt + dt_bias.to(F64)).clamp(min=dt_limit[0], max=dt_limit[1])
    Bh, Ch = B.repeat_interleave(NHEADS // NGROUPS, 2), C.repeat_interleave(NHEADS // NGROUPS, 2)
    h = (
        initial_states.to(F64).clone()
        if initial_states is not None
        else x.new_zeros(batch, NHEADS, HEADDIM, DSTATE)
    )
    prev = torch.zeros(batch, dtype=torch.int64)
    ys = []
    for t in range(seqlen):
        kept = torch.exp(d[:, t] * A.to(F64))[:, :, None, None] * h
        if seq_idx is not None:
            kept = torch.where(
                (seq_idx[:, t].long() == prev)[:, None, None, None], kept, torch.zeros((), dtype=F64)
            )
            prev = seq_idx[:, t].long()
        h = kept + (d[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        ys.append((h * Ch[:, t, :, None, :]).sum(-1) + x[:, t] * D.to(F64)[:, None])
    y = torch.stack(ys, 1).flatten(-2)
    if rmsnorm_weight is None:
        out = y * F.silu(z)
    else:
        v = y if norm_before_gate else y * F.silu(z)
        vg = v.unflatten(-1, (NGROUPS, DIM // NGROUPS))
        v = (vg / torch.sqrt((vg * vg).mean(-1, keepdim=True) + eps)).flatten(-2) * rmsnorm_weight.to(F64)
        out = v * F.silu(z) if norm_before_gate else v
    if d_nonssm:
        x0, x1 = zx0.chunk(2, dim=-1)
        out = torch.cat([F.silu(x0) * x1, out], dim=-1)
    if outproj_weight is not None:
        out = F.linear(
            out, outproj_weight.to(F64), outproj_bias.to(F64) if outproj_bias is not None else None
        )
    return out, h


@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("norm_before_gate", [True, False])
@pytest.mark.parametrize("d_nonssm", [0, 3])
@pytest.mark.parametrize("proj", [False, True])
def test_matches_composition(rms, norm_before_gate, d_nonssm, proj):
    p = params(d_nonssm=d_nonssm)
    g = p.pop("generator")
    seq_idx = torch.tensor([[0] * 9 + [1] * 14, [0] * 23], dtype=torch.int32)
    init = torch.randn(2, NHEADS, HEADDIM, DSTATE, generator=g, dtype=F64)
    if not rms:
        p["rmsnorm_weight"] = None
    if not proj:
        p["outproj_weight"] = p["outproj_bias"] = None
    want, final_want = composed(**p, seq_idx=seq_idx, initial_states=init, norm_before_gate=norm_before_gate)
    out, final = mamba_split_conv1d_scan_combined(
        p["zxbcdt"],
        p["conv1d_weight"],
        p["conv1d_bias"],
        p["dt_bias"],
        p["A"],
        p["D"],
        8,
        initial_states=init,
        seq_idx=seq_idx,
        return_final_states=True,
        rmsnorm_weight=p["rmsnorm_weight"],
        outproj_weight=p["outproj_weight"],
        outproj_bias=p["outproj_bias"],
        headdim=HEADDIM,
        ngroups=NGROUPS,
        norm_before_gate=norm_before_gate,
    )
    torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(final, final_want, rtol=1e-9, atol=1e-9)


def test_D_per_dim_and_dt_limit_and_reference():
    p = params()
    g = p.pop("generator")
    D2 = torch.randn(NHEADS, HEADDIM, generator=g, dtype=F64)
    lim = (0.1, 0.8)
    kw = dict(
        rmsnorm_weight=p["rmsnorm_weight"],
        outproj_weight=p["outproj_weight"],
        outproj_bias=p["outproj_bias"],
        ngroups=NGROUPS,
        dt_limit=lim,
    )
    args = (p["zxbcdt"], p["conv1d_weight"], p["conv1d_bias"], p["dt_bias"], p["A"])
    out = mamba_split_conv1d_scan_combined(*args, D2, 8, **kw)
    ref = mamba_split_conv1d_scan_ref(*args, D2, 8, **kw)
    # the reference runs D in float32, as the original's does
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # D (nheads,) with headdim equals D (nheads, headdim) with equal columns
    D1 = p["D"]
    torch.testing.assert_close(
        mamba_split_conv1d_scan_combined(*args, D1, 8, headdim=HEADDIM, **kw),
        mamba_split_conv1d_scan_combined(*args, D1[:, None].expand(NHEADS, HEADDIM), 8, **kw),
    )


def test_gradients_match_composition():
    p = params(d_nonssm=2, seqlen=13)
    g = p.pop("generator")
    init = torch.randn(2, NHEADS, HEADDIM, DSTATE, generator=g, dtype=F64)
    names = [
        "zxbcdt",
        "conv1d_weight",
        "conv1d_bias",
        "dt_bias",
        "A",
        "D",
        "rmsnorm_weight",
        "outproj_weight",
        "outproj_bias",
    ]
    a = {k: p[k].clone().requires_grad_() for k in names}
    ia = init.clone().requires_grad_()
    out, final = mamba_split_conv1d_scan_combined(
        a["zxbcdt"],
        a["conv1d_weight"],
        a["conv1d_bias"],
        a["dt_bias"],
        a["A"],
        a["D"],
        4,
        initial_states=ia,
        return_final_states=True,
        rmsnorm_weight=a["rmsnorm_weight"],
        outproj_weight=a["outproj_weight"],
        outproj_bias=a["outproj_bias"],
        headdim=HEADDIM,
        ngroups=NGROUPS,
    )
    w1 = torch.randn(out.shape, generator=g, dtype=F64)
    w2 = torch.randn(final.shape, generator=g, dtype=F64)
    got = torch.autograd.grad((out * w1).sum() + (final * w2).sum(), [a[k] for k in names] + [ia])
    b = {k: p[k].clone().requires_grad_() for k in names}
    ib = init.clone().requires_grad_()
    want_out, want_final = composed(**b, initial_states=ib)
    want = torch.autograd.grad((want_out * w1).sum() + (want_final * w2).sum(), [b[k] for k in names] + [ib])
    for name, x, y in zip(names + ["initial_states"], got, want):
        torch.testing.assert_close(x, y, rtol=1e-8, atol=1e-8, msg=name)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
def test_low_precision(dtype, tol):
    p = params(dtype=dtype)
    p.pop("generator")
    for k in ("dt_bias", "D", "rmsnorm_weight", "conv1d_bias", "conv1d_weight"):
        p[k] = p[k].to(dtype)
    p["A"] = p["A"].float()
    out = mamba_split_conv1d_scan_combined(
        p["zxbcdt"],
        p["conv1d_weight"],
        p["conv1d_bias"],
        p["dt_bias"],
        p["A"],
        p["D"],
        8,
        rmsnorm_weight=p["rmsnorm_weight"],
        outproj_weight=p["outproj_weight"],
        outproj_bias=p["outproj_bias"],
        headdim=HEADDIM,
        ngroups=NGROUPS,
    )
    assert out.dtype == dtype
    want, _ = composed(**{k: v for k, v in p.items()})
    assert ((out.to(F64) - want).abs().max() / want.abs().max()) < tol


def test_empty_batch_and_seqlen():
    for batch, seqlen in ((0, 5), (2, 0)):
        p = params(batch=batch, seqlen=seqlen)
        p.pop("generator")
        z = p["zxbcdt"].clone().requires_grad_()
        out, final = mamba_split_conv1d_scan_combined(
            z,
            p["conv1d_weight"],
            p["conv1d_bias"],
            p["dt_bias"],
            p["A"],
            p["D"],
            8,
            return_final_states=True,
            rmsnorm_weight=p["rmsnorm_weight"],
            outproj_weight=p["outproj_weight"],
            headdim=HEADDIM,
            ngroups=NGROUPS,
        )
        assert out.shape == (batch, seqlen, 7) and final.shape == (batch, NHEADS, HEADDIM, DSTATE)
        assert (final == 0).all()
        (grad,) = torch.autograd.grad(out.sum(), z)
        assert grad.shape == z.shape


def _call(**changes):
    p = params(seqlen=6)
    p.pop("generator")
    kw = dict(
        zxbcdt=p["zxbcdt"],
        conv1d_weight=p["conv1d_weight"],
        conv1d_bias=p["conv1d_bias"],
        dt_bias=p["dt_bias"],
        A=p["A"],
        D=p["D"],
        chunk_size=4,
        headdim=HEADDIM,
        ngroups=NGROUPS,
    )
    kw.update(changes)
    return mamba_split_conv1d_scan_combined(**kw)


BAD = [
    ("activation", dict(activation="relu"), NotImplementedError, ["activation", "'relu'"]),
    ("zxbcdt 2-D", dict(zxbcdt=torch.zeros(6, 44, dtype=F64)), ValueError, ["zxbcdt", "3-D"]),
    ("zxbcdt channels", dict(zxbcdt=torch.zeros(2, 6, 45, dtype=F64)), ValueError, ["zxbcdt", "channels"]),
    ("no headdim", dict(headdim=None), ValueError, ["headdim", "D is (nheads,)"]),
    ("headdim 0", dict(headdim=0), ValueError, ["headdim", ">= 1"]),
    ("ngroups 3", dict(ngroups=3), ValueError, ["ngroups", "nheads=4"]),
    (
        "conv 3-D",
        dict(conv1d_weight=torch.zeros(CONV_DIM, 1, 4, dtype=F64)),
        ValueError,
        ["conv1d_weight", "2-D"],
    ),
    ("conv rows", dict(conv1d_weight=torch.zeros(CONV_DIM + 1, 4, dtype=F64)), ValueError, ["conv1d_weight"]),
    ("conv bias", dict(conv1d_bias=torch.zeros(3, dtype=F64)), ValueError, ["conv1d_bias"]),
    ("dt_bias", dict(dt_bias=torch.zeros(3, dtype=F64)), ValueError, ["dt_bias", "(nheads,)"]),
    ("A", dict(A=torch.zeros(5, dtype=F64)), ValueError, ["A"]),
    ("D 3-D", dict(D=torch.zeros(4, 3, 1, dtype=F64)), ValueError, ["D"]),
    (
        "rmsnorm_weight",
        dict(rmsnorm_weight=torch.zeros(5, dtype=F64)),
        ValueError,
        ["rmsnorm_weight", "(dim,)"],
    ),
    ("eps", dict(rmsnorm_eps=-1.0), ValueError, ["rmsnorm_eps", ">= 0"]),
    ("outproj", dict(outproj_weight=torch.zeros(7, 5, dtype=F64)), ValueError, ["outproj_weight"]),
    ("outproj_bias alone", dict(outproj_bias=torch.zeros(7, dtype=F64)), ValueError, ["outproj_bias"]),
    ("outproj dtype", dict(outproj_weight=torch.zeros(7, DIM)), TypeError, ["outproj_weight", "float64"]),
    ("seq_idx", dict(seq_idx=torch.zeros(2, 5, dtype=torch.int32)), ValueError, ["seq_idx"]),
    ("init", dict(initial_states=torch.zeros(2, 4, 3, dtype=F64)), ValueError, ["initial_states"]),
    ("chunk", dict(chunk_size=0), ValueError, ["chunk_size"]),
    ("norm flag", dict(norm_before_gate="yes"), TypeError, ["norm_before_gate"]),
    ("final flag", dict(return_final_states=1), TypeError, ["return_final_states"]),
]


@pytest.mark.parametrize("label,changes,exc,words", BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_are_named(label, changes, exc, words):
    with pytest.raises(exc) as info:
        _call(**changes)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_conv1d_scan_reference():
    p = params()
    p.pop("generator")
    z, xBC, dt = torch.split(p["zxbcdt"], [DIM, CONV_DIM, NHEADS], dim=-1)
    want = mamba_split_conv1d_scan_combined(
        p["zxbcdt"], p["conv1d_weight"], p["conv1d_bias"], p["dt_bias"], p["A"], p["D"], 8,
        headdim=HEADDIM, ngroups=NGROUPS,
    )
    got = mamba_conv1d_scan_ref(
        xBC, p["conv1d_weight"], p["conv1d_bias"], dt, p["A"], 8, D=p["D"], z=z, dt_bias=p["dt_bias"],
        dt_softplus=True, ngroups=NGROUPS,
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # the reference's D is float32


CONV_REF_BAD = [
    ("xBC 2-D", dict(xBC=torch.zeros(6, CONV_DIM, dtype=F64)), ValueError, ["xBC", "3-D"]),
    ("xBC channels", dict(xBC=torch.zeros(2, 6, CONV_DIM + 1, dtype=F64)), ValueError, ["xBC", "channels"]),
    ("dt", dict(dt=torch.zeros(2, 5, NHEADS, dtype=F64)), ValueError, ["dt", "matching xBC"]),
    ("headdim", dict(D=None, headdim=None), ValueError, ["headdim"]),
    ("ngroups", dict(ngroups=0), ValueError, ["ngroups", ">= 1"]),
    ("activation", dict(activation="gelu"), NotImplementedError, ["activation"]),
]


@pytest.mark.parametrize("label,changes,exc,words", CONV_REF_BAD, ids=[b[0] for b in CONV_REF_BAD])
def test_conv1d_scan_reference_names_bad_arguments(label, changes, exc, words):
    p = params(seqlen=6)
    p.pop("generator")
    kw = dict(xBC=torch.zeros(2, 6, CONV_DIM, dtype=F64), conv1d_weight=p["conv1d_weight"],
              conv1d_bias=p["conv1d_bias"], dt=torch.zeros(2, 6, NHEADS, dtype=F64), A=p["A"], chunk_size=4,
              D=p["D"], headdim=HEADDIM, ngroups=NGROUPS)
    kw.update(changes)
    with pytest.raises(exc) as info:
        mamba_conv1d_scan_ref(**kw)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
