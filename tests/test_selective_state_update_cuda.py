"""GPU tests of the compiled selective_state_update kernel (selective_scan._update_ops).

Every result is compared with a float64 reference: the package's pure-PyTorch function run on
float64 copies of the very same inputs (it is checked against the step-by-step recurrence on
CPU in test_selective_scan_state_update.py). Inputs are fresh random tensors; outputs are
poisoned (NaN) before the kernel runs so an unwritten element shows; state memory the step must
not touch is compared bitwise. GPU tests are marked ``gpu`` and skipped without a GPU
(conftest.py); the CPU tests at the end run everywhere.
"""

from __future__ import annotations

from typing import Dict, Optional

import pytest
import torch

from selective_scan import selective_state_update
from selective_scan.selective_state_update import _kernel_fits

gpu = pytest.mark.gpu
F64 = torch.float64
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias")


@pytest.fixture
def ops():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from selective_scan import _update_ops

    return _update_ops


@pytest.fixture
def strict(ops, monkeypatch):
    """The public function must take the compiled path: a missing extension is an error."""
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "cuda")


@pytest.fixture
def kernel_calls(ops, strict, monkeypatch):
    """Counts the public function's calls into the compiled op."""
    calls = {"n": 0}
    real = ops.update

    def spy(*args):
        calls["n"] += 1
        return real(*args)

    monkeypatch.setattr(ops, "update", spy)
    return calls


