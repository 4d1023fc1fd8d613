"""Forward and backward of the selective scan in PyTorch, built on ``chunked.scan``.

Math (per batch b, channel d, state n):
``dt = softplus(delta + delta_bias)`` (identity above 20), ``a_t = dt_t A``,
``h_t = exp(a_t) h_{t-1} + dt_t B_t u_t``, ``y_t = sum_n C_t h_t (+ D u_t)`` (``2 Re`` for
complex A), ``out = y * silu(z)``.

The backward recomputes the states h rather than keeping an autograd graph, runs the
adjoint ``g_t = conj(C_t) dy_t + conj(exp(a_{t+1})) g_{t+1}`` with the same chunked scan
(reversed), and forms every gradient from h, g and ``d a_t = conj(exp(a_t) h_{t-1}) g_t``.

Work is done in blocks of (batches, channels of one group) sized so that the
(batch, channels, dstate, L) temporaries stay cache-friendly and memory stays bounded;
blocks are independent except for the sums that form dA, dB, dC, dD and ddelta_bias.
Inputs are validated by the caller (``_checks``); tensors may have any strides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F

from . import chunked
from ._checks import compute_dtype

Tensor = torch.Tensor

# Target size (elements) of one block's (batch, channels, dstate, L) temporaries.
BLOCK_ELEMENTS = 1 << 20
SOFTPLUS_THRESHOLD = 20.0


@dataclass
class _Problem:
    """The normalised arguments shared by forward and backward."""

    u: Tensor
    delta: Tensor
    A: Tensor
    B: Tensor  # fixed (dim, n) or variable (batch, G, n, L), complex for complex A
    C: Tensor
    D: Optional[Tensor]
    z: Optional[Tensor]
    delta_bias: Optional[Tensor]
    delta_softplus: bool
    real: torch.dtype  # compute dtype (float32 or float64)
    cplx: torch.dtype  # dtype of A-related quantities (real or complex)
    groups: int

    @property
    def is_complex(self) -> bool:
        return self.A.is_complex()


def _as_variable(t: Tensor, is_complex: bool) -> Tensor:
    """Variable B/C as (batch, G, n, L); complex ones from interleaved real/imag pairs."""
    if t.dim() == 3:
        t = t.unsqueeze(1)
    if is_complex:
        t = torch.view_as_complex(t.unflatten(-1, (-1, 2)).contiguous())
    return t


def make_problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus, groups) -> _Problem:
    real = compute_dtype(u)
    cplx = (torch.complex128 if real == torch.float64 else torch.complex64) if A.is_complex() else real
    if B.dim() > 2:
        B = _as_variable(B.to(real), A.is_complex())
    if C.dim() > 2:
        C = _as_variable(C.to(real), A.is_complex())
    return _Problem(u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus), real, cplx, groups)


def _blocks(p: _Problem) -> Iterator[Tuple[slice, slice, int]]:
    """(batch slice, channel slice, group) blocks covering the problem."""
    batch, dim, L = p.u.shape
    n = p.A.shape[1]
    dpg = dim // p.groups
    chans = max(1, BLOCK_ELEMENTS // (n * L))
    if chans >= dpg:
        nb = max(1, chans // dpg)
        for b0 in range(0, batch, nb):
            for g in range(p.groups):
                yield slice(b0, min(b0 + nb, batch)), slice(g * dpg, (g + 1) * dpg), g
    else:
        for b0 in range(batch):
            for g in range(p.groups):
                for d0 in range(g * dpg, (g + 1) * dpg, chans):
                    yield slice(b0, b0 + 1), slice(d0, min(d0 + chans, (g + 1) * dpg)), g


def _bc_block(t: Tensor, bs: slice, ds: slice, g: int, dtype: torch.dtype) -> Tensor:
    """B or C broadcastable to (batch, channels, n, L)."""
    if t.dim() == 2:
        return t[ds].to(dtype)[None, :, :, None]
    return t[bs, g].to(dtype)[:, None]


class _Block:
    """One block's recomputed quantities: dt, a = dt*A, the scan input x and the states h."""

    def __init__(self, p: _Problem, bs: slice, ds: slice, g: int):
        self.ds = ds
        self.u = p.u[bs, ds].to(p.real)
        pre = p.delta[bs, ds].to(p.real)
        if p.delta_bias is not None:
            pre = pre + p.delta_bias[ds].to(p.real)[:, None]
        self.pre = pre
        self.dt = F.softplus(pre, threshold=SOFTPLUS_THRESHOLD) if p.delta_softplus else pre
        self.A = p.A[ds].to(p.cplx)
        self.Bv = _bc_block(p.B, bs, ds, g, p.cplx)
        self.Cv = _bc_block(p.C, bs, ds, g, p.cplx)
        self.a = self.dt.unsqueeze(-2) * self.A.unsqueeze(-1)  # (b, d, n, L)
        self.dtu = self.dt * self.u
        x = self.dtu.unsqueeze(-2) * self.Bv
        shape = self.a.shape
        self.h = chunked.scan(self.a.reshape(-1, shape[-1]), x.reshape(-1, shape[-1])).view(shape)

    def y(self, p: _Problem) -> Tensor:
        """Un-gated output y + D u, (b, d, L) in the compute dtype."""
        y = (self.h * self.Cv).sum(-2)
        y = 2 * y.real if p.is_complex else y
        if p.D is not None:
            y = y + p.D[self.ds].to(p.real)[:, None] * self.u
        return y


