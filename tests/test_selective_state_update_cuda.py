"""GPU tests of the compiled selective_state_update kernel (selective_scan._update_ops).

Every result is compared with a float64 reference: the package's pure-PyTorch function run on
float64 copies of the very same inputs (it is checked against the step-by-step recurrence on
CPU in test_selective_scan_state_update.py). Inputs are fresh random tensors; outputs are
poisoned (NaN) before the kernel runs so an unwritten element shows; state memory the step must
not touch is compared bitwise. GPU tests are marked ``gpu`` and skipped without a GPU
(conftest.py); the CPU tests at the end run everywhere.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional

import header_values
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


def _mamba2_inputs(batch, ngroups, state_dtype, nheads=8, headdim=64, dstate=128):
    """Mamba-2's decode operands: per-head A, dt, D and dt_bias expanded over (dim, dstate)
    with stride 0."""
    state = torch.randn(batch, nheads, headdim, dstate, device="cuda").to(state_dtype)
    x = torch.randn(batch, nheads, headdim, device="cuda", dtype=torch.bfloat16)
    dt = torch.rand(batch, nheads, 1, device="cuda", dtype=torch.bfloat16).expand(-1, -1, headdim)
    A = (-torch.rand(nheads, 1, 1, device="cuda")).expand(-1, headdim, dstate)
    B = torch.randn(batch, ngroups, dstate, device="cuda", dtype=torch.bfloat16)
    C = torch.randn(batch, ngroups, dstate, device="cuda", dtype=torch.bfloat16)
    D = torch.randn(nheads, 1, device="cuda").expand(-1, headdim)
    dt_bias = torch.randn(nheads, 1, device="cuda").expand(-1, headdim)
    z = torch.randn(batch, nheads, headdim, device="cuda", dtype=torch.bfloat16)
    return state, x, dt, A, B, C, D, z, dt_bias


@gpu
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_mamba2_decode_shape_with_broadcast_operands(ops, state_dtype):
    run_and_check(ops, *_mamba2_inputs(3, 1, state_dtype), softplus=True)


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
def test_dstate_zero_is_refused(ops):
    # a step with no state is refused before any dispatch, naming the argument and the rule
    inputs = make_inputs(2, 3, 5, 0, 1)
    with pytest.raises(ValueError, match=r"dstate \(state.shape\[-1\]\) must be >= 1, got 0"):
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


# ------------------------------------------------- GPU: every kernel and launch shape of update.cu
#
# Which kernel runs (update.cu's launcher): the typed kernel <state dtype, T> when x, dt, B, C
# (and z) share a dtype T, A is float32, D and dt_bias are each float32 or T, dstate is a whole
# number of 16-byte chunks (4 fp32 / 8 16-bit states) and state, A (or an A with stride 0 along
# the states), B and C allow whole-chunk vector reads; otherwise the generic kernel of the state
# dtype. Launch shape: lanes per row = chunks rounded up to a power of two (at most 32); "wide"
# (two chunks per lane) for fp32 states with dstate > 128; else "pair" (two batch rows per
# thread) when batch >= 2 and (batch // 2) * nheads * dim * lanes >= pair_min_threads()
# (PAIR_MIN_THREADS_PER_SM per SM of the running GPU); else one row each.
# A typed launch that is not "wide", has batch and nheads <= 65535 and keeps every offset below
# 2**31 runs the lean kernel instead: one pass of 32 / lanes rows per warp below
# lean_full_rows() rows (batch * nheads * dim: LEAN_FULL_ROWS_PER_SM per SM of the running GPU),
# all of a row's lanes' passes (32 rows) from it on.

PAIR_MIN_THREADS_PER_SM = 1984
LEAN_FULL_ROWS_PER_SM = 256


def pair_min_threads() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return PAIR_MIN_THREADS_PER_SM * props.multi_processor_count


def lean_full_rows() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return LEAN_FULL_ROWS_PER_SM * props.multi_processor_count


def _lanes(dstate: int, state_dtype: torch.dtype) -> int:
    chunk = 16 // torch.empty(0, dtype=state_dtype).element_size()
    chunks = -(-dstate // chunk)
    lanes = 1
    while lanes < min(chunks, 32):
        lanes *= 2
    return lanes


def _pair_dim(batch: int, nheads: int, dstate: int, state_dtype: torch.dtype) -> int:
    """An odd channel count just large enough for the pair shape at this batch and heads."""
    need = -(-pair_min_threads() // ((batch // 2) * nheads * _lanes(dstate, state_dtype)))
    return need | 1


ACT = ("x", "dt", "z", "B", "C")


@gpu
@pytest.mark.parametrize("batch", [1, 16, 65, 256])  # one row / one row / pair (odd) / pair
@pytest.mark.parametrize("weights", ["fp32", "act"])  # A fp32; D, dt_bias fp32 or in T
@pytest.mark.parametrize("in_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_typed_kernels_at_decode_batches(ops, state_dtype, in_dtype, weights, batch):
    # Mamba-1 decode: dim 5120, dstate 16, 3-D layout, contiguous: every typed kernel
    dtypes = {n: in_dtype for n in ACT}
    if weights == "act":
        dtypes.update(D=in_dtype, dt_bias=in_dtype)
    inputs = make_inputs(batch, None, 5120, 16, 1, state_dtype, dtypes)
    run_and_check(ops, *inputs, softplus=True)


@gpu
@pytest.mark.parametrize("absent", ["D", "z", "dt_bias", "D+z", "D+dt_bias", "z+dt_bias"])
@pytest.mark.parametrize("weights", ["fp32", "act"])
@pytest.mark.parametrize("batch", [1, 256])  # with fp32 weights: the row kernel, the lean kernel
def test_lean_kernel_each_optional_operand_absent(ops, batch, weights, absent):
    # The row and lean kernels load an absent z from x and an absent D or dt_bias from A (so
    # that no load waits behind a branch); what they read there must not reach the output: each
    # operand left out on its own and in pairs, the others present in fp32 or in the
    # activations' dtype (the lean kernel at both batches then).
    dtypes = {n: torch.bfloat16 for n in ACT}
    if weights == "act":
        dtypes.update(D=torch.bfloat16, dt_bias=torch.bfloat16)
    inputs = dict(zip(("state", *NAMES), make_inputs(batch, None, 5120, 16, 1, torch.float32, dtypes)))
    for name in absent.split("+"):
        inputs[name] = None
    run_and_check(ops, *inputs.values(), softplus=True)


def _channel_stride_2(t: torch.Tensor) -> torch.Tensor:
    """t's values in a view whose channels (last axis) are two elements apart."""
    big = torch.full((*t.shape, 2), float("nan"), device="cuda", dtype=t.dtype)
    view = big[..., 0]
    view.copy_(t)
    return view


