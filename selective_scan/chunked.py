"""The linear recurrence at the heart of the PyTorch selective scan, computed in place.

``scan_(m, x)`` turns ``x`` (L, ...) into the states ``h_i = m_i * h_{i-1} + x_i`` (``h_{-1}``
zero or given), for every trailing position independently, and returns the last state.
``reverse=True`` runs the same recurrence from the end: ``h_i = m_i * h_{i+1} + x_i``.

Why this shape of algorithm:

* **Exactly causal.** A step only ever reads steps processed before it. Nothing is multiplied
  by a 0/1 mask and no difference of cumulative sums is formed, so a NaN or Inf at step i cannot
  reach an earlier step (0 * NaN is NaN, and -inf - -inf is NaN), and a decay of exactly 0
  (``A = -inf``) is just a 0, as in the per-step loop.
* **The loop's own arithmetic.** Every stored state is computed by the loop's operation
  ``m_i * h_prev + x_i`` from the true previous state; only the state carried from one chunk to
  the next is formed as ``P * H + s`` (P the chunk's product of multipliers, s its state when
  started from zero). Where P underflows to 0 although no factor is 0, it is kept at the
  smallest positive number, so an infinite state stays infinite as in the loop instead of
  turning into 0 * inf = NaN; a finite state is off by at most that number times ``|H|``.
  Hence for multipliers that are finite and non-negative (decays ``exp(dt A)``) or NaN, every
  state is finite, infinite or NaN exactly where the loop's is. (An infinite multiplier, or a
  complex one next to an infinite state, may give NaN where the loop gives an infinity.)
* **Few, large operations.** The sequence is cut into chunks of ``CHUNK`` steps, all chunks
  being processed at once: pass 1 runs the recurrence from zero inside every chunk (keeping only
  the running state), the chunk-to-chunk carries are the same recurrence over ``L / CHUNK``
  steps (solved recursively), and pass 2 runs the recurrence again inside every chunk from its
  true starting state, writing the result. That is about ``2 * CHUNK`` operations per level,
  each on ``L / CHUNK`` slabs at once, instead of L operations on single slabs: on a CPU each
  operation is large enough to run at memory speed, and a 2048-step scan is about 85 kernel
  launches on a GPU instead of thousands.

Tensors are time-major so that one step of every chunk is a set of contiguous slabs. ``m`` and
``x`` share one dtype, real or complex (complex A); ``x`` must be contiguous.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch

Tensor = torch.Tensor

# Steps per chunk. A level costs about 2 * CHUNK operations plus a few, and passes over its data
# about three times; the next level has 1 / CHUNK of that data. 16 was the fastest of 4 to 32 on
# the 2-core CPU (bench/cpu_scan.py; 8 and 32 within 10%, 4 40% slower from the larger deeper
# levels), and keeps a 2048-step scan near 85 kernel launches on a GPU.
CHUNK = 16


def scan_(
    m: Tensor,
    x: Tensor,
    h0: Optional[Tensor] = None,
    reverse: bool = False,
    work: Optional[Tensor] = None,
    ends: Optional[Tensor] = None,
) -> Tensor:
    """Replace ``x`` (L, ...) by the states of ``h_i = m_i h_{i-1} + x_i``; return the last one.

    ``m`` has x's shape and contiguous trailing dimensions; ``h0`` (x's shape less the first
    dimension) is the state before the first step, zero when None, and is multiplied by ``m``
    at the first step as in the loop. With ``reverse`` the steps run from L-1 down to 0. The
    returned last state is a view of x. ``work``, optional, is a flat tensor of x's dtype with
    at least ``work_size(x.shape)`` elements for the per-chunk temporaries (a caller scanning
    many blocks saves the allocations). ``ends``, optional, (``checkpoint_count(L)``, ...)
    receives the states at the ends of the first level's chunks: with them ``resume_``
    recomputes the states in one pass.
    """
    shape = x.shape
    if m.shape != shape:
        raise ValueError(f"m must have x's shape {tuple(shape)}, got {tuple(m.shape)}")
    x = x.view(shape[0], -1)  # one flat slab per step: the fastest layout for every operation
    m = m.reshape(shape[0], -1)
    h0 = x.new_zeros(x.shape[1]) if h0 is None else h0.reshape(-1)
    if work is None:
        work = x.new_empty(work_size(shape))
    _scan_from(m, x, h0, reverse, work, ends)
    return x[0 if reverse else -1].view(shape[1:])


def resume_(m: Tensor, x: Tensor, ends: Tensor) -> None:
    """Replace ``x`` by the states a forward ``scan_(m, x)`` from a zero state gave, bit for
    bit, from the chunk ends that scan stored in ``ends``: only its last pass."""
    L = x.shape[0]
    x, m = x.view(L, -1), m.reshape(L, -1)
    h0 = x.new_zeros(x.shape[1])
    K = checkpoint_count(L)
    if not K:
        _loop(m, x, h0, False)
        return
    r = L - K * CHUNK
    if r:
        h0 = _loop(m[:r], x[:r], h0, False)
    ms, xs = m[r:].view(K, CHUNK, -1).unbind(1), x[r:].view(K, CHUNK, -1).unbind(1)
    _last_pass(ms, xs, h0, ends.reshape(K, x.shape[1]), list(range(CHUNK)), False)


def checkpoint_count(L: int) -> int:
    """The number of chunks at the first level of a scan over L steps (0: not chunked)."""
    return L // CHUNK if L >= 2 * CHUNK else 0


def work_size(shape: Sequence[int]) -> int:
    """Elements of the ``work`` tensor ``scan_`` needs for x of this shape: the chunks' end
    states and multiplier products, (K, R) each, at every level."""
    L, R = shape[0], math.prod(shape[1:])
    size = 0
    while L >= 2 * CHUNK:
        L //= CHUNK
        size += 2 * L * R
    return size


def _scan_from(
    m: Tensor, x: Tensor, h0: Tensor, reverse: bool, work: Tensor, keep: Optional[Tensor] = None
) -> None:
    """``scan_`` on (L, R) slabs from a given starting state ``h0`` (R,); the chunk ends are
    copied to ``keep`` (K, ...) as well when given."""
    L, R = x.shape
    if L < 2 * CHUNK:  # too short to be worth chunking: the plain loop
        _loop(m, x, h0, reverse)
        return
    K, r = divmod(L, CHUNK)
    if r:  # the partial chunk that comes first in processing order, plainly
        head = slice(L - r, L) if reverse else slice(0, r)
        h0 = _loop(m[head], x[head], h0, reverse)
        body = slice(0, L - r) if reverse else slice(r, L)
        m, x = m[body], x[body]
    mc = m.view(K, CHUNK, R)
    ms, xs = mc.unbind(1), x.view(K, CHUNK, R).unbind(1)  # step j of every chunk: (K, R)
    steps = list(range(CHUNK - 1, -1, -1) if reverse else range(CHUNK))
    ends, prods = work[: K * R].view(K, R), work[K * R : 2 * K * R].view(K, R)
    # pass 1: every chunk's state at its end when started from zero (its first m is in P)
    torch.addcmul(xs[steps[1]], ms[steps[1]], xs[steps[0]], out=ends)
    for j in steps[2:]:
        torch.addcmul(xs[j], ms[j], ends, out=ends)
    # the carries: the same recurrence over chunks, with the chunks' multiplier products
    _scan_from(_chunk_products(mc, prods), ends, h0, reverse, work[2 * K * R :])
    if keep is not None:
        keep.copy_(ends.view(keep.shape))
    _last_pass(ms, xs, h0, ends, steps, reverse)


def _last_pass(
    ms: Sequence[Tensor], xs: Sequence[Tensor], h0: Tensor, ends: Tensor, steps: List[int], reverse: bool
) -> None:
    """Pass 2: the loop's own step inside every chunk, from its true starting state (h0 for the
    first chunk processed, the end of the one processed before for the others)."""
    j = steps[0]
    first, rest, before = (-1, slice(0, -1), slice(1, None)) if reverse else (0, slice(1, None), slice(0, -1))
    xs[j][first].addcmul_(ms[j][first], h0)
    xs[j][rest].addcmul_(ms[j][rest], ends[before])
    prev = xs[j]
    for j in steps[1:]:
        xs[j].addcmul_(ms[j], prev)
        prev = xs[j]


def _loop(m: Tensor, x: Tensor, h: Tensor, reverse: bool) -> Tensor:
    """The plain per-step recurrence; returns the last state (a view of x)."""
    xs, ms = x.unbind(0), m.unbind(0)
    for i in range(len(xs) - 1, -1, -1) if reverse else range(len(xs)):
        xs[i].addcmul_(ms[i], h)
        h = xs[i]
    return h


def _chunk_products(mc: Tensor, out: Tensor) -> Tensor:
    """The product of each chunk's multipliers, (K, T, R) -> (K, R), into ``out``.

    A real product that underflowed to 0 although no factor is 0 is raised to the smallest
    positive number, so that an infinite state carried through it stays infinite."""
    prod = torch.prod(mc, 1, out=out)
    if prod.is_complex():
        return prod
    tiny = torch.finfo(prod.dtype).smallest_normal * torch.finfo(prod.dtype).eps
    zero = prod == 0
    if prod.device.type == "cpu" and not zero.any():  # the usual case; a cheap check on a CPU
        return prod
    return prod.masked_fill_(zero & (mc.amin(1) > 0), tiny)
