"""Argument validation and layout rules for the causal_conv1d functions.

Every public entry point validates here before anything runs, so both backends (the
compiled kernel and reference.py) may rely on what these checks guarantee:

- x is ``(batch, dim, seqlen)`` (3-D; update's 2-D form is unsqueezed by the caller),
  floating (fp32/fp16/bf16, or fp64 which only the PyTorch path runs); any of its sizes may
  be 0 (an empty problem, which runs the PyTorch path: argchecks' rule on sizes);
- weight is ``(dim, width)`` with 2 <= width <= 4, floating, any of the float dtypes,
  independent of x; bias is ``(dim,)`` in weight's dtype;
- states, buffers and gradients that share x's role (initial_states, final_states_out,
  dout, dfinal_states, dx, conv_state) have x's dtype and the documented shape;
- seq_idx ``(batch, seqlen)``, cache_seqlens ``(batch,)`` and conv_state_indices
  ``(batch,)`` are int32;
- every tensor is on x's device; outputs written in place do not overlap themselves.

Checks that need tensor values (index ranges, duplicates, sortedness) run only for
tensors not on CUDA, where reading values costs no device synchronisation.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from mamba_kernels.runtime.argchecks import (
    TENSOR,
    describe,
    device_error,
    dtype_error,
    error,
    require_bool,
    require_device,
    require_dtype,
    require_dtype_in,
    require_shape,
    require_tensor,
    require_writable,
    shape_error,
)

MIN_WIDTH = 2
MAX_WIDTH = 4
# dtypes the compiled kernel handles; float64 is accepted too but always runs in PyTorch
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FLOAT_DTYPES = KERNEL_DTYPES + (torch.float64,)
ACTIVATIONS = (None, "silu", "swish")


# --- layout -------------------------------------------------------------------------------


def layout(t: torch.Tensor) -> str:
    """Layout family of a ``(batch, dim, seqlen)`` tensor.

    ``channel_last`` iff stride(1) == 1 and stride(2) > 1 (a transposed ``(b, l, d)``
    tensor, possibly a channel slice of a wider one), ``channel_first`` iff stride(2) == 1,
    else ``strided``. Same rule as the original's C++ side.
    """
    _, s_dim, s_len = t.stride()
    if s_dim == 1 and s_len > 1:
        return "channel_last"
    if s_len == 1:
        return "channel_first"
    return "strided"


def empty_like_layout(
    x: torch.Tensor, shape: Optional[Sequence[int]] = None, dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    """An uninitialised ``(b, d, l)`` tensor in x's layout family (x's dtype by default).

    Dense x gets exactly ``empty_like``'s strides; a channel-last slice of a wider tensor
    (not dense, where ``empty_like`` would fall back to channel-first) gets a dense
    channel-last tensor, so channel-last in always means channel-last out.
    """
    b, d, l = x.shape if shape is None else shape
    dtype = x.dtype if dtype is None else dtype
    if shape is None and _dense(x):
        return torch.empty_like(x, dtype=dtype)
    if layout(x) == "channel_last":
        # empty_strided, not a transposed view: a view output of an autograd.Function cannot
        # be modified in place by the caller, which the original's own tests do.
        return torch.empty_strided((b, d, l), (l * d, 1, d), dtype=dtype, device=x.device)
    return torch.empty((b, d, l), dtype=dtype, device=x.device)


def as_layout_of(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """t itself when it is in x's layout family (unit stride on the same axis), else a dense
    copy that is (channel-first for strided x); makes strided and stride-0 (expanded) dense."""
    fam = "channel_last" if layout(x) == "channel_last" else "channel_first"
    if layout(t) == fam:
        return t
    b, d, l = t.shape
    if fam == "channel_last":
        out = torch.empty((b, l, d), dtype=t.dtype, device=t.device).transpose(1, 2)
    else:
        out = torch.empty((b, d, l), dtype=t.dtype, device=t.device)
    return out.copy_(t)


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: some permutation of t is contiguous."""
    span = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1):
        if stride != span:
            return False
        span *= size
    return True


# --- argument checks -------------------------------------------------------------------------
#
# These run on every call, also in front of the compiled kernels, so the common arguments are
# checked inline (each rule one test, each tensor attribute read once) and a message is only
# built, by mamba_kernels.runtime.argchecks' *_error helpers, when a rule fails. Every message
# reads "fn: arg rule, got <the whole value described>" (argchecks' default wording).

_FLOAT = "must be float32, float16, bfloat16 or float64"
_INT32 = (torch.int32,)
_INT32_RULE = "must be an int32 tensor"


def activation_is_silu(activation: object, fn: str = "causal_conv1d") -> bool:
    """None -> False; "silu" / "swish" -> True; anything else NotImplementedError."""
    if activation is None:
        return False
    if isinstance(activation, str) and activation in ("silu", "swish"):
        return True
    raise NotImplementedError(
        f"{fn}: activation must be None, silu, or swish, got {activation!r}"
    )


