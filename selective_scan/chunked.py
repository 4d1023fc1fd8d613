"""The chunked linear recurrence at the heart of the PyTorch selective scan.

``scan(a, x)`` computes, for every row independently, ``h_t = exp(a_t) * h_{t-1} + x_t``
(``h_{-1} = h0`` or 0) with no Python loop over time steps:

* The sequence is cut into chunks of ``CHUNK`` steps. Inside a chunk the closed form
  ``h_t = exp(S_t) h_start + sum_{s<=t} exp(S_t - S_s) x_s`` is evaluated for all chunks at
  once. The exponent of every (t, s) pair with ``s <= t`` is formed directly as the segment sum
  ``a_{s+1} + ... + a_t`` by one matmul with a 0/1 matrix, so pairs with ``s > t`` are never
  formed (that is the masking: nothing is exponentiated that could overflow), no cumulative
  product is divided by, and no difference of large cumulative sums loses precision.
* The chunk-to-chunk carry is itself a linear recurrence over ``L / CHUNK`` steps whose
  log-decays are the chunk totals; it is solved by the same function recursively, so the
  only sequential structure is across chunks (``log_CHUNK(L)`` levels deep).

``a`` may be complex (complex A), in which case decays are complex and ``x``/``h`` complex.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

# Steps per chunk. The cost per step is about CHUNK*(CHUNK+3)/2 exps plus skinny matmuls,
# against log_CHUNK(L) recursion levels; 4 was fastest on a 2-core AVX-512 CPU
# (bench/cpu_scan.py) and keeps the per-pair work small on GPUs too.
CHUNK = 4


@functools.lru_cache(maxsize=32)
def _chunk_matrices(T: int, dtype: torch.dtype, device: torch.device) -> Tuple[Tensor, Tensor, Tensor, int]:
    """0/1 matrices for one chunk of T steps.

    With P = T(T+1)/2 pairs p = (t, s), s <= t:
    ``a @ W`` gives, per pair, ``sum_{r=s+1..t} a_r`` (columns :P) and, per step t, the
    sum from the chunk start ``sum_{r<=t} a_r`` (columns P:); ``x @ Gs`` gathers x_s per
    pair, ``(.) @ Gt`` sums pairs into their t.
    """
    pairs = [(t, s) for t in range(T) for s in range(t + 1)]
    P = len(pairs)
    W = torch.zeros(T, P + T, dtype=dtype)
    Gs = torch.zeros(T, P, dtype=dtype)
    Gt = torch.zeros(P, T, dtype=dtype)
    for p, (t, s) in enumerate(pairs):
        W[s + 1 : t + 1, p] = 1
        Gs[s, p] = 1
        Gt[p, t] = 1
    for t in range(T):
        W[: t + 1, P + t] = 1
    return W.to(device), Gs.to(device), Gt.to(device), P


def scan(a: Tensor, x: Tensor, h0: Optional[Tensor] = None) -> Tensor:
    """All states of ``h_t = exp(a_t) h_{t-1} + x_t`` for rows of ``a``, ``x`` (R, L).

    ``a``, ``x`` and ``h0`` (R,) share one dtype (real or complex). Returns (R, L).
    """
    R, L = a.shape
    T = min(CHUNK, L)
    nc = -(-L // T)
    Lp = nc * T
    if Lp != L:  # zero log-decay and zero input leave the state unchanged in the padding
        a = F.pad(a, (0, Lp - L))
        x = F.pad(x, (0, Lp - L))
    W, Gs, Gt, P = _chunk_matrices(T, a.dtype, a.device)
    a2 = a.reshape(R * nc, T)
    x2 = x.reshape(R * nc, T)
    E = (a2 @ W).exp_()  # per pair exp(S_t - S_s); per step exp(S_t)
    h = (E[:, :P] * (x2 @ Gs)) @ Gt  # in-chunk part, zero state at each chunk start
    if nc == 1:
        if h0 is not None:
            h = h + E[:, P:] * h0[:, None]
        return h.view(R, Lp)[:, :L]
    h = h.view(R, nc, T)
    # state at each chunk end, then the state entering each chunk
    ends = scan(a2.sum(-1).view(R, nc), h[..., -1], h0)
    if h0 is None:
        starts = F.pad(ends[:, :-1], (1, 0))
    else:
        starts = torch.cat([h0[:, None], ends[:, :-1]], 1)
    h = h.add_(E[:, P:].view(R, nc, T) * starts[..., None])
    return h.view(R, Lp)[:, :L]


def scan_reverse(a: Tensor, q: Tensor) -> Tensor:
    """The adjoint recurrence ``g_t = q_t + conj(exp(a_{t+1})) g_{t+1}`` (g_L = 0), (R, L)."""
    a_next = F.pad(a[:, 1:], (0, 1))
    if a_next.is_complex():
        a_next = a_next.conj()
    return scan(a_next.flip(-1), q.flip(-1)).flip(-1)