def _poison_allocator(nbytes: int) -> None:
    """Leave NaN in the caching allocator's free blocks, so the next output (if not fully
    written by the kernel) holds NaN instead of stale finite values."""
    t = torch.full((max(nbytes // 4, 1 << 20),), float("nan"), device="cuda")
    del t


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits (bitwise comparison that also holds for NaN)."""
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def _tol(*dtypes: torch.dtype) -> float:
    """Relative tolerance set by the least precise storage dtype involved."""
    table = {F64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
    return max(table[d] for d in dtypes)


def assert_close(actual: torch.Tensor, ref: torch.Tensor, *dtypes: torch.dtype) -> None:
    assert actual.shape == ref.shape, (actual.shape, ref.shape)
    a = actual.double()
    assert torch.isfinite(a).all(), "non-finite values (unwritten or wrong elements)"
    tol = _tol(*dtypes)
    scale = max(1.0, ref.abs().max().item()) if ref.numel() else 1.0
    torch.testing.assert_close(a, ref, rtol=tol, atol=tol * scale)


def make_inputs(
    batch: int,
    nheads: Optional[int],
    dim: int,
    dstate: int,
    ngroups: int = 1,
    state_dtype: torch.dtype = torch.float32,
    dtypes: Optional[Dict[str, torch.dtype]] = None,
    optional: bool = True,
    slots: Optional[int] = None,
):
    """Random inputs on the GPU; nheads None gives the 3-D layout (no heads axis)."""
    dtypes = dtypes or {}

    def dt_of(name):
        return dtypes.get(name, torch.float32)

    h = [] if nheads is None else [nheads]
    g = [] if nheads is None else [ngroups]

    def rnd(name, *shape, scale=1.0):
        return (torch.randn(*shape, device="cuda") * scale).to(dt_of(name))

    state = torch.randn(slots or batch, *h, dim, dstate, device="cuda").to(state_dtype)
    x = rnd("x", batch, *h, dim)
    dt = rnd("dt", batch, *h, dim, scale=0.5)
    A = (-torch.rand(*h, dim, dstate, device="cuda") - 0.1).to(dt_of("A"))
    B = rnd("B", batch, *g, dstate)
    C = rnd("C", batch, *g, dstate)
    D = rnd("D", *h, dim) if optional else None
    z = rnd("z", batch, *h, dim) if optional else None
    dt_bias = rnd("dt_bias", *h, dim, scale=0.5) if optional else None
    return state, x, dt, A, B, C, D, z, dt_bias


def reference(state, x, dt, A, B, C, D, z, dt_bias, softplus, idx=None):
    """(out, new state) from the pure-PyTorch function on float64 copies; state not touched."""
    d64 = lambda t: None if t is None else t.to(F64)  # noqa: E731
    s64 = state.to(F64, copy=True)  # a copy even when state is float64 already
    out = selective_state_update(
        s64, d64(x), d64(dt), d64(A), d64(B), d64(C), d64(D), d64(z), d64(dt_bias), softplus, idx
    )
    return out, s64


def run_and_check(ops, state, x, dt, A, B, C, D, z, dt_bias, softplus, idx=None, through_api=False):
    """One step through the op (or the public function) against the reference. Every slot not
    referenced by a valid row must stay bitwise unchanged."""
    want_out, want_state = reference(state, x, dt, A, B, C, D, z, dt_bias, softplus, idx)
    before = state.clone()
    _poison_allocator(x.numel() * x.element_size() * 4)
    if through_api:
        out = selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, softplus, idx)
    else:
        out = ops.update(state, x, dt, A, B, C, D, z, dt_bias, softplus, idx)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    in_dtypes = [t.dtype for t in (x, dt, A, B, C, D, z, dt_bias) if t is not None]
    assert_close(out, want_out, state.dtype, *in_dtypes)
    if idx is None:
        touched = torch.ones(state.shape[0], dtype=torch.bool, device="cuda")
    else:
        touched = torch.zeros(state.shape[0], dtype=torch.bool, device="cuda")
        touched[idx[idx >= 0].long()] = True
        pad = idx < 0
        assert (out[pad] == 0).all(), "a padded row's output must be exactly 0"
    assert_close(state[touched], want_state[touched], state.dtype, *in_dtypes)
    assert torch.equal(bits(state[~touched]), bits(before[~touched])), "an unreferenced slot changed"
    return out


# ------------------------------------------------------------------------- GPU: the contract


LAYOUTS = [(None, 1), (1, 1), (4, 1), (4, 2), (4, 4)]  # (nheads or None for 3-D, ngroups)


@gpu
@pytest.mark.parametrize("dstate", [1, 3, 8, 16, 17, 64, 128, 256])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda v: f"h{v[0]}g{v[1]}")
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_layouts_and_dstate(ops, state_dtype, layout, dstate):
    nheads, ngroups = layout
    inputs = make_inputs(3, nheads, 37, dstate, ngroups, state_dtype)
    run_and_check(ops, *inputs, softplus=True)


@gpu
@pytest.mark.parametrize("optional,softplus", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("in_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_dtype_combinations(ops, state_dtype, in_dtype, optional, softplus):
    # x, dt, z, B, C in the activation dtype; A, D, dt_bias fp32 (as models keep them)
    dtypes = {n: in_dtype for n in ("x", "dt", "z", "B", "C")}
    inputs = make_inputs(4, 8, 64, 16, 2, state_dtype, dtypes, optional)
    run_and_check(ops, *inputs, softplus=softplus)


@gpu
@pytest.mark.parametrize("seed", range(12))
def test_every_operand_its_own_dtype(ops, seed):
    g = torch.Generator().manual_seed(seed)
    pick = lambda: DTYPES[int(torch.randint(3, (1,), generator=g))]  # noqa: E731
    dtypes = {n: pick() for n in NAMES}
    nheads = None if seed % 3 == 0 else 2
    dstate = [16, 5, 64, 128][seed % 4]
    inputs = make_inputs(3, nheads, 40, dstate, 1, pick(), dtypes)
    run_and_check(ops, *inputs, softplus=bool(seed % 2))


@gpu
@pytest.mark.parametrize("batch", [1, 2, 7, 64])
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_mamba1_decode_shape(ops, state_dtype, batch):
    # dim 5120, dstate 16, the 3-D layout; contiguous state: the 16-byte vector path
    dtypes = {n: torch.bfloat16 for n in ("x", "dt", "z", "B", "C")}
    inputs = make_inputs(batch, None, 5120, 16, 1, state_dtype, dtypes)
    run_and_check(ops, *inputs, softplus=True)


@gpu
@pytest.mark.parametrize(
    "batch,nheads,dim,dstate", [(4, None, 1024, 256), (8, 16, 64, 128), (2, 2, 700, 64)], ids=str
)
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_many_rows_large_dstate(ops, state_dtype, batch, nheads, dim, dstate):
    # enough rows that each row keeps the fewest lanes (most states per thread)
    inputs = make_inputs(batch, nheads, dim, dstate, 1, state_dtype, {"x": torch.bfloat16})
    run_and_check(ops, *inputs, softplus=True)


@gpu
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_mamba2_decode_shape_with_broadcast_operands(ops, state_dtype):
    # Mamba-2 passes per-head A, dt, D and dt_bias expanded over (dim, dstate) with stride 0
    batch, nheads, headdim, dstate, ngroups = 3, 8, 64, 128, 1
    state = torch.randn(batch, nheads, headdim, dstate, device="cuda").to(state_dtype)
    x = torch.randn(batch, nheads, headdim, device="cuda", dtype=torch.bfloat16)
    dt = torch.rand(batch, nheads, 1, device="cuda", dtype=torch.bfloat16).expand(-1, -1, headdim)
    A = (-torch.rand(nheads, 1, 1, device="cuda")).expand(-1, headdim, dstate)
    B = torch.randn(batch, ngroups, dstate, device="cuda", dtype=torch.bfloat16)
    C = torch.randn(batch, ngroups, dstate, device="cuda", dtype=torch.bfloat16)
    D = torch.randn(nheads, 1, device="cuda").expand(-1, headdim)
    dt_bias = torch.randn(nheads, 1, device="cuda").expand(-1, headdim)
    z = torch.randn(batch, nheads, headdim, device="cuda", dtype=torch.bfloat16)
    run_and_check(ops, state, x, dt, A, B, C, D, z, dt_bias, softplus=True)


def _strided(t: torch.Tensor, pad_last: int = 3) -> torch.Tensor:
    """t as a non-contiguous view with an odd storage offset: a slice of a wider buffer."""
    big = torch.full((*t.shape[:-1], t.shape[-1] + pad_last + 1), float("nan"), device="cuda", dtype=t.dtype)
    view = big[..., 1 : 1 + t.shape[-1]]
    view.copy_(t)
    return view


@gpu
@pytest.mark.parametrize("heads", [False, True])
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_strided_views_everywhere(ops, state_dtype, heads):
    nheads = 4 if heads else None
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(3, nheads, 33, 16, 2 if heads else 1, state_dtype)
    # state: a window of a bigger cache (offset slots, channels and states; odd strides)
    h = [4] if heads else []
    cache = torch.randn(5, *h, 40, 21, device="cuda").to(state_dtype)
    view = cache[1:4, ..., 2:35, 3:19]
    view.copy_(state)
    x, dt, z, B, C, A, D, dt_bias = (_strided(t) for t in (x, dt, z, B, C, A, D, dt_bias))
    before = cache.clone()
    run_and_check(ops, view, x, dt, A, B, C, D, z, dt_bias, softplus=True)
    outside = torch.ones_like(cache, dtype=torch.bool)
    outside[1:4, ..., 2:35, 3:19] = False
    assert torch.equal(bits(cache[outside]), bits(before[outside])), "wrote outside the state view"


@gpu
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_state_with_dstate_not_innermost(ops, state_dtype):
    # (batch, nheads, dim, dstate) stored as (batch, dstate, nheads, dim): no unit stride on dstate
    inputs = list(make_inputs(2, 3, 24, 16, 1, state_dtype))
    inputs[0] = inputs[0].permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)
    assert inputs[0].stride(-1) != 1
    run_and_check(ops, *inputs, softplus=False)


@gpu
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("heads", [False, True])
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_state_batch_indices_padding_and_larger_cache(ops, state_dtype, heads, idx_dtype):
    nheads = 4 if heads else None
    inputs = make_inputs(6, nheads, 50, 16, 2 if heads else 1, state_dtype, slots=11)
    idx = torch.tensor([7, -1, 0, 10, -5, 3], device="cuda", dtype=idx_dtype)
    run_and_check(ops, *inputs, softplus=True, idx=idx)


@gpu
def test_state_batch_indices_strided_on_a_strided_cache(ops):
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(4, 2, 30, 12, 1, slots=9)
    cache = torch.randn(12, 2, 31, 13, device="cuda")[1:10, :, 1:, 1:]
    cache.copy_(state)
    idx = torch.tensor([[5, 0], [-1, 0], [8, 0], [2, 0]], device="cuda")[:, 0]  # stride 2
    run_and_check(ops, cache, x, dt, A, B, C, D, z, dt_bias, softplus=True, idx=idx)


@gpu
def test_index_past_the_cache_gives_nan_and_touches_nothing(ops):
    # No host sync to check the values: the kernel must stay in bounds and make the error visible.
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(3, None, 70, 16, slots=4)
    idx = torch.tensor([1, 4, 1 << 40], device="cuda")
    before = state.clone()
    out = ops.update(state, x, dt, A, B, C, D, z, dt_bias, True, idx)
    torch.cuda.synchronize()
    assert torch.isnan(out[1:]).all()
    want_out, want_state = reference(before[1:2], x[:1], dt[:1], A, B[:1], C[:1], D, z[:1], dt_bias, True)
    assert_close(out[:1], want_out, torch.float32)
    assert_close(state[1:2], want_state, torch.float32)
    untouched = torch.tensor([True, False, True, True], device="cuda")
    assert torch.equal(bits(state[untouched]), bits(before[untouched]))


@gpu
def test_padded_row_never_reads_its_slot(ops):
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(2, 2, 16, 16, slots=3)
    state[0] = float("nan")  # addressed by no valid row
    out = ops.update(state, x, dt, A, B, C, D, z, dt_bias, True, torch.tensor([-1, 2], device="cuda"))
    assert torch.isfinite(out).all() and (out[0] == 0).all()


@gpu
def test_more_than_65535_batch_heads(ops):
    # batch * nheads beyond the grid's y limit: blocks loop over (batch, head) pairs
    inputs = make_inputs(40000, 2, 3, 4, 1)
    run_and_check(ops, *inputs, softplus=True)


@gpu
def test_dstate_zero(ops):
    inputs = make_inputs(2, 3, 5, 0, 1)
    run_and_check(ops, *inputs, softplus=True)


@gpu
def test_softplus_identity_above_20(ops):
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(2, None, 64, 16)
    dt = 19.0 + 3.0 * torch.rand_like(dt)  # both sides of the threshold
    A = A * 0.01
    run_and_check(ops, state, x, dt, A, B, C, D, z, dt_bias, softplus=True)


@gpu
def test_empty_batch(ops):
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(0, 2, 8, 16)
    out = ops.update(state, x, dt, A, B, C, D, z, dt_bias, True, None)
    assert out.shape == x.shape


@gpu
def test_repeated_runs_agree_bitwise(ops):
    inputs = make_inputs(16, 4, 128, 64, 2, torch.float32, {"x": torch.bfloat16})
    state = inputs[0]
    s1, s2 = state.clone(), state.clone()
    o1 = ops.update(s1, *inputs[1:], True, None)
    o2 = ops.update(s2, *inputs[1:], True, None)
    assert torch.equal(bits(o1), bits(o2)) and torch.equal(bits(s1), bits(s2))


# ------------------------------------------------------------------- GPU: the public function


@gpu
@pytest.mark.parametrize("heads", [False, True])
def test_public_function_takes_the_kernel(ops, kernel_calls, heads):
    inputs = make_inputs(
        5,
        4 if heads else None,
        48,
        16,
        2 if heads else 1,
        torch.float32,
        {"x": torch.bfloat16, "z": torch.bfloat16},
    )
    idx = torch.tensor([3, -1, 0, 6, 2], device="cuda", dtype=torch.int32)
    inputs = list(inputs)
    inputs[0] = torch.randn(7, *inputs[0].shape[1:], device="cuda")
    run_and_check(ops, *inputs, softplus=True, idx=idx, through_api=True)
    assert kernel_calls["n"] == 1


@gpu
def test_public_function_float64_and_large_dstate_run_in_pytorch(ops, kernel_calls):
    inputs = make_inputs(2, 2, 8, 16, 1, F64)
    run_and_check(ops, *inputs, softplus=True, through_api=True)
    inputs = make_inputs(2, 2, 8, 300, 1)
    run_and_check(ops, *inputs, softplus=True, through_api=True)
    assert kernel_calls["n"] == 0


@gpu
def test_public_function_output_is_not_differentiable(ops, kernel_calls):
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(2, None, 16, 16)
    A.requires_grad_()
    D.requires_grad_()
    out = selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, True)
    assert kernel_calls["n"] == 1
    assert not out.requires_grad  # no autograd fallback that would drop the gradient silently
    assert torch.is_grad_enabled()


@gpu
def test_cuda_graph_capture(ops, kernel_calls):
    # The CUDA path makes no host sync (the index values are not read on the host), so a decode
    # step with slot indices can be captured and replayed.
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(4, 2, 32, 16, 1, slots=6)
    idx = torch.tensor([4, -1, 0, 5], device="cuda")
    args = (x, dt, A, B, C, D, z, dt_bias, True, idx)
    selective_state_update(state.clone(), *args)  # warm up (lazy import, dispatch decision)
    want_out, want_state = reference(state, *args)
    start = state.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = selective_state_update(state, *args)
    state.copy_(start)  # capture records the kernel without running it
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, want_out, torch.float32)
    assert_close(state[[4, 0, 5]], want_state[[4, 0, 5]], torch.float32)
    assert torch.equal(state[[1, 2, 3]], start[[1, 2, 3]])
    assert kernel_calls["n"] == 2  # the warm-up and the captured call both ran the kernel


@gpu
def test_torch_compile_fullgraph(ops, strict):
    def step(state, x, dt, A, B, C, D, z, dt_bias, idx):
        out = selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, True, idx)
        return out.float() * 2.0

    compiled = torch.compile(step, fullgraph=True)
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(
        3, 4, 32, 16, 2, torch.bfloat16, {"x": torch.bfloat16}, slots=5
    )
    idx = torch.tensor([4, -1, 1], device="cuda", dtype=torch.int32)
    s_eager, s_comp = state.clone(), state.clone()
    eager = step(s_eager, x, dt, A, B, C, D, z, dt_bias, idx)
    comp = compiled(s_comp, x, dt, A, B, C, D, z, dt_bias, idx)
    assert torch.equal(comp, eager)
    assert torch.equal(bits(s_comp), bits(s_eager)), "the compiled graph must mutate state like eager"


# ------------------------------------------------------------------------ GPU: bad input


@gpu
def test_direct_op_rejects_bad_input(ops):
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(2, 4, 8, 16, 2)
    before = state.clone()
    ok = dict(
        state=state,
        x=x,
        dt=dt,
        A=A,
        B=B,
        C=C,
        D=D,
        z=z,
        dt_bias=dt_bias,
        dt_softplus=True,
        state_batch_indices=None,
    )

    def call(**change):
        a = {**ok, **change}
        return ops.update(
            a["state"],
            a["x"],
            a["dt"],
            a["A"],
            a["B"],
            a["C"],
            a["D"],
            a["z"],
            a["dt_bias"],
            a["dt_softplus"],
            a["state_batch_indices"],
        )

    cases = [
        (dict(x=x[:, :, :-1]), RuntimeError, r"x must have shape \[2, 4, 8\].*got \[2, 4, 7\]"),
        (dict(dt=dt[:1]), RuntimeError, r"dt must have shape"),
        (dict(z=z[:, :3]), RuntimeError, r"z must have shape"),
        (dict(A=A[:, :, :8]), RuntimeError, r"A must have shape \[4, 8, 16\]"),
        (dict(B=B[:, :, :8]), RuntimeError, r"B must have shape"),
        (dict(C=C[:, :1]), RuntimeError, r"C must have shape"),
        (
            dict(B=torch.randn(2, 3, 16, device="cuda"), C=torch.randn(2, 3, 16, device="cuda")),
            RuntimeError,
            r"divisible by ngroups.*nheads=4, ngroups=3",
        ),
        (dict(D=D[0]), RuntimeError, r"D must have shape \[4, 8\]"),
        (dict(dt_bias=dt_bias[:, :2]), RuntimeError, r"dt_bias must have shape"),
        (dict(x=x.double()), TypeError, r"x must be float32, float16 or bfloat16.*Double"),
        (dict(state=state.double()), TypeError, r"state must be float32"),
        (dict(A=A.to(torch.int32)), TypeError, r"A must be float32"),
        (dict(x=x.cpu()), RuntimeError, r"x must be on state's device cuda:0, got cpu"),
        (dict(D=D.cpu()), RuntimeError, r"D must be on state's device"),
        (dict(state=state[:1]), RuntimeError, r"state.shape\[0\] must equal the batch 2, got 1"),
        (dict(state=state[0]), RuntimeError, r"x must be \(batch, dim\)"),
        (dict(state=state[..., 0, 0]), RuntimeError, r"state must be \(batch, dim, dstate\) or"),
        (
            dict(state=state.expand(2, 4, 8, 16).contiguous()[:, :, :1].expand(2, 4, 8, 16)),
            RuntimeError,
            r"no two of its elements may share memory",
        ),
        (
            dict(state_batch_indices=torch.zeros(2, device="cuda")),
            TypeError,
            r"state_batch_indices must be int32 or int64, got Float",
        ),
        (
            dict(state_batch_indices=torch.zeros(3, device="cuda", dtype=torch.int32)),
            RuntimeError,
            r"state_batch_indices must have shape \[2\]",
        ),
        (
            dict(state_batch_indices=torch.zeros(2, dtype=torch.int32)),
            RuntimeError,
            r"state_batch_indices must be on state's device",
        ),
    ]
    for change, exc, match in cases:
        # a dtype is a TypeError from the classic binding, a RuntimeError from the stable ABI
        with pytest.raises((exc, RuntimeError) if exc is TypeError else exc, match=match):
            call(**change)
    big = make_inputs(1, None, 4, 257)
    with pytest.raises(RuntimeError, match=r"dstate \(state.shape\[-1\]\) must be <= 256 .*got 257"):
        ops.update(*big, True, None)
    torch.cuda.synchronize()  # nothing above may have launched a faulty kernel
    assert torch.equal(bits(state), bits(before)), "a rejected call must not touch the state"


@gpu
def test_public_function_rejects_bad_input_like_on_cpu(ops, kernel_calls):
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(2, 4, 8, 16, 2)
    with pytest.raises(ValueError, match="dt must have shape"):
        selective_state_update(state, x, dt[:, :, :-1], A, B, C)
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        selective_state_update(state, x.cpu(), dt, A, B, C)
    with pytest.raises(ValueError, match="state_batch_indices must be an int32/int64"):
        selective_state_update(state, x, dt, A, B, C, state_batch_indices=torch.zeros(2, device="cuda"))
    assert kernel_calls["n"] == 0


# ---------------------------------------------------------------------------- CPU, everywhere


def test_kernel_fits_rule():
    s = torch.zeros(2, 3, 16)
    f32, f64, bf = torch.zeros(1), torch.zeros(1, dtype=F64), torch.zeros(1, dtype=torch.bfloat16)
    assert _kernel_fits(s, f32, bf, None)
    assert not _kernel_fits(s, f32, f64)
    assert not _kernel_fits(s.double(), f32)
    assert _kernel_fits(torch.zeros(2, 3, 256), f32)
    assert not _kernel_fits(torch.zeros(2, 3, 257), f32)


def test_cpu_tensors_take_the_pytorch_path_with_index_checks(monkeypatch):
    monkeypatch.delenv("MAMBA_KERNELS_BACKEND", raising=False)
    state, x, dt = torch.randn(3, 4, 5), torch.randn(2, 4), torch.randn(2, 4)
    A, B, C = -torch.rand(4, 5), torch.randn(2, 5), torch.randn(2, 5)
    with pytest.raises(ValueError, match="must not repeat"):
        selective_state_update(state, x, dt, A, B, C, state_batch_indices=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="< state.shape"):
        selective_state_update(state, x, dt, A, B, C, state_batch_indices=torch.tensor([0, 3]))
    out = selective_state_update(state, x, dt, A, B, C, state_batch_indices=torch.tensor([2, -1]))
    assert out.shape == x.shape and (out[1] == 0).all()


def test_strict_backend_on_cpu_tensors_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "cuda")
    state, x, dt = torch.randn(2, 4, 5), torch.randn(2, 4), torch.randn(2, 4)
    A, B, C = -torch.rand(4, 5), torch.randn(2, 5), torch.randn(2, 5)
    with pytest.raises(RuntimeError, match="MAMBA_KERNELS_BACKEND=cuda"):
        selective_state_update(state, x, dt, A, B, C)
