"""selective_state_update against the float64 one-step recurrence, incl. state_batch_indices,
and against the full scan (decode after prefill)."""

from __future__ import annotations

import pytest
import torch
from test_selective_scan_loops import loop_scan, loop_state_update

from selective_scan import selective_scan_fn, selective_state_update

F64 = torch.float64


def make(batch=3, heads=4, dim=5, n=6, groups=2, dtype=torch.float32, seed=0, slots=None):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=F64).to(dtype)

    state = rnd(slots or batch, heads, dim, n)
    x, dt, z = rnd(batch, heads, dim), rnd(batch, heads, dim), rnd(batch, heads, dim)
    A = (-torch.rand(heads, dim, n, generator=g, dtype=F64)).to(dtype)
    B, C = rnd(batch, groups, n), rnd(batch, groups, n)
    D, dt_bias = rnd(heads, dim), rnd(heads, dim)
    return state, x, dt, A, B, C, D, z, dt_bias


@pytest.mark.parametrize("softplus", [False, True])
@pytest.mark.parametrize("optional", [True, False])
def test_heads_form_matches_recurrence(softplus, optional):
    state, x, dt, A, B, C, D, z, dt_bias = make()
    if not optional:
        D = z = dt_bias = None
    if not softplus:
        dt = dt.abs()
    want_out, want_state = loop_state_update(state, x, dt, A, B, C, D, z, dt_bias, softplus)
    before = state.data_ptr()
    out = selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, softplus)
    assert state.data_ptr() == before and out.shape == x.shape and out.dtype == x.dtype
    torch.testing.assert_close(out.to(F64), want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.to(F64), want_state, rtol=1e-5, atol=1e-5)


def test_no_heads_form():
    state, x, dt, A, B, C, D, z, dt_bias = make(heads=1, groups=1, dtype=F64)
    want_out, want_state = loop_state_update(state, x, dt, A, B, C, D, z, dt_bias, True)
    s3 = state[:, 0].clone()
    out = selective_state_update(
        s3, x[:, 0], dt[:, 0], A[0], B[:, 0], C[:, 0], D[0], z[:, 0], dt_bias[0], True
    )
    assert out.shape == x[:, 0].shape
    torch.testing.assert_close(out, want_out[:, 0])
    torch.testing.assert_close(s3, want_state[:, 0])


def test_half_state_keeps_dtype():
    state, x, dt, A, B, C, D, z, dt_bias = make(dtype=torch.bfloat16)
    want_out, want_state = loop_state_update(state, x, dt, A, B, C, D, z, dt_bias, True)
    out = selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, True)
    assert state.dtype == out.dtype == torch.bfloat16
    torch.testing.assert_close(state.to(F64), want_state, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out.to(F64), want_out, rtol=3e-2, atol=3e-2)


def test_state_batch_indices_with_padding():
    state, x, dt, A, B, C, D, z, dt_bias = make(batch=4, slots=7, dtype=F64)
    idx = torch.tensor([5, -1, 0, 2])
    original = state.clone()
    out = selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, True, state_batch_indices=idx)
    for row, slot in enumerate(idx.tolist()):
        if slot < 0:  # padded row: zero output, no slot touched
            assert torch.equal(out[row], torch.zeros_like(out[row]))
            continue
        want_out, want_state = loop_state_update(
            original[slot : slot + 1],
            x[row : row + 1],
            dt[row : row + 1],
            A,
            B[row : row + 1],
            C[row : row + 1],
            D,
            z[row : row + 1],
            dt_bias,
            True,
        )
        torch.testing.assert_close(out[row], want_out[0])
        torch.testing.assert_close(state[slot], want_state[0])
    untouched = [s for s in range(7) if s not in (5, 0, 2)]
    assert torch.equal(state[untouched], original[untouched])


