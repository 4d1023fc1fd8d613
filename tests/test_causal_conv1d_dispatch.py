"""cpp_functions is the one dispatch point: when dispatch picks the compiled path it calls
``_ops.fwd/bwd/update`` with exactly its own arguments (after validation and layout
normalisation) and returns their result unchanged; float64 and failed validation never
reach it. ``_ops`` here is a recording stand-in: the code under test is cpp_functions."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import causal_conv1d
from causal_conv1d import causal_conv1d_fn, causal_conv1d_update, cpp_functions
from mamba_kernels.runtime import dispatch


@pytest.fixture
def fake_ops(monkeypatch):
    calls = []
    ops = types.ModuleType("causal_conv1d._ops")
    sentinel = object()

    def record(name):
        def fn(*args):
            calls.append((name, args))
            if name == "update":
                return torch.full_like(args[0], 7.0)
            return sentinel if name == "fwd" else (sentinel, None, None, None)

        return fn

    for name in ("fwd", "bwd", "update"):
        setattr(ops, name, record(name))
    monkeypatch.setitem(sys.modules, "causal_conv1d._ops", ops)
    monkeypatch.setattr(causal_conv1d, "_ops", ops, raising=False)
    monkeypatch.setattr(dispatch, "use_cuda", lambda kernel, device_type: kernel == "causal_conv1d")
    return calls, sentinel


def test_fwd_goes_to_ops_with_normalised_arguments(fake_ops):
    calls, sentinel = fake_ops
    x = torch.randn(2, 4, 12)[:, :, ::2]  # no unit stride: made contiguous first
    w, b = torch.randn(4, 3), torch.randn(8)[::2]
    seq = torch.zeros(2, 12, dtype=torch.int32)[:, ::2]
    assert cpp_functions.causal_conv1d_fwd_function(x, w, b, seq, None, None, True) is sentinel
    (name, args), = calls
    assert name == "fwd" and len(args) == 7
    assert args[0].is_contiguous() and torch.equal(args[0], x) and args[1] is w
    assert args[2].is_contiguous() and args[3].is_contiguous() and args[6] is True


def test_bwd_and_update_go_to_ops(fake_ops):
    calls, sentinel = fake_ops
    x = torch.randn(2, 6, 4).transpose(1, 2)
    w = torch.randn(4, 2)
    dout = torch.randn(2, 4, 6)  # other layout family: re-laid to channel-last
    dx = torch.empty(2, 6, 4).transpose(1, 2)
    res = cpp_functions.causal_conv1d_bwd_function(x, w, None, dout, None, None, None, dx, False, False)
    assert res[0] is sentinel
    name, args = calls[-1]
    assert name == "bwd" and len(args) == 10 and args[7] is dx
    assert args[3].stride(1) == 1 and torch.equal(args[3], dout)
    state = torch.randn(2, 4, 1)
    out = cpp_functions.causal_conv1d_update_function(x, state, w, None, False, None, None)
    assert torch.equal(out, torch.full((2, 4, 6), 7.0))
    name, args = calls[-1]
    assert name == "update" and len(args) == 7 and args[1] is state


def test_update_2d_is_unsqueezed_before_ops(fake_ops):
    calls, _ = fake_ops
    out = causal_conv1d_update(torch.randn(2, 4), torch.randn(2, 4, 3), torch.randn(4, 4))
    assert calls[-1][1][0].shape == (2, 4, 1)
    assert torch.equal(out, torch.full((2, 4), 7.0))


def test_float64_and_bad_input_never_reach_ops(fake_ops):
    calls, _ = fake_ops
    x = torch.randn(1, 4, 5, dtype=torch.float64)
    out = causal_conv1d_fn(x, torch.randn(4, 3, dtype=torch.float64))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    with pytest.raises(ValueError):
        causal_conv1d_fn(torch.randn(1, 4, 5), torch.randn(4, 5))
    assert calls == []
