"""causal_conv1d_update / causal_conv1d_update_function / causal_conv1d_update_ref on CPU,
against a per-token loop written here; states must match exactly."""

from __future__ import annotations

import pytest
import torch

from causal_conv1d import causal_conv1d_update
from causal_conv1d.causal_conv1d_interface import causal_conv1d_update_ref
from causal_conv1d.cpp_functions import causal_conv1d_update_function

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def loop_update(x, conv_state, w, b=None, silu=False, cache_seqlens=None, indices=None):
    """One token at a time, one row at a time. Returns (out float64, new conv_state).

    Shift register: the window is the state's last W - 1 columns plus the token, then the
    state shifts left by one and takes the token. Circular: the token goes to column
    (cache_seqlens + i) % state_len and the window is the W - 1 columns before it.
    A negative index gives output 0 and leaves the state alone.
    """
    bsz, dim, length = x.shape
    width = w.shape[1]
    state = conv_state.clone()
    state_len = state.shape[2]
    out = torch.zeros(bsz, dim, length, dtype=torch.float64)
    wd = w.double()
    for r in range(bsz):
        row = r if indices is None else int(indices[r])
        if row < 0:
            continue
        for i in range(length):
            tok = x[r, :, i]
            if cache_seqlens is None:
                prev = state[row, :, state_len - (width - 1):].clone()
                state[row] = torch.cat([state[row, :, 1:], tok[:, None]], dim=1)
            else:
                pos = (int(cache_seqlens[r]) + i) % state_len
                cols = [(pos - (width - 1) + j) % state_len for j in range(width - 1)]
                prev = state[row][:, cols]
                state[row, :, pos] = tok
            window = torch.cat([prev, tok[:, None]], dim=1).double()
            acc = (window * wd).sum(1)
            if b is not None:
                acc = acc + b.double()
            if silu:
                acc = acc * torch.sigmoid(acc)
            out[r, :, i] = acc
    return out, state


def close(got, ref, dtype):
    tol = TOL[dtype]
    got = got.double()
    assert ((got - ref).abs() <= tol * (1 + ref.abs())).all(), (got - ref).abs().max()


def state_tensor(n, dim, state_len, dtype):
    """conv_state in the transposed layout the original's tests use."""
    return torch.randn(n, state_len, dim).to(dtype).transpose(1, 2)


