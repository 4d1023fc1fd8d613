"""Output shapes of the compiled SSD ops, ``mamba_kernels::ssd_chunk_scan_fwd`` and
``mamba_kernels::ssd_chunk_scan_bwd``: their fake (meta) implementations, which torch.compile
traces instead of the CUDA kernels. Kept apart from
``_ssd_ops`` (which loads the extension) so it can be checked without one."""

from __future__ import annotations

import torch

OP_NAME = "ssd_chunk_scan_fwd"
BWD_OP_NAME = "ssd_chunk_scan_bwd"


def ssd_fwd_fake(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus,
                 dt_limit_lo, dt_limit_hi):
    """(out, out_x, dt_out, dA_cumsum, states, final_states, varlen_states), allocated as the
    CUDA op does: contiguous; out_x empty without z, varlen_states without cu_seqlens; the
    intermediates float32."""
    batch, seqlen, nheads, headdim = x.shape
    dstate = B.shape[-1]
    nchunks = -(-seqlen // chunk_size)
    f32 = torch.float32
    out = x.new_empty((batch, seqlen, nheads, headdim))
    out_x = x.new_empty((batch, seqlen, nheads, headdim)) if z is not None else x.new_empty((0,))
    dt_out = x.new_empty((batch, nheads, nchunks, chunk_size), dtype=f32)
    dA_cumsum = x.new_empty((batch, nheads, nchunks, chunk_size), dtype=f32)
    states = x.new_empty((batch, nchunks, nheads, headdim, dstate), dtype=f32)
    final_states = x.new_empty((batch, nheads, headdim, dstate), dtype=f32)
    if cu_seqlens is not None:
        varlen_states = x.new_empty((cu_seqlens.shape[0] - 1, nheads, headdim, dstate), dtype=f32)
    else:
        varlen_states = x.new_empty((0,), dtype=f32)
    return out, out_x, dt_out, dA_cumsum, states, final_states, varlen_states


def ssd_bwd_fake(dout, x, dt, A, B, C, out, chunk_size, D, z, dt_bias, initial_states, dfinal_states, seq_idx,
                 dt_softplus, dt_limit_lo, dt_limit_hi):
    """(dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states), allocated as the CUDA op does:
    contiguous, each like its input (shape and dtype); an empty (0,) tensor of x's dtype where the
    input is None."""
    def like(t):
        return x.new_empty(tuple(t.shape), dtype=t.dtype)

    none = x.new_empty((0,))
    return (like(x), like(dt), like(A), like(B), like(C),
            like(D) if D is not None else none,
            like(x) if z is not None else none,
            like(dt_bias) if dt_bias is not None else none,
            like(initial_states) if initial_states is not None else none)
