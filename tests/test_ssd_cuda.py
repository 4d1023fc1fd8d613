"""Tests of the compiled SSD chunked-scan forward and backward (selective_scan._ssd_ops, csrc/ssd).

Every GPU result is compared with a float64 step-by-step recurrence written here (per head:
h_t = exp(dt_t A) h_(t-1) + dt_t x_t B_t^T, reset where seq_idx changes; y_t = C_t h_t + D x_t;
the silu(z) gate), run on float64 copies of the very same inputs. Inputs are fresh random
tensors; the op allocates its outputs with torch.empty, so the tests check that no NaN is left
in them. The backward's gradients are compared with autograd through the same recurrence
(``reference_grads``). GPU tests are marked ``gpu`` and skipped without a GPU (conftest.py); the
tests in the CPU section at the end (the schemas with their fakes, the reference checked against
chunk formulas and the PyTorch path, the backward's formulas phase by phase) run on CPU.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

gpu = pytest.mark.gpu
F64 = torch.float64
ROOT = Path(__file__).resolve().parents[1]
# max |ours - reference| / max |reference| per activation dtype: fp32 runs fp32 FMAs; 16-bit
# inputs run bf16 / fp16 tensor-core products of 16-bit operands (x dt-scaled, the state, the
# decayed C B^T), the output rounded to the dtype.
TOL = {torch.float32: 2e-4, torch.float16: 8e-3, torch.bfloat16: 4e-2}


@pytest.fixture
def ops():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from selective_scan import _ssd_ops

    return _ssd_ops


def make(batch=2, seqlen=200, nheads=4, headdim=64, dstate=64, ngroups=1, dtype=torch.float32, D="head",
         z=False, dt_bias=False, init=False, seq_idx=False, device="cuda"):
    g = dict(device=device)
    x = torch.randn(batch, seqlen, nheads, headdim, **g).to(dtype)
    dt = (torch.randn(batch, seqlen, nheads, **g) * 0.5 - 1.0)
    if not dt_bias:
        dt = F.softplus(dt)  # positive steps without the op's softplus
    A = -torch.exp(torch.rand(nheads, **g) * 1.5)
    B = torch.randn(batch, seqlen, ngroups, dstate, **g).to(dtype)
    C = torch.randn(batch, seqlen, ngroups, dstate, **g).to(dtype)
    args = dict(x=x, dt=dt, A=A, B=B, C=C)
    args["D"] = {None: None, "head": torch.randn(nheads, **g),
                 "channel": torch.randn(nheads, headdim, **g)}[D]
    args["z"] = torch.randn(batch, seqlen, nheads, headdim, **g).to(dtype) if z else None
    args["dt_bias"] = torch.randn(nheads, **g) * 0.5 if dt_bias else None
    args["initial_states"] = torch.randn(batch, nheads, headdim, dstate, **g) if init else None
    if seq_idx:
        # nondecreasing ids, a few sequences per row, boundaries anywhere (also inside chunks)
        cuts = torch.rand(batch, seqlen, **g) < 3.0 / max(seqlen, 1)
        cuts[:, 0] = False
        args["seq_idx"] = torch.cumsum(cuts.int(), dim=1).to(torch.int32)
    else:
        args["seq_idx"] = None
    return args


def reference(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
              dt_softplus=False, dt_limit=(0.0, float("inf"))):
    """The recurrence in float64, step by step: (out, out_x, dt, dA_cumsum, states, final)."""
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    xd = x.to(F64)
    d = dt.to(F64)
    if dt_bias is not None:
        d = d + dt_bias.to(F64)
    if dt_softplus:
        d = torch.where(d <= 20.0, torch.log1p(torch.exp(d)), d)
    d = d.clamp(dt_limit[0], dt_limit[1])  # always, as mamba_ssm: (0, inf) zeroes a negative dt
    Ad = A.to(F64)
    Bh = B.to(F64).repeat_interleave(nheads // ngroups, dim=2)
    Ch = C.to(F64).repeat_interleave(nheads // ngroups, dim=2)
    h = (initial_states.to(F64).clone() if initial_states is not None
         else torch.zeros(batch, nheads, headdim, dstate, dtype=F64, device=x.device))
    prev = torch.zeros(batch, dtype=torch.int32, device=x.device)
    nchunks = -(-seqlen // chunk_size)
    states = torch.zeros(batch, nchunks, nheads, headdim, dstate, dtype=F64, device=x.device)
    ys = []
    for t in range(seqlen):
        if t % chunk_size == 0:
            states[:, t // chunk_size] = h
        if seq_idx is not None:
            reset = seq_idx[:, t] != prev
            h = torch.where(reset[:, None, None, None], torch.zeros_like(h), h)
            prev = seq_idx[:, t]
        decay = torch.exp(d[:, t] * Ad)  # (batch, nheads)
        dx = d[:, t, :, None, None] * xd[:, t, :, :, None]
        h = decay[..., None, None] * h + dx * Bh[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", h, Ch[:, t]))
    y = torch.stack(ys, dim=1) if ys else torch.zeros_like(xd)
    if D is not None:
        Dd = D.to(F64)
        y = y + (Dd[None, None, :, None] if Dd.dim() == 1 else Dd[None, None]) * xd
    out = y * F.silu(z.to(F64)) if z is not None else y
    # dt and its running sum per chunk, (batch, nheads, nchunks, chunk): 0 and flat past seqlen
    pad = nchunks * chunk_size - seqlen
    dpad = F.pad(d, (0, 0, 0, pad))  # (batch, nchunks * chunk, nheads)
    dtc = dpad.permute(0, 2, 1).reshape(batch, nheads, nchunks, chunk_size)
    cs = torch.cumsum(dtc * Ad[None, :, None, None], dim=-1)
    return out, (y if z is not None else None), dtc, cs, states, h


def call(ops, args, chunk_size, **kw):
    return ops.ssd_forward_cuda(args["x"], args["dt"], args["A"], args["B"], args["C"], chunk_size,
                                D=args["D"], z=args["z"], dt_bias=args["dt_bias"],
                                initial_states=args["initial_states"], seq_idx=args["seq_idx"], **kw)


def close(got, want, tol, what):
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert not torch.isnan(got).any(), f"{what}: NaN left in the output"
    err = (got.to(F64) - want).abs().max().item() if want.numel() else 0.0
    scale = max(want.abs().max().item(), 1.0) if want.numel() else 1.0
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol} x {scale:.3g}"


def check(ops, args, chunk_size, dtype, **kw):
    got = call(ops, args, chunk_size, **kw)
    want = reference(**args, chunk_size=chunk_size, **kw)
    seqlen = args["x"].shape[1]
    tol = TOL[dtype]
    out, out_x, dt_out, cs, states, final = got
    assert out.dtype == args["x"].dtype and out.shape == args["x"].shape
    close(out, want[0], tol, "out")
    if args["z"] is not None:
        assert out_x is not None and out_x.dtype == out.dtype
        close(out_x, want[1], tol, "out_x")
    else:
        assert out_x is None
    for t in (dt_out, cs, states, final):
        assert t.dtype == torch.float32
    close(dt_out, want[2], 1e-5, "dt_out")
    close(cs, want[3], 1e-4, "dA_cumsum")
    close(states, want[4], tol, "states")
    close(final, want[5], tol, "final_states")
    assert dt_out.shape[2] == -(-seqlen // chunk_size)
    return got


DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [64, 128, 256, 37, 100])  # 37: odd rows of C B^T; 100: a partial t-tile
def test_dtypes_and_chunks(ops, dtype, chunk):
    args = make(seqlen=2 * chunk + 37, dtype=dtype)  # odd length: a short last chunk
    check(ops, args, chunk, dtype)


@gpu
@pytest.mark.parametrize("seqlen", [1, 17, 63, 64, 128, 192, 300])
def test_lengths(ops, seqlen):
    # shorter than a chunk, exactly k chunks, a few steps past
    args = make(seqlen=seqlen, dtype=torch.bfloat16, nheads=2)
    check(ops, args, 64, torch.bfloat16)


@gpu
@pytest.mark.parametrize("headdim", [32, 64, 128, 37, 40])  # 40: vector reads, a partial tile
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_headdims(ops, headdim, dtype):
    args = make(seqlen=150, headdim=headdim, dtype=dtype, nheads=2)
    check(ops, args, 64, dtype)


@gpu
@pytest.mark.parametrize("dstate", [16, 64, 128, 256, 20, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_dstates(ops, dstate, dtype):
    args = make(seqlen=140, dstate=dstate, dtype=dtype, nheads=2, headdim=32)
    check(ops, args, 64, dtype)


@gpu
@pytest.mark.parametrize("ngroups", [1, 4, 8])
def test_groups(ops, ngroups):
    args = make(seqlen=130, nheads=8, ngroups=ngroups, dtype=torch.bfloat16, headdim=32)
    check(ops, args, 64, torch.bfloat16)


@gpu
@pytest.mark.parametrize("D", [None, "head", "channel"])
@pytest.mark.parametrize("z", [False, True])
def test_D_and_gate(ops, D, z):
    args = make(seqlen=100, D=D, z=z, dtype=torch.float32)
    check(ops, args, 64, torch.float32)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_dt_bias_softplus_limit(ops, dtype):
    args = make(seqlen=170, dt_bias=True, dtype=dtype)
    check(ops, args, 64, dtype, dt_softplus=True, dt_limit=(0.05, 0.6))
    check(ops, args, 64, dtype, dt_softplus=True)
    args["dt"] = args["dt"].to(dtype)  # dt in the activations' dtype (mamba2's projection split)
    check(ops, args, 64, dtype, dt_softplus=True)


@gpu
def test_parameters_in_16_bit(ops):
    # A, D, dt_bias and the initial states may each be float16 / bfloat16 (read as they are)
    args = make(seqlen=100, dt_bias=True, init=True, D="channel", dtype=torch.bfloat16)
    for k, t in (("A", torch.bfloat16), ("D", torch.float16), ("dt_bias", torch.bfloat16),
                 ("initial_states", torch.float16)):
        args[k] = args[k].to(t)
    check(ops, args, 64, torch.bfloat16, dt_softplus=True)


@gpu
def test_default_limit_zeroes_negative_dt(ops):
    args = make(seqlen=150, dtype=torch.float32)
    args["dt"] = torch.randn_like(args["dt"])  # negative steps without softplus: clamped to 0
    got = check(ops, args, 64, torch.float32)
    assert (got[2] >= 0).all() and (got[2] == 0).any()


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [64, 256])
def test_initial_states_and_seq_idx(ops, dtype, chunk):
    args = make(seqlen=3 * chunk - 11, init=True, seq_idx=True, z=True, dtype=dtype)
    check(ops, args, chunk, dtype)
    args["seq_idx"] = args["seq_idx"] + 1  # the first sequence is not 0: the initial state is dropped
    check(ops, args, chunk, dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [64, 256])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_varlen_states(ops, dtype, chunk, index_dtype):
    # packed sequences (batch 1): one crossing chunks, an empty one, one starting exactly on a chunk
    # boundary (128), one ending on one (192), a long last one; the first starts from the initial state
    lens = [5, 123, 0, 64, 100, 166]
    args = make(batch=1, seqlen=sum(lens), dtype=dtype, init=True, z=True)
    ids = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    args["seq_idx"] = ids.to(torch.int32)[None].cuda()
    cu = torch.tensor([0] + lens).cumsum(0).to(index_dtype).cuda()
    got = ops.ssd_forward_cuda(args["x"], args["dt"], args["A"], args["B"], args["C"], chunk, D=args["D"],
                               z=args["z"], initial_states=args["initial_states"], seq_idx=args["seq_idx"],
                               cu_seqlens=cu)
    assert len(got) == 7
    check(ops, args, chunk, dtype)  # the other outputs as without cu_seqlens
    varlen = got[6]
    assert varlen.shape == (len(lens),) + args["initial_states"].shape[1:] and varlen.dtype == torch.float32
    for i, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        part = {k: (v[:, start:end] if k in ("x", "dt", "B", "C", "z") else v) for k, v in args.items()}
        part["seq_idx"] = None
        part["initial_states"] = args["initial_states"] if i == 0 else None
        want = reference(**part, chunk_size=chunk)[5]
        close(varlen[i:i + 1], want, TOL[dtype], f"varlen_states[{i}]")


@gpu
def test_seq_idx_change_at_chunk_starts(ops):
    args = make(seqlen=256, init=True, seq_idx=True, dtype=torch.float32)
    args["seq_idx"] = (torch.arange(256, device="cuda") // 64).to(torch.int32).expand(2, 256).contiguous()
    check(ops, args, 64, torch.float32)


SPLIT_SIZES = (2, 133, 4, 32, 2, 32)  # batch, seqlen, nheads, headdim, ngroups, dstate


def _split_projection(dtype):
    """The operands as mamba2's split of one projection makes them: x, z, B, C and dt are
    strided slices of one (batch, seqlen, width) tensor."""
    batch, seqlen, nheads, headdim, ngroups, dstate = SPLIT_SIZES
    width = 2 * nheads * headdim + 2 * ngroups * dstate + nheads + 5
    zxbcdt = torch.randn(batch, seqlen, width, device="cuda").to(dtype)
    o = 0
    z = zxbcdt[..., o:o + nheads * headdim].view(batch, seqlen, nheads, headdim)
    o += nheads * headdim
    x = zxbcdt[..., o:o + nheads * headdim].view(batch, seqlen, nheads, headdim)
    o += nheads * headdim
    B = zxbcdt[..., o:o + ngroups * dstate].view(batch, seqlen, ngroups, dstate)
    o += ngroups * dstate
    C = zxbcdt[..., o:o + ngroups * dstate].view(batch, seqlen, ngroups, dstate)
    o += ngroups * dstate
    dt = zxbcdt[..., o:o + nheads].float() * 0.5
    return dict(x=x, dt=dt, A=-torch.rand(nheads, device="cuda") - 0.5, B=B, C=C,
                D=torch.randn(nheads, headdim, device="cuda"), z=z,
                dt_bias=torch.randn(nheads, device="cuda") * 0.3, initial_states=None, seq_idx=None)


def _restride(args, dtype):
    """x with a non-contiguous last axis, B with its heads and steps transposed, initial states
    with their last two axes transposed; no z."""
    batch, seqlen, nheads, headdim, ngroups, dstate = SPLIT_SIZES
    big = torch.randn(batch, seqlen, nheads, 2 * headdim, device="cuda").to(dtype)
    args["x"] = big[..., ::2]
    args["z"] = None
    args["B"] = torch.randn(batch, ngroups, seqlen, dstate, device="cuda").to(dtype).transpose(1, 2)
    args["initial_states"] = torch.randn(batch, nheads, dstate, headdim, device="cuda").transpose(2, 3)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_inputs(ops, dtype):
    # mamba2's split of one projection: x, z, B, C and dt are slices of a bigger tensor
    args = _split_projection(dtype)
    check(ops, args, 64, dtype, dt_softplus=True)
    # a non-contiguous last axis and transposed heads
    _restride(args, dtype)
    check(ops, args, 64, dtype, dt_softplus=True)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["x", "B", "C", "dt"])
def test_nan_reaches_no_earlier_step(ops, dtype, where):
    chunk, seqlen, t = 64, 200, 90  # step 90: inside chunk 1, not on a 16-step boundary
    args = make(seqlen=seqlen, dtype=dtype, z=True)
    want = reference(**args, chunk_size=chunk)
    poisoned = dict(args)
    poisoned[where] = args[where].clone()
    poisoned[where][:, t] = float("nan")
    out = call(ops, poisoned, chunk)[0]
    assert not torch.isnan(out[:, :t]).any(), "a NaN reached an earlier step"
    close(out[:, :t], want[0][:, :t], TOL[dtype], "out before the NaN")
    if where in ("x", "dt", "B"):
        assert torch.isnan(out[:, t:]).any()


@gpu
def test_inf_in_x_reaches_no_earlier_step(ops):
    args = make(seqlen=100, dtype=torch.bfloat16)
    args["x"][:, 70] = float("inf")
    out = call(ops, args, 64)[0]
    assert torch.isfinite(out[:, :70]).all()


@gpu
def test_empty_and_long(ops):
    args = make(batch=1, seqlen=0, init=True)
    out, _, dt_out, cs, states, final = call(ops, args, 64)
    assert out.shape[1] == 0 and states.shape[1] == 0
    torch.testing.assert_close(final, args["initial_states"])
    args = make(batch=1, seqlen=1500, nheads=1, headdim=16, dstate=16, dtype=torch.float32)
    check(ops, args, 256, torch.float32)


@gpu
def test_errors_name_the_argument(ops):
    args = make(seqlen=64)

    def err(match, **change):
        a = dict(args)
        chunk = change.pop("chunk", 64)
        a.update(change)
        with pytest.raises((RuntimeError, TypeError), match=match):
            call(ops, a, chunk)

    x, B = args["x"], args["B"]
    err(r"x must be \(batch, seqlen, nheads, headdim\)", x=x[0])
    err(r"x must be float32, float16 or bfloat16", x=x.double())
    err(r"chunk_size must be in 1..256", chunk=512)
    err(r"dt must have shape \[2, 64, 4\]", dt=args["dt"][:, :10])
    err(r"A must have shape \[4\]", A=args["A"][:2])
    err(r"nheads must be divisible by ngroups", B=B.expand(-1, -1, 3, -1), C=B.expand(-1, -1, 3, -1))
    err(r"B must have x's dtype", B=B.half())
    err(r"C must have shape", C=args["C"][:, :, :, :8])
    err(r"D must have shape", D=torch.randn(3, device="cuda"))
    err(r"z must have shape", z=x[:, :, :, :8])
    err(r"dt_bias must have shape", dt_bias=torch.randn(5, device="cuda"))
    err(r"initial_states must have shape", initial_states=torch.randn(2, 4, 64, 8, device="cuda"))
    err(r"seq_idx must be int32", seq_idx=torch.zeros(2, 64, dtype=torch.int64, device="cuda"))
    err(r"seq_idx must have shape", seq_idx=torch.zeros(2, 63, dtype=torch.int32, device="cuda"))
    err(r"A must be on x's device", A=args["A"].cpu())
    err(r"x must be a CUDA tensor", x=x.cpu())
    with pytest.raises(RuntimeError, match=r"cu_seqlens needs batch 1"):
        ops.ssd_forward_cuda(x, args["dt"], args["A"], B, args["C"], 64,
                             cu_seqlens=torch.tensor([0, 64], dtype=torch.int32, device="cuda"))
    with pytest.raises((RuntimeError, TypeError), match=r"cu_seqlens must be int32 or int64"):
        ops.ssd_forward_cuda(x[:1], args["dt"][:1], args["A"], B[:1], args["C"][:1], 64,
                             cu_seqlens=torch.tensor([0.0, 64.0], device="cuda"))


@gpu
def test_compile_fullgraph(ops):
    args = make(seqlen=80, z=True)

    def f(x, dt, A, B, C, D, z):
        out = ops.ssd_forward_cuda(x, dt, A, B, C, 64, D=D, z=z)
        return out[0] * 2, out[5]

    a = [args[k] for k in ("x", "dt", "A", "B", "C", "D", "z")]
    eager = f(*a)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(*a)
    torch.testing.assert_close(compiled[0], eager[0])
    torch.testing.assert_close(compiled[1], eager[1])


# ------------------------------------------------------------------------- backward (GPU)

GRAD_KEYS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")
# max |ours - reference| / max(|reference|, 1) per activation dtype. The 16-bit path multiplies
# 16-bit operands (dy, x, the decayed C B^T and its gradient, the states and their gradients) on
# tensor cores; the per-head sums (dA, dt_bias, D) add many terms of both signs, hence a factor.
BWD_TOL = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 6e-2}
SUM_FACTOR = {"dA": 4.0, "ddt_bias": 4.0, "dD": 4.0}
GRAD_NAMES = ("dx", "ddt", "dA", "dB", "dC", "dD", "dz", "ddt_bias", "dinitial_states")


def reference_grads(args, chunk_size, dout, dfinal=None, **kw):
    """Gradients of sum(out dout) + sum(final dfinal) through the float64 recurrence (autograd),
    in GRAD_NAMES order (None where the input is None)."""
    leaves = {k: args[k].detach().to(F64).requires_grad_() for k in GRAD_KEYS if args.get(k) is not None}
    a = dict(args)
    a.update(leaves)
    out, _, _, _, _, final = reference(**a, chunk_size=chunk_size, **kw)
    loss = (out * dout.to(F64)).sum()
    if dfinal is not None:
        loss = loss + (final * dfinal.to(F64)).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    got = dict(zip(leaves, grads))
    return tuple(got.get(k) for k in GRAD_KEYS)


def call_bwd(ops, args, chunk_size, dout, dfinal=None, **kw):
    fwd = call(ops, args, chunk_size, **kw)
    y = fwd[1] if args["z"] is not None else fwd[0]
    return ops.ssd_backward_cuda(dout, args["x"], args["dt"], args["A"], args["B"], args["C"], y, chunk_size,
                                 D=args["D"], z=args["z"], dt_bias=args["dt_bias"],
                                 initial_states=args["initial_states"], dfinal_states=dfinal,
                                 seq_idx=args["seq_idx"], **kw)


def check_bwd(ops, args, chunk_size, dtype, dfinal=False, **kw):
    x = args["x"]
    dout = torch.randn(x.shape, device=x.device).to(x.dtype)
    dfin = None
    if dfinal:
        b, _, h, p = x.shape
        dfin = torch.randn(b, h, p, args["B"].shape[-1], device=x.device)
    got = call_bwd(ops, args, chunk_size, dout, dfin, **kw)
    want = reference_grads(args, chunk_size, dout, dfin, **kw)
    assert len(got) == 9
    for name, g, w, key in zip(GRAD_NAMES, got, want, GRAD_KEYS):
        if args.get(key) is None:
            assert g is None, f"{name} given for an absent input"
            continue
        inp = args[key]
        assert g.dtype == inp.dtype and g.shape == inp.shape, (name, g.dtype, g.shape)
        close(g, w, BWD_TOL[dtype] * SUM_FACTOR.get(name, 1.0), name)
    return got


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [64, 128, 256])
def test_bwd_dtypes_and_chunks(ops, dtype, chunk):
    args = make(seqlen=2 * chunk + 37, dtype=dtype, z=True)  # odd length: a short last chunk
    check_bwd(ops, args, chunk, dtype)


@gpu
@pytest.mark.parametrize("seqlen", [1, 17, 63, 64, 130])
def test_bwd_lengths(ops, seqlen):
    check_bwd(ops, make(seqlen=seqlen, init=True), 64, torch.float32, dfinal=True)


@gpu
@pytest.mark.parametrize("headdim", [37, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bwd_headdims(ops, headdim, dtype):
    check_bwd(ops, make(seqlen=150, headdim=headdim, dtype=dtype, D="channel"), 64, dtype)


@gpu
@pytest.mark.parametrize("dstate", [16, 64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_bwd_dstates(ops, dstate, dtype):
    check_bwd(ops, make(seqlen=150, dstate=dstate, dtype=dtype, init=True), 64, dtype)


@gpu
@pytest.mark.parametrize("ngroups", [1, 2, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bwd_groups(ops, ngroups, dtype):
    check_bwd(ops, make(seqlen=140, nheads=8, ngroups=ngroups, dtype=dtype), 64, dtype)


@gpu
@pytest.mark.parametrize("D", [None, "head", "channel"])
@pytest.mark.parametrize("z", [False, True])
def test_bwd_D_and_gate(ops, D, z):
    check_bwd(ops, make(seqlen=100, D=D, z=z), 64, torch.float32)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_bwd_dt_bias_softplus_limit(ops, dtype):
    args = make(seqlen=160, dtype=dtype, dt_bias=True, z=True)
    lo, hi = 0.2, 0.6
    sp = F.softplus(args["dt"] + args["dt_bias"])
    assert ((sp < lo) | (sp > hi)).any() and ((sp > lo) & (sp < hi)).any()  # clamped steps and free ones
    check_bwd(ops, args, 64, dtype, dt_softplus=True, dt_limit=(lo, hi))
    check_bwd(ops, args, 64, dtype, dt_softplus=True)


@gpu
def test_bwd_default_limit_zeroes_negative_dt(ops):
    args = make(seqlen=90)
    args["dt"] = torch.randn_like(args["dt"])  # negative steps: clamped to 0, no gradient
    got = check_bwd(ops, args, 64, torch.float32)
    assert (got[1][args["dt"] < 0] == 0).all()


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [64, 256])
def test_bwd_initial_final_and_seq_idx(ops, dtype, chunk):
    args = make(seqlen=3 * chunk - 11, dtype=dtype, init=True, seq_idx=True, z=True, dt_bias=True)
    check_bwd(ops, args, chunk, dtype, dfinal=True, dt_softplus=True)


@gpu
def test_bwd_seq_idx_change_at_chunk_starts(ops):
    args = make(seqlen=256, init=True)
    args["seq_idx"] = (torch.arange(256, device="cuda") // 64).to(torch.int32)[None].repeat(2, 1)
    check_bwd(ops, args, 64, torch.float32, dfinal=True)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bwd_strided_inputs(ops, dtype):
    batch, seqlen, nheads, headdim, ngroups, dstate = SPLIT_SIZES
    args = _split_projection(dtype)
    check_bwd(ops, args, 64, dtype, dt_softplus=True)
    _restride(args, dtype)
    check_bwd(ops, args, 64, dtype, dfinal=True, dt_softplus=True)
    # a strided dout and out
    fwd = call(ops, args, 64, dt_softplus=True)
    dout = torch.randn(batch, nheads, seqlen, headdim, device="cuda").to(dtype).transpose(1, 2)
    got = ops.ssd_backward_cuda(dout, args["x"], args["dt"], args["A"], args["B"], args["C"], fwd[0], 64,
                                D=args["D"], dt_bias=args["dt_bias"], initial_states=args["initial_states"],
                                dt_softplus=True)
    want = ops.ssd_backward_cuda(dout.contiguous(), args["x"], args["dt"], args["A"], args["B"], args["C"],
                                 fwd[0], 64, D=args["D"], dt_bias=args["dt_bias"],
                                 initial_states=args["initial_states"], dt_softplus=True)
    for g, w in zip(got, want):
        if w is not None:
            assert torch.equal(g, w)


@gpu
def test_bwd_poisoned_outputs(ops):
    """The op allocates with torch.empty: NaN-filled memory handed back to the allocator must not
    show through (every output element and every workspace element read is written)."""
    args = make(seqlen=200, dtype=torch.bfloat16, z=True, init=True, D="channel", dt_bias=True)
    poison = torch.full((64 << 20,), float("nan"), device="cuda")
    del poison
    check_bwd(ops, args, 128, torch.bfloat16, dfinal=True, dt_softplus=True)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_bwd_deterministic(ops, dtype):
    args = make(batch=2, seqlen=300, nheads=8, ngroups=2, dtype=dtype, z=True, init=True, dt_bias=True,
                D="channel", seq_idx=True)
    dout = torch.randn(args["x"].shape, device="cuda").to(dtype)
    dfin = torch.randn(2, 8, 64, 64, device="cuda")
    one = call_bwd(ops, args, 64, dout, dfin, dt_softplus=True)
    for _ in range(2):
        two = call_bwd(ops, args, 64, dout, dfin, dt_softplus=True)
        for a, b in zip(one, two):
            assert a is None or torch.equal(a, b), "two runs differ"


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [90, 127, 128])  # inside a chunk, its last step, its first step
def test_bwd_nan_in_dout_reaches_no_later_step(ops, dtype, t):
    """Gradients flow backward in time: the gradient of an input at step s depends on dout at
    steps >= s only. A NaN in dout at step t may reach every gradient at steps <= t (and the
    per-head ones), none at a later step; there they equal the gradients with dout[t] = 0 up to
    one rounding of the output dtype: with dout all finite the diagonal tile of dx's intra-chunk
    product runs on tensor cores, with the NaN it takes the exact terms apart (another order of
    the same sum)."""
    args = make(seqlen=200, dtype=dtype, z=True, init=True, dt_bias=True)
    dout = torch.randn(args["x"].shape, device="cuda").to(dtype)
    dout[:, t] = 0
    clean = call_bwd(ops, args, 64, dout, dt_softplus=True)
    dout[:, t] = float("nan")
    got = call_bwd(ops, args, 64, dout, dt_softplus=True)
    for name, g, c in zip(GRAD_NAMES, got, clean):
        if name not in ("dx", "ddt", "dB", "dC", "dz"):
            continue
        assert torch.isfinite(g[:, t + 1:]).all(), f"{name}: a NaN reached a later step"
        ulp = {torch.float32: 1e-5, torch.float16: 2.0**-9, torch.bfloat16: 2.0**-6}[dtype]
        later = c[:, t + 1:]
        atol = ulp * later.abs().max().item()
        torch.testing.assert_close(g[:, t + 1:], later, rtol=ulp, atol=atol, msg=name)
    assert torch.isnan(got[0][:, t]).any()


@gpu
def test_bwd_empty(ops):
    args = make(batch=1, seqlen=0, init=True)
    dfin = torch.randn(1, 4, 64, 64, device="cuda")
    got = call_bwd(ops, args, 64, torch.empty_like(args["x"]), dfin)
    assert got[0].shape == args["x"].shape
    torch.testing.assert_close(got[8], dfin)
    assert (got[2] == 0).all() and (got[5] == 0).all()


@gpu
@pytest.mark.parametrize("shape", [dict(headdim=0), dict(dstate=0)])
def test_bwd_stateless(ops, shape):
    # no state (the kernels need headdim and dstate >= 1): the wrapper's y = D x gradients; y
    # from the reference (the compiled forward writes no output when dstate is 0)
    args = make(seqlen=70, z=True, init=True, dt_bias=True, D="channel", **shape)
    dout = torch.randn(args["x"].shape, device="cuda")
    y = reference(**args, chunk_size=64)[1].float()
    got = ops.ssd_backward_cuda(dout, args["x"], args["dt"], args["A"], args["B"], args["C"], y, 64,
                                D=args["D"], z=args["z"], dt_bias=args["dt_bias"],
                                initial_states=args["initial_states"])
    want = reference_grads(args, 64, dout)
    for name, g, w in zip(GRAD_NAMES, got, want):
        close(g, w if w is not None else torch.zeros(g.shape, dtype=F64, device="cuda"), 1e-4, name)


@gpu
def test_bwd_errors_name_the_argument(ops):
    args = make(seqlen=64, z=True)
    x = args["x"]
    fwd = call(ops, args, 64)

    def err(match, dout=x, out=fwd[1], dfinal=None, **change):
        a = dict(args)
        chunk = change.pop("chunk", 64)
        a.update(change)
        with pytest.raises((RuntimeError, TypeError), match="ssd_chunk_scan_bwd: " + match):
            ops.ssd_backward_cuda(dout, a["x"], a["dt"], a["A"], a["B"], a["C"], out, chunk, D=a["D"],
                                  z=a["z"], dt_bias=a["dt_bias"], initial_states=a["initial_states"],
                                  dfinal_states=dfinal, seq_idx=a["seq_idx"])

    err(r"dout must have shape \[2, 64, 4, 64\] \(like x\)", dout=x[:, :10])
    err(r"out must have shape", out=x[:, :, :2])
    err(r"dfinal_states must have shape", dfinal=torch.randn(2, 4, 64, 8, device="cuda"))
    err(r"dfinal_states must be on x's device", dfinal=torch.randn(2, 4, 64, 64))
    err(r"chunk_size must be in 1..256", chunk=0)
    err(r"dt must have shape", dt=args["dt"][:, :10])
    err(r"B must have x's dtype", B=args["B"].half())
    err(r"x must be float32, float16 or bfloat16", x=x.double())
    err(r"dout must be float32, float16 or bfloat16", dout=x.double())


@gpu
def test_bwd_compile_fullgraph(ops):
    args = make(seqlen=80, z=True)
    dout = torch.randn_like(args["x"])

    def f(x, dt, A, B, C, D, z, y):
        return ops.ssd_backward_cuda(dout, x, dt, A, B, C, y, 64, D=D, z=z)

    y = call(ops, args, 64)[1]
    a = [args[k] for k in ("x", "dt", "A", "B", "C", "D", "z")] + [y]
    eager = f(*a)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(*a)
    for e, c in zip(eager, compiled):
        assert (e is None) == (c is None)
        if e is not None:
            torch.testing.assert_close(c, e)


# ------------------------------------------------------------------------------ CPU


def _schemas() -> dict:
    """The op schemas of csrc/ssd/ssd_ops.h by name (adjacent string literals joined)."""
    text = (ROOT / "csrc" / "ssd" / "ssd_ops.h").read_text()
    body = re.search(r"kSsdSchemas\[\] = \{(.*?)\};", text, re.S).group(1)
    joined = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', body))
    parts = [p for p in re.split(r"(?=ssd_chunk_scan_\w+\()", joined) if p]
    return {p[:p.index("(")]: p for p in parts}


def _schema() -> str:
    return _schemas()["ssd_chunk_scan_fwd"]


def test_schema_traces_with_the_fake_impl():
    """The schema of csrc/ssd/ssd_ops.h with the fake implementation of _ssd_meta, in a scratch
    namespace: torch.compile's view of the op (shapes and dtypes), without the extension."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from selective_scan._ssd_meta import OP_NAME, ssd_fwd_fake

    schema = _schema()
    assert schema.startswith(OP_NAME + "(")
    ns = "mk_ssd_schema_test"
    lib = torch.library.Library(ns, "FRAGMENT")
    if not hasattr(getattr(torch.ops, ns), OP_NAME):
        lib.define(schema)
    qual = f"{ns}::{OP_NAME}"
    if hasattr(torch.library, "register_fake"):
        torch.library.register_fake(qual, ssd_fwd_fake, lib=lib)
    else:  # torch < 2.4
        torch.library.impl_abstract(qual, ssd_fwd_fake, lib=lib)
    op = getattr(getattr(torch.ops, ns), OP_NAME).default

    with FakeTensorMode():
        a = make(batch=2, seqlen=300, nheads=4, headdim=32, dstate=16, ngroups=2, dtype=torch.bfloat16,
                 z=True, device="cpu")
        none4 = (None, None, None, None)  # dt_bias, initial_states, seq_idx, cu_seqlens
        inf = float("inf")
        res = op(a["x"], a["dt"], a["A"], a["B"], a["C"], 128, a["D"], a["z"], *none4, True, 0.0, inf)
        out, out_x, dt_out, cs, states, final, varlen = res
        assert varlen.shape == (0,)
        assert out.shape == (2, 300, 4, 32) and out.dtype == torch.bfloat16
        assert out_x.shape == out.shape
        assert dt_out.shape == cs.shape == (2, 4, 3, 128) and cs.dtype == torch.float32
        assert states.shape == (2, 3, 4, 32, 16) and states.dtype == torch.float32
        assert final.shape == (2, 4, 32, 16)
        res = op(a["x"], a["dt"], a["A"], a["B"], a["C"], 64, None, None, *none4, False, 0.0, 1.0)
        assert res[1].shape == (0,) and res[4].shape == (2, 5, 4, 32, 16)
        cu = torch.tensor([0, 100, 300], dtype=torch.int32)
        x1 = a["x"][:1]
        res = op(x1, a["dt"][:1], a["A"], a["B"][:1], a["C"][:1], 64, None, None, None, None, None, cu, False,
                 0.0, 1.0)
        assert res[6].shape == (2, 4, 32, 16) and res[6].dtype == torch.float32


