"""Argument validation and layout rules for the causal_conv1d functions.

Every public entry point validates here before anything runs, so both backends (the
compiled kernel and reference.py) may rely on what these checks guarantee:

- x is ``(batch, dim, seqlen)`` (3-D; update's 2-D form is unsqueezed by the caller),
  floating (fp32/fp16/bf16, or fp64 which only the PyTorch path runs), all sizes >= 1;
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

MIN_WIDTH = 2
MAX_WIDTH = 4
# dtypes the compiled kernel handles; float64 is accepted too but always runs in PyTorch
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FLOAT_DTYPES = KERNEL_DTYPES + (torch.float64,)
ACTIVATIONS = (None, "silu", "swish")


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    return repr(value)


def _err(cls: type, fn: str, arg: str, rule: str, value: object) -> Exception:
    return cls(f"{fn}: {arg} {rule}, got {_describe(value)}")


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


def _overlaps_itself(t: torch.Tensor) -> bool:
    if t.is_contiguous() and t.numel() > 0:  # the usual case, answered without sorting strides
        return False
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1)
    span = 1
    for stride, size in dims:
        if stride < span:
            return True
        span = stride * size
    return False


# --- argument checks -------------------------------------------------------------------------
#
# These run on every call, also in front of the compiled kernels, so the common arguments are
# checked inline (each rule one test, each tensor attribute read once) and a message is only
# built, by the *_error helpers below, when a rule fails.

_TENSOR = "must be a torch.Tensor"
_FLOAT = "must be float32, float16, bfloat16 or float64"


def activation_is_silu(activation: object, fn: str = "causal_conv1d") -> bool:
    """None -> False; "silu" / "swish" -> True; anything else NotImplementedError."""
    if activation is None:
        return False
    if isinstance(activation, str) and activation in ("silu", "swish"):
        return True
    raise NotImplementedError(
        f"{fn}: activation must be None, silu, or swish, got {activation!r}"
    )


def check_bool(fn: str, arg: str, value: object) -> None:
    if not isinstance(value, bool):
        raise _err(TypeError, fn, arg, "must be a bool", value)


def _device_error(fn: str, arg: str, t: torch.Tensor, x: torch.Tensor) -> Exception:
    return _err(ValueError, fn, arg, f"must be on x's device {x.device}", t)


def _shape_error(fn: str, arg: str, t: torch.Tensor, shape: Tuple[int, ...], names: str) -> Exception:
    return _err(ValueError, fn, arg, f"must have shape {names} = {shape}", t)


def _dtype_error(fn: str, arg: str, t: torch.Tensor, dtype: torch.dtype, whose: str) -> Exception:
    return _err(TypeError, fn, arg, f"must have {whose} dtype {dtype}", t)


def _tensor(fn: str, arg: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise _err(TypeError, fn, arg, _TENSOR, t)
    return t


def _same_device(fn: str, arg: str, t: torch.Tensor, x: torch.Tensor) -> None:
    if t.device != x.device:
        raise _device_error(fn, arg, t, x)


def _shape(fn: str, arg: str, t: torch.Tensor, shape: Tuple[int, ...], names: str) -> None:
    if t.shape != shape:
        raise _shape_error(fn, arg, t, shape, names)


def _float(fn: str, arg: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise _err(TypeError, fn, arg, _FLOAT, t)


def _dtype(fn: str, arg: str, t: torch.Tensor, dtype: torch.dtype, whose: str) -> None:
    if t.dtype != dtype:
        raise _dtype_error(fn, arg, t, dtype, whose)


def _int32(fn: str, arg: str, t: torch.Tensor) -> None:
    if t.dtype != torch.int32:
        raise _err(TypeError, fn, arg, "must be an int32 tensor", t)


def _writable(fn: str, arg: str, t: torch.Tensor) -> None:
    if _overlaps_itself(t):
        raise _err(ValueError, fn, arg, "is written in place and must not overlap itself (e.g. expand)", t)
    if t.requires_grad and t.is_leaf:
        raise _err(ValueError, fn, arg, "is written in place and must not be a leaf that requires grad", t)


def _x_weight_bias(fn: str, x: object, weight: object, bias: object) -> int:
    """Checks x, weight and bias; returns the width."""
    if not isinstance(x, torch.Tensor):
        raise _err(TypeError, fn, "x", _TENSOR, x)
    shape = x.shape
    if len(shape) != 3:
        raise _err(ValueError, fn, "x", "must have shape (batch, dim, seqlen)", x)
    if x.dtype not in FLOAT_DTYPES:
        raise _err(TypeError, fn, "x", _FLOAT, x)
    if 0 in shape:
        raise _err(ValueError, fn, "x", "must have batch, dim and seqlen all >= 1", x)
    if not isinstance(weight, torch.Tensor):
        raise _err(TypeError, fn, "weight", _TENSOR, weight)
    device = x.device
    if weight.device != device:
        raise _device_error(fn, "weight", weight, x)
    if weight.dtype not in FLOAT_DTYPES:
        raise _err(TypeError, fn, "weight", _FLOAT, weight)
    dim = shape[1]
    wshape = weight.shape
    if len(wshape) != 2 or wshape[0] != dim:
        raise _err(ValueError, fn, "weight", f"must have shape (dim, width) with dim = {dim}", weight)
    width = wshape[1]
    if not MIN_WIDTH <= width <= MAX_WIDTH:
        rule = f"width (its last size) must be between {MIN_WIDTH} and {MAX_WIDTH}"
        raise _err(ValueError, fn, "weight", rule, weight)
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise _err(TypeError, fn, "bias", _TENSOR, bias)
        if bias.device != device:
            raise _device_error(fn, "bias", bias, x)
        if bias.shape != (dim,):
            raise _shape_error(fn, "bias", bias, (dim,), "(dim,)")
        if bias.dtype != weight.dtype:
            raise _dtype_error(fn, "bias", bias, weight.dtype, "weight's")
    return width


def _state(fn: str, arg: str, t: object, x: torch.Tensor, width: int) -> torch.Tensor:
    t = _tensor(fn, arg, t)
    _same_device(fn, arg, t, x)
    _shape(fn, arg, t, (x.shape[0], x.shape[1], width - 1), "(batch, dim, width - 1)")
    _dtype(fn, arg, t, x.dtype, "x's")
    return t


def _seq_idx(fn: str, seq_idx: object, x: torch.Tensor) -> None:
    if isinstance(seq_idx, str):
        raise _err(
            TypeError, fn, "seq_idx",
            "(4th positional argument since causal-conv1d 1.1) must be an int32 tensor or None; "
            "pass activation by keyword",
            seq_idx,
        )
    seq_idx = _tensor(fn, "seq_idx", seq_idx)
    _same_device(fn, "seq_idx", seq_idx, x)
    _shape(fn, "seq_idx", seq_idx, (x.shape[0], x.shape[2]), "(batch, seqlen)")
    _int32(fn, "seq_idx", seq_idx)


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
        _writable(fn, "final_states_out", _state(fn, "final_states_out", final_states_out, x, width))
    check_bool(fn, "silu_activation", silu_activation)


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
    dout = _tensor(fn, "dout", dout)
    _same_device(fn, "dout", dout, x)
    _shape(fn, "dout", dout, tuple(x.shape), "x's shape (batch, dim, seqlen)")
    _dtype(fn, "dout", dout, x.dtype, "x's")
    if seq_idx is not None:
        _seq_idx(fn, seq_idx, x)
    if initial_states is not None:
        _state(fn, "initial_states", initial_states, x, width)
    if dfinal_states is not None:
        _state(fn, "dfinal_states", dfinal_states, x, width)
    if dx is not None:
        dx = _tensor(fn, "dx", dx)
        _same_device(fn, "dx", dx, x)
        _shape(fn, "dx", dx, tuple(x.shape), "x's shape (batch, dim, seqlen)")
        _dtype(fn, "dx", dx, x.dtype, "x's")
        _writable(fn, "dx", dx)
    check_bool(fn, "return_dinitial_states", return_dinitial_states)
    if return_dinitial_states and initial_states is None:
        raise _err(ValueError, fn, "return_dinitial_states", "needs initial_states to be given", True)
    check_bool(fn, "silu_activation", silu_activation)


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
        raise _err(TypeError, fn, "conv_state", _TENSOR, conv_state)
    if conv_state.device != x.device:
        raise _device_error(fn, "conv_state", conv_state, x)
    if conv_state.dtype != x.dtype:
        raise _dtype_error(fn, "conv_state", conv_state, x.dtype, "x's")
    state_shape = conv_state.shape
    if len(state_shape) != 3 or state_shape[1] != dim:
        raise _err(ValueError, fn, "conv_state", f"must have shape (batch, dim, state_len) with dim = {dim}",
                   conv_state)
    if state_shape[2] < width - 1:
        rule = f"must have state_len >= width - 1 = {width - 1}"
        raise _err(ValueError, fn, "conv_state", rule, conv_state)
    _writable(fn, "conv_state", conv_state)
    check_bool(fn, "silu_activation", silu_activation)
    if cache_seqlens is not None:
        cache_seqlens = _tensor(fn, "cache_seqlens", cache_seqlens)
        _same_device(fn, "cache_seqlens", cache_seqlens, x)
        _shape(fn, "cache_seqlens", cache_seqlens, (batch,), "(batch,)")
        _int32(fn, "cache_seqlens", cache_seqlens)
        if cache_seqlens.device.type != "cuda" and bool((cache_seqlens < 0).any()):
            raise _err(ValueError, fn, "cache_seqlens", "must be >= 0", cache_seqlens.tolist())
    if conv_state_indices is None:
        if state_shape[0] != batch:
            raise _err(
                ValueError, fn, "conv_state",
                f"must have batch = {batch} entries when conv_state_indices is None", conv_state,
            )
        return
    idx = _tensor(fn, "conv_state_indices", conv_state_indices)
    _same_device(fn, "conv_state_indices", idx, x)
    _shape(fn, "conv_state_indices", idx, (batch,), "(batch,)")
    _int32(fn, "conv_state_indices", idx)
    if idx.device.type != "cuda":
        n = state_shape[0]
        if bool((idx >= n).any()):
            raise _err(ValueError, fn, "conv_state_indices", f"must be < conv_state.shape[0] = {n} (or < 0 "
                       "for padding)", idx.tolist())
        used = idx[idx >= 0]
        if used.unique().numel() != used.numel():
            raise _err(ValueError, fn, "conv_state_indices", "must not repeat a state row", idx.tolist())


def check_varlen(
    x: object, cu_seqlens: object, state_len: object, fn: str = "causal_conv1d_varlen_states"
) -> None:
    x = _tensor(fn, "x", x)
    if x.dim() != 2:
        raise _err(ValueError, fn, "x", "must be (total_tokens, dim)", x)
    _float(fn, "x", x)
    cu = _tensor(fn, "cu_seqlens", cu_seqlens)
    _same_device(fn, "cu_seqlens", cu, x)
    if cu.dim() != 1 or cu.numel() < 1:
        raise _err(ValueError, fn, "cu_seqlens", "must be (batch + 1,)", cu)
    if cu.dtype not in (torch.int32, torch.int64):
        raise _err(TypeError, fn, "cu_seqlens", "must be an int32 or int64 tensor", cu)
    if isinstance(state_len, bool) or not isinstance(state_len, int):
        raise _err(TypeError, fn, "state_len", "must be an int", state_len)
    if state_len < 1:
        raise _err(ValueError, fn, "state_len", "must be >= 1", state_len)
    if cu.device.type != "cuda":
        if int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) > x.shape[0]:
            raise _err(
                ValueError, fn, "cu_seqlens",
                f"must start at 0, never decrease and end at most at total_tokens = {x.shape[0]}",
                cu.tolist(),
            )
