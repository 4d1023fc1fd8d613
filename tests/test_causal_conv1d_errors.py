"""The causal_conv1d error surface: each bad argument gives ValueError / TypeError /
NotImplementedError naming the argument, before anything runs."""

from __future__ import annotations

import pytest
import torch

from causal_conv1d import causal_conv1d_fn, causal_conv1d_update
from causal_conv1d.causal_conv1d_interface import causal_conv1d_ref, causal_conv1d_update_ref
from causal_conv1d.causal_conv1d_varlen import causal_conv1d_varlen_states
from causal_conv1d.cpp_functions import (
    causal_conv1d_bwd_function,
    causal_conv1d_fwd_function,
    causal_conv1d_update_function,
)

B, D, L, W = 2, 8, 10, 4


def x_():
    return torch.randn(B, D, L)


def w_():
    return torch.randn(D, W)


def st_(width=W, dtype=torch.float32):
    return torch.randn(B, D, width - 1, dtype=dtype)


def i32(*values):
    return torch.tensor(values, dtype=torch.int32)


def fn(*args, **kwargs):
    return lambda: causal_conv1d_fn(*args, **kwargs)


def bwd(dout=None, initial_states=None, dfinal_states=None, dx=None, return_dinit=False):
    dout = x_() if dout is None else dout
    return lambda: causal_conv1d_bwd_function(
        x_(), w_(), None, dout, None, initial_states, dfinal_states, dx, return_dinit, False
    )


FN_CASES = {
    "x_rank": (fn(torch.randn(D, L), w_()), ValueError, "x"),
    "x_int": (fn(torch.ones(B, D, L, dtype=torch.int64), w_()), TypeError, "x"),
    "x_not_tensor": (fn([[1.0]], w_()), TypeError, "x"),
    "width_5": (fn(x_(), torch.randn(D, 5)), ValueError, "weight"),
    "width_1": (fn(x_(), torch.randn(D, 1)), ValueError, "weight"),
    "weight_dim": (fn(x_(), torch.randn(D + 1, W)), ValueError, "weight"),
    "weight_rank": (fn(x_(), torch.randn(D, 1, W)), ValueError, "weight"),
    "weight_int": (fn(x_(), torch.ones(D, W, dtype=torch.int32)), TypeError, "weight"),
    "weight_device": (fn(x_(), torch.randn(D, W, device="meta")), ValueError, "weight"),
    "bias_shape": (fn(x_(), w_(), torch.randn(D + 1)), ValueError, "bias"),
    "bias_dtype": (fn(x_(), w_(), torch.randn(D, dtype=torch.float16)), TypeError, "bias"),
    "seq_idx_dtype": (fn(x_(), w_(), None, torch.zeros(B, L, dtype=torch.int64)), TypeError, "seq_idx"),
    "seq_idx_shape": (fn(x_(), w_(), None, torch.zeros(B, L + 1, dtype=torch.int32)), ValueError, "seq_idx"),
    "seq_idx_device": (fn(x_(), w_(), None, torch.zeros(B, L, dtype=torch.int32, device="meta")), ValueError,
                       "seq_idx"),
    "activation_positional": (fn(x_(), w_(), None, "silu"), TypeError, "seq_idx"),
    "initial_states_shape": (fn(x_(), w_(), initial_states=st_(W + 1)), ValueError, "initial_states"),
    "initial_states_dtype": (fn(x_(), w_(), initial_states=st_(dtype=torch.float16)), TypeError,
                             "initial_states"),
    "final_states_out_shape": (fn(x_(), w_(), return_final_states=True, final_states_out=st_(W - 1)),
                               ValueError, "final_states_out"),
    "final_states_out_dtype": (fn(x_(), w_(), return_final_states=True,
                                  final_states_out=st_(dtype=torch.bfloat16)),
                               TypeError, "final_states_out"),
    "final_states_out_overlap": (fn(x_(), w_(), return_final_states=True,
                                    final_states_out=torch.zeros(1, 1, 1).expand(B, D, W - 1)),
                                 ValueError, "final_states_out"),
    "return_final_states_type": (fn(x_(), w_(), return_final_states="yes"), TypeError, "return_final_states"),
    "ref_width": (lambda: causal_conv1d_ref(x_(), torch.randn(D, 6)), ValueError, "weight"),
    "ref_seq_idx_dtype": (lambda: causal_conv1d_ref(x_(), w_(), seq_idx=torch.zeros(B, L)), TypeError,
                          "seq_idx"),
}

CPP_CASES = {
    "fwd_silu_type": (lambda: causal_conv1d_fwd_function(x_(), w_(), None, None, None, None, "silu"),
                      TypeError, "silu_activation"),
    "fwd_weight": (lambda: causal_conv1d_fwd_function(x_(), torch.randn(D, 5), None, None, None, None, False),
                   ValueError, "weight"),
    "bwd_dout_shape": (bwd(dout=torch.randn(B, D, L + 1)), ValueError, "dout"),
    "bwd_dout_dtype": (bwd(dout=torch.randn(B, D, L).half()), TypeError, "dout"),
    "bwd_dx_shape": (bwd(dx=torch.empty(B, D, L - 1)), ValueError, "dx"),
    "bwd_dx_dtype": (bwd(dx=torch.empty(B, D, L).double()), TypeError, "dx"),
    "bwd_dx_overlap": (bwd(dx=torch.empty(1, D, L).expand(B, D, L)), ValueError, "dx"),
    "bwd_dinit_without_init": (bwd(return_dinit=True), ValueError, "return_dinitial_states"),
    "bwd_dfinal_shape": (bwd(dfinal_states=st_(W + 1)), ValueError, "dfinal_states"),
    "bwd_init_dtype": (bwd(initial_states=st_(dtype=torch.float16)), TypeError, "initial_states"),
}


