"""The Mamba-2 SSD scan by chunks, in PyTorch: ``ssd_forward`` is the forward that
``ssd_combined`` runs on every device, and the function a compiled kernel replaces.

Math, per batch b, head h (group g = h // (nheads / ngroups)), position t::

    dt_t  = clamp(softplus?(dt[b, t, h] + dt_bias[h]), *dt_limit)   (softplus: identity above 20)
    H_t   = exp(dt_t A[h]) H_{t-1} + dt_t x[b, t, h, :] B[b, t, g, :]^T    (headdim, dstate)
    y_t   = H_t C[b, t, g, :] + D[h] x[b, t, h, :]                   (D per head or per (head, dim))
    out_t = y_t * silu(z[b, t, h, :])                                (when z is given)

with ``H_{-1}`` = initial_states (zeros without them). With ``seq_idx``, H_{t-1} is dropped
(the state restarts from zero) where seq_idx[b, t] differs from seq_idx[b, t-1]; before the
first position the sequence number is 0, so initial_states continue into the first tokens
only if seq_idx[b, 0] == 0. The sequences are told apart by equality of their numbers, as
mamba_ssm does; for non-decreasing numbers (packed sequences) that is a restart at each change.

The sequence is cut into chunks of ``chunk_size`` (Q) steps, the last one padded with dt = 0
and x = 0. With ``a_t`` the cumulative sum of dt A inside a chunk (``dA_cumsum``):

* inside a chunk, ``y_i = sum_{j <= i} (C_i . B_j) exp(a_i - a_j) dt_j x_j``: a (Q, Q) matrix
  per chunk and head, its decays formed as ``exp`` of differences of ``a`` with the entries
  above the diagonal (and across sequences) set to -inf before the exp, so no exp of a large
  positive number is ever taken and their gradients are exact zeros;
* the state a chunk adds, ``sum_j exp(a_last - a_j) dt_j x_j B_j^T``;
* the states passed from chunk to chunk, ``S_{c+1} = exp(a_last(c)) S_c + local_c``;
* the contribution of the state entering the chunk, ``exp(a_i) S_c C_i``.

Computed in float32 (float64 for float64 x) whatever the inputs' dtypes, with autocast off;
autograd runs through these operations. Work is done in blocks of (batches, heads of one
group), each of whose (Q, Q) temporaries holds at most ``BLOCK_ELEMENTS`` elements, so memory
stays bounded at any size; with autograd over more than one block, each block keeps only its
inputs and runs again in the backward (activation checkpointing), so the backward's memory stays
bounded too, for the price of a second forward.

NaN is causal: a NaN or Inf at position t reaches no output before t. Every masked entry is
set with ``where`` (an exact zero, never 0 * NaN); the one product that cannot be masked that
way, the (Q, Q) matrix times x, runs as a single matmul when x is finite and otherwise in
row blocks that only ever multiply x_j into rows i >= j.

``ssd_forward`` returns mamba_ssm's internal decomposition (``_mamba_chunk_scan_combined_fwd``):
``(out, out_x, dt_out, dA_cumsum, states, final_states, varlen_states)``:

* ``out`` (batch, seqlen, nheads, headdim), x's dtype: the output (gated by silu(z) with z);
* ``out_x``: the same before the gate when z is given, else None;
* ``dt_out`` (batch, nheads, nchunks, chunk_size): dt after bias, softplus and clamp, 0 past
  seqlen; ``dA_cumsum`` the same shape, the cumulative sum of dt_out * A inside each chunk;
  both float32 (float64 for float64 x);
* ``states`` (batch, nchunks, nheads, headdim, dstate), C's dtype: the state ENTERING each
  chunk (``states[:, 0]`` is initial_states, or zeros);
* ``final_states`` (batch, nheads, headdim, dstate), float32 (float64 for float64 x): the
  state after the last position;
* ``varlen_states`` (num_seqs, nheads, headdim, dstate), C's dtype, when cu_seqlens is
  given (batch 1), else None: the state after each sequence's last token, each sequence
  starting from zero (the first from initial_states, when seq_idx does not say otherwise);
  an empty sequence keeps the state it started from.

Arguments are validated by the caller (``_ssd_checks``); tensors may have any strides.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from mamba_kernels.runtime.library import is_compiling

Tensor = torch.Tensor

# Elements of one (batches, heads, chunks, Q, Q) temporary of a block: 2**23 (32 MiB in float32)
# keeps the five or so such temporaries of a block within a few hundred MiB at any size.
BLOCK_ELEMENTS = 1 << 23
# Row-block size of the NaN-exact product (x not finite): 16 rows per block.
EXACT_ROWS = 16
SOFTPLUS_THRESHOLD = 20.0
NO_LIMIT = (0.0, math.inf)


def compute_dtype(x: Tensor) -> torch.dtype:
    """float64 for float64 x, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def process_dt(
    dt: Tensor, dt_bias: Optional[Tensor], dt_softplus: bool, dt_limit: Tuple[float, float], real: torch.dtype
) -> Tensor:
    """dt in ``real``, plus dt_bias, through softplus (identity above 20), clamped to dt_limit:
    mamba_ssm's chunk cumsum. The clamp's gradient passes inside [lo, hi], bounds included."""
    dt = dt.to(real)
    if dt_bias is not None:
        dt = dt + dt_bias.to(real)
    if dt_softplus:
        dt = F.softplus(dt, threshold=SOFTPLUS_THRESHOLD)
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    if lo != -math.inf or hi != math.inf:
        dt = dt.clamp(min=None if lo == -math.inf else lo, max=None if hi == math.inf else hi)
    return dt