@gpu
@pytest.mark.parametrize("case", ["1x96", "5x100", "7x100-linear", "3x4x96-idx", "64x96-idx",
                                  "2x8x64-groups"])
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_row_and_lean_kernels_agree_bitwise(ops, state_dtype, case):
    # A small launch over dense operands takes the row kernel (update.cu); the same values with
    # x, dt and z two elements apart along the channels take the lean kernel. Both must give
    # the reference's values and the same bits, in the output and in the state (slot indices
    # with a padded row included). 1x96 and 5x100 (a part warp) are Mamba-1's step, which the
    # row kernel takes with its shape fixed at compile time; without softplus (linear) it does not.
    batch, nheads, ngroups = {"1x96": (1, None, 1), "5x100": (5, None, 1), "7x100-linear": (7, None, 1),
                              "3x4x96-idx": (3, 4, 1), "64x96-idx": (64, None, 1),
                              "2x8x64-groups": (2, 8, 2)}[case]
    dim = 64 if nheads == 8 else 100 if case.endswith(("100", "linear")) else 96
    softplus = not case.endswith("linear")
    dtypes = {n: torch.bfloat16 for n in ACT}
    slots = batch + 3 if case.endswith("idx") else None
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(batch, nheads, dim, 16, ngroups, state_dtype, dtypes,
                                                       slots=slots)
    idx = None
    if slots:
        idx = torch.randperm(slots, device="cuda")[:batch].to(torch.int32)
        idx[batch // 2] = -1
    row_state, lean_state = state.clone(), state.clone()
    row_out = run_and_check(ops, row_state, x, dt, A, B, C, D, z, dt_bias, softplus, idx)
    xs, dts, zs = (_channel_stride_2(t) for t in (x, dt, z))
    lean_out = ops.update(lean_state, xs, dts, A, B, C, D, zs, dt_bias, softplus, idx)
    assert torch.equal(bits(row_out), bits(lean_out))
    assert torch.equal(bits(row_state), bits(lean_state))


def _kernels_launched(fn) -> List[str]:
    """The names of the CUDA kernels fn launches, as the profiler (CUPTI) records them."""
    acts = [torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@gpu
@pytest.mark.parametrize("case, kernel", [
    ("1x96", r"state_update_row<[^<>]*, true>"),  # Mamba-1's step, shape fixed at compile time
    ("1x5120", r"state_update_row<[^<>]*, true>"),  # the decode bench's batch 1
    ("64x5120", r"state_update_row<[^<>]*, true>"),  # its batch 64: the most rows the row kernel takes
    ("7x100-linear", r"state_update_row<[^<>]*, false>"),  # no softplus: not Mamba-1's step
    ("3x4x96-idx", r"state_update_row<[^<>]*, false>"),  # heads and slot indices
    ("256x5120", r"state_update_lean<"),  # past the row kernel's rows
    ("1x96-strided", r"state_update_lean<"),  # x, dt and z two elements apart along the channels
    ("1x96-bf16-A", r"state_update_kernel<"),  # a model cast whole to bf16: the generic kernel
])
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_each_step_takes_the_kernel_meant_for_it(ops, state_dtype, case, kernel):
    # The bitwise tests above show the kernels agree; this shows which one each shape ran, so a
    # change of the launcher's choice (and of what the decode bench measures) cannot pass unseen.
    sizes = [int(v) for v in case.split("-")[0].split("x")]  # batch[ x heads] x dim
    batch, nheads, dim = sizes[0], sizes[1] if len(sizes) == 3 else None, sizes[-1]
    dtypes = {n: torch.bfloat16 for n in (NAMES if case.endswith("bf16-A") else ACT)}
    slots = batch + 3 if case.endswith("idx") else None
    inputs = make_inputs(batch, nheads, dim, 16, 1, state_dtype, dtypes, slots=slots)
    state, x, dt, A, B, C, D, z, dt_bias = inputs
    idx = torch.randperm(slots, device="cuda")[:batch].to(torch.int32) if slots else None
    if case.endswith("strided"):
        x, dt, z = (_channel_stride_2(t) for t in (x, dt, z))
    softplus = not case.endswith("linear")
    names = _kernels_launched(lambda: ops.update(state, x, dt, A, B, C, D, z, dt_bias, softplus, idx))
    steps = [n for n in names if "state_update" in n]
    assert len(steps) == 1, f"expected one decode kernel, the profiler recorded {names} (is CUPTI available?)"
    assert re.search(kernel, steps[0]), f"{case}: ran {steps[0]}, expected {kernel}"


@gpu
@pytest.mark.parametrize("batch", [1, 64])
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_generic_kernel_all_16_bit_with_a_16_bit_A(ops, state_dtype, batch):
    # a model cast whole to bf16 (A too): the generic kernel, one-row and pair shapes
    dtypes = {n: torch.bfloat16 for n in NAMES}
    inputs = make_inputs(batch, None, 5120, 16, 1, state_dtype, dtypes)
    run_and_check(ops, *inputs, softplus=True)


DSTATES = [1, 2, 4, 5, 8, 12, 16, 17, 24, 40, 64, 100, 128, 129, 136, 200, 256]


@gpu
@pytest.mark.parametrize("shape", ["one", "pair"])
@pytest.mark.parametrize("dstate", DSTATES)
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_every_dstate_and_chunking(ops, state_dtype, dstate, shape):
    # whole chunks (typed), partial chunks (generic), fewer chunks than lanes, two chunks per
    # lane (fp32, dstate > 128: never paired), in the one-row and the pair launch shapes
    nheads, batch = 2, (3 if shape == "one" else 8)
    dim = 37 if shape == "one" else _pair_dim(batch, nheads, dstate, state_dtype)
    dtypes = {n: torch.bfloat16 for n in ACT}
    inputs = make_inputs(batch, nheads, dim, dstate, 1, state_dtype, dtypes)
    run_and_check(ops, *inputs, softplus=True)


@gpu
@pytest.mark.parametrize("layout", [(24, 3), (80, 8), (7, 7), (6, 1)], ids=lambda v: f"h{v[0]}g{v[1]}")
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_many_heads_and_groups_in_the_pair_shape(ops, state_dtype, layout):
    # heads per group 8, 10, 1 and 6 (the kernel divides block and head indices by multiply-shift)
    nheads, ngroups = layout
    batch, dstate = 6, 64
    dim = _pair_dim(batch, nheads, dstate, state_dtype)
    inputs = make_inputs(batch, nheads, dim, dstate, ngroups, state_dtype, {n: torch.bfloat16 for n in ACT})
    run_and_check(ops, *inputs, softplus=True)


@gpu
@pytest.mark.parametrize("dim", [1, 3, 33])
@pytest.mark.parametrize("dstate", [4, 16, 256])
def test_short_channel_axis(ops, dim, dstate):
    # blocks shrink to whole warps when a (batch, head) has few channels
    inputs = make_inputs(5, 3, dim, dstate, 1, torch.float32, {n: torch.bfloat16 for n in ACT})
    run_and_check(ops, *inputs, softplus=False)


@gpu
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_pair_shape_with_slot_indices_and_padding(ops, state_dtype, idx_dtype):
    # pairs of rows with one, both or neither padded, over a cache larger than the batch
    batch, slots = 33, 50
    dim = _pair_dim(batch, 1, 16, state_dtype)
    inputs = make_inputs(batch, None, dim, 16, 1, state_dtype, {n: torch.bfloat16 for n in ACT}, slots=slots)
    g = torch.Generator().manual_seed(3)
    idx = torch.randperm(slots, generator=g)[:batch]
    idx[[0, 1, 4, 9, 32]] = torch.tensor([-1, -1, -7, -1, -1])  # pair 0 both, 2 and 4 one, 16 the odd one
    run_and_check(ops, *inputs, softplus=True, idx=idx.to("cuda", idx_dtype))


@gpu
@pytest.mark.parametrize("side", ["below", "from"])
@pytest.mark.parametrize("dstate", [8, 16, 64, 128])
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_lean_kernel_on_both_sides_of_the_full_pass_launch(ops, state_dtype, dstate, side):
    # 3 heads of 45 channels: partial warps and partial last passes in both launch shapes;
    # lanes per row 1-32 (a single pass whatever the launch, up to 32 passes in pairs)
    nheads, dim = 3, 45
    full = lean_full_rows()
    batch = full // (nheads * dim) + (1 if side == "from" else 0)
    assert (batch * nheads * dim >= full) == (side == "from")
    inputs = make_inputs(batch, nheads, dim, dstate, 3, state_dtype, {n: torch.bfloat16 for n in ACT})
    run_and_check(ops, *inputs, softplus=True)


@gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_lean_full_pass_launch_with_slot_indices_padding_and_bad_index(ops, state_dtype):
    # whole blocks of padding and of an index past the cache, between live ones
    nheads, dim, slots = 2, 333, 120
    batch = lean_full_rows() // (nheads * dim) + 1
    acts = {n: torch.bfloat16 for n in ACT}
    inputs = make_inputs(batch, nheads, dim, 16, 1, state_dtype, acts, slots=slots)
    idx = torch.randperm(slots, generator=torch.Generator().manual_seed(11))[:batch]
    idx[[0, 5, batch - 1]] = -1
    run_and_check(ops, *inputs, softplus=True, idx=idx.to("cuda"))
    idx[7] = slots  # past the cache: NaN output, nothing touched
    state = inputs[0]
    before = state.clone()
    out = ops.update(*inputs, True, idx.to("cuda"))
    torch.cuda.synchronize()
    assert torch.isnan(out[7]).all() and torch.isfinite(out[8]).all() and (out[0] == 0).all()
    touched = torch.zeros(slots, dtype=torch.bool)
    touched[idx[(idx >= 0) & (idx < slots)]] = True
    untouched = ~touched.cuda()
    assert torch.equal(bits(state[untouched]), bits(before[untouched])), "an unreferenced slot changed"


@gpu
@pytest.mark.parametrize("dim", [1, 4])  # one row per lane group / pairs of rows (fp32 state)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_general_typed_kernel_beyond_the_lean_grid(ops, state_dtype, dim):
    # A batch above 65535 exceeds the lean kernel's grid (its z axis): the general typed kernel
    # runs, with slot indices and padded rows.
    batch, slots = 70000, 70010
    inputs = make_inputs(batch, None, dim, 16, 1, state_dtype, {n: torch.bfloat16 for n in ACT}, slots=slots)
    idx = torch.randperm(slots, generator=torch.Generator().manual_seed(5))[:batch]
    idx[[0, 3, batch - 1]] = -1
    run_and_check(ops, *inputs, softplus=True, idx=idx.to("cuda"))


@gpu
def test_offsets_past_2_31_take_the_general_kernel(ops):
    # Slots past 2^31 elements of the cache: 32-bit offsets would wrap there, so the launcher
    # must not pick the lean kernel. Only the used slots are compared (a float64 copy of the
    # whole 4.3 GB cache would not fit the test).
    dim, n, batch = 8, 16, 3
    slots = (1 << 31) // (dim * n) + 4
    state = torch.zeros(slots, dim, n, device="cuda", dtype=torch.bfloat16)
    idx = torch.tensor([slots - 1, 5, slots - 3], device="cuda")
    used = torch.randn(batch, dim, n, device="cuda").to(torch.bfloat16)
    state[idx] = used
    _, x, dt, A, B, C, D, z, dt_bias = make_inputs(batch, None, dim, n, 1, torch.bfloat16,
                                                   {k: torch.bfloat16 for k in ACT})
    want_out, want_state = reference(used, x, dt, A, B, C, D, z, dt_bias, True)
    out = ops.update(state, x, dt, A, B, C, D, z, dt_bias, True, idx)
    assert_close(out, want_out, torch.bfloat16)
    assert_close(state[idx], want_state, torch.bfloat16)
    assert not state[6:16].any()  # a slot no row names stays untouched
    del state


@gpu
def test_pair_shape_index_past_the_cache(ops):
    batch = 4
    dim = _pair_dim(batch, 1, 16, torch.float32)
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(batch, None, dim, 16, slots=5)
    idx = torch.tensor([2, 5, -1, 1 << 40], device="cuda")  # rows 1 and 3 out of range
    before = state.clone()
    out = ops.update(state, x, dt, A, B, C, D, z, dt_bias, True, idx)
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all() and torch.isnan(out[3]).all() and (out[2] == 0).all()
    want_out, want_state = reference(before[2:3], x[:1], dt[:1], A, B[:1], C[:1], D, z[:1], dt_bias, True)
    assert_close(out[:1], want_out, torch.float32)
    assert_close(state[2:3], want_state, torch.float32)
    untouched = torch.tensor([True, True, False, True, True], device="cuda")
    assert torch.equal(bits(state[untouched]), bits(before[untouched]))


@gpu
@pytest.mark.parametrize("dstate", [16, 256])
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_generic_kernel_strided_state_in_the_large_shapes(ops, state_dtype, dstate):
    # a window of a bigger cache (no vector access): generic kernel, pair (16) or wide (256 fp32)
    batch, nheads = 8, 2
    dim = _pair_dim(batch, nheads, dstate, state_dtype) if dstate == 16 else 65
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(
        batch, nheads, dim, dstate, 1, state_dtype, {n: torch.bfloat16 for n in ACT}
    )
    cache = torch.randn(batch + 2, nheads, dim + 1, dstate + 3, device="cuda").to(state_dtype)
    view = cache[1:-1, :, 1:, 2:-1]
    view.copy_(state)
    before = cache.clone()
    run_and_check(ops, view, x, dt, A, B, C, D, z, dt_bias, softplus=True)
    outside = torch.ones_like(cache, dtype=torch.bool)
    outside[1:-1, :, 1:, 2:-1] = False
    assert torch.equal(bits(cache[outside]), bits(before[outside])), "wrote outside the state view"


@gpu
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_misaligned_state_takes_the_generic_kernel(ops, state_dtype):
    # contiguous rows but the state starts 1 element into its buffer: no 16-byte accesses
    batch, dim, dstate = 6, 300, 16
    buf = torch.randn(batch * dim * dstate + 1, device="cuda").to(state_dtype)
    state = buf[1:].view(batch, dim, dstate)
    inputs = list(make_inputs(batch, None, dim, dstate, 1, state_dtype, {n: torch.bfloat16 for n in ACT}))
    state.copy_(inputs[0])
    inputs[0] = state
    run_and_check(ops, *inputs, softplus=True)


@gpu
@pytest.mark.parametrize("state_dtype", DTYPES, ids=str)
def test_mamba2_broadcast_operands_in_the_pair_shape(ops, state_dtype):
    # Mamba-2's expanded per-head A, dt, D, dt_bias at a serving batch: typed kernel, A read once
    batch, nheads, headdim, dstate = 64, 8, 64, 128
    assert (batch // 2) * nheads * headdim * _lanes(dstate, state_dtype) >= pair_min_threads()
    run_and_check(ops, *_mamba2_inputs(batch, 2, state_dtype, nheads, headdim, dstate), softplus=True)


@gpu
@pytest.mark.parametrize("optional", [False, True])
def test_pair_shape_without_optional_operands_and_softplus(ops, optional):
    batch = 64
    inputs = make_inputs(batch, None, 5120, 16, 1, torch.float32, {n: torch.bfloat16 for n in ACT}, optional)
    run_and_check(ops, *inputs, softplus=False)


@gpu
def test_pair_shape_repeated_runs_agree_bitwise(ops):
    inputs = make_inputs(64, None, 5120, 16, 1, torch.float32, {n: torch.bfloat16 for n in ACT})
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
    # the op goes first and refuses; our checks then name the rule as on CPU
    state, x, dt, A, B, C, D, z, dt_bias = make_inputs(2, 4, 8, 16, 2)
    before = state.clone()
    with pytest.raises(ValueError, match="dt must have shape"):
        selective_state_update(state, x, dt[:, :, :-1], A, B, C)
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        selective_state_update(state, x.cpu(), dt, A, B, C)
    with pytest.raises(ValueError, match="state_batch_indices must be an int32/int64"):
        selective_state_update(state, x, dt, A, B, C, state_batch_indices=torch.zeros(2, device="cuda"))
    torch.cuda.synchronize()
    assert kernel_calls["n"] == 3 and torch.equal(state, before)  # refused, the state untouched
    # the in-place target's rule, shared with causal_conv1d_update: checked before the op
    shared = state[:, :, :1].expand(2, 4, 8, 16)
    with pytest.raises(ValueError, match="state is written in place and must not overlap itself"):
        selective_state_update(shared, x, dt, A, B, C)
    assert kernel_calls["n"] == 3


# ---------------------------------------------------------------------------- CPU, everywhere


def test_launch_shape_mirrors_match_the_kernel_policy():
    # the GPU tests pick sizes on either side of these; a policy change must move them too
    assert header_values.policy("UpdatePolicy", "kPairMinThreadsPerSm") == PAIR_MIN_THREADS_PER_SM
    assert header_values.policy("UpdatePolicy", "kLeanFullRowsPerSm") == LEAN_FULL_ROWS_PER_SM


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
