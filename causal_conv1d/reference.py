"""Pure-PyTorch causal depthwise conv1d: forward, backward and decode update.

Runs on any device. Vectorised: the conv is a sum over the (at most 4) taps of shifted
views, so there is no Python loop over time or batch. Computes in float32 (float64 when x
or weight is float64) whatever the input dtypes; the backward is an explicit formula.

Arguments have passed ``_checks``; these functions do no validation of their own.

Semantics (the original's, plus the superset noted):
- ``out[b, c, t] = act(bias[c] + sum_k weight[c, k] * src[b, c, t - (W - 1) + k])`` where
  ``src`` is x, with ``initial_states`` (or zeros) in front of position 0.
- With ``seq_idx``, a tap only sees a source of the same ``seq_idx`` as token t; the
  initial-state columns belong to the first segment (tag ``seq_idx[b, 0]``). Tokens with
  ``seq_idx < 0`` are padding: output exactly 0, no gradient flows from them.
- Final states are the last ``W - 1`` columns of ``cat(initial_states, x)``. With
  ``seq_idx`` (superset: the original refuses it) columns not in the last token's segment,
  and padding columns, are zero, so feeding them as the next chunk's initial states
  continues that segment exactly.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from ._checks import empty_like_layout

Tensor = torch.Tensor


def compute_dtype(*tensors: Optional[Tensor]) -> torch.dtype:
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _padded(x: Tensor, initial_states: Optional[Tensor], width: int, dtype: torch.dtype) -> Tensor:
    """``cat(initial_states or zeros, x)`` along time, in ``dtype`` and x's layout family
    (so every tap below is a view with x's memory order): (b, d, W - 1 + L)."""
    b, d, length = x.shape
    xp = empty_like_layout(x, shape=(b, d, width - 1 + length), dtype=dtype)
    if initial_states is None:
        xp[:, :, :width - 1] = 0
    else:
        xp[:, :, :width - 1] = initial_states
    xp[:, :, width - 1:] = x
    return xp


def _padded_tags(seq_idx: Tensor, width: int) -> Tensor:
    """seq_idx with the W - 1 head columns tagged as the first segment: (b, W - 1 + L); with no
    token (L = 0) the head columns are tagged 0, one segment that the final state keeps."""
    if seq_idx.shape[1] == 0:
        return seq_idx.new_zeros((seq_idx.shape[0], width - 1))
    return torch.cat([seq_idx[:, :1].expand(-1, width - 1), seq_idx], dim=1)


def _tap_masks(seq_idx: Optional[Tensor], width: int) -> Optional[List[Tensor]]:
    """Per tap k, (b, 1, L) bool: the source of tap k is in token t's segment."""
    if seq_idx is None:
        return None
    length = seq_idx.shape[1]
    tags = _padded_tags(seq_idx, width)
    return [(tags[:, k:k + length] == seq_idx).unsqueeze(1) for k in range(width)]


def _final_keep(seq_idx: Tensor, width: int) -> Tensor:
    """(b, 1, W - 1) bool: which final-state columns are in the last token's segment."""
    tags = _padded_tags(seq_idx, width)[:, -(width - 1):]
    if seq_idx.shape[1] == 0:  # no token: the state carries over unchanged
        return (tags >= 0).unsqueeze(1)
    return ((tags == seq_idx[:, -1:]) & (tags >= 0)).unsqueeze(1)


def _preactivation(
    xp: Tensor, w: Tensor, b: Optional[Tensor], masks: Optional[List[Tensor]], length: int
) -> Tensor:
    width = w.shape[1]
    acc = xp[:, :, width - 1:] * w[:, width - 1:]  # the token itself: never masked
    for k in range(width - 1):
        tap = xp[:, :, k:k + length]
        if masks is None:
            acc.addcmul_(tap, w[:, k:k + 1])
        else:
            acc.add_(torch.where(masks[k], tap * w[:, k:k + 1], 0.0))
    if b is not None:
        acc.add_(b[:, None])
    return acc


def fwd(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    seq_idx: Optional[Tensor],
    initial_states: Optional[Tensor],
    final_states_out: Optional[Tensor],
    silu_activation: bool,
) -> Tensor:
    """Forward. Returns a new ``out`` in x's layout; writes ``final_states_out`` in place."""
    ct = compute_dtype(x, weight)
    width = weight.shape[1]
    length = x.shape[2]
    xp = _padded(x, initial_states, width, ct)
    bc = None if bias is None else bias.to(ct)
    y = _preactivation(xp, weight.to(ct), bc, _tap_masks(seq_idx, width), length)
    if silu_activation:
        y = F.silu(y)
    if seq_idx is not None:
        y = torch.where((seq_idx >= 0).unsqueeze(1), y, 0.0)
    out = empty_like_layout(x)
    out.copy_(y)
    if final_states_out is not None:
        fs = xp[:, :, length:]
        if seq_idx is not None:
            fs = torch.where(_final_keep(seq_idx, width), fs, 0.0)
        final_states_out.copy_(fs)
    return out


def bwd(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    dout: Tensor,
    seq_idx: Optional[Tensor],
    initial_states: Optional[Tensor],
    dfinal_states: Optional[Tensor],
    dx: Optional[Tensor],
    return_dinitial_states: bool,
    silu_activation: bool,
) -> Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    """Backward: (dx, dweight, dbias, dinitial_states); ``dx`` written in place when given."""
    ct = compute_dtype(x, weight)
    width = weight.shape[1]
    b, d, length = x.shape
    xp = _padded(x, initial_states, width, ct)
    w = weight.to(ct)
    masks = _tap_masks(seq_idx, width)
    g = dout.to(ct)
    if silu_activation:
        pre = _preactivation(xp, w, None if bias is None else bias.to(ct), masks, length)
        g = torch.ops.aten.silu_backward(g, pre)
    if seq_idx is not None:
        g = torch.where((seq_idx >= 0).unsqueeze(1), g, 0.0)

    dxp = empty_like_layout(x, shape=(b, d, width - 1 + length), dtype=ct).zero_()
    dweight = torch.empty((d, width), dtype=ct, device=x.device)
    for k in range(width):
        gk = g if masks is None or k == width - 1 else torch.where(masks[k], g, 0.0)
        dxp[:, :, k:k + length].addcmul_(gk, w[:, k:k + 1])
        dweight[:, k] = (gk * xp[:, :, k:k + length]).sum(dim=(0, 2))
    if dfinal_states is not None:
        dfs = dfinal_states.to(ct)
        if seq_idx is not None:
            dfs = torch.where(_final_keep(seq_idx, width), dfs, 0.0)
        dxp[:, :, length:] += dfs

    if dx is None:
        dx = empty_like_layout(x)
    dx.copy_(dxp[:, :, width - 1:])
    dbias = None if bias is None else g.sum(dim=(0, 2)).to(bias.dtype)
    dinitial_states = None
    if return_dinitial_states:
        dinitial_states = empty_like_layout(x, shape=(b, d, width - 1))
        dinitial_states.copy_(dxp[:, :, :width - 1])
    return dx, dweight.to(weight.dtype), dbias, dinitial_states


def update(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    silu_activation: bool,
    cache_seqlens: Optional[Tensor],
    conv_state_indices: Optional[Tensor],
) -> Tensor:
    """Decode step(s) for a 3-D x; mutates ``conv_state`` in place, returns a new ``out``.

    Shift-register mode (no cache_seqlens): the state becomes the last state_len columns
    of ``cat(state, x)``. Circular mode: x is written at ``(cache_seqlens + i) % state_len``
    after the W - 1 entries before ``cache_seqlens`` are read. Rows whose
    conv_state_indices is negative get output 0 and touch no state.
    """
    ct = compute_dtype(x, weight)
    batch, _, length = x.shape
    state_len = conv_state.shape[2]
    width = weight.shape[1]
    dev = x.device

    if conv_state_indices is None:
        rows = torch.arange(batch, device=dev)
        sel = None
    else:
        live = conv_state_indices >= 0
        sel = live.nonzero().squeeze(1)
        rows = conv_state_indices[sel].long()
    xs = x if sel is None else x[sel]
    state = conv_state[rows]  # a copy: (n, d, state_len), x's dtype

    if cache_seqlens is None:
        full = torch.cat([state, xs], dim=2)
        window = full[:, :, state_len - (width - 1):]
        new_state = full[:, :, length:]
    else:
        pos = cache_seqlens.long() if sel is None else cache_seqlens[sel].long()
        n, d = state.shape[0], state.shape[1]
        read = (pos[:, None] - (width - 1) + torch.arange(width - 1, device=dev)) % state_len
        prev = state.gather(2, read[:, None, :].expand(n, d, width - 1))
        window = torch.cat([prev, xs], dim=2)
        # when length > state_len only the last state_len tokens survive; writing just those
        # keeps the scatter free of duplicate positions
        keep = min(length, state_len)
        write = (pos[:, None] + torch.arange(length - keep, length, device=dev)) % state_len
        new_state = state.scatter(2, write[:, None, :].expand(n, d, keep), xs[:, :, length - keep:])

    y = _preactivation(window.to(ct), weight.to(ct), None if bias is None else bias.to(ct), None, length)
    if silu_activation:
        y = F.silu(y)
    if sel is None:
        conv_state.copy_(new_state)
        result = y
    else:
        conv_state[rows] = new_state
        result = torch.zeros((batch,) + tuple(y.shape[1:]), dtype=ct, device=dev)
        result[sel] = y
    out = empty_like_layout(x)
    out.copy_(result)
    return out
