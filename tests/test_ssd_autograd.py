"""The SSD's autograd Functions (selective_scan.ssd_combined): MambaChunkScanCombinedFn and
MambaSplitConv1dScanCombinedFn give the gradients of plain autograd through the same PyTorch
forward for every option, keep for the backward what mamba_ssm 2.3.2 keeps (or less), call the
compiled backward with its exact signature where it exists, refuse double backward; the dispatch
of the compiled forward (wired on the CPU with stand-ins; on a GPU for real); torch.compile."""

from __future__ import annotations

import math
import pathlib
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from selective_scan import ssd_combined as sc
from selective_scan.ssd_combined import (
    MambaChunkScanCombinedFn,
    MambaSplitConv1dScanCombinedFn,
    mamba_chunk_scan,
    mamba_chunk_scan_combined,
    mamba_split_conv1d_scan_combined,
    ssd_forward,
)

F64 = torch.float64
ROOT = pathlib.Path(__file__).resolve().parents[1]
NHEADS, HEADDIM, NGROUPS, DSTATE = 4, 3, 2, 5


def scan_args(batch=2, seqlen=21, dtype=F64, seed=0, D="head", z=True, bias=True, init=True, seq_idx=None):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=F64) * scale).to(dtype)

    a = dict(
        x=r(batch, seqlen, NHEADS, HEADDIM),
        dt=r(batch, seqlen, NHEADS, scale=0.5),
        A=-(torch.rand(NHEADS, generator=g, dtype=F64) + 0.3),
        B=r(batch, seqlen, NGROUPS, DSTATE),
        C=r(batch, seqlen, NGROUPS, DSTATE),
        D={"head": r(NHEADS), "dim": r(NHEADS, HEADDIM), None: None}[D],
        z=r(batch, seqlen, NHEADS, HEADDIM) if z else None,
        dt_bias=r(NHEADS, scale=0.5) if bias else None,
        initial_states=r(batch, NHEADS, HEADDIM, DSTATE) if init else None,
    )
    if seq_idx is not None:
        cuts = torch.rand(batch, seqlen, generator=g) < 0.2
        a["seq_idx"] = torch.cumsum(cuts.to(torch.int64), 1).to(seq_idx)
    return a


DIFF = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")


def leaves(a):
    return {
        k: (v.detach().clone().requires_grad_() if k in DIFF and v is not None else v) for k, v in a.items()
    }


def grads_of(outs, a, seed=1):
    """Gradients of a random weighting of outs (None outputs skipped) w.r.t. a's leaves."""
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs if o is not None)
    wrt = [v for k, v in a.items() if k in DIFF and v is not None and v.requires_grad]
    return torch.autograd.grad(loss, wrt, allow_unused=True)


def close(a, b):
    for u, v in zip(a, b):
        assert (u is None) == (v is None)
        if u is not None:
            torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-10)


OPTIONS = {
    "plain": dict(D=None, z=False, bias=False, init=False),
    "D_head": dict(D="head", z=False, bias=False, init=False),
    "D_dim_z": dict(D="dim", z=True, bias=False, init=False),
    "bias_softplus_limit": dict(kw=dict(dt_softplus=True, dt_limit=(0.1, 0.9))),
    "init_seq_idx32": dict(seq_idx=torch.int32),
    "init_seq_idx64": dict(seq_idx=torch.int64),
}


@pytest.mark.parametrize("final", [False, True])
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_chunk_scan_gradients_equal_plain_autograd(option, final):
    spec = dict(OPTIONS[option])
    kw = spec.pop("kw", {})
    a = scan_args(**spec)
    mine, ref = leaves(a), leaves(a)
    res = mamba_chunk_scan_combined(
        **{k: mine[k] for k in mine}, chunk_size=8, return_final_states=final, **kw
    )
    res = res if isinstance(res, tuple) else (res,)
    assert type(res[0].grad_fn).__name__ == MambaChunkScanCombinedFn.__name__ + "Backward"
    plain = ssd_forward(
        ref["x"],
        ref["dt"],
        ref["A"],
        ref["B"],
        ref["C"],
        8,
        ref["D"],
        ref["z"],
        ref["dt_bias"],
        ref["initial_states"],
        ref.get("seq_idx"),
        None,
        kw.get("dt_softplus", False),
        kw.get("dt_limit", (0.0, math.inf)),
    )
    want = (plain[0], plain[5]) if final else (plain[0],)
    for u, v in zip(res, want):
        torch.testing.assert_close(u, v, rtol=0, atol=0)
    close(grads_of(res, mine), grads_of(want, ref))