def _iter_blocks(p: _Problem) -> Iterator[Tuple[slice, slice, int, _Block]]:
    for bs, ds, g in _blocks(p):
        yield bs, ds, g, _Block(p, bs, ds, g)


def forward(p: _Problem, return_last_state: bool) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """Returns (out, out_z or None, last_state or None); out has delta's layout."""
    batch, dim, _ = p.u.shape
    out = torch.empty_like(p.delta)
    out_z = torch.empty_like(p.delta) if p.z is not None else None
    last = p.u.new_empty((batch, dim, p.A.shape[1]), dtype=p.cplx) if return_last_state else None
    for bs, ds, _g, blk in _iter_blocks(p):
        y = blk.y(p)
        out[bs, ds] = y
        if out_z is not None:
            out_z[bs, ds] = y * F.silu(p.z[bs, ds].to(p.real))
        if last is not None:
            last[bs, ds] = blk.h[..., -1]
    return out, out_z, last


def backward(
    p: _Problem, dout: Tensor, dz: Optional[Tensor] = None, recompute_out_z: bool = False
) -> List[Optional[Tensor]]:
    """Gradients ``[du, ddelta, dA, dB, dC, dD, ddelta_bias, dz, out_z]`` for the scan output
    (gated when z is given). A given ``dz`` (z's shape) is written in place and returned.
    ``out_z`` is only computed when ``recompute_out_z``."""
    batch, dim, L = p.u.shape
    n = p.A.shape[1]
    du = torch.empty_like(p.u)
    ddelta = torch.empty_like(p.delta)
    if p.z is not None and dz is None:
        dz = torch.empty_like(p.z)
    out_z = torch.empty_like(p.delta) if (recompute_out_z and p.z is not None) else None
    dA = torch.zeros(dim, n, dtype=p.cplx, device=p.u.device)
    dB = torch.zeros(p.B.shape, dtype=p.cplx, device=p.u.device)
    dC = torch.zeros(p.C.shape, dtype=p.cplx, device=p.u.device)
    dD = torch.zeros(dim, dtype=p.real, device=p.u.device) if p.D is not None else None
    dbias = torch.zeros(dim, dtype=p.real, device=p.u.device) if p.delta_bias is not None else None
    for bs, ds, g, blk in _iter_blocks(p):
        dy = dout[bs, ds].to(p.real)
        if p.z is not None:
            y = blk.y(p)
            zb = p.z[bs, ds].to(p.real)
            sig = torch.sigmoid(zb)
            silu = zb * sig
            dz[bs, ds] = dy * y * sig * (1 + zb * (1 - sig))
            if out_z is not None:
                out_z[bs, ds] = y * silu
            dy = dy * silu
        if dD is not None:
            dD[ds] += (dy * blk.u).sum((0, 2))
        dyw = 2 * dy if p.is_complex else dy  # d/d(sum C h) of y = 2 Re(sum C h)
        h = blk.h
        # dC_t = conj(h_t) dy_t
        dCt = h.conj() * dyw.unsqueeze(-2) if p.is_complex else h * dyw.unsqueeze(-2)
        if p.C.dim() == 2:
            dC[ds] += dCt.sum((0, 3))
        else:
            dC[bs, g] += dCt.sum(1)
        q = blk.Cv.conj() * dyw.unsqueeze(-2) if p.is_complex else blk.Cv * dyw.unsqueeze(-2)
        q = q.expand(h.shape)
        gr = chunked.scan_reverse(blk.a.reshape(-1, L), q.reshape(-1, L)).view(h.shape)
        # d a_t = conj(exp(a_t) h_{t-1}) g_t
        h_prev = F.pad(h[..., :-1], (1, 0))
        da = blk.a.exp() * h_prev
        da = da.conj() * gr if p.is_complex else da * gr
        dA[ds] += (da * blk.dt.unsqueeze(-2)).sum((0, 3))
        # x_t = dt_t u_t B_t: dB_t = dt_t u_t g_t, and sum_n conj(B_t) g_t feeds du and ddt
        dBt = gr * blk.dtu.unsqueeze(-2)
        if p.B.dim() == 2:
            dB[ds] += dBt.sum((0, 3))
        else:
            dB[bs, g] += dBt.sum(1)
        Bg = (blk.Bv.conj() * gr).sum(-2) if p.is_complex else (blk.Bv * gr).sum(-2)
        Ada = (
            (blk.A.conj().unsqueeze(-1) * da).sum(-2) if p.is_complex else (blk.A.unsqueeze(-1) * da).sum(-2)
        )
        if p.is_complex:
            Bg, Ada = Bg.real, Ada.real
        du_b = blk.dt * Bg
        if p.D is not None:
            du_b = du_b + p.D[ds].to(p.real)[:, None] * dy
        du[bs, ds] = du_b
        ddt = blk.u * Bg + Ada
        if p.delta_softplus:
            ddt = torch.where(blk.pre <= SOFTPLUS_THRESHOLD, ddt * torch.sigmoid(blk.pre), ddt)
        ddelta[bs, ds] = ddt
        if dbias is not None:
            dbias[ds] += ddt.sum((0, 2))
    return [du, ddelta, dA, dB, dC, dD, dbias, dz, out_z]