def test_reference_matches_a_chunked_evaluation():
    """The test's float64 recurrence against the chunk formulas (ssd.h) on CPU: the reference the
    GPU tests trust is itself checked, seq_idx and initial state included."""
    torch.manual_seed(3)
    chunk = 16
    a = make(batch=2, seqlen=45, nheads=2, headdim=3, dstate=4, ngroups=1, init=True, seq_idx=True, D=None,
             device="cpu", dtype=F64)
    a = {k: (v.to(F64) if v is not None and v.is_floating_point() else v) for k, v in a.items()}
    a["seq_idx"] = torch.tensor([[0] * 20 + [1] * 25, [0] * 16 + [2] * 29], dtype=torch.int32)
    out, _, dtc, cs, states, final = reference(**a, chunk_size=chunk)
    x, B, C, seq = a["x"], a["B"], a["C"], a["seq_idx"]
    batch, seqlen, nheads, _ = x.shape
    for b in range(batch):
        for h in range(nheads):
            H = a["initial_states"][b, h].clone()
            prev = 0
            for c in range(-(-seqlen // chunk)):
                torch.testing.assert_close(states[b, c, h], H)
                lo, hi = c * chunk, min((c + 1) * chunk, seqlen)
                for t in range(lo, hi):
                    i = t - lo
                    y = torch.zeros(x.shape[-1], dtype=F64)
                    if seq[b, t] == prev:
                        y += torch.exp(cs[b, h, c, i]) * (H @ C[b, t, 0])
                    for s in range(lo, t + 1):
                        if seq[b, s] == seq[b, t]:
                            w = torch.exp(cs[b, h, c, i] - cs[b, h, c, s - lo]) * dtc[b, h, c, s - lo]
                            y += (C[b, t, 0] @ B[b, s, 0]) * w * x[b, s, h]
                    torch.testing.assert_close(out[b, t, h], y)
                last = hi - 1
                S = sum((torch.exp(cs[b, h, c, last - lo] - cs[b, h, c, s - lo]) * dtc[b, h, c, s - lo]
                         * torch.outer(x[b, s, h], B[b, s, 0]))
                        for s in range(lo, hi) if seq[b, s] == seq[b, last])
                keep = seq[b, last] == prev
                H = (torch.exp(cs[b, h, c, last - lo]) * H if keep else 0) + S
                prev = int(seq[b, last])
            torch.testing.assert_close(final[b, h], H)


def test_wrapper_on_meta_tensors():
    """ssd_forward_cuda's arguments reach the op in the schema's order: meta tensors run the fake
    implementation (needs the built extension, not a GPU)."""
    try:
        from selective_scan import _ssd_ops
    except (ImportError, OSError) as e:
        pytest.skip(f"extension not built: {e}")
    a = make(batch=1, seqlen=130, nheads=4, headdim=16, dstate=8, ngroups=2, z=True, init=True, seq_idx=True,
             dt_bias=True, device="meta")
    res = _ssd_ops.ssd_forward_cuda(a["x"], a["dt"], a["A"], a["B"], a["C"], 64, D=a["D"], z=a["z"],
                                    dt_bias=a["dt_bias"], initial_states=a["initial_states"],
                                    seq_idx=a["seq_idx"], dt_softplus=True, dt_limit=(0.0, 1.0))
    assert len(res) == 6 and res[1].shape == a["x"].shape and res[4].shape == (1, 3, 4, 16, 8)
    cu = torch.tensor([0, 50, 130], dtype=torch.int32, device="meta")
    res = _ssd_ops.ssd_forward_cuda(a["x"], a["dt"], a["A"], a["B"], a["C"], 64, seq_idx=a["seq_idx"],
                                    cu_seqlens=cu)
    assert len(res) == 7 and res[1] is None and res[6].shape == (2, 4, 16, 8)


def test_bwd_schema_traces_with_the_fake_impl():
    """The backward's schema (csrc/ssd/ssd_ops.h) with its fake implementation, in a scratch
    namespace: the gradients' shapes and dtypes as torch.compile sees them."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from selective_scan._ssd_meta import BWD_OP_NAME, ssd_bwd_fake

    schema = _schemas()[BWD_OP_NAME]
    ns = "mk_ssd_bwd_schema_test"
    lib = torch.library.Library(ns, "FRAGMENT")
    if not hasattr(getattr(torch.ops, ns), BWD_OP_NAME):
        lib.define(schema)
    qual = f"{ns}::{BWD_OP_NAME}"
    if hasattr(torch.library, "register_fake"):
        torch.library.register_fake(qual, ssd_bwd_fake, lib=lib)
    else:  # torch < 2.4
        torch.library.impl_abstract(qual, ssd_bwd_fake, lib=lib)
    op = getattr(getattr(torch.ops, ns), BWD_OP_NAME).default
    with FakeTensorMode():
        a = make(batch=2, seqlen=300, nheads=4, headdim=32, dstate=16, ngroups=2, dtype=torch.bfloat16,
                 z=True, D="channel", dt_bias=True, init=True, device="cpu")
        a["dt"] = a["dt"].half()
        res = op(a["x"], a["x"], a["dt"], a["A"], a["B"], a["C"], a["x"], 128, a["D"], a["z"], a["dt_bias"],
                 a["initial_states"], None, None, True, 0.0, float("inf"))
        assert len(res) == 9
        for g, key in zip(res, GRAD_KEYS):
            assert g.shape == a[key].shape and g.dtype == a[key].dtype, key
        none6 = (None,) * 6  # D, z, dt_bias, initial_states, dfinal_states, seq_idx
        res = op(a["x"], a["x"], a["dt"], a["A"], a["B"], a["C"], a["x"], 64, *none6, False, 0.0, 1.0)
        assert [tuple(r.shape) for r in res[5:]] == [(0,)] * 4


def test_reference_grads_match_the_pytorch_path():
    """reference_grads (autograd through the float64 recurrence) equals autograd through the
    PyTorch chunked path, ssd_pytorch.ssd_forward, in float64: the harness the GPU backward tests
    trust, checked on CPU with every option."""
    from selective_scan.ssd_pytorch import ssd_forward

    torch.manual_seed(5)
    a = make(batch=2, seqlen=37, nheads=4, headdim=3, dstate=5, ngroups=2, init=True, seq_idx=True, z=True,
             dt_bias=True, D="channel", device="cpu", dtype=F64)
    a = {k: (v.to(F64) if v is not None and v.is_floating_point() else v) for k, v in a.items()}
    a["seq_idx"] = torch.tensor([[0] * 20 + [1] * 17, [0] * 8 + [2] * 29], dtype=torch.int32)
    dout = torch.randn(a["x"].shape, dtype=F64)
    dfin = torch.randn(2, 4, 3, 5, dtype=F64)
    kw = dict(dt_softplus=True, dt_limit=(0.1, 0.9))
    want = reference_grads(a, 8, dout, dfin, **kw)
    leaves = {k: a[k].detach().clone().requires_grad_() for k in GRAD_KEYS}
    b = dict(a)
    b.update(leaves)
    res = ssd_forward(b["x"], b["dt"], b["A"], b["B"], b["C"], 8, D=b["D"], z=b["z"], dt_bias=b["dt_bias"],
                      initial_states=b["initial_states"], seq_idx=b["seq_idx"], **kw)
    loss = (res[0] * dout).sum() + (res[5] * dfin).sum()
    got = torch.autograd.grad(loss, list(leaves.values()))
    for name, g, w in zip(GRAD_NAMES, got, want):
        torch.testing.assert_close(g, w, msg=name)


def test_bwd_wrapper_on_meta_tensors():
    """ssd_backward_cuda's arguments reach the op in the schema's order (meta tensors run the fake
    implementation; needs the built extension, not a GPU)."""
    try:
        from selective_scan import _ssd_ops
    except (ImportError, OSError) as e:
        pytest.skip(f"extension not built: {e}")
    a = make(batch=1, seqlen=130, nheads=4, headdim=16, dstate=8, ngroups=2, z=True, init=True, seq_idx=True,
             dt_bias=True, D="channel", device="meta")
    res = _ssd_ops.ssd_backward_cuda(a["x"], a["x"], a["dt"], a["A"], a["B"], a["C"], a["x"], 64, D=a["D"],
                                     z=a["z"], dt_bias=a["dt_bias"], initial_states=a["initial_states"],
                                     dfinal_states=a["initial_states"], seq_idx=a["seq_idx"],
                                     dt_softplus=True, dt_limit=(0.0, 1.0))
    assert len(res) == 9
    for g, key in zip(res, GRAD_KEYS):
        assert g.shape == a[key].shape and g.dtype == a[key].dtype, key
    res = _ssd_ops.ssd_backward_cuda(a["x"], a["x"], a["dt"], a["A"], a["B"], a["C"], a["x"], 64)
    assert res[5:] == (None, None, None, None)


def _decomposed_backward(a, Q, dout, dfinal, dt_softplus=False, dt_limit=(0.0, float("inf"))):
    """csrc/ssd/bwd.cu's gradient formulas (docs/KERNELS.md, "Mamba-2 SSD backward"), phase by
    phase in float64 with loops over (batch, head, chunk): the state gradients by reverse state
    passing, d(C B^T) per group, the per-step sums into dA_cumsum's and dt's gradients, the
    reverse running sum, the dt chain, the parameter sums."""
    x, B, C, A = a["x"], a["B"], a["C"], a["A"]
    batch, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    hpg = H // G
    seq = a["seq_idx"] if a["seq_idx"] is not None else torch.zeros(batch, L, dtype=torch.int32)
    raw = a["dt"] + (a["dt_bias"] if a["dt_bias"] is not None else 0)
    sp = torch.where(raw <= 20, torch.log1p(torch.exp(raw)), raw) if dt_softplus else raw
    d = sp.clamp(dt_limit[0], dt_limit[1])
    z = a["z"]
    dy = dout * F.silu(z) if z is not None else dout
    nc = -(-L // Q)
    dx, dB, dC = torch.zeros_like(x), torch.zeros_like(B), torch.zeros_like(C)
    ddt_post = torch.zeros_like(d)
    dA = torch.zeros_like(A)
    dD = torch.zeros(H, P, dtype=F64)
    dinit = torch.zeros(batch, H, P, N, dtype=F64)
    for b in range(batch):
        # forward recomputation: running sums, entering states
        cs, Hs = {}, {}
        for h in range(H):
            g = h // hpg
            init = a["initial_states"]
            Hc = init[b, h].clone() if init is not None else torch.zeros(P, N, dtype=F64)
            prev = 0
            for c in range(nc):
                lo, hi = c * Q, min((c + 1) * Q, L)
                cs[h, c] = torch.cumsum(d[b, lo:hi, h] * A[h], 0)
                Hs[h, c] = Hc
                sq = seq[b, lo:hi]
                u = torch.where(sq == sq[-1], torch.exp(cs[h, c][-1] - cs[h, c]) * d[b, lo:hi, h],
                                torch.zeros(()))
                S = (u[:, None] * x[b, lo:hi, h]).T @ B[b, lo:hi, g]
                keep = int(sq[-1]) == prev
                Hc = (torch.exp(cs[h, c][-1]) * Hc if keep else 0) + S
                prev = int(sq[-1])
        dcs = {}
        for h in range(H):
            g = h // hpg
            # reverse state passing
            Gr = dfinal[b, h].clone() if dfinal is not None else torch.zeros(P, N, dtype=F64)
            dS, decay_grad = {}, {}
            for c in reversed(range(nc)):
                lo, hi = c * Q, min((c + 1) * Q, L)
                sq = seq[b, lo:hi]
                prev = int(seq[b, lo - 1]) if c > 0 else 0
                w = torch.where(sq == prev, torch.exp(cs[h, c]), torch.zeros(()))
                own = (w[:, None] * dy[b, lo:hi, h]).T @ C[b, lo:hi, g]
                dS[c] = Gr
                keep = int(sq[-1]) == prev
                decay_grad[c] = torch.exp(cs[h, c][-1]) * (Hs[h, c] * Gr).sum() if keep else torch.zeros(())
                Gr = own + torch.exp(cs[h, c][-1]) * Gr if keep else own
            dinit[b, h] = Gr
            for c in range(nc):
                lo, hi = c * Q, min((c + 1) * Q, L)
                n = hi - lo
                sq = seq[b, lo:hi]
                prev = int(seq[b, lo - 1]) if c > 0 else 0
                csc, dtc = cs[h, c], d[b, lo:hi, h]
                xs, ys, Bs, Cs = x[b, lo:hi, h], dy[b, lo:hi, h], B[b, lo:hi, g], C[b, lo:hi, g]
                mask = (torch.arange(n)[:, None] >= torch.arange(n)[None, :]) & (sq[:, None] == sq[None, :])
                decay = torch.where(mask, torch.exp(csc[:, None] - csc[None, :]), torch.zeros(()))
                CB = Cs @ Bs.T
                M = CB * decay * dtc[None, :]
                dM = ys @ xs.T
                Fm = torch.where(mask, dM * CB * decay, torch.zeros(()))
                E = Fm * dtc[None, :]
                dCB = torch.where(mask, dM * decay * dtc[None, :], torch.zeros(()))
                w = torch.where(sq == prev, torch.exp(csc), torch.zeros(()))
                in_state = sq == sq[-1]
                e = torch.where(in_state, torch.exp(csc[-1] - csc), torch.zeros(()))
                u = e * dtc
                BdS = Bs @ dS[c].T
                dw = (xs * BdS).sum(1)
                off = w * (ys * (Cs @ Hs[h, c].T)).sum(1)
                dx[b, lo:hi, h] += u[:, None] * BdS + M.T @ ys
                if a["D"] is not None:
                    Dh = a["D"][h] if a["D"].dim() == 2 else a["D"][h].expand(P)
                    dx[b, lo:hi, h] += Dh * ys
                dD[h] += (ys * xs).sum(0)
                dC[b, lo:hi, g] += w[:, None] * (ys @ Hs[h, c]) + dCB @ Bs
                dB[b, lo:hi, g] += u[:, None] * (xs @ dS[c]) + dCB.T @ Cs
                dc = E.sum(1) - dtc * Fm.sum(0) + off - dw * u
                dc[-1] += (dw * u).sum() + decay_grad[c]
                dcs[h, c] = dc
                ddt_post[b, lo:hi, h] = Fm.sum(0) + dw * e
        for h in range(H):
            for c in range(nc):
                lo, hi = c * Q, min((c + 1) * Q, L)
                da = torch.flip(torch.cumsum(torch.flip(dcs[h, c], [0]), 0), [0])
                ddt_post[b, lo:hi, h] += da * A[h]
                dA[h] += (da * d[b, lo:hi, h]).sum()
    inside = (sp >= dt_limit[0]) & (sp <= dt_limit[1])
    dsp = torch.where(raw <= 20, torch.sigmoid(raw), torch.ones(())) if dt_softplus else torch.ones(())
    ddt = torch.where(inside, ddt_post * dsp, torch.zeros(()))
    dz = dout * a["_y"] * (torch.sigmoid(z) * (1 + z * (1 - torch.sigmoid(z)))) if z is not None else None
    dD = (dD if a["D"].dim() == 2 else dD.sum(1)) if a["D"] is not None else None
    ddt_bias = ddt.sum((0, 1)) if a["dt_bias"] is not None else None
    return (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinit if a["initial_states"] is not None else None)


@pytest.mark.parametrize("opts", [dict(), dict(seq=True, init=True, z=True, bias=True, D="channel")])
def test_backward_decomposition_matches_autograd(opts):
    """The backward kernels' formulas (bwd.cu's phases, in float64 on CPU) against autograd
    through the recurrence: the derivation the CUDA code implements, checked without a GPU."""
    torch.manual_seed(11)
    a = make(batch=2, seqlen=45, nheads=4, headdim=3, dstate=5, ngroups=2, init=opts.get("init", False),
             z=opts.get("z", False), dt_bias=opts.get("bias", False), D=opts.get("D", "head"), device="cpu",
             dtype=F64)
    a = {k: (v.to(F64) if v is not None and v.is_floating_point() else v) for k, v in a.items()}
    if opts.get("seq"):
        a["seq_idx"] = torch.tensor([[0] * 20 + [1] * 25, [0] * 16 + [2] * 29], dtype=torch.int32)
    kw = dict(dt_softplus=True, dt_limit=(0.1, 0.9)) if opts.get("bias") else {}
    dout = torch.randn(a["x"].shape, dtype=F64)
    dfin = torch.randn(2, 4, 3, 5, dtype=F64)
    want = reference_grads(a, 16, dout, dfin, **kw)
    res = reference(**a, chunk_size=16, **kw)
    a["_y"] = res[1] if a["z"] is not None else res[0]
    got = _decomposed_backward(a, 16, dout, dfin, **kw)
    for name, g, w in zip(GRAD_NAMES, got, want):
        assert (g is None) == (w is None), name
        if w is not None:
            torch.testing.assert_close(g, w, msg=name)


@pytest.mark.parametrize("shape", [dict(headdim=0), dict(dstate=0)])
def test_stateless_backward_on_cpu(shape):
    """ssd_backward_cuda's PyTorch branch for headdim or dstate 0 (y = D x) against autograd
    (needs the built extension to import the module, not a GPU)."""
    try:
        from selective_scan import _ssd_ops
    except (ImportError, OSError) as e:
        pytest.skip(f"extension not built: {e}")
    torch.manual_seed(2)
    a = make(batch=2, seqlen=20, nheads=4, z=True, init=True, dt_bias=True, D="channel", device="cpu",
             **shape)
    dout = torch.randn(a["x"].shape)
    y = reference(**a, chunk_size=8)[1].float()
    got = _ssd_ops.ssd_backward_cuda(dout, a["x"], a["dt"], a["A"], a["B"], a["C"], y, 8, D=a["D"], z=a["z"],
                                     dt_bias=a["dt_bias"], initial_states=a["initial_states"])
    want = reference_grads(a, 8, dout)
    for name, g, w in zip(GRAD_NAMES, got, want):
        w = w if w is not None else torch.zeros(g.shape, dtype=F64)
        torch.testing.assert_close(g.to(F64), w, rtol=1e-4, atol=1e-4, msg=name)