@pytest.mark.parametrize("only", DIFF)
def test_chunk_scan_gradient_of_one_input(only):
    a = scan_args(D="dim")
    mine, ref = leaves(a), leaves(a)
    for d in (mine, ref):
        for k in DIFF:
            d[k].requires_grad_(k == only)
    out, final = mamba_chunk_scan_combined(**mine, chunk_size=8, dt_softplus=True, return_final_states=True)
    plain = ssd_forward(*(ref[k] for k in ("x", "dt", "A", "B", "C")), 8, ref["D"], ref["z"], ref["dt_bias"],
                        ref["initial_states"], None, None, True)
    (g1,) = grads_of((out, final), mine)
    (g2,) = grads_of((plain[0], plain[5]), ref)
    torch.testing.assert_close(g1, g2, rtol=1e-10, atol=1e-10)
    assert g1.abs().max() > 0


def test_only_final_states_used_and_unused_inputs():
    """dout None (out unused); A without requires_grad gets no gradient computed."""
    a = scan_args()
    mine, ref = leaves(a), leaves(a)
    mine["A"].requires_grad_(False)
    ref["A"].requires_grad_(False)
    _, final = mamba_chunk_scan_combined(**mine, chunk_size=8, return_final_states=True)
    plain = ssd_forward(
        *(ref[k] for k in ("x", "dt", "A", "B", "C")),
        8,
        ref["D"],
        ref["z"],
        ref["dt_bias"],
        ref["initial_states"],
    )
    close(grads_of([final], mine), grads_of([plain[5]], ref))


def _plain_varlen(ref, cu):
    """The PyTorch forward with varlen states, on the reference leaves (chunk 8)."""
    return ssd_forward(*(ref[k] for k in ("x", "dt", "A", "B", "C")), 8, ref["D"], ref["z"], ref["dt_bias"],
                       ref["initial_states"], ref["seq_idx"], cu)


@pytest.mark.parametrize("final", [False, True])
def test_varlen_states_gradient_runs_the_recompute(final, monkeypatch):
    """varlen states get gradients (the original refuses): through the PyTorch recompute, even
    where the compiled backward would run otherwise (it has no varlen-states gradient)."""
    a = scan_args(batch=1, seqlen=30, seq_idx=torch.int32, dtype=torch.float32)
    a["A"] = a["A"].float()
    a["seq_idx"] = torch.tensor([[0] * 7 + [1] * 13 + [2] * 10], dtype=torch.int32)
    cu = torch.tensor([0, 7, 20, 30])
    mine, ref = leaves(a), leaves(a)
    res = mamba_chunk_scan_combined(
        **mine, chunk_size=8, cu_seqlens=cu, return_final_states=final, return_varlen_states=True
    )
    plain = _plain_varlen(ref, cu)
    want = (plain[0], plain[5], plain[6]) if final else (plain[0], plain[6])
    close(grads_of(res, mine), grads_of(want, ref))
    # the compiled backward is not asked for a varlen-states gradient (stand-in forward on the CPU)
    calls = _standins(monkeypatch)
    mine = leaves(a)
    res = mamba_chunk_scan_combined(**mine, chunk_size=8, cu_seqlens=cu, return_varlen_states=True)
    ref = leaves(a)
    plain = _plain_varlen(ref, cu)
    close(grads_of(res, mine), grads_of((plain[0], plain[6]), ref))
    assert calls == ["fwd"]
    mine = leaves(a)
    res = mamba_chunk_scan_combined(**mine, chunk_size=8, cu_seqlens=cu, return_varlen_states=True)
    grads_of(res[:1], mine)  # varlen_states unused: the compiled backward runs
    assert calls == ["fwd", "fwd", "bwd"]


def test_mamba_chunk_scan_gradients():
    a = scan_args(init=False)
    a.pop("initial_states")
    mine, ref = leaves(a), leaves(a)
    out = mamba_chunk_scan(**mine, chunk_size=8, dt_softplus=True)
    plain = ssd_forward(
        *(ref[k] for k in ("x", "dt", "A", "B", "C")),
        8,
        ref["D"],
        ref["z"],
        ref["dt_bias"],
        dt_softplus=True,
        dt_limit=(-math.inf, math.inf),
    )
    close(grads_of([out], mine), grads_of([plain[0]], ref))


