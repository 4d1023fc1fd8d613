"""Forward and backward of the selective scan in PyTorch, built on ``chunked.scan_``.

Math (per batch b, channel d, state n):
``dt = softplus(delta + delta_bias)`` (identity above 20), ``a_t = dt_t A``,
``h_t = exp(a_t) h_{t-1} + dt_t B_t u_t``, ``y_t = sum_n C_t h_t (+ D u_t)`` (``2 Re`` for
complex A), ``out = y * silu(z)``.

The backward recomputes the states h rather than keeping an autograd graph (in one pass when
the forward kept the states at the scan's chunk ends), runs the adjoint
``g_t = conj(C_t) dy_t + conj(exp(a_{t+1})) g_{t+1}`` with the same scan (reversed), and forms
every gradient from h, g and ``d a_t = conj(exp(a_t) h_{t-1}) g_t``.

Work is done in blocks of (batches, channels of one group). A block's (L, batch, channels,
dstate) quantities live in a few buffers allocated once per call and reused by every block
(fresh large allocations cost page faults comparable to the arithmetic on a CPU), time-major
so that the scan's steps are contiguous slabs. Block sizes keep those buffers cache-sized on a
CPU and, on other devices, as large as the memory rule allows (buffers and a block's
temporaries together at most the size of the inputs, so everything extra stays below twice
it), since there every operation is a kernel launch.
Inputs are validated by the caller (``_checks``); tensors may have any strides.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F

from . import chunked
from ._checks import compute_dtype

Tensor = torch.Tensor

# Elements per (L, batch, channels, dstate) buffer on a CPU: 2**20 (4 MiB in fp32) was the
# fastest of 2**18 .. 2**23 in bench/cpu_scan.py on the 2-core CPU.
CPU_BLOCK_ELEMENTS = 1 << 20
# Elsewhere the cap is the memory rule; this bound only keeps a block's index space modest.
MAX_BLOCK_ELEMENTS = 1 << 28
# The memory rule: buffers and temporaries within this fraction of the inputs' size, the rest of
# twice the inputs left to the results' staging, allocator slack and the caller's own copies.
BUDGET = 1.0
# Below this many elements per buffer (256 KiB in fp32) the rule is not applied: tiny problems
# would be cut into blocks whose per-block overhead dwarfs the work, to save a few hundred KiB.
MIN_BLOCK_ELEMENTS = 1 << 16
# (batch, channels, L) temporaries a block holds at once (dt, dt*u, y, gates, gradients),
# counted next to the buffers against the memory rule.
BLOCK_TEMPORARIES = 12
SOFTPLUS_THRESHOLD = 20.0


@dataclass
class _Problem:
    """The normalised arguments shared by forward and backward."""

    u: Tensor
    delta: Tensor
    A: Tensor
    B: Tensor  # fixed (dim, n) or variable (batch, G, n, L), complex for complex A
    C: Tensor
    Bt: Tensor  # fixed B, or variable B time-major and contiguous: (G, L, batch, n)
    Ct: Tensor
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


def grad_as_given(grad: Tensor, given: Tensor) -> Tensor:
    """A dB or dC from ``backward`` in the shape and dtype of the B or C the caller passed:
    fixed (dim, n) as is; variable without the group axis when given 3-D, and as interleaved
    real/imag pairs along time for complex A."""
    if given.dim() == 2:
        return grad.to(given.dtype)
    if grad.is_complex():
        grad = torch.view_as_real(grad).flatten(-2)
    if given.dim() == 3:
        grad = grad.squeeze(1)
    return grad.to(given.dtype)


def make_problem(u, delta, A, B, C, D, z, delta_bias, delta_softplus, groups) -> _Problem:
    real = compute_dtype(u)
    cplx = (torch.complex128 if real == torch.float64 else torch.complex64) if A.is_complex() else real
    if B.dim() > 2:
        B = _as_variable(B.to(real), A.is_complex())
    if C.dim() > 2:
        C = _as_variable(C.to(real), A.is_complex())
    Bt, Ct = (t if t.dim() == 2 else t.permute(1, 3, 0, 2).contiguous() for t in (B, C))
    return _Problem(u, delta, A, B, C, Bt, Ct, D, z, delta_bias, bool(delta_softplus), real, cplx, groups)


def _nbytes(*ts: Optional[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def _block_limit(p: _Problem, buffers: int, reserved: int) -> int:
    """Elements per buffer: ``buffers`` of them plus a block's (batch, channels, L)
    temporaries fit in ``BUDGET`` times the inputs' size less ``reserved`` bytes (the call's
    other allocations), so that everything extra stays within twice the inputs; but never
    fewer than ``MIN_BLOCK_ELEMENTS``."""
    inputs = _nbytes(p.u, p.delta, p.A, p.B, p.C, p.D, p.z, p.delta_bias)
    per_element = buffers * _itemsize(p.cplx) + BLOCK_TEMPORARIES * _itemsize(p.real) / p.A.shape[1]
    limit = int((BUDGET * inputs - reserved) / per_element)
    cap = CPU_BLOCK_ELEMENTS if p.u.device.type == "cpu" else MAX_BLOCK_ELEMENTS
    return max(MIN_BLOCK_ELEMENTS, min(limit, cap))


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _blocks(p: _Problem, limit: int) -> Iterator[Tuple[slice, slice, int]]:
    """(batch slice, channel slice, group) blocks of at most ``limit`` buffer elements (at least
    one (batch, channel) row each), covering the problem; channel blocks of a group are even."""
    batch, dim, L = p.u.shape
    per_row = p.A.shape[1] * L
    dpg = dim // p.groups
    rows = max(1, limit // per_row)
    if rows >= dpg:
        nb = min(batch, rows // dpg)
        for b0 in range(0, batch, nb):
            for g in range(p.groups):
                yield slice(b0, min(b0 + nb, batch)), slice(g * dpg, (g + 1) * dpg), g
        return
    pieces = -(-dpg // rows)
    size = -(-dpg // pieces)
    for b0 in range(batch):
        for g in range(p.groups):
            for d0 in range(g * dpg, (g + 1) * dpg, size):
                yield slice(b0, b0 + 1), slice(d0, min(d0 + size, (g + 1) * dpg)), g


class _Buffers:
    """Work buffers allocated once per call and reused by every block (no large allocation per
    block). ``big(i, shape)``: (L, batch, channels, dstate) views; one spare time step at the end
    lets ``big(i, shape, 1)`` view buffer i shifted by one step. ``small(i, shape)``: (L,
    batch, channels) views, for sums over the states. ``scan``: the scan's workspace."""

    def __init__(self, p: _Problem, big: int, small: int, limit: int):
        n, L = p.A.shape[1], p.u.shape[2]
        largest = max((bs.stop - bs.start) * (ds.stop - ds.start) * n * L for bs, ds, _ in _blocks(p, limit))
        new = functools.partial(torch.empty, dtype=p.cplx, device=p.u.device)
        self._big = [new(largest + largest // L) for _ in range(big)]
        self._small = [new(largest // n) for _ in range(small)]
        self.scan = new(chunked.work_size((L, largest // L)))

    def big(self, i: int, shape: Tuple[int, ...], shift: int = 0) -> Tensor:
        step = math.prod(shape[1:])
        return self._big[i][shift * step : (shift + shape[0]) * step].view(shape)

    def small(self, i: int, shape: Tuple[int, ...]) -> Tensor:
        return self._small[i][: math.prod(shape)].view(shape)


def _time_major(t: Tensor) -> Tensor:
    """(batch, channels, L) -> an (L, batch, channels) view."""
    return t.permute(2, 0, 1)


def _bc_block(t: Tensor, bs: slice, ds: slice, g: int, dtype: torch.dtype) -> Tensor:
    """B or C (``Bt``/``Ct``) broadcastable to the time-major (L, batch, channels, n)."""
    if t.dim() == 2:
        return t[ds].to(dtype)
    return t[g][:, bs].to(dtype).unsqueeze(2)


def _sum_n(x: Tensor, out: Tensor) -> Tensor:
    """Sum over the last (state) dimension of a contiguous buffer view, into ``out``: a
    matrix-vector product, on a CPU several times faster than a reduction over a short inner
    dimension."""
    n = x.shape[-1]
    torch.mv(x.view(-1, n), x.new_ones(n), out=out.view(-1))
    return out


class _Block:
    """One block: dt and dt*u (batch, channels, L), and in the big buffers the decays
    ``e = exp(dt A)`` (buffer 1) and the states h (buffer 0), (L, batch, channels, dstate).
    ``ckpt`` (K, batch, dim, dstate): the states at the scan's chunk ends, stored (``resume``
    False) or used to recompute the states in one pass (``resume`` True)."""

    def __init__(
        self, p: _Problem, bs: slice, ds: slice, g: int, bufs: _Buffers, ckpt: Optional[Tensor], resume: bool
    ):
        self.ds = ds
        self.u = p.u[bs, ds]
        pre = p.delta[bs, ds].to(p.real)
        if p.delta_bias is not None:
            pre = pre + p.delta_bias[ds].to(p.real)[:, None]
        self.pre = pre
        self.dt = F.softplus(pre, threshold=SOFTPLUS_THRESHOLD) if p.delta_softplus else pre
        self.dtu = self.dt * self.u
        # time-major copies: the (L, batch, channels, dstate) operations read them 2x faster
        self.dt_t, self.dtu_t = _time_major(self.dt).contiguous(), _time_major(self.dtu).contiguous()
        self.A = p.A[ds].to(p.cplx)
        self.Bv = _bc_block(p.Bt, bs, ds, g, p.cplx)
        self.Cv = _bc_block(p.Ct, bs, ds, g, p.cplx)
        bb, dd, L = self.u.shape
        self.shape = (L, bb, dd, p.A.shape[1])
        self.e = bufs.big(1, self.shape)
        torch.mul(self.dt_t.unsqueeze(-1), self.A, out=self.e).exp_()
        self.h = bufs.big(0, self.shape)
        torch.mul(self.dtu_t.unsqueeze(-1), self.Bv, out=self.h)
        if resume:  # the forward's chunk ends are known: one pass gives the states
            chunked.resume_(self.e, self.h, ckpt[:, bs, ds])
        else:
            chunked.scan_(self.e, self.h, work=bufs.scan, ends=None if ckpt is None else ckpt[:, bs, ds])

    def y(self, p: _Problem, work: Tensor, out: Tensor) -> Tensor:
        """Un-gated output y + D u (batch, channels, L), via the buffers ``work`` and ``out``."""
        y = _sum_n(torch.mul(self.h, self.Cv, out=work), out)
        y = (y.real.mul_(2) if p.is_complex else y).permute(1, 2, 0)
        if p.D is None:
            return y.contiguous()
        # into the (batch, channels, L) layout, which every later operation on y reads fastest
        return torch.addcmul(y, self.u, p.D[self.ds].to(p.real)[:, None], out=torch.empty_like(self.pre))


def checkpoints_like(p: _Problem) -> Tensor:
    """An empty tensor for the states at the scan's chunk ends, (K, batch, dim, dstate): about
    1/16 of the states, as large as u for dstate 16."""
    batch, dim, L = p.u.shape
    return p.u.new_empty((chunked.checkpoint_count(L), batch, dim, p.A.shape[1]), dtype=p.cplx)


def forward(p: _Problem, return_last_state: bool, checkpoints: bool = False) -> Tuple[Optional[Tensor], ...]:
    """Returns (out, out_z or None, last_state or None), out in delta's layout; with
    ``checkpoints`` also the states at the scan's chunk ends, for ``backward``."""
    batch, dim, _ = p.u.shape
    out = torch.empty_like(p.delta)
    out_z = torch.empty_like(p.delta) if p.z is not None else None
    empty = p.u.numel() == 0  # no step at all (or nothing to scan): the last state is h0 = 0
    new = p.u.new_zeros if empty else p.u.new_empty
    last = new((batch, dim, p.A.shape[1]), dtype=p.cplx) if return_last_state else None
    ckpt = checkpoints_like(p) if checkpoints else None
    result = (out, out_z, last, ckpt) if checkpoints else (out, out_z, last)
    if empty:
        return result
    limit = _block_limit(p, 2, reserved=_nbytes(p.Bt, p.Ct, last, ckpt))
    bufs = _Buffers(p, big=2, small=1, limit=limit)
    for bs, ds, g in _blocks(p, limit):
        blk = _Block(p, bs, ds, g, bufs, ckpt, resume=False)
        if last is not None:
            last[bs, ds] = blk.h[-1]
        y = blk.y(p, work=blk.e, out=bufs.small(0, blk.shape[:-1]))  # the decays are used up
        out[bs, ds] = y
        if out_z is not None:
            torch.mul(y, F.silu(p.z[bs, ds].to(p.real)), out=out_z[bs, ds])
    return result


def _add_bc_grad(acc: Tensor, grad: Tensor, bs: slice, ds: slice, g: int) -> None:
    """Accumulate a block's dB or dC: fixed (channels, n) or time-major (L, batch, n)."""
    if acc.dim() == 2:
        acc[ds] += grad
    else:
        acc[g][:, bs] += grad


def _from_time_major(t: Tensor) -> Tensor:
    """A variable dB/dC (G, L, batch, n) back to (batch, G, n, L)."""
    return t if t.dim() == 2 else t.permute(2, 0, 3, 1).contiguous()


def _bc_grad(x: Tensor, w: Tensor, fixed: bool, work: Tensor) -> Tensor:
    """``x * w`` for x (L, b, d, n) and w (L, b, d), summed over what B/C is shared across:
    (d, n) for a fixed B/C, else (L, b, n). Through a work buffer (on a CPU much faster than
    batches of tiny matrix products)."""
    return torch.mul(x, w.unsqueeze(-1), out=work).sum((0, 1) if fixed else 2)


def backward(
    p: _Problem,
    dout: Tensor,
    dz: Optional[Tensor] = None,
    recompute_out_z: bool = False,
    checkpoints: Optional[Tensor] = None,
    y: Optional[Tensor] = None,
) -> List[Optional[Tensor]]:
    """Gradients ``[du, ddelta, dA, dB, dC, dD, ddelta_bias, dz, out_z]`` for the scan output
    (gated when z is given). A given ``dz`` (z's shape) is written in place and returned.
    ``out_z`` is only computed when ``recompute_out_z``. ``checkpoints`` from ``forward``
    (same inputs) spare most of the forward scan's recomputation, and its un-gated output ``y``
    (``out``) the output's.

    Long: the reverse scan and the gradients it feeds, block by block, with the recomputation choices
    (checkpoints, y) at the point they apply; split, the blocks' shared state would travel through many
    arguments.
    """
    batch, dim, L = p.u.shape
    n = p.A.shape[1]
    du = torch.empty_like(p.u)
    ddelta = torch.empty_like(p.delta)
    if p.z is not None and dz is None:
        dz = torch.empty_like(p.z)
    out_z = torch.empty_like(p.delta) if (recompute_out_z and p.z is not None) else None
    zeros = functools.partial(torch.zeros, device=p.u.device)
    dA = zeros(dim, n, dtype=p.cplx)
    dB, dC = zeros(p.Bt.shape, dtype=p.cplx), zeros(p.Ct.shape, dtype=p.cplx)
    dD = zeros(dim, dtype=p.real) if p.D is not None else None
    dbias = zeros(dim, dtype=p.real) if p.delta_bias is not None else None
    # dout is one of the backward's inputs; B, C time-major and their gradients are extra
    limit = _block_limit(p, 3, reserved=2 * _nbytes(p.Bt, p.Ct) - _nbytes(dout))
    bufs = _Buffers(p, big=3, small=2, limit=limit) if p.u.numel() else None
    cx = p.is_complex
    conj = torch.conj if cx else (lambda t: t)
    for bs, ds, g in _blocks(p, limit) if bufs else ():
        blk = _Block(p, bs, ds, g, bufs, checkpoints, resume=checkpoints is not None)
        h, e, work = blk.h, blk.e, bufs.big(2, blk.shape)
        sums = (bufs.small(0, blk.shape[:-1]), bufs.small(1, blk.shape[:-1]))
        dy = dout[bs, ds].to(p.real)
        if p.z is not None:  # out = y silu(z): dz = dout y silu'(z), and dy = dout silu(z)
            yb = blk.y(p, work, sums[0]) if y is None else y[bs, ds].to(p.real)
            zb = p.z[bs, ds].to(p.real)
            torch.ops.aten.silu_backward.grad_input(dy * yb, zb, grad_input=dz[bs, ds])
            silu = F.silu(zb)
            if out_z is not None:
                torch.mul(yb, silu, out=out_z[bs, ds])
            dy = dy * silu
        if dD is not None:
            dD[ds] += (dy * blk.u).sum((0, 2))
        dyw = _time_major(2 * dy if cx else dy).contiguous()  # d/d(sum C h) of y = 2 Re(sum C h)
        # dC_t = conj(h_t) dy_t, summed over what C is shared across
        _add_bc_grad(dC, conj(_bc_grad(h, dyw, p.C.dim() == 2, work)), bs, ds, g)
        # the adjoint g_t = conj(C_t) dy_t + conj(e_{t+1}) g_{t+1} (g_L = 0), in the work buffer
        gr = torch.mul(dyw.unsqueeze(-1), conj(blk.Cv), out=work)  # (this operand order is 2x faster)
        if cx:
            e.conj_physical_()
        e_next = bufs.big(1, blk.shape, shift=1)  # e_next[t] = e[t+1]; its last step is spare
        e_next[-1].fill_(1)  # it multiplies the zero state after the end (1, not 0: no zero decay)
        chunked.scan_(e_next, gr, reverse=True, work=bufs.scan)
        # d a_t = conj(e_t h_{t-1}) g_t (h_{-1} = 0, times 0 as in the loop's autograd), in e
        da = e.mul_(gr)
        da[1:].mul_(conj(h[:-1]))
        da[0].mul_(0)
        dA[ds] += torch.mul(da, blk.dt_t.unsqueeze(-1), out=h).sum((0, 1))
        Ada = _sum_n(da.mul_(conj(blk.A)), sums[0])
        # x_t = dt_t u_t B_t: dB_t = dt_t u_t g_t; sum_n conj(B_t) g_t feeds du and ddt
        _add_bc_grad(dB, _bc_grad(gr, blk.dtu_t, p.B.dim() == 2, h), bs, ds, g)
        Bg = _sum_n(torch.mul(gr, conj(blk.Bv), out=h), sums[1])
        if cx:
            Bg, Ada = Bg.real, Ada.real
        Bg, Ada = Bg.permute(1, 2, 0), Ada.permute(1, 2, 0)
        # straight into du when it has the compute dtype; a half du through a float block (torch
        # 2.1's CPU addcmul cannot cast into an out= of another dtype)
        du_blk = du[bs, ds] if du.dtype == p.real else torch.empty_like(blk.pre)
        if p.D is None:
            torch.mul(blk.dt, Bg, out=du_blk)
        else:
            torch.addcmul(dy * p.D[ds].to(p.real)[:, None], blk.dt, Bg, out=du_blk)
        if du_blk.dtype != du.dtype:
            du[bs, ds] = du_blk
        ddt = torch.addcmul(Ada, blk.u, Bg, out=torch.empty_like(blk.pre))  # (batch, channels, L)
        if p.delta_softplus:
            ddt = torch.ops.aten.softplus_backward(ddt, blk.pre, 1, SOFTPLUS_THRESHOLD)
        ddelta[bs, ds] = ddt
        if dbias is not None:
            dbias[ds] += ddt.sum((0, 2))
    return [du, ddelta, dA, _from_time_major(dB), _from_time_major(dC), dD, dbias, dz, out_z]
