"""Public API of causal-conv1d 1.7.0 (``causal_conv1d.causal_conv1d_interface``).

``causal_conv1d_fn`` / ``CausalConv1dFn`` and ``causal_conv1d_update`` run through
``cpp_functions`` (the dispatch point); ``causal_conv1d_fn`` enters ``CausalConv1dFn``
only when autograd (or a mode that traces or transforms Functions) needs it, and otherwise
runs the same forward straight (the Function's machinery alone costs about 2.5 us of host
time per call). ``causal_conv1d_ref`` and ``causal_conv1d_update_ref`` are the original's
plain reference functions: they compute in weight's dtype with ``F.conv1d`` and support
autograd through ordinary torch ops.

Superset of the original: seq_idx, initial_states and final states also work for
channel-first x, and final states also with seq_idx (see ``reference``).
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch.autograd import forward_ad

from mamba_kernels.runtime import library

from . import _checks, cpp_functions

Tensor = torch.Tensor


_FN = "causal_conv1d_fn"


def _forward(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    seq_idx: Optional[Tensor],
    initial_states: Optional[Tensor],
    return_final_states: bool,
    final_states_out: Optional[Tensor],
    activation: Optional[str],
) -> Tuple[Tensor, Optional[Tensor], bool]:
    """Validate (once) and run the forward: ``(out, final states or None, silu)``."""
    silu = _checks.activation_is_silu(activation, _FN)
    _checks.require_bool("return_final_states", return_final_states, fn=_FN)
    if not return_final_states:
        final_states_out = None  # ignored unless requested, as in the original
    # validate before allocating anything from x's shape
    _checks.check_fwd(x, weight, bias, seq_idx, initial_states, final_states_out, silu, _FN)
    if return_final_states and final_states_out is None:
        b, d, _ = x.shape
        final_states_out = _checks.empty_like_layout(x, shape=(b, d, weight.shape[1] - 1))
    out = cpp_functions.fwd_unchecked(x, weight, bias, seq_idx, initial_states, final_states_out, silu)
    return out, final_states_out, silu


class CausalConv1dFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        x: Tensor,
        weight: Tensor,
        bias: Optional[Tensor] = None,
        seq_idx: Optional[Tensor] = None,
        initial_states: Optional[Tensor] = None,
        return_final_states: bool = False,
        final_states_out: Optional[Tensor] = None,
        activation: Optional[str] = None,
    ):
        out, final_states_out, silu = _forward(
            x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out, activation
        )
        ctx.save_for_backward(x, weight, bias, seq_idx, initial_states)
        ctx.silu = silu
        ctx.return_final_states = return_final_states
        ctx.return_dinitial_states = initial_states is not None and ctx.needs_input_grad[4]
        return (out, final_states_out) if return_final_states else out

    @staticmethod
    def backward(ctx, dout: Tensor, *rest: Tensor):
        x, weight, bias, seq_idx, initial_states = ctx.saved_tensors
        dfinal_states = rest[0] if ctx.return_final_states else None
        dx, dweight, dbias, dinitial_states = cpp_functions.causal_conv1d_bwd_function(
            x,
            weight,
            bias,
            dout,
            seq_idx,
            initial_states,
            dfinal_states,
            None,
            ctx.return_dinitial_states,
            ctx.silu,
        )
        return dx, dweight, dbias, None, dinitial_states, None, None, None


# (bound once: each is read on every call)
_is_compiling = library.is_compiling
_tracing_state = torch._C._get_tracing_state
_functorch_active = torch._C._are_functorch_transforms_active


def _needs_function(*tensors: Optional[Tensor]) -> bool:
    """Whether a call must run as ``CausalConv1dFn``: autograd would record it, or a mode
    that sees autograd Functions is on (torch.compile, jit tracing, forward AD, functorch),
    which thus sees exactly what it always saw. Otherwise the Function adds only cost
    (about 2.5 us per call in ``apply``) and the forward runs straight."""
    return (
        cpp_functions.requires_grad(*tensors)
        or _is_compiling()
        or _tracing_state() is not None
        or forward_ad._current_level >= 0  # a dual_level is open: inputs may carry tangents
        or _functorch_active()
    )


def _conv(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    seq_idx: Optional[Tensor],
    initial_states: Optional[Tensor],
    return_final_states: bool,
    activation: Optional[str],
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """What ``CausalConv1dFn.apply`` returns (no buffer given), run as that Function only
    when ``_needs_function`` says so."""
    if _needs_function(x, weight, bias, initial_states):
        return CausalConv1dFn.apply(
            x, weight, bias, seq_idx, initial_states, return_final_states, None, activation
        )
    out, final_states, _ = _forward(x, weight, bias, seq_idx, initial_states, return_final_states, None,
                                    activation)
    return (out, final_states) if return_final_states else out


def causal_conv1d_fn(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    seq_idx: Optional[Tensor] = None,
    initial_states: Optional[Tensor] = None,
    return_final_states: bool = False,
    final_states_out: Optional[Tensor] = None,
    activation: Optional[str] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Causal depthwise conv1d over the last axis of x ``(batch, dim, seqlen)``.

    weight ``(dim, width)`` with 2 <= width <= 4; bias ``(dim,)``; seq_idx ``(batch,
    seqlen)`` int32 (segments; < 0 is padding with output 0); initial_states ``(batch,
    dim, width - 1)``; activation None, "silu" or "swish". Returns ``out`` in x's layout,
    or ``(out, final_states)`` when ``return_final_states`` (``final_states_out`` is
    written in place and returned as that same object).
    """
    if not (return_final_states and final_states_out is not None):
        return _conv(x, weight, bias, seq_idx, initial_states, return_final_states, activation)
    # autograd cannot hand a caller's buffer (often a transposed view) back from a Function
    # that has two outputs, so the Function returns its own and an ordinary, differentiable
    # copy_ fills the caller's buffer: the same object comes back, with gradients.
    _checks.check_fwd(x, weight, bias, seq_idx, initial_states, final_states_out, False, _FN)
    out, final_states = _conv(x, weight, bias, seq_idx, initial_states, True, activation)
    final_states_out.copy_(final_states)
    return out, final_states_out


