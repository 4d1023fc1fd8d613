"""GPU tests of the compiled selective scan (selective_scan._cuda via selective_scan_fn and the ops).

Every result is compared with a float64 sequential reference written here (not the package's
own), on fresh random inputs; allocator blocks are poisoned with NaN before the kernels run,
so an element a kernel forgets to write shows up. Skipped without a GPU (conftest.py).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ops():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from selective_scan import _ops

    return _ops


@pytest.fixture(autouse=True)
def _strict_backend(monkeypatch):
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "cuda")  # never a silent fallback here


def _poison_allocator(nbytes: int) -> None:
    t = torch.full((max(nbytes // 4, 1 << 20),), float("nan"), device="cuda")
    del t


def make_inputs(
    batch,
    dim,
    L,
    N,
    dtype,
    *,
    cplx=False,
    var_b=True,
    var_c=True,
    groups=1,
    D=True,
    z=True,
    bias=True,
    seed=0,
):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape, dt=torch.float32):
        return torch.randn(*shape, device="cuda", generator=g, dtype=torch.float32).to(dt)

    lf = 2 * L if cplx else L
    u = rnd(batch, dim, L, dt=dtype)
    delta = (0.5 * rnd(batch, dim, L) - 2.0).to(dtype)  # softplus(-2 +- 1) ~ 0.05..0.3
    A = -torch.exp(0.5 * rnd(dim, N))
    if cplx:
        A = torch.complex(A, 3.0 * rnd(dim, N))
    wdt = torch.complex64 if cplx else torch.float32
    B = rnd(batch, groups, N, lf, dt=dtype) if var_b else rnd(dim, N, dt=wdt)
    C = rnd(batch, groups, N, lf, dt=dtype) if var_c else rnd(dim, N, dt=wdt)
    return dict(
        u=u,
        delta=delta,
        A=A,
        B=B,
        C=C,
        D=rnd(dim) if D else None,
        z=rnd(batch, dim, L, dt=dtype) if z else None,
        delta_bias=(0.3 * rnd(dim)) if bias else None,
    )


def reference(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=True):
    """float64 per-step recurrence: (out, last state)."""
    f = torch.float64
    cplx = A.is_complex()
    batch, dim, L = u.shape
    uf, dt = u.to(f), delta.to(f)
    if delta_bias is not None:
        dt = dt + delta_bias.to(f)[:, None]
    if delta_softplus:
        dt = F.softplus(dt)
    Ac = A.to(torch.complex128 if cplx else f)

    def per_channel(t):  # -> (dim, N) or (batch, dim, N, L)
        if t.dim() == 2:
            return t.to(Ac.dtype)
        t = t.to(f)
        if t.dim() == 3:
            t = t.unsqueeze(1)
        if cplx:
            t = torch.view_as_complex(t.unflatten(-1, (-1, 2)).contiguous())
        return t.repeat_interleave(dim // t.shape[1], dim=1)

    Bc, Cc = per_channel(B), per_channel(C)
    decay = torch.exp(dt.unsqueeze(-1) * Ac[:, None, :])  # (b, d, L, N)
    h = torch.zeros(batch, dim, A.shape[1], dtype=Ac.dtype, device=u.device)
    ys = []
    for t in range(L):
        Bt = Bc if Bc.dim() == 2 else Bc[..., t]
        Ct = Cc if Cc.dim() == 2 else Cc[..., t]
        h = decay[:, :, t] * h + (dt[:, :, t] * uf[:, :, t]).unsqueeze(-1) * Bt
        yt = (h * Ct).sum(-1)
        ys.append(2 * yt.real if cplx else yt)
    y = torch.stack(ys, -1)
    if D is not None:
        y = y + uf * D.to(f)[:, None]
    if z is not None:
        y = y * F.silu(z.to(f))
    return y, h


TOL = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def assert_close(actual: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert actual.shape == ref.shape, (what, actual.shape, ref.shape)
    a = actual.to(ref.dtype)
    assert torch.isfinite(torch.view_as_real(a) if a.is_complex() else a).all(), f"{what}: non-finite values"
    scale = ref.abs().max().item() + 1e-6
    err = (a - ref).abs().max().item()
    assert err <= TOL[dtype] * scale, f"{what}: max error {err:.3g} vs scale {scale:.3g} ({dtype})"


NAMES = ["u", "delta", "A", "B", "C", "D", "z", "delta_bias"]


def run_and_check(inp, dtype, softplus=True, grads=True, last_state=False):
    from selective_scan import selective_scan_fn

    leaves = {
        k: (v.detach().clone().requires_grad_(grads) if v is not None else None) for k, v in inp.items()
    }
    _poison_allocator(1 << 26)
    res = selective_scan_fn(
        *[leaves[k] for k in NAMES], delta_softplus=softplus, return_last_state=last_state
    )
    out, last = res if last_state else (res, None)
    refs = {
        k: (v.detach().double() if not v.is_complex() else v.detach().to(torch.complex128)).requires_grad_(
            grads
        )
        if v is not None
        else None
        for k, v in inp.items()
    }
    ref_out, ref_last = reference(*[refs[k] for k in NAMES], delta_softplus=softplus)
    assert out.dtype == inp["u"].dtype
    assert_close(out, ref_out, dtype, "out")
    if last_state:
        assert_close(last, ref_last, torch.float32, "last_state")
    if not grads:
        return
    dout = torch.randn_like(out)
    out.backward(dout)
    ref_out.backward(dout.double())
    for k in NAMES:
        if leaves[k] is None:
            continue
        gtol = dtype if k in ("u", "delta", "z") or leaves[k].dtype == dtype else torch.float32
        if dtype != torch.float32:
            gtol = dtype  # low-precision inputs round everything downstream
        assert leaves[k].grad is not None, k
        assert leaves[k].grad.dtype == leaves[k].dtype, (k, leaves[k].grad.dtype)
        assert_close(leaves[k].grad, refs[k].grad, gtol, f"d{k}")


CASES = [
    # dtype, cplx, var_b, var_c, groups, L
    (torch.float32, False, True, True, 1, 1),
    (torch.float32, False, True, True, 1, 63),
    (torch.float32, False, True, True, 2, 64),
    (torch.float32, False, True, True, 1, 65),
    (torch.float32, False, False, True, 1, 100),
    (torch.float32, False, True, False, 1, 129),
    (torch.float32, False, False, False, 1, 77),
    (torch.bfloat16, False, True, True, 1, 300),
    (torch.float16, False, True, True, 4, 300),
    (torch.bfloat16, False, False, False, 1, 33),
    (torch.float32, True, True, True, 1, 70),
    (torch.float32, True, False, False, 1, 70),
    (torch.float32, True, True, False, 2, 9),
    (torch.bfloat16, True, True, True, 1, 130),
    (torch.float16, True, False, True, 1, 17),
]


@pytest.mark.parametrize("dtype,cplx,var_b,var_c,groups,L", CASES)
def test_matrix(ops, dtype, cplx, var_b, var_c, groups, L):
    inp = make_inputs(
        2, 8, L, 16 if not cplx else 8, dtype, cplx=cplx, var_b=var_b, var_c=var_c, groups=groups
    )
    run_and_check(inp, dtype, last_state=True)


@pytest.mark.parametrize("D,z,bias,softplus", list(itertools.product([False, True], repeat=4)))
def test_optional_parts(ops, D, z, bias, softplus):
    inp = make_inputs(2, 4, 70, 4, torch.float32, D=D, z=z, bias=bias)
    if not softplus:  # keep dt > 0, as softplus would
        inp["delta"] = F.softplus(inp["delta"])
    run_and_check(inp, torch.float32, softplus=softplus)


@pytest.mark.parametrize("L", [2047, 2048, 2049, 4097, 9000])
def test_long_sequences(ops, L):
    inp = make_inputs(1, 3, L, 4, torch.float32, groups=1)
    run_and_check(inp, torch.float32, last_state=True)


@pytest.mark.parametrize(
    "N,cplx", [(1, False), (3, False), (17, False), (64, False), (256, False), (5, True), (256, True)]
)
def test_dstate(ops, N, cplx):
    inp = make_inputs(2, 4, 40, N, torch.float32, cplx=cplx)
    run_and_check(inp, torch.float32, last_state=True)


@pytest.mark.parametrize("dim", [1, 31, 33, 130])
def test_channel_counts(ops, dim):
    # channel counts around the blocks (32 / 128 channels) and partial blocks
    inp = make_inputs(3, dim, 67, 16, torch.float32)
    run_and_check(inp, torch.float32)


# Problem sizes that pick each states-per-lane layout of the lane forward (fwd_lanes.cu) on a
# 132-SM GPU: 4 states per lane from about 11,600 channels, 2 from about 5,800 (and from 4,225,
# where one state per lane's blocks would not fit in one wave), else 1; odd channel counts
# leave partial blocks, L = 70 a partial tile and a partial chunk.
@pytest.mark.parametrize(
    "batch,dim,N,dtype",
    [
        (8, 2047, 16, torch.bfloat16),  # kS = 4
        (7, 2048, 12, torch.float32),   # kS = 4, padded states
        (4, 2049, 16, torch.float16),   # kS = 2
        (3, 2048, 5, torch.float32),    # kS = 2, padded states
        (1, 2049, 16, torch.bfloat16),  # kS = 1
        (1, 4999, 16, torch.bfloat16),  # kS = 2: 625 blocks at kS = 1, more than one wave
    ],
)
def test_lane_layouts(ops, batch, dim, N, dtype):
    inp = make_inputs(batch, dim, 70, N, dtype, seed=batch)
    run_and_check(inp, dtype, last_state=True)


# One state per lane (few channels) walks the sequence in 32-step tiles, 64 steps a chunk:
# lengths around tile and chunk ends, with B and C variable (the full-tile copy) or B fixed.
@pytest.mark.parametrize("L", [1, 31, 32, 33, 63, 64, 65, 95, 97, 127, 129, 190])
@pytest.mark.parametrize("var_b", [True, False])
def test_one_state_per_lane_tile_edges(ops, L, var_b):
    inp = make_inputs(2, 40, L, 16, torch.bfloat16, var_b=var_b, seed=L)
    run_and_check(inp, torch.bfloat16, last_state=True)


# The lane backward's clusters (bwd_lanes.cu): with variable B and C, where each block of a
# (batch, group) takes the same number of 16-channel groups and the GPU holds every cluster at
# once, 16 (else 8) consecutive blocks share one row of the dB/dC partials, each chunk's sums
# sent to the block that owns them. On a 132-SM H100/H200:
# (batch, dim, groups, var_b, var_c, L) -> blocks a cluster, groups a block.
CLUSTER_CASES = [
    (4, 1536, 1, True, True, 300),  # 16, 2 (mamba_ssm's small block)
    (2, 1024, 2, True, True, 130),  # 16 in each of two channel groups, 1
    (11, 384, 1, True, True, 130),  # 8, 1
    (11, 384, 1, True, True, 2049),  # 8, 1, in windows of 1024 steps, the last chunk one step
    (8, 2040, 1, True, True, 70),  # 16, 4, the last block's last group half its channels
    (11, 384, 1, False, True, 65),  # 1: fixed B
    (4, 1552, 1, True, True, 70),  # 1: 97 groups, 2 a block, the last block one
]


@pytest.mark.parametrize("batch,dim,groups,var_b,var_c,L", CLUSTER_CASES)
def test_backward_clusters(ops, batch, dim, groups, var_b, var_c, L):
    inp = make_inputs(batch, dim, L, 16, torch.float32, var_b=var_b, var_c=var_c, groups=groups, seed=dim)
    run_and_check(inp, torch.float32)


@pytest.mark.parametrize("L", [2048, 2049])
def test_backward_one_pass_over_segments(ops, L):
    """Where windows would take more memory than one pass (mamba_ssm's small block, clusters of
    16), the backward from states 1024 steps apart in pairs runs in one launch over several
    segments: bitwise the backward from a state every 64 steps, and repeatable."""
    inp = make_inputs(4, 1536, L, 16, torch.bfloat16, seed=L)
    args = [inp[k] for k in NAMES]
    out, _, ckpt = ops.fwd(*args, True, True)
    dout = torch.randn_like(out)
    want_dz, want_out_z = torch.empty_like(out), torch.empty_like(out)
    want = ops.bwd(*args, dout, ckpt, out, want_dz, want_out_z, True)
    need = -(-L // 1024)
    _, _, states = ops.fwd(*args, True, True, 1024, need + need % 2, True)
    for _ in range(2):
        _poison_allocator(want_dz.numel() * want_dz.element_size() * 12)
        dz, out_z = torch.full_like(out, float("nan")), torch.full_like(out, float("nan"))
        got = ops.bwd(*args, dout, states, out, dz, out_z, True, 1024, True)
        assert torch.equal(dz, want_dz) and torch.equal(out_z, want_out_z), "dz / out_z"
        for name, a, b in zip(("du", "ddelta", "dA", "dB", "dC", "dD", "ddelta_bias"), got, want):
            assert torch.equal(a, b), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("var_b", [True, False])
def test_two_states_per_lane_16bit_bc(ops, dtype, var_b):
    """Two states per lane (batch x dim 8196 on a 132-SM GPU) with 16-bit B/C: B/C as strided
    views (element loads where the tile staging otherwise takes vectors) give the same result
    as contiguous ones, bitwise, and both match the reference; also with a fixed B. Strided
    rows run the lane forward's general tile, contiguous ones its full-tile copy."""
    from selective_scan import selective_scan_fn

    batch, dim, L, N = 4, 2049, 70, 16
    inp = make_inputs(batch, dim, L, N, dtype, var_b=var_b, seed=7)
    views = dict(inp)
    if var_b:
        views["B"] = inp["B"].transpose(2, 3).contiguous().transpose(2, 3)  # L stride N
    views["C"] = torch.stack([inp["C"], inp["C"]], -1)[..., 0]  # L stride 2
    assert views["C"].stride(-1) == 2
    outs = [selective_scan_fn(*[a[k] for k in NAMES], delta_softplus=True) for a in (views, inp)]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    run_and_check(views, dtype, grads=False, last_state=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_views(ops, dtype):
    """u/z as halves of one xz tensor, delta channel-strided, B/C with non-unit L stride,
    a non-contiguous dout: results match the contiguous run."""
    from selective_scan import selective_scan_fn

    batch, dim, L, N = 2, 16, 131, 16
    base = make_inputs(batch, dim, L, N, dtype)
    xz = torch.randn(batch, 2 * dim, L, device="cuda").to(dtype)
    u, z = xz.chunk(2, dim=1)
    delta = torch.randn(batch, L, dim, device="cuda").to(dtype).transpose(1, 2)  # channel-last view
    B = torch.randn(batch, 1, L, N, device="cuda").to(dtype).transpose(2, 3)
    C = torch.randn(batch, 1, N, 2 * L, device="cuda").to(dtype)[..., ::2]
    args = dict(base, u=u, z=z, delta=delta, B=B, C=C)
    contig = {k: (v.contiguous() if v is not None else None) for k, v in args.items()}
    leaves = [
        {k: (v.clone().requires_grad_() if v is not None else None) for k, v in a.items()}
        for a in (args, contig)
    ]
    dout = torch.randn(batch, L, dim, device="cuda").to(dtype).transpose(1, 2)
    outs = []
    for lv in leaves:
        out = selective_scan_fn(*[lv[k] for k in NAMES], delta_softplus=True)
        out.backward(dout)
        outs.append(out)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    for k in NAMES:
        torch.testing.assert_close(leaves[0][k].grad, leaves[1][k].grad, rtol=1e-6, atol=1e-6, msg=k)


@pytest.mark.parametrize("dstate", [16, 24])  # the lane kernel, the general one
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dz_and_out_z_written_in_place_into_views(ops, dstate, dtype):
    """dz and the recomputed gated output go into views of NaN-poisoned buffers: every element
    of the view written, nothing around it touched, out_z = y silu(z) from the y given."""
    inp = make_inputs(2, 8, 100, dstate, dtype)
    args = [inp[k] for k in NAMES]
    out, out_z_fwd, ckpt = ops.fwd(*args, True, True)  # y kept (keep_y) and the gated output
    dout = torch.randn_like(out)
    big = torch.full((2, 16, 100), float("nan"), device="cuda", dtype=dtype)
    dz = big[:, 8:]
    keep = big[:, :8].clone()
    big_z = torch.full((2, 8, 130), float("nan"), device="cuda", dtype=dtype)
    out_z = big_z[:, :, 30:]  # strided rows: not contiguous
    grads = ops.bwd(*args, dout, ckpt, out, dz, out_z, True)
    assert torch.isfinite(dz).all() and torch.isfinite(out_z).all()
    torch.testing.assert_close(big[:, :8], keep, equal_nan=True)
    assert torch.isnan(big_z[:, :, :30]).all()
    zf = inp["z"].double()
    ref_dz = dout.double() * out.double() * torch.sigmoid(zf) * (1 + zf * (1 - torch.sigmoid(zf)))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(dz.double(), ref_dz, rtol=tol, atol=tol)
    ref_out_z = out.double() * zf * torch.sigmoid(zf)  # from the rounded y, as a caller recomputes it
    torch.testing.assert_close(out_z.double(), ref_out_z.to(dtype).double(), rtol=tol, atol=tol)
    torch.testing.assert_close(out_z, out_z_fwd, rtol=tol, atol=tol)
    assert len(grads) == 7
    # without out_z (an empty tensor) the gradients are the same, bitwise
    no_out_z = torch.empty(0, device="cuda", dtype=dtype)
    again = ops.bwd(*args, dout, ckpt, out, torch.empty_like(dz), no_out_z, True)
    for a, b in zip(grads, again):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dstate", [16, 24])
def test_states_only_forward(ops, dstate):
    """Neither keep_y nor z: only the states are written (out empty), bitwise those of the full
    forward; what a backward that recomputes its states runs."""
    inp = make_inputs(2, 8, 200, dstate, torch.bfloat16)
    args = [inp[k] for k in NAMES]
    _, _, ckpt = ops.fwd(*args, True, True)
    no_z = list(args)
    no_z[NAMES.index("z")] = None
    out, out_z, states = ops.fwd(*no_z, True, False)
    assert out.numel() == 0 and out_z.numel() == 0
    assert torch.equal(states, ckpt)


# batch x dim: the lane forward's 1, 2 and 4 states per lane on an H200 (132 SMs)
@pytest.mark.parametrize("batch,dim", [(2, 8), (1, 6144), (1, 12288)])
def test_forward_outputs_left_out(ops, batch, dim):
    """The forward with each output left out (no y, or no y and no z) writes the others bitwise as
    the full forward does, across full tiles and the sequence's ragged end (L = 100)."""
    inp = make_inputs(batch, dim, 100, 16, torch.bfloat16)
    args = [inp[k] for k in NAMES]
    out, out_z, ckpt = ops.fwd(*args, True, True)
    no_y, gated, states = ops.fwd(*args, True, False)  # z given, y not kept
    assert no_y.numel() == 0
    assert torch.equal(gated, out_z) and torch.equal(states, ckpt)
    no_z = list(args)
    no_z[NAMES.index("z")] = None
    y, none, states = ops.fwd(*no_z, True, True)  # y kept, no z
    assert none.numel() == 0
    assert torch.equal(y, out) and torch.equal(states, ckpt)


# (batch, dim, dstate, complex): the lane forward at 1, 2 and 4 states per lane, the general
# forward (dstate 24, complex A), and its two-pass segmented form (few channels, long sequence)
KEPT_STATE_CASES = [(2, 8, 16, False), (1, 6144, 16, False), (1, 12288, 16, False), (2, 8, 24, False),
                    (1, 4, 8, True), (1, 2, 32, False)]


@pytest.mark.parametrize("batch,dim,dstate,cplx", KEPT_STATE_CASES)
@pytest.mark.parametrize("L", [1, 1000, 1024, 1025, 2048, 2049, 4100])
def test_forward_keeps_a_state_every_1024_steps_in_pairs(ops, batch, dim, dstate, cplx, L):
    """state_steps 1024 with the original's x layout (2 ceil(L / 2048) slots, pairs interleaved):
    slot k is bitwise the 64-step forward's state after min(1024 (k + 1), L) steps, the outputs
    are bitwise the same, and the slot past the final state (when L % 2048 is 1..1024) holds it."""
    inp = make_inputs(batch, dim, L, dstate, torch.bfloat16, cplx=cplx)
    args = [inp[k] for k in NAMES]
    out, out_z, ckpt = ops.fwd(*args, True, True)
    rows = -(-L // 2048)
    nc = ckpt.shape[2]
    _poison_allocator(ckpt.numel() * 4)
    out2, out_z2, x = ops.fwd(*args, True, True, 1024, 2 * rows, True)
    assert torch.equal(out2, out) and torch.equal(out_z2, out_z)
    per = 2 if cplx else 1
    assert x.shape == (batch, dim, rows, 2 * dstate * per)  # two slots a row: the original's x shape
    slots = x.view(batch, dim, rows, dstate, 2, per).transpose(3, 4).reshape(ckpt.shape[:2] + (2 * rows, -1))
    want = ckpt[:, :, [min(16 * (k + 1), nc) - 1 for k in range(2 * rows)]]
    assert torch.equal(slots, want)
    # contiguous slots, and the default count
    _, _, flat = ops.fwd(*args, True, True, 1024)
    assert torch.equal(flat, want[:, :, : -(-L // 1024)])


def test_forward_state_arguments_are_checked(ops):
    inp = make_inputs(1, 4, 3000, 16, torch.float32)
    args = [inp[k] for k in NAMES]
    for steps in (0, -64, 100, 192):
        with pytest.raises(RuntimeError, match=f"state_steps must be 64 times a power of two.*got {steps}"):
            ops.fwd(*args, True, True, steps)
    for count in (0, 1, 5, -2):  # 3 and 4 (one more) are the valid counts
        rule = "state_count must be -1, ceil.L / state_steps. = 3 or one more"
        with pytest.raises(RuntimeError, match=f"{rule}.*got {count}"):
            ops.fwd(*args, True, True, 1024, count)
    with pytest.raises(RuntimeError, match="state_pairs needs an even state_count, got 3"):
        ops.fwd(*args, True, True, 1024, 3, True)
    empty = make_inputs(1, 4, 0, 16, torch.float32)
    with pytest.raises(RuntimeError, match="= 0 .L = 0"):
        ops.fwd(*[empty[k] for k in NAMES], True, True, 1024, 1)


# (batch, dim, dtype, var_b, var_c): the lane backward (real A, dstate <= 16) with variable B
# and C (the models' case, bf16 and fp32), fixed B, fixed C; one channel range and many
SPACED_BWD_CASES = [(2, 8, torch.bfloat16, True, True), (1, 40, torch.float32, True, True),
                    (2, 8, torch.bfloat16, False, True), (1, 6, torch.float32, True, False),
                    (2, 2048, torch.bfloat16, True, True)]


@pytest.mark.parametrize("batch,dim,dtype,var_b,var_c", SPACED_BWD_CASES)
@pytest.mark.parametrize("L", [1, 63, 64, 65, 1000, 1024, 1025, 2048, 2049, 4100])
@pytest.mark.parametrize("steps,pairs", [(128, False), (1024, False), (1024, True)])
def test_backward_from_states_up_to_1024_steps_apart(ops, batch, dim, dtype, var_b, var_c, L, steps, pairs):
    """The lane backward from states every 128 or 1024 steps (the original's x layout with
    pairs, the count one more where the forward writes the final state twice) recomputes the
    chunk starts between them, and past one segment runs in windows of a segment, the last
    first, its running sums carried between them: every gradient, dz and out_z bitwise those
    of one pass from a state every 64 steps, at sequence ends on and off the segment and chunk
    boundaries, with fixed B or C (their sums carried) and with many channel groups a block."""
    inp = make_inputs(batch, dim, L, 16, dtype, var_b=var_b, var_c=var_c, seed=L)
    args = [inp[k] for k in NAMES]
    out, _, ckpt = ops.fwd(*args, True, True)
    dout = torch.randn_like(out)
    want_dz, want_out_z = torch.empty_like(out), torch.empty_like(out)
    want = ops.bwd(*args, dout, ckpt, out, want_dz, want_out_z, True)
    need = -(-L // steps)
    counts = [need + (need % 2)] if pairs else [need, need + 1]
    for count in counts:
        _, _, states = ops.fwd(*args, True, True, steps, count, pairs)
        _poison_allocator(want_dz.numel() * want_dz.element_size() * 12)
        dz, out_z = torch.full_like(out, float("nan")), torch.full_like(out, float("nan"))
        got = ops.bwd(*args, dout, states, out, dz, out_z, True, steps, pairs)
        assert torch.equal(dz, want_dz) and torch.equal(out_z, want_out_z), (count, "dz / out_z")
        for name, a, b in zip(("du", "ddelta", "dA", "dB", "dC", "dD", "ddelta_bias"), got, want):
            assert torch.equal(a, b), (count, name)


def test_backward_state_arguments_are_checked(ops):
    inp = make_inputs(1, 4, 3000, 16, torch.float32)
    args = [inp[k] for k in NAMES]
    out, _, _ = ops.fwd(*args, True, True)
    dz, out_z = torch.empty_like(out), out.new_empty((0,))
    _, _, x = ops.fwd(*args, True, True, 1024, 4, True)
    for steps in (0, 100, 192):
        with pytest.raises(RuntimeError, match=f"state_steps must be 64 times a power of two.*got {steps}"):
            ops.bwd(*args, out, x, out, dz, out_z, True, steps, True)
    too_far = "backward takes states 1024 steps apart at most.*got state_steps 2048"
    with pytest.raises(RuntimeError, match=too_far):
        ops.bwd(*args, out, x, out, dz, out_z, True, 2048, True)
    # pairs: two slots a row, as many rows as the forward wrote; a row short, or the rows read
    # as single slots, is refused
    paired = r"ckpt must be .* shape \[1, 4, 2, 32\] for state_steps 1024 in pairs, got \[1, 4, 1, 32\]"
    with pytest.raises(RuntimeError, match=paired):
        ops.bwd(*args, out, x[:, :, :1], out, dz, out_z, True, 1024, True)
    single = r"ckpt must be .* shape \[1, 4, 3 \(or one more\), 16\] for state_steps 1024, got \[1, 4, 2, 32"
    with pytest.raises(RuntimeError, match=single):
        ops.bwd(*args, out, x, out, dz, out_z, True, 1024, False)
    # the general kernel (dstate > 16, complex A) reads a state every 64 steps, unpaired
    big = make_inputs(1, 4, 300, 24, torch.float32)
    bargs = [big[k] for k in NAMES]
    bout, _, _ = ops.fwd(*bargs, True, True)
    _, _, bx = ops.fwd(*bargs, True, True, 128)
    general = "backward takes states 64 steps apart, not in pairs.*got state_steps 128"
    with pytest.raises(RuntimeError, match=general):
        ops.bwd(*bargs, bout, bx, bout, torch.empty_like(bout), out_z, True, 128, False)


def test_bitwise_repeatable(ops):
    """Two runs agree bitwise (no atomics): many channel blocks, groups, variable B/C."""
    from selective_scan import selective_scan_fn

    inp = make_inputs(2, 512, 300, 16, torch.bfloat16, groups=2)
    results = []
    for _ in range(2):
        leaves = {k: (v.clone().requires_grad_() if v is not None else None) for k, v in inp.items()}
        out = selective_scan_fn(*[leaves[k] for k in NAMES], delta_softplus=True)
        out.backward(torch.ones_like(out))
        results.append([out] + [leaves[k].grad for k in NAMES])
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("where", ["u", "delta", "B", "C"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_is_causal(ops, where, value):
    from selective_scan import selective_scan_fn

    L, t_bad = 150, 70
    inp = make_inputs(1, 4, L, 16, torch.float32, D=False, z=False)
    clean = selective_scan_fn(*[inp[k] for k in NAMES], delta_softplus=True)
    bad = dict(inp)
    bad[where] = inp[where].clone()
    if where in ("u", "delta"):
        bad[where][0, 1, t_bad] = value
    else:
        bad[where][0, 0, 3, t_bad] = value
    out = selective_scan_fn(*[bad[k] for k in NAMES], delta_softplus=True)
    assert torch.equal(out[..., :t_bad], clean[..., :t_bad])
    ref, _ = reference(*[bad[k] for k in NAMES], delta_softplus=True)
    assert torch.equal(torch.isfinite(out), torch.isfinite(ref))


def test_a_minus_inf(ops):
    inp = make_inputs(2, 4, 90, 8, torch.float32)
    inp["A"][1, 2] = float("-inf")
    run_and_check(inp, torch.float32, grads=False, last_state=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_minus_inf_at_a_zero_dt_keeps_the_state(ops, dtype):
    # The lane kernels (real A, dstate <= 16) take exp(dt A) at dt = 0 as 1 for every A, -inf
    # included (docs/SCAN.md): the state passes through such a step. The reference gets the
    # same with A at the most negative finite float, where every dt > 0 still decays to 0.
    from selective_scan import selective_scan_fn

    inp = make_inputs(2, 4, 45, 8, dtype, bias=False)
    inp["A"][1, 2] = float("-inf")
    inp["delta"] = (inp["delta"].float().abs() + 0.05).to(dtype)  # dt > 0 (no softplus) ...
    inp["delta"][:, 1, 7] = 0.0  # ... except exactly 0 at step 7 of channel 1
    out, last = selective_scan_fn(*[inp[k] for k in NAMES], delta_softplus=False, return_last_state=True)
    ref_in = dict(inp, A=inp["A"].clone())
    ref_in["A"][1, 2] = -torch.finfo(torch.float32).max
    ref_out, ref_last = reference(
        *[ref_in[k].double() if ref_in[k] is not None else None for k in NAMES], delta_softplus=False
    )
    assert_close(out, ref_out, dtype, "out")
    assert_close(last, ref_last, torch.float32, "last_state")


def test_dim_over_65536(ops):
    from selective_scan import selective_scan_fn

    inp = make_inputs(1, 70000, 5, 2, torch.float32)
    out = selective_scan_fn(*[inp[k] for k in NAMES], delta_softplus=True)
    rows = slice(69990, 70000)
    sub = {
        k: (v[:, rows] if k in ("u", "delta", "z") else v[rows] if k in ("A", "D", "delta_bias") else v)
        for k, v in inp.items()
    }
    ref, _ = reference(*[sub[k] for k in NAMES], delta_softplus=True)
    assert_close(out[:, rows], ref, torch.float32, "out")


def test_over_2_31_elements(ops):
    from selective_scan import selective_scan_fn

    dim, L = 65600, 32768  # 2.15e9 elements per tensor
    u = torch.randn(1, dim, L, device="cuda", dtype=torch.bfloat16)
    delta = torch.full_like(u, -1.0)
    A = -torch.ones(dim, 1, device="cuda")
    B = torch.ones(dim, 1, device="cuda")
    C = torch.ones(dim, 1, device="cuda")
    out = selective_scan_fn(u, delta, A, B, C, delta_softplus=True)
    rows = slice(dim - 3, dim)
    tail = selective_scan_fn(
        u[:, rows].contiguous(), delta[:, rows].contiguous(), A[rows], B[rows], C[rows], delta_softplus=True
    )
    assert torch.equal(out[:, rows], tail)
    del out, u, delta


def test_torch_compile_fullgraph(ops):
    from selective_scan import selective_scan_fn

    inp = make_inputs(2, 8, 50, 16, torch.float32)

    def step(u, delta, A, B, C, D, z, bias):
        return selective_scan_fn(u, delta, A, B, C, D, z, bias, delta_softplus=True).sum()

    compiled = torch.compile(step, fullgraph=True)
    leaves = [(v.clone().requires_grad_() if v is not None else None) for v in (inp[k] for k in NAMES)]
    loss = compiled(*leaves)
    loss.backward()
    eager = [(v.clone().requires_grad_() if v is not None else None) for v in (inp[k] for k in NAMES)]
    loss_e = step(*eager)
    loss_e.backward()
    torch.testing.assert_close(loss, loss_e)
    for a, b in zip(leaves, eager):
        torch.testing.assert_close(a.grad, b.grad)


def test_direct_op_rejects_bad_input(ops):
    inp = make_inputs(1, 4, 10, 4, torch.float32)
    args = [inp[k] for k in NAMES]
    with pytest.raises(RuntimeError, match="dstate"):
        ops.fwd(args[0], args[1], torch.randn(4, 300, device="cuda"), *args[3:], True, False)
    with pytest.raises(RuntimeError, match="delta must have shape"):
        ops.fwd(args[0], args[1][..., :5], *args[2:], True, False)
    with pytest.raises(RuntimeError, match="variable B"):
        ops.fwd(args[0], args[1], args[2], args[3][..., :3], *args[4:], True, False)
    # the classic binding raises TypeError for a dtype; the stable ABI can only raise RuntimeError
    with pytest.raises((RuntimeError, TypeError), match="u must be"):
        ops.fwd(args[0].double(), args[1].double(), *args[2:], True, False)
    out, _, ckpt = ops.fwd(*args, True, True)
    empty = out.new_empty((0,))
    with pytest.raises(RuntimeError, match="ckpt"):
        ops.bwd(*args, out, ckpt[:, :, :0], out, torch.empty_like(out), empty, True)
    with pytest.raises(RuntimeError, match="out_z must have shape"):
        ops.bwd(*args, out, ckpt, out, torch.empty_like(out), out[:, :2], True)
    with pytest.raises(RuntimeError, match="out_z must not overlap itself"):
        ops.bwd(*args, out, ckpt, out, torch.empty_like(out), out[:, :1].expand_as(out), True)
    no_z = list(args)
    no_z[NAMES.index("z")] = None
    with pytest.raises(RuntimeError, match="out_z .* needs z"):
        ops.bwd(*no_z, out, ckpt, None, empty, torch.empty_like(out), True)


@pytest.mark.parametrize("kind", ["projected", "given_fixed_b", "complex", "given_3d_c"])
def test_mamba_inner_fn_on_the_kernels(ops, monkeypatch, kind):
    """mamba_inner_fn through the compiled conv and scan (fp32) against the PyTorch path in
    float64: output and every gradient; dz/dx land in place in the split dxz."""
    from selective_scan import mamba_inner_fn

    g = torch.Generator(device="cuda").manual_seed(3)
    batch, L, d_model, d_inner, d_state, dt_rank = 2, 97, 16, 32, 8, 4
    cplx = kind == "complex"
    A = -torch.exp(0.5 * torch.randn(d_inner, d_state, device="cuda", generator=g))
    if cplx:
        A = torch.complex(A, torch.randn(d_inner, d_state, device="cuda", generator=g))
    reals = d_state * (2 if cplx else 1)
    B = C = None
    n_var = 2
    if kind == "given_fixed_b":
        B = torch.randn(d_inner, d_state, device="cuda", generator=g)
        n_var = 1
    if kind == "given_3d_c":
        C = torch.randn(batch, d_state, L, device="cuda", generator=g)
        n_var = 1
    args = dict(
        xz=torch.randn(batch, 2 * d_inner, L, device="cuda", generator=g),
        conv1d_weight=0.5 * torch.randn(d_inner, 1, 4, device="cuda", generator=g),
        conv1d_bias=0.1 * torch.randn(d_inner, device="cuda", generator=g),
        x_proj_weight=0.2 * torch.randn(dt_rank + n_var * reals, d_inner, device="cuda", generator=g),
        delta_proj_weight=0.3 * torch.randn(d_inner, dt_rank, device="cuda", generator=g),
        out_proj_weight=0.2 * torch.randn(d_model, d_inner, device="cuda", generator=g),
        out_proj_bias=0.1 * torch.randn(d_model, device="cuda", generator=g),
        A=A, B=B, C=C,
        D=torch.randn(d_inner, device="cuda", generator=g),
        delta_bias=0.3 * torch.randn(d_inner, device="cuda", generator=g) - 1.0,
    )

    def run(dtype64: bool):
        leaves = {}
        for k, v in args.items():
            if v is None:
                leaves[k] = None
                continue
            v = v.detach().clone()
            if dtype64:
                v = v.to(torch.complex128 if v.is_complex() else torch.float64)
            leaves[k] = v.requires_grad_()
        out = mamba_inner_fn(**leaves, delta_softplus=True)
        out.backward(torch.ones_like(out))
        return out, leaves

    out, leaves = run(False)
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "reference")
    ref, ref_leaves = run(True)
    assert_close(out, ref, torch.float32, "out")
    for k, v in leaves.items():
        if v is not None:
            assert_close(v.grad, ref_leaves[k].grad, torch.float32, f"d{k}")