def test_padded_slot_with_garbage_state_stays_clean():
    state, x, dt, A, B, C, D, z, dt_bias = make(batch=2, slots=3, dtype=F64)
    state[0] = float("nan")  # slot 0 is never addressed by a valid row
    out = selective_state_update(
        state,
        x,
        dt,
        A,
        B,
        C,
        D,
        z,
        dt_bias,
        True,
        state_batch_indices=torch.tensor([-1, 2], dtype=torch.int32),
    )
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("idx,match", [([0, 0], "repeat"), ([0, 3], "< state.shape"), ([0], "shape")])
def test_bad_state_batch_indices(idx, match):
    state, x, dt, A, B, C, *_ = make(batch=2, slots=3)
    with pytest.raises(ValueError, match=match):
        selective_state_update(state, x, dt, A, B, C, state_batch_indices=torch.tensor(idx))


def test_bad_shapes():
    state, x, dt, A, B, C, D, *_ = make(heads=3, groups=2)
    with pytest.raises(ValueError, match="divisible by ngroups"):
        selective_state_update(state, x, dt, A, B, C)
    state, x, dt, A, B, C, D, *_ = make()
    with pytest.raises(ValueError, match="dt"):
        selective_state_update(state, x, dt[:, :, :-1], A, B, C)
    with pytest.raises(ValueError, match="D"):
        selective_state_update(state, x, dt, A, B, C, D=D[0])
    with pytest.raises(ValueError, match="state.shape"):
        selective_state_update(state[:-1], x, dt, A, B, C)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        selective_state_update(state, x.tolist(), dt, A, B, C)


def test_decode_continues_the_scan():
    # prefill with the scan, then one decode step == the scan over L + 1 tokens (mamba#187)
    g = torch.Generator().manual_seed(11)
    b, d, n, L = 2, 4, 5, 30
    u = torch.randn(b, d, L + 1, generator=g, dtype=F64)
    delta = torch.randn(b, d, L + 1, generator=g, dtype=F64)
    A = -torch.rand(d, n, generator=g, dtype=F64)
    B = torch.randn(b, n, L + 1, generator=g, dtype=F64)
    C = torch.randn(b, n, L + 1, generator=g, dtype=F64)
    D, bias = torch.randn(d, generator=g, dtype=F64), torch.rand(d, generator=g, dtype=F64)
    z = torch.randn(b, d, L + 1, generator=g, dtype=F64)
    full, _ = loop_scan(u, delta, A, B, C, D, z, bias, True)
    _, state = selective_scan_fn(
        u[..., :L], delta[..., :L], A, B[..., :L], C[..., :L], D, z[..., :L], bias, True, True
    )
    out = selective_state_update(
        state, u[..., L], delta[..., L], A, B[..., L], C[..., L], D, z[..., L], bias, True
    )
    torch.testing.assert_close(out, full[..., L])


@pytest.mark.parametrize("heads", [True, False])
def test_backward_with_a_float32_state(heads):
    # the state already has the compute dtype: its float32 view must not be an alias that the
    # in-place update then overwrites under autograd
    state, x, dt, A, B, C, D, z, dt_bias = make(heads=4 if heads else 1, groups=2 if heads else 1)
    assert state.dtype == torch.float32
    inputs = [x, dt, A, B, C, D, z, dt_bias]
    leaves = [t.clone().requires_grad_() for t in inputs]
    start = state.clone().requires_grad_()  # the state comes out of earlier differentiable steps
    live = start.clone()
    if heads:
        out = selective_state_update(live, *leaves[:7], dt_bias=leaves[7], dt_softplus=True)
    else:  # the same single head in the no-heads form
        x1, dt1, A1, B1, C1, D1, z1, bias1 = leaves
        one = (x1[:, 0], dt1[:, 0], A1[0], B1[:, 0], C1[:, 0], D1[0], z1[:, 0])
        out = selective_state_update(live[:, 0], *one, dt_bias=bias1[0], dt_softplus=True)[:, None]
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    (out * w).sum().backward()
    ref_leaves = [t.to(F64).requires_grad_() for t in [state, *inputs]]
    want_out, want_state = loop_state_update(*ref_leaves[:8], ref_leaves[8], True)
    (want_out * w.to(F64)).sum().backward()
    torch.testing.assert_close(out.detach().to(F64), want_out.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(live.detach().to(F64), want_state.detach(), rtol=1e-5, atol=1e-5)
    names = ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias")
    for name, got, ref in zip(names, [start, *leaves], ref_leaves):
        torch.testing.assert_close(got.grad.to(F64), ref.grad, rtol=1e-4, atol=1e-4, msg=name)