def _x_weight_bias(fn: str, x: object, weight: object, bias: object) -> int:
    """Checks x, weight and bias; returns the width."""
    if not isinstance(x, torch.Tensor):
        raise error(TypeError, "x", TENSOR, describe(x), fn)
    shape = x.shape
    if len(shape) != 3:
        raise error(ValueError, "x", "must have shape (batch, dim, seqlen)", describe(x), fn)
    if x.dtype not in FLOAT_DTYPES:
        raise error(TypeError, "x", _FLOAT, describe(x), fn)
    if not isinstance(weight, torch.Tensor):
        raise error(TypeError, "weight", TENSOR, describe(weight), fn)
    device = x.device
    if weight.device != device:
        raise device_error("weight", weight, device, "x's", fn)
    if weight.dtype not in FLOAT_DTYPES:
        raise error(TypeError, "weight", _FLOAT, describe(weight), fn)
    dim = shape[1]
    wshape = weight.shape
    if len(wshape) != 2 or wshape[0] != dim:
        rule = f"must have shape (dim, width) with dim = {dim}"
        raise error(ValueError, "weight", rule, describe(weight), fn)
    width = wshape[1]
    if not MIN_WIDTH <= width <= MAX_WIDTH:
        rule = f"width (its last size) must be between {MIN_WIDTH} and {MAX_WIDTH}"
        raise error(ValueError, "weight", rule, describe(weight), fn)
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise error(TypeError, "bias", TENSOR, describe(bias), fn)
        if bias.device != device:
            raise device_error("bias", bias, device, "x's", fn)
        if bias.shape != (dim,):
            raise shape_error("bias", bias, (dim,), "(dim,)", fn)
        if bias.dtype != weight.dtype:
            raise dtype_error("bias", bias, weight.dtype, "weight's", fn)
    return width


def _like_x(fn: str, arg: str, t: object, x: torch.Tensor, shape: Tuple[int, ...], what: str) -> torch.Tensor:
    """t is a tensor on x's device, of ``shape`` (``what`` names its sizes), in x's dtype."""
    t = require_tensor(arg, t, fn=fn)
    assert t is not None  # (for type checkers: require_tensor checked it)
    require_device(arg, t, x.device, "x's", fn=fn)
    require_shape(arg, t, shape, what, fn=fn)
    require_dtype(arg, t, x.dtype, "x's", fn=fn)
    return t


def _state(fn: str, arg: str, t: object, x: torch.Tensor, width: int) -> torch.Tensor:
    return _like_x(fn, arg, t, x, (x.shape[0], x.shape[1], width - 1), "(batch, dim, width - 1)")


def _int32_vector(
    fn: str, arg: str, t: object, x: torch.Tensor, shape: Tuple[int, ...], what: str
) -> torch.Tensor:
    """t is an int32 tensor on x's device, of ``shape``."""
    t = require_tensor(arg, t, fn=fn)
    assert t is not None  # (for type checkers: require_tensor checked it)
    require_device(arg, t, x.device, "x's", fn=fn)
    require_shape(arg, t, shape, what, fn=fn)
    require_dtype_in(arg, t, _INT32, _INT32_RULE, fn=fn)
    return t


def _seq_idx(fn: str, seq_idx: object, x: torch.Tensor) -> None:
    if isinstance(seq_idx, str):
        raise error(
            TypeError, "seq_idx",
            "(4th positional argument since causal-conv1d 1.1) must be an int32 tensor or None; "
            "pass activation by keyword",
            describe(seq_idx), fn,
        )
    _int32_vector(fn, "seq_idx", seq_idx, x, (x.shape[0], x.shape[2]), "(batch, seqlen)")


def check_fwd(
    x: object,
    weight: object,
    bias: object,
    seq_idx: object,
    initial_states: object,
    final_states_out: object,
    silu_activation: object,
    fn: str = "causal_conv1d_fwd_function",
) -> None:
    width = _x_weight_bias(fn, x, weight, bias)
    assert isinstance(x, torch.Tensor)  # (for type checkers: _x_weight_bias checked it)
    if seq_idx is not None:
        _seq_idx(fn, seq_idx, x)
    if initial_states is not None:
        _state(fn, "initial_states", initial_states, x, width)
    if final_states_out is not None:
        out = _state(fn, "final_states_out", final_states_out, x, width)
        require_writable("final_states_out", out, fn=fn)
    require_bool("silu_activation", silu_activation, fn=fn)