def upd(x=None, conv_state=None, weight=None, cache_seqlens=None, indices=None, activation=None):
    x = torch.randn(B, D) if x is None else x
    conv_state = torch.randn(B, D, W - 1) if conv_state is None else conv_state
    weight = w_() if weight is None else weight
    return lambda: causal_conv1d_update(x, conv_state, weight, None, activation, cache_seqlens, indices)


UPDATE_CASES = {
    "x_rank": (upd(x=torch.randn(B, D, 1, 1)), ValueError, "x"),
    "x_dim": (upd(x=torch.randn(B, D + 1)), ValueError, "weight"),
    "state_dtype": (upd(conv_state=torch.randn(B, D, W - 1).half()), TypeError, "conv_state"),
    "state_len": (upd(conv_state=torch.randn(B, D, W - 2)), ValueError, "conv_state"),
    "state_batch": (upd(conv_state=torch.randn(B + 1, D, W - 1)), ValueError, "conv_state"),
    "state_dim": (upd(conv_state=torch.randn(B, D + 1, W - 1)), ValueError, "conv_state"),
    "state_rank": (upd(conv_state=torch.randn(B, D)), ValueError, "conv_state"),
    "width": (upd(weight=torch.randn(D, 5), conv_state=torch.randn(B, D, 4)), ValueError, "weight"),
    "activation": (upd(activation="relu"), NotImplementedError, "activation"),
    "cache_seqlens_dtype": (upd(cache_seqlens=torch.zeros(B, dtype=torch.int64)), TypeError, "cache_seqlens"),
    "cache_seqlens_shape": (upd(cache_seqlens=i32(0, 0, 0)), ValueError, "cache_seqlens"),
    "cache_seqlens_negative": (upd(cache_seqlens=i32(3, -1)), ValueError, "cache_seqlens"),
    "indices_dtype": (upd(indices=torch.zeros(B, dtype=torch.int64)), TypeError, "conv_state_indices"),
    "indices_range": (upd(indices=i32(0, 2)), ValueError, "conv_state_indices"),
    "indices_repeat": (upd(indices=i32(1, 1)), ValueError, "conv_state_indices"),
    "indices_shape": (upd(indices=i32(0)), ValueError, "conv_state_indices"),
    "fn_x_2d": (lambda: causal_conv1d_update_function(torch.randn(B, D), torch.randn(B, D, W - 1), w_(), None,
                                                      False, None, None), ValueError, "x"),
    "ref_state_len": (lambda: causal_conv1d_update_ref(torch.randn(B, D), torch.randn(B, D, 1), w_()),
                      ValueError, "conv_state"),
}


def varlen(x, cu, state_len):
    return lambda: causal_conv1d_varlen_states(x, cu, state_len)


VARLEN_CASES = {
    "x_rank": (varlen(torch.randn(2, 4, 3), i32(0, 2), 3), ValueError, "x"),
    "cu_dtype": (varlen(torch.randn(6, 4), torch.tensor([0.0, 6.0]), 3), TypeError, "cu_seqlens"),
    "cu_start": (varlen(torch.randn(6, 4), i32(1, 6), 3), ValueError, "cu_seqlens"),
    "cu_order": (varlen(torch.randn(6, 4), i32(0, 4, 2), 3), ValueError, "cu_seqlens"),
    "cu_end": (varlen(torch.randn(6, 4), i32(0, 7), 3), ValueError, "cu_seqlens"),
    "state_len": (varlen(torch.randn(6, 4), i32(0, 6), 0), ValueError, "state_len"),
    "state_len_type": (varlen(torch.randn(6, 4), i32(0, 6), 2.0), TypeError, "state_len"),
}

ALL = {f"fn-{k}": v for k, v in FN_CASES.items()}
ALL.update({f"cpp-{k}": v for k, v in CPP_CASES.items()})
ALL.update({f"update-{k}": v for k, v in UPDATE_CASES.items()})
ALL.update({f"varlen-{k}": v for k, v in VARLEN_CASES.items()})


@pytest.mark.parametrize("case", sorted(ALL))
def test_error_names_the_argument(case):
    call, exc, arg = ALL[case]
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert type(info.value) is exc
    assert arg in msg and "got" in msg, msg


@pytest.mark.parametrize("activation", ["gelu", "SiLU", 1])
def test_unknown_activation_keeps_the_original_text(activation):
    with pytest.raises(NotImplementedError, match="activation must be None, silu, or swish"):
        causal_conv1d_fn(x_(), w_(), activation=activation)


def test_width_error_shows_the_value():
    with pytest.raises(ValueError, match=r"between 2 and 4.*\(8, 5\)"):
        causal_conv1d_fn(x_(), torch.randn(D, 5))


def test_bad_padding_index_leaves_state_untouched():
    conv_state = torch.randn(B, D, W - 1)
    before = conv_state.clone()
    with pytest.raises(ValueError):
        causal_conv1d_update(torch.randn(B, D), conv_state, w_(), conv_state_indices=i32(0, 5))
    assert torch.equal(conv_state, before)


def test_strict_cuda_backend_refuses_cpu_tensors(monkeypatch):
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "cuda")
    with pytest.raises(RuntimeError, match="MAMBA_KERNELS_BACKEND=cuda"):
        causal_conv1d_fn(x_(), w_())
    monkeypatch.setenv("MAMBA_KERNELS_BACKEND", "reference")
    assert causal_conv1d_fn(x_(), w_()).shape == (B, D, L)
