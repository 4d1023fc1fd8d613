"""causal_conv1d_varlen_states against a per-sequence loop written here (exact)."""

from __future__ import annotations

import pytest
import torch

from causal_conv1d.causal_conv1d_varlen import causal_conv1d_varlen_states, causal_conv1d_varlen_states_ref


def loop_states(x, lengths, state_len):
    """Row b: the last min(len_b, state_len) tokens of sequence b, right-aligned, zeros before."""
    out = torch.zeros(len(lengths), x.shape[1], state_len, dtype=x.dtype)
    start = 0
    for b, n in enumerate(lengths):
        for j in range(state_len):
            tok = start + n - state_len + j
            if tok >= start:
                out[b, :, j] = x[tok]
        start += n
    return out


@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("state_len", [1, 3, 8])
def test_varlen_states_exact(state_len, dtype, cu_dtype):
    lengths = [0, 1, 2, 5, 17, 3, 0, 9]
    total = sum(lengths) + 4  # trailing tokens beyond the last sequence are ignored
    x = torch.randn(total, 16).to(dtype)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=cu_dtype)
    states = causal_conv1d_varlen_states(x, cu, state_len)
    want = loop_states(x, lengths, state_len)
    assert states.shape == (len(lengths), 16, state_len) and states.dtype == dtype
    assert states.stride(1) == 1  # allocated channel-last, as the original
    assert torch.equal(states, want)
    assert torch.equal(causal_conv1d_varlen_states_ref(x, cu, state_len), want)


def test_varlen_states_of_a_channel_slice():
    x = torch.randn(30, 24)[:, 4:20]
    cu = torch.tensor([0, 10, 30], dtype=torch.int32)
    assert torch.equal(causal_conv1d_varlen_states(x, cu, 4), loop_states(x, [10, 20], 4))