def test_no_grad_calls_do_not_record():
    a = leaves(scan_args())
    with torch.no_grad():
        assert mamba_chunk_scan_combined(**a, chunk_size=8).grad_fn is None


def saved_during(fn):
    rows = []

    def pack(t):
        rows.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, rows


def same(t, u):
    return t.shape == u.shape and t.dtype == u.dtype and t.data_ptr() == u.data_ptr()


def test_chunk_scan_saves_the_inputs_only():
    """mamba_ssm keeps out_x, x, dt, dA_cumsum, A, B, C, D, z, dt_bias, initial_states, seq_idx;
    the recompute path keeps the inputs alone (no out_x, no dA_cumsum)."""
    a = leaves(scan_args(seq_idx=torch.int32))
    out, rows = saved_during(lambda: mamba_chunk_scan_combined(**a, chunk_size=8))
    want = [a[k] for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "seq_idx")]
    assert len(rows) == len(want) and all(same(t, u) for t, u in zip(rows, want))


def test_chunk_scan_saves_out_x_for_the_compiled_backward(monkeypatch):
    _standins(monkeypatch)
    a = scan_args(dtype=torch.float32, seq_idx=torch.int64)
    a["A"] = a["A"].float()
    a = leaves(a)
    out, rows = saved_during(lambda: mamba_chunk_scan_combined(**a, chunk_size=8))
    names = ["out_x", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "seq_idx"]
    assert len(rows) == len(names)
    assert rows[0].shape == a["x"].shape and rows[0].dtype == a["x"].dtype
    assert all(same(t, a[k]) for t, k in zip(rows[1:-1], names[1:-1]))
    assert rows[-1].dtype == torch.int32 and torch.equal(rows[-1], a["seq_idx"].to(torch.int32))


def test_double_backward_is_refused():
    a = leaves(scan_args())
    out = mamba_chunk_scan_combined(**a, chunk_size=8)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), a["x"], create_graph=True)


# ------------------------------------------------------------------ the compiled path's wiring


def _standins(monkeypatch, bwd=True):
    """The dispatch chooses the compiled path for CPU tensors, whose ``_ssd_ops`` is a stand-in
    with the compiled functions' contracts (float32 states, varlen states in float32, seq_idx
    int32 only, the backward's exact signature), computing with the PyTorch forward."""
    calls = []

    def fwd(
        x,
        dt,
        A,
        B,
        C,
        chunk_size,
        D=None,
        z=None,
        dt_bias=None,
        initial_states=None,
        seq_idx=None,
        dt_softplus=False,
        dt_limit=(0.0, float("inf")),
        cu_seqlens=None,
    ):
        assert seq_idx is None or seq_idx.dtype == torch.int32
        calls.append("fwd")
        res = ssd_forward(
            x,
            dt,
            A,
            B,
            C,
            chunk_size,
            D,
            z,
            dt_bias,
            initial_states,
            seq_idx,
            cu_seqlens,
            dt_softplus,
            dt_limit,
        )
        res = res[:6] if cu_seqlens is None else res[:6] + (res[6].to(torch.float32),)
        return res

    def ssd_backward_cuda(
        dout,
        x,
        dt,
        A,
        B,
        C,
        out,
        chunk_size,
        D=None,
        z=None,
        dt_bias=None,
        initial_states=None,
        dfinal_states=None,
        seq_idx=None,
        dt_softplus=False,
        dt_limit=(0.0, float("inf")),
    ):
        calls.append("bwd")
        assert seq_idx is None or seq_idx.dtype == torch.int32
        want = ssd_forward(
            x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, None, dt_softplus, dt_limit
        )[1 if z is not None else 0]
        torch.testing.assert_close(out, want)  # the ungated output
        needs = (True,) * 9
        return sc._chunk_scan_backward(
            False,
            None,
            x,
            dt,
            A,
            B,
            C,
            chunk_size,
            D,
            z,
            dt_bias,
            initial_states,
            seq_idx,
            None,
            dt_softplus,
            dt_limit,
            needs,
            dout,
            dfinal_states,
            None,
        )

    ops = SimpleNamespace(ssd_forward_cuda=fwd)
    if bwd:
        ops.ssd_backward_cuda = ssd_backward_cuda
    monkeypatch.setattr(sc, "_ops", lambda: ops)
    monkeypatch.setattr(sc, "_CUDA_BACKWARD", None)

    def use_cuda(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens):
        covered, kseq = sc._kernel_seq_idx(seq_idx)
        ok = covered and sc._kernel_covers(
            x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, kseq, cu_seqlens
        )
        return (True, kseq) if ok else (False, seq_idx)

    monkeypatch.setattr(sc, "_use_cuda", use_cuda)
    return calls