def _neg_inf(like: Tensor) -> Tensor:
    return torch.full((), -math.inf, dtype=like.dtype, device=like.device)


def _pad_time(t: Tensor, total: int) -> Tensor:
    """t (batch, seqlen, ...) padded with zeros along time to ``total`` steps."""
    pad = total - t.shape[1]
    if not pad:
        return t
    return torch.cat([t, t.new_zeros((t.shape[0], pad) + tuple(t.shape[2:]))], dim=1)


class _Segments:
    """Which positions belong to one sequence, per chunk: from ids (batch, seqlen), equal ids
    meaning one sequence, and the id 0 before the first position."""

    def __init__(self, ids: Tensor, nchunks: int, Q: int):
        batch, seqlen = ids.shape
        ids = ids.to(torch.int64)
        if nchunks * Q > seqlen and seqlen:  # the padding belongs to the last sequence
            ids = torch.cat([ids, ids[:, -1:].expand(batch, nchunks * Q - seqlen)], dim=1)
        ids = ids.reshape(batch, nchunks, Q)
        last = ids[:, :, -1]  # (batch, nchunks): the sequence at each chunk's end
        prev = torch.cat([last.new_zeros(batch, 1), last[:, :-1]], dim=1)  # ... at the previous end
        self.ids = ids
        self.same = ids[:, :, :, None] == ids[:, :, None, :]  # (batch, nchunks, Q, Q)
        self.with_last = ids == last[:, :, None]  # (batch, nchunks, Q)
        self.with_prev = ids == prev[:, :, None]  # continues the state entering the chunk
        self.carry = last == prev  # (batch, nchunks): the chunk's end state continues the entering one

    def rows(self, b0: int, b1: int) -> _Segments:
        part = object.__new__(_Segments)
        for name in ("ids", "same", "with_last", "with_prev", "carry"):
            setattr(part, name, getattr(self, name)[b0:b1])
        return part


def _causal_matmul(M: Tensor, x: Tensor, exact: bool) -> Tensor:
    """``M @ x`` for M (..., Q, Q) with exact zeros above the diagonal. With ``exact``, x_j
    is only ever multiplied into rows i >= j, so a NaN or Inf in x reaches no earlier row."""
    if not exact:
        return torch.matmul(M, x)
    Q = M.shape[-1]
    outs = []
    for r0 in range(0, Q, EXACT_ROWS):
        r1 = min(r0 + EXACT_ROWS, Q)
        tri = torch.ones(r1 - r0, r1 - r0, dtype=torch.bool, device=M.device).tril()
        prod = M[..., r0:r1, r0:r1, None] * x[..., None, r0:r1, :]  # (..., rows, cols, p)
        part = torch.where(tri[:, :, None], prod, prod.new_zeros(())).sum(-2)
        if r0:
            part = part + torch.matmul(M[..., r0:r1, :r0], x[..., :r0, :])
        outs.append(part)
    return torch.cat(outs, dim=-2)