def causal_conv1d_update(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    activation: Optional[str] = None,
    cache_seqlens: Optional[Tensor] = None,
    conv_state_indices: Optional[Tensor] = None,
) -> Tensor:
    """Decode step(s): x ``(batch, dim)`` or ``(batch, dim, seqlen)``; ``conv_state``
    ``(batch, dim, state_len)`` (or ``(entries, dim, state_len)`` with int32
    ``conv_state_indices``, negative = padded row: output 0, no state touched) is updated
    in place; int32 ``cache_seqlens`` selects the circular-buffer mode (not advanced
    here). Returns ``out`` of x's shape."""
    fn = "causal_conv1d_update"
    silu = _checks.activation_is_silu(activation, fn)
    if isinstance(x, Tensor) and x.dim() not in (2, 3):
        raise ValueError(
            f"{fn}: x must have shape (batch, dim) or (batch, dim, seqlen), got a tensor of shape "
            f"{tuple(x.shape)}"
        )
    squeeze = isinstance(x, Tensor) and x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    out = cpp_functions.causal_conv1d_update_function(
        x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices
    )
    return out.squeeze(-1) if squeeze else out


# --- the original's reference functions ------------------------------------------------------


def causal_conv1d_ref(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    initial_states: Optional[Tensor] = None,
    return_final_states: bool = False,
    final_states_out: Optional[Tensor] = None,
    activation: Optional[str] = None,
    seq_idx: Optional[Tensor] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Reference conv in weight's dtype (note: no ``seq_idx`` in 4th place; it is the last
    keyword, as in causal-conv1d 1.7.0)."""
    fn = "causal_conv1d_ref"
    silu = _checks.activation_is_silu(activation, fn)
    _checks.require_bool("return_final_states", return_final_states, fn=fn)
    if not return_final_states:
        final_states_out = None
    _checks.check_fwd(x, weight, bias, seq_idx, initial_states, final_states_out, silu, fn)
    dtype_in = x.dtype
    x = x.to(weight.dtype)
    dim, width = weight.shape
    seqlen = x.shape[-1]
    if initial_states is None:
        xp = F.pad(x, (width - 1, 0))
    else:
        xp = torch.cat([initial_states.to(weight.dtype), x], dim=-1)
    if x.numel() == 0:  # empty batch, dim or seqlen: F.conv1d takes neither groups=0 nor L=0
        out = xp.new_zeros(x.shape)
        tags = seq_idx.new_zeros((x.shape[0], width - 1 + seqlen)) if seq_idx is not None else None
    elif seq_idx is None:
        out = F.conv1d(xp, weight.unsqueeze(1), bias, padding=0, groups=dim)
    else:
        tags = torch.cat([seq_idx[:, :1].expand(-1, width - 1), seq_idx], dim=1)
        windows = xp.unfold(-1, width, 1)  # (b, d, L, W)
        same = tags.unfold(-1, width, 1) == seq_idx.unsqueeze(-1)  # (b, L, W)
        windows = windows.masked_fill(~same.unsqueeze(1), 0)
        out = (windows * weight[:, None, :]).sum(-1)
        if bias is not None:
            out = out + bias[:, None]
    if silu:
        out = F.silu(out)
    if seq_idx is not None:
        out = out.masked_fill((seq_idx < 0).unsqueeze(1), 0)
    out = out.to(dtype_in)
    if not return_final_states:
        return out
    final_states = xp[..., seqlen:]
    if seq_idx is not None and seqlen > 0:  # (no token: the states carry over unchanged)
        tail = tags[:, seqlen:]
        final_states = final_states.masked_fill(~((tail == seq_idx[:, -1:]) & (tail >= 0)).unsqueeze(1), 0)
    final_states = final_states.to(dtype_in)
    if final_states_out is not None:
        final_states_out.copy_(final_states)
        final_states = final_states_out
    return out, final_states


def causal_conv1d_update_ref(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    activation: Optional[str] = None,
    cache_seqlens: Optional[Tensor] = None,
) -> Tensor:
    """Reference decode step in weight's dtype; mutates ``conv_state`` in place."""
    fn = "causal_conv1d_update_ref"
    silu = _checks.activation_is_silu(activation, fn)
    if isinstance(x, Tensor) and x.dim() not in (2, 3):
        raise ValueError(
            f"{fn}: x must have shape (batch, dim) or (batch, dim, seqlen), got a tensor of shape "
            f"{tuple(x.shape)}"
        )
    squeeze = isinstance(x, Tensor) and x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    _checks.check_update(x, conv_state, weight, bias, silu, cache_seqlens, None, fn)
    dtype_in = x.dtype
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    state_len = conv_state.shape[-1]
    if cache_seqlens is None:
        xp = torch.cat([conv_state.to(weight.dtype), x.to(weight.dtype)], dim=-1)
        conv_state.copy_(xp[:, :, -state_len:].to(conv_state.dtype))
        xp = xp[:, :, -(width - 1 + seqlen):]
    else:
        start = cache_seqlens.long()[:, None]
        read = (start - (width - 1) + torch.arange(width - 1, device=x.device)) % state_len
        prev = conv_state.gather(2, read.unsqueeze(1).expand(-1, dim, -1))
        xp = torch.cat([prev.to(weight.dtype), x.to(weight.dtype)], dim=-1)
        for i in range(seqlen):  # in order, so later tokens win when seqlen > state_len
            pos = ((start[:, 0] + i) % state_len)[:, None, None].expand(-1, dim, 1)
            conv_state.scatter_(2, pos, x[:, :, i:i + 1])
    if x.numel() == 0:  # empty batch, dim or seqlen: F.conv1d takes neither groups=0 nor L=0
        out = xp.new_zeros(x.shape)
    else:
        out = F.conv1d(xp, weight.unsqueeze(1), bias, padding=0, groups=dim)[..., -seqlen:]
    if silu:
        out = F.silu(out)
    out = out.to(dtype_in)
    return out.squeeze(-1) if squeeze else out