@pytest.mark.parametrize("bwd", [True, False])
def test_compiled_path_wiring(monkeypatch, bwd):
    """float32 inputs through the stand-in compiled functions: same outputs and gradients as
    plain autograd; the compiled backward is called where it exists, else the recompute."""
    calls = _standins(monkeypatch, bwd)
    a = scan_args(dtype=torch.float32, seq_idx=torch.int64)
    a["A"] = a["A"].float()
    mine, ref = leaves(a), leaves(a)
    out, final = mamba_chunk_scan_combined(**mine, chunk_size=8, dt_softplus=True, return_final_states=True)
    assert final.dtype == torch.float32
    plain = ssd_forward(
        *(ref[k] for k in ("x", "dt", "A", "B", "C")),
        8,
        ref["D"],
        ref["z"],
        ref["dt_bias"],
        ref["initial_states"],
        ref["seq_idx"],
        None,
        True,
    )
    torch.testing.assert_close(out, plain[0])
    g1, g2 = grads_of((out, final), mine), grads_of((plain[0], plain[5]), ref)
    for u, v in zip(g1, g2):
        torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-5)
    assert calls == (["fwd", "bwd"] if bwd else ["fwd"])


def test_compiled_path_varlen_states_dtype(monkeypatch):
    """varlen_states come back in C's dtype whichever path ran (the kernel gives float32)."""
    calls = _standins(monkeypatch)
    a = scan_args(batch=1, dtype=torch.float16, seq_idx=torch.int32, init=False)
    a["A"] = a["A"].float()
    a["seq_idx"] = torch.tensor([[0] * 10 + [1] * 11], dtype=torch.int32)
    with torch.no_grad():
        _, varlen = mamba_chunk_scan_combined(
            **a, chunk_size=8, cu_seqlens=torch.tensor([0, 10, 21]), return_varlen_states=True
        )
    assert calls == ["fwd"] and varlen.dtype == torch.float16


def test_kernel_coverage():
    a = scan_args(dtype=torch.float32, seq_idx=torch.int32)
    a["A"] = a["A"].float()
    args = [a[k] for k in ("x", "dt", "A", "B", "C")]
    rest = [a[k] for k in ("D", "z", "dt_bias", "initial_states")]
    assert sc._kernel_covers(*args, 8, *rest, a["seq_idx"], None)
    assert sc._kernel_covers(*args, 256, *rest, None, None)
    assert not sc._kernel_covers(*args, 257, *rest, None, None)
    assert not sc._kernel_covers(*args, 8, *rest, a["seq_idx"].long(), None)
    assert not sc._kernel_covers(*[t.double() for t in args], 8, *rest, None, None)
    assert not sc._kernel_covers(args[0], args[1], args[2], args[3].half(), args[4], 8, *rest, None, None)
    assert not sc._kernel_covers(*args, 8, rest[0].double(), *rest[1:], None, None)
    # varlen states only with the seq_idx marking the sequences
    assert not sc._kernel_covers(*args, 8, *rest, None, torch.tensor([0, 21]))
    assert sc._kernel_covers(*args, 8, *rest, a["seq_idx"], torch.tensor([0, 21]))
    ok, s = sc._kernel_seq_idx(a["seq_idx"].long())
    assert ok and s.dtype == torch.int32 and torch.equal(s.long(), a["seq_idx"].long())
    ok, s = sc._kernel_seq_idx(torch.tensor([[0, 2**31]]))
    assert not ok and s.dtype == torch.int64
    assert sc._kernel_seq_idx(None) == (True, None)