def _chunk_states(
    dA: Tensor, dt: Tensor, xb: Tensor, Bg: Tensor, init: Optional[Tensor], seg: Optional[_Segments]
) -> Tuple[Tensor, Tensor]:
    """The states entering each chunk (b, hb, c, p, n) and the state after the last one.

    dA, dt (b, hb, c, Q); xb (b, hb, c, Q, p); Bg (b, c, Q, n); init (b, hb, p, n) or None."""
    b, hb, c, Q = dA.shape
    p, n = xb.shape[-1], Bg.shape[-1]
    expo = dA[..., -1:] - dA
    if seg is not None:
        keep = seg.with_last[:, None]
        expo = torch.where(keep, expo, _neg_inf(expo))
        w = torch.where(keep, torch.exp(expo) * dt, dt.new_zeros(()))
    else:
        w = torch.exp(expo) * dt
    local = torch.matmul((xb * w[..., None]).transpose(-1, -2), Bg[:, None])  # (b, hb, c, p, n)
    decay = torch.exp(dA[..., -1])  # (b, hb, c)
    S = init if init is not None else xb.new_zeros(b, hb, p, n)
    enters: List[Tensor] = []
    for k in range(c):
        enters.append(S)
        passed = decay[:, :, k, None, None] * S
        if seg is not None:
            passed = torch.where(seg.carry[:, k, None, None, None], passed, passed.new_zeros(()))
        S = passed + local[:, :, k]
    enter = torch.stack(enters, dim=2) if enters else xb.new_zeros(b, hb, 0, p, n)
    return enter, S


def _block_outputs(
    dA: Tensor, dt: Tensor, xb: Tensor, Bg: Tensor, Cg: Tensor, CB: Tensor, enter: Tensor,
    seg: Optional[_Segments], exact: bool,
) -> Tensor:
    """y (b, hb, c, Q, p) of a block without the D term: intra-chunk plus entering states."""
    Q = dA.shape[-1]
    causal = torch.ones(Q, Q, dtype=torch.bool, device=dA.device).tril()
    mask = causal if seg is None else causal & seg.same[:, None]  # (Q, Q) or (b, 1, c, Q, Q)
    expo = dA[..., :, None] - dA[..., None, :]
    expo = torch.where(mask, expo, _neg_inf(expo))
    M = CB[:, None] * torch.exp(expo) * dt[..., None, :]
    M = torch.where(mask, M, M.new_zeros(()))
    y = _causal_matmul(M, xb, exact)
    off = torch.matmul(Cg[:, None], enter.transpose(-1, -2)) * torch.exp(dA)[..., None]
    if seg is not None:
        off = torch.where(seg.with_prev[:, None, :, :, None], off, off.new_zeros(()))
    return y + off


def _block(dA, dtb, xb, Bg, Cg, CB, init, seg, exact) -> Tuple[Tensor, Tensor, Tensor]:
    """One block: its outputs without D (b, hb, c, Q, p), the states entering its chunks and its
    final state."""
    enter, final = _chunk_states(dA, dtb, xb, Bg, init, seg)
    return _block_outputs(dA, dtb, xb, Bg, Cg, CB, enter, seg, exact), enter, final


def _varlen_states(
    dA: Tensor, dt: Tensor, xb: Tensor, Bg: Tensor, init: Optional[Tensor], seg: _Segments,
    starts: List[int], ends: List[int],
) -> Tensor:
    """The state after each sequence's last token (num_seqs, hb, p, n), batch 1: the state
    entering its last chunk carried to that token, plus that chunk's tokens of the sequence."""
    _, hb, c, Q = dA.shape
    p, n = xb.shape[-1], Bg.shape[-1]
    enter, _ = _chunk_states(dA, dt, xb, Bg, init, seg)
    zero = xb.new_zeros(hb, p, n)
    empty_first = init[0] if init is not None else zero
    out: List[Tensor] = []
    live = [s for s in range(len(starts)) if ends[s] > starts[s]]
    if live:
        last = torch.tensor([ends[s] - 1 for s in live], device=dA.device)
        ck, pos = last // Q, last % Q
        a = dA[0][:, ck, pos]  # (hb, S)
        dAc, dtc = dA[0][:, ck], dt[0][:, ck]  # (hb, S, Q)
        j = torch.arange(Q, device=dA.device)
        ids = seg.ids[0][ck]  # (S, Q)
        mine = (j[None, :] <= pos[:, None]) & (ids == ids.gather(1, pos[:, None]))
        expo = torch.where(mine, a[..., None] - dAc, _neg_inf(a))
        w = torch.where(mine, torch.exp(expo) * dtc, dtc.new_zeros(()))
        own = torch.matmul((xb[0][:, ck] * w[..., None]).transpose(-1, -2), Bg[0][ck][None])  # (hb, S, p, n)
        carried = enter[0][:, ck] * torch.exp(a)[..., None, None]
        cont = seg.with_prev[0][ck].gather(1, pos[:, None])[:, 0]  # (S,)
        carried = torch.where(cont[None, :, None, None], carried, carried.new_zeros(()))
        states = (own + carried).transpose(0, 1)  # (S, hb, p, n)
    k = 0
    for s in range(len(starts)):
        if ends[s] > starts[s]:
            out.append(states[k])
            k += 1
        else:
            out.append(empty_first if s == 0 else zero)
    return torch.stack(out) if out else xb.new_zeros(0, hb, p, n)