@pytest.mark.parametrize("itype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("extra_state", [0, 3])
@pytest.mark.parametrize("length", [None, 1, 4, 5])
@pytest.mark.parametrize("width", [2, 3, 4])
def test_shift_register(width, length, extra_state, itype):
    bsz, dim = 3, 16
    x = torch.randn(bsz, dim, length or 1).to(itype)
    if length is None:
        x = x[..., 0]  # 2-D x: (batch, dim)
    conv_state = state_tensor(bsz, dim, width - 1 + extra_state, itype)
    w, b = torch.randn(dim, width), torch.randn(dim)
    ref_out, ref_state = loop_update(x if length else x[..., None], conv_state, w, b, True)
    out = causal_conv1d_update(x, conv_state, w, b, "silu")
    assert out.shape == x.shape and out.dtype == itype
    assert torch.equal(conv_state, ref_state)
    close(out if length else out[..., None], ref_out, itype)


@pytest.mark.parametrize("length", [1, 3, 5, 9])
@pytest.mark.parametrize("state_len_extra", [0, 2, 6])
@pytest.mark.parametrize("width", [2, 3, 4])
def test_circular_cache_seqlens(width, state_len_extra, length):
    """Includes seqlen > state_len, where later tokens overwrite earlier ones."""
    bsz, dim = 4, 8
    state_len = width - 1 + state_len_extra
    x = torch.randn(bsz, dim, length, dtype=torch.bfloat16)
    conv_state = state_tensor(bsz, dim, state_len, torch.bfloat16)
    w, b = torch.randn(dim, width, dtype=torch.bfloat16), torch.randn(dim, dtype=torch.bfloat16)
    cache_seqlens = torch.randint(0, 1024, (bsz,), dtype=torch.int32)
    saved_seqlens = cache_seqlens.clone()
    ref_out, ref_state = loop_update(x, conv_state, w, b, False, cache_seqlens)
    out = causal_conv1d_update(x, conv_state, w, b, None, cache_seqlens)
    assert torch.equal(conv_state, ref_state)
    assert torch.equal(cache_seqlens, saved_seqlens)  # not advanced: the caller does that
    close(out, ref_out, torch.bfloat16)


@pytest.mark.parametrize("circular", [False, True])
@pytest.mark.parametrize("pad", [False, True])
def test_conv_state_indices(pad, circular):
    """Continuous batching: rows gather their state; -1 rows output exactly 0 and every
    state row not used stays bit-identical."""
    bsz, dim, width, state_len, length = 8, 16, 4, 6, 2
    entries = 3 * bsz
    x = torch.randn(bsz, dim, length)
    conv_state = state_tensor(entries, dim, state_len, torch.float32)
    before = conv_state.clone()
    indices = torch.randperm(entries)[:bsz].to(torch.int32)
    if pad:
        indices[::2] = -1
    cache_seqlens = torch.randint(0, 50, (bsz,), dtype=torch.int32) if circular else None
    w, b = torch.randn(dim, width), torch.randn(dim)
    ref_out, ref_state = loop_update(x, conv_state, w, b, True, cache_seqlens, indices)
    out = causal_conv1d_update_function(x, conv_state, w, b, True, cache_seqlens, indices)
    assert torch.equal(conv_state, ref_state)
    used = set(indices[indices >= 0].tolist())
    for e in range(entries):
        if e not in used:
            assert torch.equal(conv_state[e], before[e])
    if pad:
        assert torch.equal(out[::2], torch.zeros_like(out[::2]))
    close(out, ref_out, torch.float32)


def test_layouts_and_weight_dtype():
    """Channel-last multi-token x keeps its layout; fp16 weight with fp32 x."""
    bsz, dim, width, length = 2, 8, 3, 4
    x = torch.randn(bsz, length, dim).transpose(1, 2)
    conv_state = torch.randn(bsz, dim, width + 1)
    w, b = torch.randn(dim, width, dtype=torch.float16), torch.randn(dim, dtype=torch.float16)
    ref_out, ref_state = loop_update(x, conv_state, w, b, True)
    out = causal_conv1d_update(x, conv_state, w, b, activation="swish")
    assert out.stride(1) == 1 and out.dtype == torch.float32
    assert torch.equal(conv_state, ref_state)
    close(out, ref_out, torch.float32)


@pytest.mark.parametrize("circular", [False, True])
@pytest.mark.parametrize("two_d", [False, True])
def test_update_ref_against_loop(two_d, circular):
    bsz, dim, width, state_len = 3, 8, 4, 5
    length = 1 if two_d else 7
    x = torch.randn(bsz, dim, length)
    conv_state = state_tensor(bsz, dim, state_len, torch.float32)
    cache_seqlens = torch.randint(0, 30, (bsz,), dtype=torch.int32) if circular else None
    w, b = torch.randn(dim, width), torch.randn(dim)
    ref_out, ref_state = loop_update(x, conv_state, w, b, True, cache_seqlens)
    out = causal_conv1d_update_ref(x[..., 0] if two_d else x, conv_state, w, b, "silu", cache_seqlens)
    assert torch.equal(conv_state, ref_state)
    close(out[..., None] if two_d else out, ref_out, torch.float32)


def test_decode_steps_continue_the_full_conv():
    """Running the conv over a prefix, then decoding token by token from its final states,
    gives the full sequence's outputs."""
    from causal_conv1d import causal_conv1d_fn

    bsz, dim, width, length, prefix = 2, 8, 4, 12, 7
    x = torch.randn(bsz, dim, length)
    w, b = torch.randn(dim, width), torch.randn(dim)
    full = causal_conv1d_fn(x, w, b, activation="silu")
    _, state = causal_conv1d_fn(x[..., :prefix], w, b, return_final_states=True, activation="silu")
    state = state.contiguous()
    for t in range(prefix, length):
        y = causal_conv1d_update(x[:, :, t], state, w, b, "silu")
        torch.testing.assert_close(y, full[:, :, t], rtol=1e-5, atol=1e-5)
