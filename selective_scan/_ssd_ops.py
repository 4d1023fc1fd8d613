"""The compiled forward and backward of Mamba-2's SSD chunked scan as torch.library custom ops.

Importing this module loads ``selective_scan._cuda``, whose C++ side registers
``torch.ops.mamba_kernels.ssd_chunk_scan_fwd`` and ``ssd_chunk_scan_bwd`` (CUDA implementations;
csrc/ssd). Here we add their fake (meta) implementations (``_ssd_meta``), so
``torch.compile(fullgraph=True)`` traces them without a graph break; ``ssd_forward_cuda``, the
forward with the outputs of mamba_ssm's internal ``_mamba_chunk_scan_combined_fwd``; and
``ssd_backward_cuda``, the gradients of its inputs.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from mamba_kernels.runtime.library import register_fake

from . import _cuda  # noqa: F401  (loading it registers the op)
from ._ssd_meta import BWD_OP_NAME, OP_NAME, ssd_bwd_fake, ssd_fwd_fake

Tensor = torch.Tensor
_op = getattr(torch.ops.mamba_kernels, OP_NAME).default
_bwd_op = getattr(torch.ops.mamba_kernels, BWD_OP_NAME).default

register_fake("ssd_chunk_scan_fwd")(ssd_fwd_fake)  # OP_NAME, spelled out for tests/test_abi_audit.py
register_fake("ssd_chunk_scan_bwd")(ssd_bwd_fake)  # BWD_OP_NAME


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


def ssd_backward_cuda(
    dout: Tensor,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    out: Tensor,
    chunk_size: int,
    D: Optional[Tensor] = None,
    z: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None,
    initial_states: Optional[Tensor] = None,
    dfinal_states: Optional[Tensor] = None,
    seq_idx: Optional[Tensor] = None,
    dt_softplus: bool = False,
    dt_limit: Tuple[float, float] = (0.0, float("inf")),
) -> Tuple[Optional[Tensor], ...]:
    """``(dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states)``: the gradients of
    ``ssd_forward_cuda``'s inputs given ``dout``, the gradient of its ``out``, and
    ``dfinal_states``, that of its ``final_states`` (None: zero).

    The inputs are the forward's (same rules); ``out`` is y before the gate (the forward's
    ``out_x``) when z is given, else its ``out`` (then unread). The forward's intermediates
    (dt after bias / softplus / clamp, its running sums, the chunk states, C B^T) are recomputed,
    nothing else is needed. Each gradient has its input's shape and dtype (dx, dz like x; dB, dC
    like B, C); dD, dz, ddt_bias and dinitial_states are None where their input is. No gradient
    for varlen states (cu_seqlens). Deterministic: two calls give bitwise equal results.
    """
    if x.shape[-1] == 0 or B.shape[-1] == 0:  # no state: y = D x (the kernels need both sizes)
        return _stateless_backward(dout, x, dt, A, B, C, out, D, z, dt_bias, initial_states)
    lo, hi = dt_limit
    dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinit = _bwd_op(
        dout, x, dt, A, B, C, out, int(chunk_size), D, z, dt_bias, initial_states, dfinal_states, seq_idx,
        bool(dt_softplus), float(lo), float(hi),
    )
    return (dx, ddt, dA, dB, dC,
            dD if D is not None else None,
            dz if z is not None else None,
            ddt_bias if dt_bias is not None else None,
            dinit if initial_states is not None else None)


def _stateless_backward(dout, x, dt, A, B, C, out, D, z, dt_bias, initial_states):
    """headdim or dstate 0: y = D x, no dependence on dt, A, B, C or the initial state."""
    f32 = torch.float32
    dy = dout.to(f32)
    if z is not None:
        s = torch.sigmoid(z.to(f32))
        dz = (dout.to(f32) * out.to(f32) * s * (1 + z.to(f32) * (1 - s))).to(x.dtype)
        dy = dy * z.to(f32) * s
    else:
        dz = None
    dD = None
    if D is not None:
        Dw = D.to(f32)[:, None] if D.dim() == 1 else D.to(f32)
        dx = (dy * Dw).to(x.dtype)
        dDw = (dy * x.to(f32)).sum((0, 1))
        dD = (dDw.sum(-1) if D.dim() == 1 else dDw).to(D.dtype)
    else:
        dx = torch.zeros_like(x)
    return (dx, torch.zeros_like(dt), torch.zeros_like(A), torch.zeros_like(B), torch.zeros_like(C), dD, dz,
            torch.zeros_like(dt_bias) if dt_bias is not None else None,
            torch.zeros_like(initial_states) if initial_states is not None else None)
