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


@pytest.mark.parametrize("flag", ["no", "", 0, 1, None, 1.0, torch.tensor(True), [True]], ids=repr)
def test_dt_softplus_must_be_a_bool(flag):
    # as selective_scan_fn's flags: "no" used to be truthy and silently applied softplus
    state, x, dt, A, B, C, D, z, dt_bias = make()
    before = state.clone()
    with pytest.raises(TypeError, match=r"dt_softplus must be a bool \(True or False\), got "):
        selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus=flag)
    assert torch.equal(state, before), "a rejected call must not touch the state"


def test_dt_softplus_accepts_numpy_bools():
    np = pytest.importorskip("numpy")
    for flag in (np.bool_(True), np.bool_(False)):
        state, x, dt, A, B, C, D, z, dt_bias = make()
        want_out, want_state = loop_state_update(state, x, dt, A, B, C, D, z, dt_bias, bool(flag))
        out = selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus=flag)
        torch.testing.assert_close(out.to(F64), want_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state.to(F64), want_state, rtol=1e-5, atol=1e-5)


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


def _bad_input_cases():
    state, x, dt, A, B, C, D, z, dt_bias = make(batch=2, heads=4, dim=3, n=5, groups=2)
    base = dict(state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias)
    meta = torch.zeros(4, 3, device="meta")
    return base, [
        (dict(x=[1.0]), TypeError, "x must be a torch.Tensor, got list"),
        (dict(D=3), TypeError, "D must be a torch.Tensor, got int"),
        (dict(D=meta), ValueError, "all tensors must be on one device: state is on cpu but D is on meta"),
        (dict(state=state[0, 0]), ValueError,
         "state must be (batch, dim, dstate) or (batch, nheads, dim, dstate), got (3, 5)"),
        (dict(x=x[:, :2]), ValueError,
         "x must have shape (2, 4, 3) ((batch, nheads, dim), matching state), got (2, 2, 3)"),
        (dict(dt=dt[:1]), ValueError,
         "dt must have shape (2, 4, 3) (same as x (batch, nheads, dim)), got (1, 4, 3)"),
        (dict(z=z[..., :1]), ValueError,
         "z must have shape (2, 4, 3) (same as x (batch, nheads, dim)), got (2, 4, 1)"),
        (dict(A=A[:, :, :2]), ValueError, "A must have shape (4, 3, 5) (matching state), got (4, 3, 2)"),
        (dict(B=B[:, 0]), ValueError, "B must be (batch, ngroups, dstate), got (2, 5)"),
        (dict(B=B[:, :, :4]), ValueError,
         "B must have shape (2, 2, 5) ((batch, [ngroups,] dstate)), got (2, 2, 4)"),
        (dict(C=C[:, :1]), ValueError, "C must have shape (2, 2, 5) (same as B), got (2, 1, 5)"),
        (dict(B=B[:, :0], C=C[:, :0]), ValueError,
         "nheads must be divisible by ngroups: nheads=4, ngroups=0"),
        (dict(D=D[:2]), ValueError, "D must have shape (4, 3) (one value per channel), got (2, 3)"),
        (dict(dt_bias=dt_bias[0]), ValueError,
         "dt_bias must have shape (4, 3) (one value per channel), got (3,)"),
        (dict(z=z.to(torch.int32)), TypeError,
         "z must be a real floating dtype (float32/16, bfloat16, float64), got torch.int32"),
        (dict(state=state[:1]), ValueError,
         "without state_batch_indices, state.shape[0] must equal the batch 2, got 1"),
        (dict(state_batch_indices=torch.zeros(2)), ValueError,
         "state_batch_indices must be an int32/int64 tensor of shape (2,), got torch.float32 (2,)"),
    ]


def test_every_decode_step_rule_has_its_whole_message():
    # the checks compare on the good path and build each message only on failure: pin them all
    import re

    base, cases = _bad_input_cases()
    for change, exc, message in cases:
        with pytest.raises(exc, match="^" + re.escape(message) + "$"):
            selective_state_update(**{**base, **change})