def test_cpu_tensors_never_import_the_extension():
    code = (
        "import sys, torch\n"
        "from selective_scan.ssd_combined import mamba_chunk_scan_combined\n"
        "from selective_scan.ssd_combined import mamba_split_conv1d_scan_combined\n"
        "x = torch.randn(1, 9, 2, 3, requires_grad=True)\n"
        "B = torch.randn(1, 9, 1, 4)\n"
        "mamba_chunk_scan_combined(x, torch.rand(1, 9, 2), -torch.rand(2), B, B, 4).sum().backward()\n"
        "zx = torch.randn(1, 9, 2 * 6 + 8 + 2, requires_grad=True)\n"
        "mamba_split_conv1d_scan_combined(zx, torch.randn(14, 4), None, torch.zeros(2), -torch.rand(2),\n"
        "    torch.ones(2), 4, headdim=3).sum().backward()\n"
        "assert x.grad is not None and zx.grad is not None\n"
        "bad = [m for m in ('selective_scan._ssd_ops', 'selective_scan._cuda') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ------------------------------------------------------------------ the split layer body

W = 4
DIM = NHEADS * HEADDIM
CONV_DIM = DIM + 2 * NGROUPS * DSTATE


def split_args(d_nonssm=0, batch=2, seqlen=19, seed=0, D2=False, bias=True, init=False, seq_idx=False):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=F64) * scale).requires_grad_()

    p = dict(
        zxbcdt=r(batch, seqlen, 2 * d_nonssm + 2 * DIM + 2 * NGROUPS * DSTATE + NHEADS),
        conv1d_weight=r(CONV_DIM, W, scale=0.5),
        conv1d_bias=r(CONV_DIM) if bias else None,
        dt_bias=r(NHEADS, scale=0.5),
        A=(-(torch.rand(NHEADS, generator=g, dtype=F64) + 0.3)).requires_grad_(),
        D=r(NHEADS, HEADDIM) if D2 else r(NHEADS),
        initial_states=r(batch, NHEADS, HEADDIM, DSTATE) if init else None,
    )
    if seq_idx:
        cuts = torch.rand(batch, seqlen, generator=g) < 0.2
        p["seq_idx"] = torch.cumsum(cuts.to(torch.int32), 1).to(torch.int32)
    return p, g


def composed(p, kw):
    """The composed path with autograd through ssd_forward itself (what ran before the Functions)."""

    def plain(x, dt, A, B, C, size, D, z, dt_bias, init, seq_idx, cu_seqlens, softplus, limit, *flags):
        res = ssd_forward(x, dt, A, B, C, size, D, z, dt_bias, init, seq_idx, cu_seqlens, softplus, limit)
        return res[0], res[5], res[6]

    kept, sc._chunk_scan = sc._chunk_scan, plain
    try:
        return _call_composed(p, kw)
    finally:
        sc._chunk_scan = kept


def _call_composed(p, kw):
    meta = sc._ssd_checks.check_split(
        p["zxbcdt"],
        p["conv1d_weight"],
        p["conv1d_bias"],
        p["dt_bias"],
        p["A"],
        p["D"],
        kw.get("activation", "silu"),
        kw.get("rmsnorm_weight"),
        kw.get("rmsnorm_eps", 1e-6),
        kw.get("outproj_weight"),
        kw.get("outproj_bias"),
        kw.get("headdim"),
        kw.get("ngroups", 1),
    )
    return sc._split_composed(
        p["zxbcdt"],
        p["conv1d_weight"],
        p["conv1d_bias"],
        p["dt_bias"],
        p["A"],
        p["D"],
        kw["chunk_size"],
        p.get("initial_states"),
        p.get("seq_idx"),
        kw.get("dt_limit", (0.0, math.inf)),
        kw.get("activation", "silu"),
        kw.get("rmsnorm_weight"),
        kw.get("rmsnorm_eps", 1e-6),
        kw.get("outproj_weight"),
        kw.get("outproj_bias"),
        kw.get("norm_before_gate", True),
        meta,
    )


SPLIT = {
    "gate_only": dict(),
    "rms_before_gate": dict(rms=True),
    "rms_after_gate_nonssm_proj_bias": dict(rms=True, nbg=False, d_nonssm=3, proj=True, pbias=True),
    "proj_no_rms": dict(proj=True, d_nonssm=2),
    "init_seq_idx_D2_limit": dict(rms=True, proj=True, init=True, seq_idx=True, D2=True, limit=(0.05, 0.6)),
    "no_conv_bias_no_activation": dict(rms=True, bias=False, act=None),
}


