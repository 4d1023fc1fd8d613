"""The compiled selective-scan kernels as torch.library custom ops.

Importing this module loads ``selective_scan._cuda``, whose C++ side registers
``torch.ops.mamba_kernels.selective_scan_{fwd,bwd}`` (CUDA implementations; the backward's
``dz`` is an annotated in-place output). Here we add their fake (meta) implementations, so
``torch.compile(fullgraph=True)`` traces them without graph breaks.

Contract of the ops (the binding checks every rule):
  fwd(u, delta, A, B, C, D, z, delta_bias, delta_softplus, keep_y, state_steps=64,
      state_count=-1, state_pairs=False) -> (out, out_z, ckpt)
    B/C fixed (dim, dstate) in A's dtype or variable (batch, ngroups, dstate, L [x2]) in u's
    dtype; out = y without the z gate (empty unless keep_y); out_z = y silu(z) (empty without
    z), so without keep_y and z only ckpt is written; ckpt = float32 (batch, dim, state_count,
    dstate [x2]), slot k the state after min((k + 1) state_steps, L) steps. state_steps: 64
    times a power of two; state_count: -1 for ceil(L / state_steps), or one more when L > 0;
    state_pairs (an even count): slots 2r and 2r + 1 interleaved state by state in row r, so
    ckpt is (batch, dim, count / 2, 2 dstate [x2]), the original's x shape (memory order
    (batch, dim, count / 2, dstate, 2 [x2])). The default is what bwd reads: the state after
    every 64 steps, the last slot the final state.
  bwd(u, delta, A, B, C, D, z, delta_bias, dout, ckpt, y, dz, out_z, delta_softplus,
      state_steps=64, state_pairs=False)
    -> (du, ddelta, dA, dB, dC, dD, ddelta_bias); dz written in place when z is given, and
    out_z = y silu(z) (from the given y) when it is not empty. ckpt: the forward's states as
    it returned them, with the forward's state_steps and state_pairs; state_steps above 64
    (up to 1024) and state_pairs only for real A and dstate <= 16, where the backward
    recomputes the chunk starts between the states (bitwise what a state every 64 steps gives).
"""

from __future__ import annotations

import torch

from mamba_kernels.runtime.library import eager_entry, register_fake

from . import _cuda  # noqa: F401  (loading it registers the ops)

Tensor = torch.Tensor
CHUNK = 64  # steps between saved states (csrc/selective_scan/selective_scan.h, kChunk)
_ops = torch.ops.mamba_kernels


def _state_floats(A: Tensor) -> int:
    return A.shape[1] * (2 if A.is_complex() else 1)


@register_fake("selective_scan_fwd")
def _fwd_fake(u, delta, A, B, C, D, z, delta_bias, delta_softplus, keep_y, state_steps=CHUNK, state_count=-1,
              state_pairs=False):
    batch, dim, L = u.shape
    out = torch.empty_like(delta) if keep_y else u.new_empty((0,))
    out_z = torch.empty_like(delta) if z is not None else u.new_empty((0,))
    count = state_count if state_count >= 0 else -(-L // state_steps)
    rows, per_row = (count // 2, 2) if state_pairs else (count, 1)
    ckpt = u.new_empty((batch, dim, rows, per_row * _state_floats(A)), dtype=torch.float32)
    return out, out_z, ckpt


@register_fake("selective_scan_bwd")
def _bwd_fake(u, delta, A, B, C, D, z, delta_bias, dout, ckpt, y, dz, out_z, delta_softplus,
              state_steps=CHUNK, state_pairs=False):
    f32 = torch.float32
    dD = u.new_empty((u.shape[1],), dtype=f32) if D is not None else u.new_empty((0,), dtype=f32)
    dbias = u.new_empty((u.shape[1],), dtype=f32) if delta_bias is not None else u.new_empty((0,), dtype=f32)
    grads = (torch.empty_like(u), torch.empty_like(delta), A.new_empty(A.shape), B.new_empty(B.shape))
    return grads + (C.new_empty(C.shape), dD, dbias)


fwd = _ops.selective_scan_fwd
bwd = _ops.selective_scan_bwd
# each op's eager C++ entry; callers choose with library.pick (torch.compile traces fwd and bwd)
fwd_entry = eager_entry(fwd)
bwd_entry = eager_entry(bwd)
