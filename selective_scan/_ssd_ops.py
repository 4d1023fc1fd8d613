"""The compiled forward of Mamba-2's SSD chunked scan as a torch.library custom op.

Importing this module loads ``selective_scan._cuda``, whose C++ side registers
``torch.ops.mamba_kernels.ssd_chunk_scan_fwd`` (CUDA implementation; csrc/ssd). Here we add its
fake (meta) implementation (``_ssd_meta``), so ``torch.compile(fullgraph=True)`` traces it
without a graph break, and ``ssd_forward_cuda``, the forward with the outputs of mamba_ssm's
internal ``_mamba_chunk_scan_combined_fwd``.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from mamba_kernels.runtime.library import register_fake

from . import _cuda  # noqa: F401  (loading it registers the op)
from ._ssd_meta import OP_NAME, ssd_fwd_fake

Tensor = torch.Tensor
_op = getattr(torch.ops.mamba_kernels, OP_NAME).default

register_fake("ssd_chunk_scan_fwd")(ssd_fwd_fake)  # OP_NAME, spelled out for tests/test_abi_audit.py


def ssd_forward_cuda(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Optional[Tensor] = None,
    z: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    initial_states: Optional[Tensor] = None,
    seq_idx: Optional[Tensor] = None,
    dt_softplus: bool = False,
    dt_limit: Tuple[float, float] = (0.0, float("inf")),
    cu_seqlens: Optional[Tensor] = None,
) -> Tuple[Tensor, ...]:
    """``(out, out_x, dt_out, dA_cumsum, states, final_states)``, and ``varlen_states`` after
    them when ``cu_seqlens`` is given (mamba_ssm's ``_mamba_chunk_scan_combined_fwd``).

    x (batch, seqlen, nheads, headdim); dt (batch, seqlen, nheads); A (nheads,); B, C
    (batch, seqlen, ngroups, dstate) with ngroups dividing nheads; D (nheads,) or
    (nheads, headdim); z like x; dt_bias (nheads,); initial_states
    (batch, nheads, headdim, dstate); seq_idx (batch, seqlen) int32, nondecreasing along a row.
    x, B, C and z share one dtype (float32, float16 or bfloat16); the others may be any of the
    three. Every operand is read in place (any strides). 1 <= chunk_size <= 256.

    out: x's shape and dtype, y * silu(z) with z; out_x: y before the gate (None without z);
    dt_out, dA_cumsum: float32 (batch, nheads, nchunks, chunk_size), dt after bias / softplus /
    clamp into dt_limit (always, as mamba_ssm does: the default (0, inf) zeroes a negative dt) and
    its running sum times A within each chunk (past seqlen: 0 and flat); states:
    float32 (batch, nchunks, nheads, headdim, dstate), the state entering each chunk;
    final_states: float32 (batch, nheads, headdim, dstate).

    cu_seqlens: (nseqs + 1,) int32 or int64 offsets of sequences packed along seqlen (batch 1),
    passed together with the seq_idx that marks the same sequences; varlen_states: float32
    (nseqs, nheads, headdim, dstate), the state at the end of each sequence (0 for an empty one;
    the first sequence starts from initial_states, as its outputs do: mamba_ssm 2.3.2 leaves the
    initial state out of that sequence's varlen state when it ends inside the first chunk).
    """
    lo, hi = dt_limit
    out, out_x, dt_out, dA_cumsum, states, final_states, varlen_states = _op(
        x, dt, A, B, C, int(chunk_size), D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
        bool(dt_softplus), float(lo), float(hi),
    )
    res = (out, (out_x if z is not None else None), dt_out, dA_cumsum, states, final_states)
    return res + (varlen_states,) if cu_seqlens is not None else res
