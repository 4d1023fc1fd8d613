"""The compiled causal_conv1d kernels as torch.library custom ops.

Importing this module loads ``causal_conv1d._cuda``, whose C++ side registers
``torch.ops.mamba_kernels.causal_conv1d_{fwd,fwd_final_states,bwd,update}`` (CUDA implementations, mutated
arguments annotated in the schemas). Here we add their fake (meta) implementations, so
``torch.compile(fullgraph=True)`` traces them without graph breaks, and the three thin
functions ``cpp_functions`` calls after validating its arguments.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from mamba_kernels.runtime.library import eager_entry, pick, register_fake

from . import _cuda  # noqa: F401  (loading it registers the ops)
from ._checks import empty_like_layout

Tensor = torch.Tensor
_ops = torch.ops.mamba_kernels
# eager calls go straight to each op's C++ entry (library.eager_entry says why)
_fwd_entry = eager_entry(_ops.causal_conv1d_fwd)
_fwd_final_states_entry = eager_entry(_ops.causal_conv1d_fwd_final_states)
_bwd_entry = eager_entry(_ops.causal_conv1d_bwd)


# Fake implementations: outputs with exactly the shapes, dtypes and strides the CUDA ops give.
@register_fake("causal_conv1d_fwd")
def _fwd_fake(x, weight, bias, seq_idx, initial_states, silu_activation):
    return empty_like_layout(x)


@register_fake("causal_conv1d_fwd_final_states")
def _fwd_final_states_fake(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation):
    return empty_like_layout(x)


@register_fake("causal_conv1d_bwd")
def _bwd_fake(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, return_dinitial_states,
              silu_activation):
    dweight = weight.new_empty(weight.shape)
    dbias = bias.new_empty(bias.shape) if bias is not None else weight.new_empty((0,))
    if return_dinitial_states:
        dinit = empty_like_layout(x, shape=(x.shape[0], x.shape[1], weight.shape[1] - 1))
    else:
        dinit = x.new_empty((0,))
    return dweight, dbias, dinit


@register_fake("causal_conv1d_update")
def _update_fake(x, conv_state, weight, bias, silu_activation, cache_seqlens, conv_state_indices):
    return torch.empty_like(x)


def fwd(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    seq_idx: Optional[Tensor],
    initial_states: Optional[Tensor],
    final_states_out: Optional[Tensor],
    silu_activation: bool,
) -> Tensor:
    """out in x's layout; final_states_out, when given, is written in place."""
    if final_states_out is None:  # two ops: inductor cannot lower an Optional mutated argument
        op = pick(_ops.causal_conv1d_fwd, _fwd_entry)
        return op(x, weight, bias, seq_idx, initial_states, silu_activation)
    op = pick(_ops.causal_conv1d_fwd_final_states, _fwd_final_states_entry)
    return op(
        x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation
    )


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
    """(dx, dweight, dbias, dinitial_states); a given dx (any strides) is written in place and
    returned; dbias is None without bias, dinitial_states None unless requested. dweight and
    dbias are summed in fp32 and come back in weight's / bias's dtype."""
    if dx is None:
        dx = empty_like_layout(x)
    op = pick(_ops.causal_conv1d_bwd, _bwd_entry)
    dweight, dbias, dinit = op(
        x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, return_dinitial_states,
        silu_activation,
    )
    return (
        dx,
        dweight,
        dbias if bias is not None else None,
        dinit if return_dinitial_states else None,
    )


def update(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    silu_activation: bool,
    cache_seqlens: Optional[Tensor],
    conv_state_indices: Optional[Tensor],
) -> Tensor:
    """Decode step(s) for a 3-D x; conv_state is updated in place; returns a new out."""
    return _ops.causal_conv1d_update(
        x, conv_state, weight, bias, silu_activation, cache_seqlens, conv_state_indices
    )