def _varlen_ids(seq_idx: Optional[Tensor], cu_seqlens: Tensor, seqlen: int, device: torch.device) -> Tensor:
    """Ids (1, seqlen) that differ where seq_idx does or a sequence of cu_seqlens starts; the
    first sequence of cu_seqlens, with seq_idx 0, has id 0 (it continues initial_states)."""
    t = torch.arange(seqlen, device=device)
    number = torch.searchsorted(cu_seqlens.to(device=device, dtype=torch.int64), t, right=True) - 1
    ids = number[None, :]
    if seq_idx is not None:
        ids = ids + seq_idx.to(torch.int64) * (1 << 32)
    return ids


def _blocks(batch: int, ngroups: int, per_group: int, nchunks: int, Q: int):
    """(b0, b1, g, h0, h1) blocks: heads of one group, each (Q, Q) temporary within
    BLOCK_ELEMENTS elements (one head of one batch row at least)."""
    units = max(1, BLOCK_ELEMENTS // max(1, nchunks * Q * Q))
    hb = max(1, min(per_group, units))
    bb = max(1, min(batch, units // hb))
    for b0 in range(0, batch, bb):
        for g in range(ngroups):
            for h0 in range(g * per_group, (g + 1) * per_group, hb):
                yield b0, min(b0 + bb, batch), g, h0, min(h0 + hb, (g + 1) * per_group)


def ssd_forward(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int,
    D: Optional[Tensor] = None, z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
    initial_states: Optional[Tensor] = None, seq_idx: Optional[Tensor] = None,
    cu_seqlens: Optional[Tensor] = None, dt_softplus: bool = False,
    dt_limit: Tuple[float, float] = NO_LIMIT,
) -> Tuple[Tensor, Optional[Tensor], Tensor, Tensor, Tensor, Tensor, Optional[Tensor]]:
    """The chunked forward; returns ``(out, out_x, dt_out, dA_cumsum, states, final_states,
    varlen_states)`` as the module docstring says. Arguments are checked by the caller."""
    with torch.autocast(device_type=x.device.type, enabled=False):
        return _forward(x, dt, A, B, C, int(chunk_size), D, z, dt_bias, initial_states, seq_idx,
                        cu_seqlens, bool(dt_softplus), dt_limit)


def _forward(x, dt, A, B, C, Q, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus, dt_limit):
    """Long: the chunked algorithm's stages in order (discretise, chunk states, state passing, outputs)
    over padded chunks, with the NaN-exact and checkpointed variants where they branch; each stage's
    tensors feed the next."""
    real = compute_dtype(x)
    batch, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    per_group = nheads // ngroups if ngroups else 0
    nchunks = -(-seqlen // Q)
    total = nchunks * Q

    dt = process_dt(dt, dt_bias, dt_softplus, dt_limit, real)
    dt_out = _pad_time(dt, total).reshape(batch, nchunks, Q, nheads).permute(0, 3, 1, 2)  # (b, h, c, Q)
    dA_cumsum = torch.cumsum(dt_out * A.to(real)[:, None, None], dim=-1)
    xq = _pad_time(x, total).reshape(batch, nchunks, Q, nheads, headdim)
    Bq = _pad_time(B.to(real), total).reshape(batch, nchunks, Q, ngroups, dstate)
    Cq = _pad_time(C.to(real), total).reshape(batch, nchunks, Q, ngroups, dstate)
    init = initial_states.to(real) if initial_states is not None else None
    seg = _Segments(seq_idx, nchunks, Q) if seq_idx is not None else None
    # reading x's values is a host sync and, under torch.compile, a data-dependent branch: there the
    # NaN-exact product always runs (the same values for finite x, no graph break)
    exact = is_compiling() or not bool(torch.isfinite(x).all())
    # with autograd over more than one block, each block keeps only its inputs for the backward
    # and runs again there: the (Q, Q) matrices of all blocks would otherwise be kept at once
    recording = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, dt, A, B, C, dt_bias, initial_states))
    keep_less = recording and batch * nheads * nchunks * Q * Q > BLOCK_ELEMENTS

    varlen = None
    if cu_seqlens is not None:
        bounds = [int(v) for v in cu_seqlens.tolist()]
        starts, ends = bounds[:-1], bounds[1:]
        vseg = _Segments(_varlen_ids(seq_idx, cu_seqlens, seqlen, x.device), nchunks, Q)
        varlen_parts: List[Tensor] = []

    CBs = {}
    rows: List[Tensor] = []
    enters_rows: List[Tensor] = []
    finals_rows: List[Tensor] = []
    y_parts: List[Tensor] = []
    enter_parts: List[Tensor] = []
    final_parts: List[Tensor] = []
    current = None
    for b0, b1, g, h0, h1 in _blocks(batch, ngroups, per_group, nchunks, Q):
        if current is not None and current != b0:  # a new row block: close the previous one
            rows.append(torch.cat(y_parts, dim=1))
            enters_rows.append(torch.cat(enter_parts, dim=1))
            finals_rows.append(torch.cat(final_parts, dim=1))
            y_parts, enter_parts, final_parts = [], [], []
            CBs = {}
        current = b0
        Bg, Cg = Bq[b0:b1, :, :, g], Cq[b0:b1, :, :, g]  # (b, c, Q, n)
        if g not in CBs:
            CBs[g] = torch.matmul(Cg, Bg.transpose(-1, -2))  # (b, c, Q, Q)
        dA, dtb = dA_cumsum[b0:b1, h0:h1], dt_out[b0:b1, h0:h1]
        xb = xq[b0:b1, :, :, h0:h1].to(real).permute(0, 3, 1, 2, 4)  # (b, hb, c, Q, p)
        part_seg = seg.rows(b0, b1) if seg is not None else None
        ib = init[b0:b1, h0:h1] if init is not None else None
        if keep_less:
            y_block, enter, final = checkpoint(_block, dA, dtb, xb, Bg, Cg, CBs[g], ib, part_seg, exact,
                                               use_reentrant=False)
        else:
            y_block, enter, final = _block(dA, dtb, xb, Bg, Cg, CBs[g], ib, part_seg, exact)
        y_parts.append(y_block)
        enter_parts.append(enter)
        final_parts.append(final)
        if cu_seqlens is not None:
            varlen_parts.append(_varlen_states(dA, dtb, xb, Bg, ib, vseg, starts, ends))
    if y_parts:
        rows.append(torch.cat(y_parts, dim=1))
        enters_rows.append(torch.cat(enter_parts, dim=1))
        finals_rows.append(torch.cat(final_parts, dim=1))

    if rows:
        y = torch.cat(rows, dim=0)  # (b, h, c, Q, p)
        enter = torch.cat(enters_rows, dim=0)
        final_states = torch.cat(finals_rows, dim=0)
    else:  # no block: batch 0 or no heads; every result is empty, or the initial state
        y = xq.new_zeros(batch, nheads, nchunks, Q, headdim, dtype=real)
        enter = xq.new_zeros(batch, nheads, nchunks, headdim, dstate, dtype=real)
        final_states = init if init is not None else xq.new_zeros(batch, nheads, headdim, dstate, dtype=real)
    y = y.permute(0, 2, 3, 1, 4).reshape(batch, total, nheads, headdim)[:, :seqlen]
    if D is not None:
        Dr = D.to(real)
        y = y + x.to(real) * (Dr[:, None] if Dr.dim() == 1 else Dr)
    if y.numel() == 0:  # every input reaches the graph of an empty output: zero gradients
        y = y + (dA_cumsum.sum() + xq.sum() + Bq.sum() + Cq.sum()) * 0
    out_x = None
    if z is not None:
        out_x = y.to(x.dtype)
        y = y * F.silu(z.to(real))
    out = y.to(x.dtype)
    states = enter.permute(0, 2, 1, 3, 4).to(C.dtype)  # (b, c, h, p, n)
    if cu_seqlens is not None:
        if varlen_parts:
            varlen = torch.cat(varlen_parts, dim=1).to(C.dtype)
        else:
            num = len(starts)
            varlen = x.new_zeros(num, nheads, headdim, dstate, dtype=C.dtype)
            if init is not None and num and nheads:
                varlen = torch.cat([init[:1].to(C.dtype), varlen[1:]])
    return out, out_x, dt_out, dA_cumsum, states, final_states, varlen
