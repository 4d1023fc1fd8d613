"""Functional API of causal-conv1d (``causal_conv1d.cpp_functions``, CC >= 1.5.1).

The one dispatch point of this package: every public function and ``CausalConv1dFn``
comes through here. Each function validates (``_checks``), puts its arguments in the form
both backends expect, then runs the compiled kernel (``_ops``, when
``dispatch.use_cuda`` says so) or the PyTorch implementation (``reference``). Both
backends take and return exactly these functions' arguments and results.
``fwd_unchecked`` is the forward without its validation, for callers that have just run
the same checks (so a call pays for them once).

What the normalisation guarantees to both backends: x has a unit stride on the channel
or time axis (a copy is made otherwise); dout is in x's layout family; bias, seq_idx,
cache_seqlens and conv_state_indices are contiguous. float64 always runs in PyTorch.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Optional, Tuple

import torch

from mamba_kernels.runtime import dispatch
from mamba_kernels.runtime.argchecks import is_empty

from . import _checks, reference
from ._checks import KERNEL_DTYPES

Tensor = torch.Tensor
KERNEL = "causal_conv1d"
_PACKAGE = sys.modules[__package__]


def _contiguous(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.contiguous()


def _compiled(x: Tensor, weight: Tensor) -> bool:
    # an empty problem (batch, dim or seqlen of 0) runs the PyTorch path on any device
    # (argchecks.is_empty: no launch on an empty grid)
    if x.dtype not in KERNEL_DTYPES or weight.dtype not in KERNEL_DTYPES or is_empty(x):
        return False
    # x.is_cuda is a flag read; x.device.type builds a device object and a string
    return dispatch.use_cuda(KERNEL, "cuda" if x.is_cuda else x.device.type)


def _ops() -> ModuleType:
    """``causal_conv1d._ops``, imported on first use (importing it loads the extension); read
    from the package, which is what ``from . import _ops`` does after its import machinery."""
    ops = getattr(_PACKAGE, "_ops", None)
    if ops is None:
        from . import _ops as ops
    return ops


def _unit_stride(x: Tensor) -> Tensor:
    return x.contiguous() if _checks.layout(x) == "strided" else x


def requires_grad(*tensors: Optional[Tensor]) -> bool:
    """Whether autograd would record an op on these (None and non-tensors never count)."""
    if torch.is_grad_enabled():
        for t in tensors:
            if isinstance(t, Tensor) and t.requires_grad:
                return True
    return False


def causal_conv1d_fwd_function(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    seq_idx: Optional[Tensor],
    initial_states: Optional[Tensor],
    final_states_out: Optional[Tensor],
    silu_activation: bool,
) -> Tensor:
    """Returns a new ``out`` (x's shape, dtype and layout); writes ``final_states_out``
    (``(batch, dim, width - 1)``) in place when given."""
    _checks.check_fwd(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation)
    return fwd_unchecked(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation)


def fwd_unchecked(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    seq_idx: Optional[Tensor],
    initial_states: Optional[Tensor],
    final_states_out: Optional[Tensor],
    silu_activation: bool,
) -> Tensor:
    """``causal_conv1d_fwd_function`` for arguments that already passed ``_checks.check_fwd``
    (the autograd Function checks them once, under the public function's name)."""
    x = _unit_stride(x)
    bias, seq_idx = _contiguous(bias), _contiguous(seq_idx)
    if _compiled(x, weight):
        return _ops().fwd(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation)
    return reference.fwd(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation)


def causal_conv1d_bwd_function(
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
    """Returns ``(dx, dweight, dbias, dinitial_states)``. A given ``dx`` is written in place
    (any strides) and returned as the same object; dweight/dbias are accumulated in fp32 and
    cast to weight/bias dtype; dbias is None without bias; dinitial_states is None unless
    ``return_dinitial_states``."""
    _checks.check_bwd(
        x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, return_dinitial_states,
        silu_activation,
    )
    x = _unit_stride(x)
    dout = _checks.as_layout_of(dout, x)
    bias, seq_idx = _contiguous(bias), _contiguous(seq_idx)
    args = (x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, return_dinitial_states)
    if _compiled(x, weight):
        return _ops().bwd(*args, silu_activation)
    return reference.bwd(*args, silu_activation)


def causal_conv1d_update_function(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    silu_activation: bool,
    cache_seqlens: Optional[Tensor],
    conv_state_indices: Optional[Tensor],
) -> Tensor:
    """Decode step(s) for x ``(batch, dim, seqlen)``; mutates ``conv_state`` in place and
    returns a new ``out`` (x's shape, dtype and layout). See ``reference.update``. On the CUDA
    kernel ``out`` does not require grad (decode is inference-only, as in the original)."""
    _checks.check_update(x, conv_state, weight, bias, silu_activation, cache_seqlens, conv_state_indices)
    bias = _contiguous(bias)
    cache_seqlens, conv_state_indices = _contiguous(cache_seqlens), _contiguous(conv_state_indices)
    if _compiled(x, weight):
        # The compiled decode step has no backward (nor has the original's): its output is
        # explicitly not differentiable, instead of an autograd fallback that would drop the
        # gradient with a warning at backward time. The PyTorch path is differentiable.
        args = (x, conv_state, weight, bias, silu_activation, cache_seqlens, conv_state_indices)
        if requires_grad(x, conv_state, weight, bias):  # (else no_grad would change nothing)
            with torch.no_grad():
                return _ops().update(*args)
        return _ops().update(*args)
    return reference.update(x, conv_state, weight, bias, silu_activation, cache_seqlens, conv_state_indices)
