"""Independent float64 per-step references for the selective-scan tests (written from the
maths, not from the package), plus checks of those references against closed forms.

Other selective-scan test files import these helpers.
"""

from __future__ import annotations

import math

import torch

F64, C128 = torch.float64, torch.complex128


def softplus20(x: torch.Tensor) -> torch.Tensor:
    """softplus that is the identity above 20."""
    above = x > 20
    return torch.where(above, x, torch.log1p(torch.exp(x.masked_fill(above, 0.0))))


def silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1 + torch.exp(-x))


def _per_channel(t: torch.Tensor, batch: int, dim: int, L: int, is_complex: bool) -> torch.Tensor:
    """B or C as (batch, dim, n, L) in float64/complex128."""
    if t.dim() == 2:  # fixed (dim, n)
        t = t.to(C128 if is_complex else F64)
        return t[None, :, :, None].expand(batch, dim, t.shape[1], L)
    t = t.to(F64)
    if t.dim() == 3:
        t = t[:, None]
    if is_complex:  # real/imag interleaved along time
        t = torch.complex(t[..., 0::2], t[..., 1::2])
    groups = t.shape[1]
    return t.repeat_interleave(dim // groups, dim=1)


def loop_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """Returns (out, last_state) in float64 (complex128 state for complex A); autograd-able."""
    batch, dim, L = u.shape
    cplx = A.is_complex()
    u, delta = u.to(F64), delta.to(F64)
    if delta_bias is not None:
        delta = delta + delta_bias.to(F64)[:, None]
    if delta_softplus:
        delta = softplus20(delta)
    Ad = A.to(C128 if cplx else F64)
    Bd = _per_channel(B, batch, dim, L, cplx)
    Cd = _per_channel(C, batch, dim, L, cplx)
    h = torch.zeros(batch, dim, A.shape[1], dtype=Ad.dtype)
    ys = []
    for t in range(L):
        dt = delta[:, :, t, None]
        h = torch.exp(dt * Ad) * h + dt * Bd[..., t] * u[:, :, t, None]
        y = (h * Cd[..., t]).sum(-1)
        ys.append(2 * y.real if cplx else y)
    out = torch.stack(ys, -1)
    if D is not None:
        out = out + D.to(F64)[:, None] * u
    if z is not None:
        out = out * silu(z.to(F64))
    return out, h


def loop_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """One step in the heads form: state (b,h,d,n), x/dt/z (b,h,d), A (h,d,n), B/C (b,g,n)."""
    dt = dt.to(F64)
    if dt_bias is not None:
        dt = dt + dt_bias.to(F64)
    if dt_softplus:
        dt = softplus20(dt)
    heads = x.shape[1]
    Bh = B.to(F64).repeat_interleave(heads // B.shape[1], dim=1)[:, :, None]
    Ch = C.to(F64).repeat_interleave(heads // C.shape[1], dim=1)[:, :, None]
    new = torch.exp(dt[..., None] * A.to(F64)) * state.to(F64) + (dt * x.to(F64))[..., None] * Bh
    out = (new * Ch).sum(-1)
    if D is not None:
        out = out + D.to(F64) * x.to(F64)
    if z is not None:
        out = out * silu(z.to(F64))
    return out, new


def test_loop_constant_decay_closed_form():
    # constant delta, A, B, C, u: h_t = dt*B*u * (1 - r^(t+1)) / (1 - r), r = exp(dt*A)
    L, dt, a, b, c, u0 = 50, 0.3, -0.7, 1.5, 0.4, 2.0
    u = torch.full((1, 1, L), u0, dtype=F64)
    delta = torch.full((1, 1, L), dt, dtype=F64)
    out, last = loop_scan(
        u,
        delta,
        torch.tensor([[a]], dtype=F64),
        torch.tensor([[b]], dtype=F64),
        torch.tensor([[c]], dtype=F64),
    )
    r = math.exp(dt * a)
    want = [c * dt * b * u0 * (1 - r ** (t + 1)) / (1 - r) for t in range(L)]
    torch.testing.assert_close(out[0, 0], torch.tensor(want, dtype=F64))
    torch.testing.assert_close(last[0, 0, 0], torch.tensor(want[-1] / c, dtype=F64))


def test_loop_complex_rotation_closed_form():
    # A = i*w, no decay: h_t = dt*b*u * sum_k exp(i w dt k); out = 2 Re(c h)
    L, dt, w = 20, 0.5, 0.9
    u = torch.ones(1, 1, L, dtype=F64)
    delta = torch.full((1, 1, L), dt, dtype=F64)
    A = torch.tensor([[1j * w]], dtype=C128)
    out, _ = loop_scan(u, delta, A, torch.ones(1, 1, dtype=C128), torch.ones(1, 1, dtype=C128))
    want = [2 * sum(math.cos(w * dt * k) for k in range(t + 1)) * dt for t in range(L)]
    torch.testing.assert_close(out[0, 0], torch.tensor(want, dtype=F64))


def test_softplus20_threshold():
    x = torch.tensor([-3.0, 0.0, 19.99, 20.0, 20.01, 80.0], dtype=F64)
    want = torch.tensor(
        [
            math.log1p(math.exp(-3.0)),
            math.log(2.0),
            math.log1p(math.exp(19.99)),
            math.log1p(math.exp(20.0)),
            20.01,
            80.0,
        ],
        dtype=F64,
    )
    x.requires_grad_()
    y = softplus20(x)
    torch.testing.assert_close(y, want)
    y.sum().backward()
    sig = 1 / (1 + torch.exp(-x.detach()))
    torch.testing.assert_close(x.grad, torch.where(x.detach() > 20, torch.ones_like(sig), sig))