@pytest.mark.parametrize("final", [False, True])
@pytest.mark.parametrize("case", sorted(SPLIT))
def test_split_gradients_equal_plain_autograd(case, final):
    c = SPLIT[case]
    p, g = split_args(
        c.get("d_nonssm", 0),
        D2=c.get("D2", False),
        bias=c.get("bias", True),
        init=c.get("init", False),
        seq_idx=c.get("seq_idx", False),
    )
    d_in = 2 * 0 + DIM + c.get("d_nonssm", 0)
    kw = dict(
        chunk_size=8,
        headdim=HEADDIM,
        ngroups=NGROUPS,
        norm_before_gate=c.get("nbg", True),
        activation=c.get("act", "silu"),
    )
    if "limit" in c:
        kw["dt_limit"] = c["limit"]
    if c.get("rms"):
        kw["rmsnorm_weight"] = torch.randn(DIM, generator=g, dtype=F64).requires_grad_()
    if c.get("proj"):
        kw["outproj_weight"] = (torch.randn(7, d_in, generator=g, dtype=F64) * 0.3).requires_grad_()
        if c.get("pbias"):
            kw["outproj_bias"] = torch.randn(7, generator=g, dtype=F64).requires_grad_()
    res = mamba_split_conv1d_scan_combined(**p, **kw, return_final_states=final)
    res = res if isinstance(res, tuple) else (res,)
    assert type(res[0].grad_fn).__name__ == MambaSplitConv1dScanCombinedFn.__name__ + "Backward"
    want = composed(p, kw)
    want = want if final else want[:1]
    for u, v in zip(res, want):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)
    tensors = [
        t for t in list(p.values()) + list(kw.values()) if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    gen = torch.Generator().manual_seed(3)
    weights = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in res]
    g1 = torch.autograd.grad(sum((o * w).sum() for o, w in zip(res, weights)), tensors, allow_unused=True)
    g2 = torch.autograd.grad(sum((o * w).sum() for o, w in zip(want, weights)), tensors, allow_unused=True)
    for u, v in zip(g1, g2):
        assert (u is None) == (v is None)
        if u is not None:
            torch.testing.assert_close(u, v, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("only", ["conv1d_weight", "conv1d_bias", "A", "D", "dt_bias", "rmsnorm_weight"])
def test_split_gradient_of_one_input(only):
    """One input requiring grad (the conv weights reach the loss through x, B and C)."""
    p, g = split_args()
    p = {k: (v.detach().requires_grad_(k == only) if v is not None else v) for k, v in p.items()}
    kw = dict(chunk_size=8, headdim=HEADDIM, ngroups=NGROUPS)
    kw["rmsnorm_weight"] = torch.randn(DIM, generator=g, dtype=F64).requires_grad_(only == "rmsnorm_weight")
    leaf = kw["rmsnorm_weight"] if only == "rmsnorm_weight" else p[only]
    out = mamba_split_conv1d_scan_combined(**p, **kw)
    assert type(out.grad_fn).__name__ == MambaSplitConv1dScanCombinedFn.__name__ + "Backward"
    want = composed(p, kw)[0]
    (g1,) = torch.autograd.grad(out.square().sum(), leaf)
    (g2,) = torch.autograd.grad(want.square().sum(), leaf)
    torch.testing.assert_close(g1, g2, rtol=1e-9, atol=1e-9)
    assert g1.abs().max() > 0


def test_split_saves_what_the_original_saves():
    """zxbcdt, conv1d_weight, conv1d_bias, out_x, A, D, dt_bias, initial_states, seq_idx,
    rmsnorm_weight, rstd, outproj_weight, outproj_bias (absent ones are None), nothing else."""
    p, g = split_args(d_nonssm=2, init=True, seq_idx=True)
    kw = dict(
        chunk_size=8,
        headdim=HEADDIM,
        ngroups=NGROUPS,
        rmsnorm_weight=torch.randn(DIM, generator=g, dtype=F64).requires_grad_(),
        outproj_weight=torch.randn(7, DIM + 2, generator=g, dtype=F64).requires_grad_(),
        outproj_bias=torch.randn(7, generator=g, dtype=F64).requires_grad_(),
    )
    out, rows = saved_during(lambda: mamba_split_conv1d_scan_combined(**p, **kw))
    batch, seqlen = p["zxbcdt"].shape[:2]
    assert len(rows) == 13
    for t, k in zip(rows[:3], ("zxbcdt", "conv1d_weight", "conv1d_bias")):
        assert same(t, p[k])
    assert rows[3].shape == (batch, seqlen, NHEADS, HEADDIM) and rows[3].dtype == F64  # out_x
    for t, k in zip(rows[4:9], ("A", "D", "dt_bias", "initial_states", "seq_idx")):
        assert same(t, p[k])
    assert same(rows[9], kw["rmsnorm_weight"])
    assert rows[10].shape == (NGROUPS * batch * seqlen,) and rows[10].dtype == F64  # rstd (float64 here)
    assert same(rows[11], kw["outproj_weight"]) and same(rows[12], kw["outproj_bias"])


def test_split_keeps_less_than_autograd_through_everything():
    """A small Mamba-2 layer (bench/ssd_saved_bytes.py): the Function keeps out_x and rstd beyond
    the inputs; autograd through the composition keeps several times more."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import ssd_saved_bytes as bench
    finally:
        sys.path.pop(0)
    result = bench.measure()
    _, own_before, _ = result["before: autograd through all"]
    _, own_fn, count = result["MambaSplitConv1dScanCombinedFn"]
    # out_x (2, 512, 8, 64) float32 and rstd (1 * 2 * 512,) float32
    assert own_fn == 2 * 512 * 512 * 4 + 2 * 512 * 4
    assert own_before > 10 * own_fn


def test_split_double_backward_is_refused():
    p, _ = split_args()
    out = mamba_split_conv1d_scan_combined(**p, chunk_size=8, headdim=HEADDIM, ngroups=NGROUPS)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), p["zxbcdt"], create_graph=True)


def test_split_compiled_path_wiring(monkeypatch):
    """float32 through the stand-in compiled functions: the split Function's backward hands the
    kept out_x to the compiled backward; gradients as plain autograd's."""
    calls = _standins(monkeypatch)
    p, g = split_args(seq_idx=True, init=True)
    p = {
        k: (v.detach().float().requires_grad_() if v is not None and v.is_floating_point() else v)
        for k, v in p.items()
    }
    kw = dict(
        chunk_size=8,
        headdim=HEADDIM,
        ngroups=NGROUPS,
        return_final_states=True,
        rmsnorm_weight=torch.randn(DIM, generator=g).requires_grad_(),
        outproj_weight=torch.randn(7, DIM, generator=g).requires_grad_(),
    )
    out, final = mamba_split_conv1d_scan_combined(**p, **kw)
    loss = out.square().sum() + final.sum()
    tensors = [p["zxbcdt"], p["conv1d_weight"], p["A"], p["D"], p["initial_states"], kw["rmsnorm_weight"]]
    g1 = torch.autograd.grad(loss, tensors)
    assert calls == ["fwd", "bwd"]
    kw.pop("return_final_states")
    want = composed(p, kw)
    g2 = torch.autograd.grad(want[0].square().sum() + want[1].sum(), tensors)
    for u, v in zip(g1, g2):
        torch.testing.assert_close(u, v, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ torch.compile


@pytest.mark.parametrize("grad", [False, True])
def test_compile_fullgraph_cpu(grad):
    """No graph break on the PyTorch path; with gradients it records autograd through
    ssd_forward (the Function's recompute backward is not traceable)."""
    a = scan_args(dtype=torch.float32, seqlen=20)
    a["A"] = a["A"].float()
    a = leaves(a) if grad else a

    def f(x, dt, A, B, C, D, z, dt_bias, initial_states):
        return mamba_chunk_scan_combined(
            x, dt, A, B, C, 8, D, z, dt_bias, initial_states, dt_softplus=True, return_final_states=True
        )

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="eager")(*(a[k] for k in DIFF))
    want = f(*(a[k] for k in DIFF))
    for u, v in zip(got, want):
        torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-5)
    if grad:
        for u, v in zip(grads_of(got, a), grads_of(want, a)):
            torch.testing.assert_close(u, v, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("grad", [False, True])
def test_split_compile_fullgraph_cpu(grad):
    """The layer body under torch.compile(fullgraph=True): the composed path, autograd through
    its pieces with gradients (the Function's backward is not traceable)."""
    p, g = split_args()
    rms = torch.randn(DIM, generator=g, dtype=F64)
    names = ("zxbcdt", "conv1d_weight", "conv1d_bias", "dt_bias", "A", "D")
    args = [p[k] if grad else p[k].detach() for k in names] + [rms]

    def f(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, rms):
        return mamba_split_conv1d_scan_combined(
            zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, 8, rmsnorm_weight=rms, headdim=HEADDIM,
            ngroups=NGROUPS, return_final_states=True,
        )

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="eager")(*args)
    want = f(*args)
    for u, v in zip(got, want):
        torch.testing.assert_close(u, v)
    if grad:
        g1 = torch.autograd.grad(got[0].sum() + got[1].sum(), args[:6])
        g2 = torch.autograd.grad(want[0].sum() + want[1].sum(), args[:6])
        for u, v in zip(g1, g2):
            torch.testing.assert_close(u, v)


