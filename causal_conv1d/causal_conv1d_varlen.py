"""Conv states of packed variable-length sequences (``causal_conv1d.causal_conv1d_varlen``).

The original is a Triton kernel; this is one vectorised gather, so it needs no Triton and
runs on any device.
"""

from __future__ import annotations

import torch

from . import _checks

Tensor = torch.Tensor


def causal_conv1d_varlen_states(x: Tensor, cu_seqlens: Tensor, state_len: int) -> Tensor:
    """States ``(batch, dim, state_len)`` of packed x ``(total_tokens, dim)``.

    Row b holds the last ``min(len_b, state_len)`` tokens of sequence b (tokens
    ``cu_seqlens[b]:cu_seqlens[b + 1]``), right-aligned, zeros before them. Allocated
    channel-last (a transposed ``(batch, state_len, dim)``) in x's dtype, as the original.
    """
    _checks.check_varlen(x, cu_seqlens, state_len)
    batch = cu_seqlens.shape[0] - 1
    cu = cu_seqlens.long()
    # source token of column j of row b: end_b - state_len + j, kept when inside sequence b
    src = cu[1:, None] - state_len + torch.arange(state_len, device=x.device)
    inside = src >= cu[:-1, None]
    if x.shape[0] == 0:  # no token at all (every sequence empty): nothing to gather, zeros
        return x.new_zeros((batch, state_len, x.shape[1])).transpose(1, 2)
    gathered = x[src.clamp(min=0)]  # (batch, state_len, dim)
    states = torch.empty((batch, state_len, x.shape[1]), dtype=x.dtype, device=x.device)
    torch.where(inside.unsqueeze(-1), gathered, torch.zeros((), dtype=x.dtype, device=x.device), out=states)
    return states.transpose(1, 2)


def causal_conv1d_varlen_states_ref(x: Tensor, cu_seqlens: Tensor, state_len: int) -> Tensor:
    """Per-sequence loop reference for ``causal_conv1d_varlen_states`` (same result)."""
    _checks.check_varlen(x, cu_seqlens, state_len, "causal_conv1d_varlen_states_ref")
    bounds = cu_seqlens.tolist()
    batch = len(bounds) - 1
    states = torch.zeros((batch, state_len, x.shape[1]), dtype=x.dtype, device=x.device)
    for b in range(batch):
        tail = x[max(bounds[b], bounds[b + 1] - state_len):bounds[b + 1]]
        if tail.shape[0]:
            states[b, state_len - tail.shape[0]:] = tail
    return states.transpose(1, 2)