def check_bwd(
    x: object,
    weight: object,
    bias: object,
    dout: object,
    seq_idx: object,
    initial_states: object,
    dfinal_states: object,
    dx: object,
    return_dinitial_states: object,
    silu_activation: object,
    fn: str = "causal_conv1d_bwd_function",
) -> None:
    width = _x_weight_bias(fn, x, weight, bias)
    assert isinstance(x, torch.Tensor)  # (for type checkers: _x_weight_bias checked it)
    _like_x(fn, "dout", dout, x, tuple(x.shape), "x's shape (batch, dim, seqlen)")
    if seq_idx is not None:
        _seq_idx(fn, seq_idx, x)
    if initial_states is not None:
        _state(fn, "initial_states", initial_states, x, width)
    if dfinal_states is not None:
        _state(fn, "dfinal_states", dfinal_states, x, width)
    if dx is not None:
        dx = _like_x(fn, "dx", dx, x, tuple(x.shape), "x's shape (batch, dim, seqlen)")
        require_writable("dx", dx, fn=fn)
    require_bool("return_dinitial_states", return_dinitial_states, fn=fn)
    if return_dinitial_states and initial_states is None:
        rule = "needs initial_states to be given"
        raise error(ValueError, "return_dinitial_states", rule, describe(True), fn)
    require_bool("silu_activation", silu_activation, fn=fn)


def check_update(
    x: object,
    conv_state: object,
    weight: object,
    bias: object,
    silu_activation: object,
    cache_seqlens: object,
    conv_state_indices: object,
    fn: str = "causal_conv1d_update_function",
) -> None:
    width = _x_weight_bias(fn, x, weight, bias)
    assert isinstance(x, torch.Tensor)  # (for type checkers: _x_weight_bias checked it)
    batch, dim, _ = x.shape
    if not isinstance(conv_state, torch.Tensor):
        raise error(TypeError, "conv_state", TENSOR, describe(conv_state), fn)
    if conv_state.device != x.device:
        raise device_error("conv_state", conv_state, x.device, "x's", fn)
    if conv_state.dtype != x.dtype:
        raise dtype_error("conv_state", conv_state, x.dtype, "x's", fn)
    state_shape = conv_state.shape
    if len(state_shape) != 3 or state_shape[1] != dim:
        raise error(ValueError, "conv_state", f"must have shape (batch, dim, state_len) with dim = {dim}",
                    describe(conv_state), fn)
    if state_shape[2] < width - 1:
        rule = f"must have state_len >= width - 1 = {width - 1}"
        raise error(ValueError, "conv_state", rule, describe(conv_state), fn)
    require_writable("conv_state", conv_state, fn=fn)
    require_bool("silu_activation", silu_activation, fn=fn)
    if cache_seqlens is not None:
        cache_seqlens = _int32_vector(fn, "cache_seqlens", cache_seqlens, x, (batch,), "(batch,)")
        if cache_seqlens.device.type != "cuda" and bool((cache_seqlens < 0).any()):
            raise error(ValueError, "cache_seqlens", "must be >= 0", describe(cache_seqlens.tolist()), fn)
    if conv_state_indices is None:
        if state_shape[0] != batch:
            raise error(
                ValueError, "conv_state",
                f"must have batch = {batch} entries when conv_state_indices is None",
                describe(conv_state), fn,
            )
        return
    idx = _int32_vector(fn, "conv_state_indices", conv_state_indices, x, (batch,), "(batch,)")
    if idx.device.type != "cuda":
        n = state_shape[0]
        if bool((idx >= n).any()):
            raise error(ValueError, "conv_state_indices", f"must be < conv_state.shape[0] = {n} (or < 0 "
                        "for padding)", describe(idx.tolist()), fn)
        used = idx[idx >= 0]
        if used.unique().numel() != used.numel():
            rule = "must not repeat a state row"
            raise error(ValueError, "conv_state_indices", rule, describe(idx.tolist()), fn)


def check_varlen(
    x: object, cu_seqlens: object, state_len: object, fn: str = "causal_conv1d_varlen_states"
) -> None:
    x = require_tensor("x", x, fn=fn)
    assert x is not None  # (for type checkers: require_tensor checked it)
    if x.dim() != 2:
        raise error(ValueError, "x", "must be (total_tokens, dim)", describe(x), fn)
    require_dtype_in("x", x, FLOAT_DTYPES, _FLOAT, fn=fn)
    cu = require_tensor("cu_seqlens", cu_seqlens, fn=fn)
    assert cu is not None  # (for type checkers: require_tensor checked it)
    require_device("cu_seqlens", cu, x.device, "x's", fn=fn)
    if cu.dim() != 1 or cu.numel() < 1:
        raise error(ValueError, "cu_seqlens", "must be (batch + 1,)", describe(cu), fn)
    require_dtype_in("cu_seqlens", cu, (torch.int32, torch.int64), "must be an int32 or int64 tensor", fn=fn)
    if isinstance(state_len, bool) or not isinstance(state_len, int):
        raise error(TypeError, "state_len", "must be an int", describe(state_len), fn)
    if state_len < 1:
        raise error(ValueError, "state_len", "must be >= 1", describe(state_len), fn)
    if cu.device.type != "cuda":
        if int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) > x.shape[0]:
            raise error(
                ValueError, "cu_seqlens",
                f"must start at 0, never decrease and end at most at total_tokens = {x.shape[0]}",
                describe(cu.tolist()), fn,
            )