# ------------------------------------------------------------------ GPU


def _cuda_args(dtype, seqlen=300, **kw):
    a = scan_args(dtype=dtype, seqlen=seqlen, **kw)
    return {k: (v.cuda() if v is not None else None) for k, v in a.items()}


def _kernels_run(fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        res = fn()
        torch.cuda.synchronize()
    return res, [e.key for e in prof.key_averages()]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_forward_takes_the_kernel_and_matches_pytorch(dtype, monkeypatch):
    a = _cuda_args(dtype, seq_idx=torch.int64)
    a["A"] = a["A"].float()
    run = lambda: mamba_chunk_scan_combined(**a, chunk_size=64, dt_softplus=True, return_final_states=True)  # noqa: E731
    (out, final), names = _kernels_run(run)
    assert any("chunk_scan_kernel" in n for n in names), names
    assert final.dtype == torch.float32
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "reference")
    (ref_out, ref_final), names = _kernels_run(run)
    assert not any("chunk_scan_kernel" in n for n in names)
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(final, ref_final, rtol=tol, atol=tol)


@pytest.mark.gpu
def test_gpu_split_forward_and_backward_take_the_kernel():
    p, g = split_args(seqlen=200)
    p = {
        k: (v.detach().float().cuda().requires_grad_() if v is not None and v.is_floating_point() else v)
        for k, v in p.items()
    }
    kw = dict(
        chunk_size=64,
        headdim=HEADDIM,
        ngroups=NGROUPS,
        rmsnorm_weight=torch.randn(DIM, generator=g).cuda().requires_grad_(),
    )
    out, names = _kernels_run(lambda: mamba_split_conv1d_scan_combined(**p, **kw))
    assert any("chunk_scan_kernel" in n for n in names), names
    want = composed(p, kw)[0]  # grads: the Function's backward against autograd through the PyTorch path
    torch.testing.assert_close(out, want, rtol=1e-3, atol=1e-3)
    g1 = torch.autograd.grad(out.sum(), p["zxbcdt"])[0]
    g2 = torch.autograd.grad(want.sum(), p["zxbcdt"])[0]
    torch.testing.assert_close(g1, g2, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
def test_gpu_compile_fullgraph_takes_the_kernel():
    a = _cuda_args(torch.bfloat16, seqlen=130, seq_idx=torch.int32)
    a["A"] = a["A"].float()

    def f(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx):
        return mamba_chunk_scan_combined(
            x, dt, A, B, C, 64, D, z, dt_bias, initial_states, seq_idx, dt_softplus=True
        )

    args = [a[k] for k in DIFF + ("seq_idx",)]
    want = f(*args)  # eager first: the dispatch's checks and the extension's import are done
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got, names = _kernels_run(lambda: compiled(*args))
    assert any("chunk_scan_kernel" in n for n in names), names
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_backend_cuda_refuses_cpu_tensors_as_every_kernel(fresh, monkeypatch):
    """The dispatch decides for CPU tensors too: MAMBA_KERNELS_BACKEND=cuda is an error there
    (the compiled path cannot run), reference runs the PyTorch path."""
    a = scan_args()
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "cuda")
    with pytest.raises(RuntimeError, match="MAMBA_KERNELS_BACKEND=cuda"):
        mamba_chunk_scan_combined(**a, chunk_size=8)
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "reference")
    assert mamba_chunk_scan_combined(**a, chunk_size=8).shape == a["x"].shape
