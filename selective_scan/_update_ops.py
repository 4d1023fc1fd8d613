"""The compiled selective_state_update kernel as a torch.library custom op.

Importing this module loads ``selective_scan._cuda``, whose C++ side registers
``torch.ops.mamba_kernels.selective_state_update`` (CUDA implementation; ``state`` is
annotated as mutated in the schema). Here we add its fake (meta) implementation, so
``torch.compile(fullgraph=True)`` traces it without a graph break, and the thin function
``selective_state_update`` calls after validating its arguments.
"""

from __future__ import annotations

from typing import Optional

import torch

from mamba_kernels.runtime.library import register_fake

from . import _cuda  # noqa: F401  (loading it registers the op)

Tensor = torch.Tensor
_op = torch.ops.mamba_kernels.selective_state_update.default


@register_fake("selective_state_update")
def _fake(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices):
    return torch.empty_like(x)  # the CUDA op allocates out with empty_like(x) too


def update(
    state: Tensor,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    z: Optional[Tensor],
    dt_bias: Optional[Tensor],
    dt_softplus: bool,
    state_batch_indices: Optional[Tensor],
) -> Tensor:
    """One decode step: ``state`` is updated in place, a new ``out`` (x's shape and dtype) is
    returned. Every operand is read in place (any strides; float32/float16/bfloat16, each its
    own); dstate <= 256."""
    return _op(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices)
