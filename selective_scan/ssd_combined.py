"""Drop-in for ``mamba_ssm.ops.triton.ssd_combined`` (mamba_ssm 2.3.2): the Mamba-2 SSD scan.

Same names, positional order, defaults, shapes and return forms as the original's public
functions: ``mamba_chunk_scan_combined``, ``mamba_chunk_scan``, ``ssd_chunk_scan_combined_ref``,
``ssd_selective_scan``, ``mamba_conv1d_scan_ref``, ``mamba_split_conv1d_scan_combined`` and
``mamba_split_conv1d_scan_ref``. No Triton: the combined functions run the compiled SSD forward
(``_ssd_ops.ssd_forward_cuda``) for CUDA tensors it covers when the dispatch allows, else the
chunked PyTorch forward of ``ssd_pytorch`` (``ssd_forward``, on any device and in float64 too).
With autograd, ``MambaChunkScanCombinedFn`` and ``MambaSplitConv1dScanCombinedFn`` keep what the
original keeps (or less) and recompute the rest in their backward; the references use plain
autograd. The maths and the meaning of every argument are in ``ssd_pytorch``'s docstring;
docs/CLIENTS.md ("Mamba-2: ssd_combined") says which path runs when, and lists where we differ
from the original on purpose:

* dt NaN propagates (the clamp to dt_limit keeps it NaN), and a NaN anywhere reaches no
  earlier output; gradients flow with ``return_varlen_states`` too (the original refuses
  that backward);
* float64 inputs compute in float64, and final_states / dt_out / dA_cumsum are float64 then;
* the varlen states start each sequence from zero (the first one from initial_states)
  whatever the chunk boundaries are; a chunk's decays are never clamped at 1 for A > 0;
* every argument is checked with an error naming it (``_ssd_checks``).
"""

from __future__ import annotations

import math
import sys
from types import ModuleType
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

from causal_conv1d import causal_conv1d_fn
from mamba_kernels.runtime import dispatch, knobs
from mamba_kernels.runtime.argchecks import error, shape_of, typed_repr
from mamba_kernels.runtime.library import is_compiling

from . import _amp, _ssd_checks
from .layernorm_gated import _layer_norm_bwd, _layer_norm_fwd, rmsnorm_fn
from .scan_fn import selective_scan_fn
from .ssd_pytorch import NO_LIMIT, compute_dtype, process_dt, ssd_forward

Tensor = torch.Tensor
INF_LIMIT = (-math.inf, math.inf)

__all__ = [
    "mamba_chunk_scan_combined",
    "mamba_chunk_scan",
    "ssd_chunk_scan_combined_ref",
    "ssd_selective_scan",
    "mamba_conv1d_scan_ref",
    "mamba_split_conv1d_scan_combined",
    "mamba_split_conv1d_scan_ref",
    "ssd_forward",
    "MambaChunkScanCombinedFn",
    "MambaSplitConv1dScanCombinedFn",
]


# --- dispatch: the compiled forward (and backward) or the PyTorch path ---------------------------

KERNEL = "selective_scan"  # the extension family (selective_scan._cuda) the SSD kernels ship in
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
KERNEL_MAX_CHUNK = 256  # csrc/ssd: kSsdMaxChunk
_KERNEL_MAX_GRID = 65535  # csrc/ssd: kSsdMaxGridYZ (heads, batch * chunks, sequences)
_INT32 = torch.int32
_INT32_RANGE = (-(2**31), 2**31 - 1)
_PACKAGE = sys.modules[__package__]
# Whether _ssd_ops has the compiled backward: read once, at the first CUDA use (importing _ssd_ops
# loads the extension). The CUDA backward is written on its own branch; this guard goes when it lands.
_CUDA_BACKWARD: Optional[bool] = None


def _ops() -> ModuleType:
    """``selective_scan._ssd_ops``, imported on first use (importing it loads the extension)."""
    ops = getattr(_PACKAGE, "_ssd_ops", None)
    if ops is None:
        from . import _ssd_ops as ops
    return ops


def _cuda_backward() -> bool:
    """Whether the compiled backward exists; asked only after the dispatch chose the compiled
    forward (so the extension is loaded), answered once and then a constant global."""
    global _CUDA_BACKWARD
    if _CUDA_BACKWARD is None:
        _CUDA_BACKWARD = hasattr(_ops(), "ssd_backward_cuda")
    return _CUDA_BACKWARD


def _kernel_seq_idx(seq_idx: Optional[Tensor]) -> Tuple[bool, Optional[Tensor]]:
    """(covered, seq_idx as the kernel takes it): int32 as given; int64 converted to int32 when
    its values fit (one host read; not under torch.compile, where int64 is not covered)."""
    if seq_idx is None or seq_idx.dtype == _INT32:
        return True, seq_idx
    if seq_idx.dtype != torch.int64 or is_compiling():
        return False, seq_idx
    if seq_idx.numel():
        lo, hi = (int(v) for v in torch.aminmax(seq_idx))
        if lo < _INT32_RANGE[0] or hi > _INT32_RANGE[1]:
            return False, seq_idx
    return True, seq_idx.to(_INT32)


def _kernel_covers(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens) -> bool:
    """The compiled forward covers these (checked) operands: x, B, C, z of one 32/16-bit float
    dtype, dt, A, D, dt_bias, initial_states 32/16-bit floats, chunk_size <= 256, seq_idx int32,
    the launch grid's limits, and varlen states only with the seq_idx that marks the sequences
    (without it the kernel's states would cross sequence starts)."""
    dtype = x.dtype
    if dtype not in _KERNEL_DTYPES or B.dtype != dtype or C.dtype != dtype:
        return False
    if z is not None and z.dtype != dtype:
        return False
    for t in (dt, A, D, dt_bias, initial_states):
        if t is not None and t.dtype not in _KERNEL_DTYPES:
            return False
    if chunk_size > KERNEL_MAX_CHUNK or (seq_idx is not None and seq_idx.dtype != _INT32):
        return False
    batch, seqlen, nheads, headdim = x.shape
    if cu_seqlens is not None and (seq_idx is None or cu_seqlens.shape[0] - 1 > _KERNEL_MAX_GRID):
        return False
    nchunks = -(-seqlen // chunk_size)
    return (nheads <= _KERNEL_MAX_GRID and batch * nchunks <= _KERNEL_MAX_GRID and headdim <= 65536
            and B.shape[3] <= 65536)


def _use_cuda(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens):
    """(run the compiled forward, seq_idx for it). Off CUDA, dispatch decides without importing
    anything (``MAMBA_KERNELS_BACKEND=cuda`` makes CPU tensors an error, as for every kernel)."""
    if not x.is_cuda:
        return dispatch.use_cuda(KERNEL, x.device.type), seq_idx
    if not knobs.mamba2_cuda():  # MAMBA_KERNELS_MAMBA2_CUDA=0: the PyTorch path on CUDA too
        return False, seq_idx
    covered, kseq = _kernel_seq_idx(seq_idx)
    if covered and _kernel_covers(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, kseq,
                                  cu_seqlens) and dispatch.use_cuda(KERNEL, "cuda"):
        return True, kseq
    return False, seq_idx


def _scan_forward(use_cuda, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                  dt_softplus, dt_limit):
    """``ssd_forward``'s seven results from the compiled forward or the PyTorch one; final_states
    float32 (float64 for float64 x) and varlen_states in C's dtype either way, as mamba_ssm."""
    if not use_cuda:
        return ssd_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                           dt_softplus, dt_limit)
    res = _ops().ssd_forward_cuda(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                                  initial_states=initial_states, seq_idx=seq_idx, dt_softplus=dt_softplus,
                                  dt_limit=dt_limit, cu_seqlens=cu_seqlens)
    if cu_seqlens is None:
        return tuple(res) + (None,)
    return tuple(res[:6]) + (res[6].to(C.dtype),)


def _records(*tensors: Optional[Tensor]) -> bool:
    """Whether autograd would record an op on these."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _no_double_backward() -> None:
    if torch.is_grad_enabled():  # backward(create_graph=True)
        raise RuntimeError(
            "mamba_kernels: the SSD scan's backward is not differentiable (double backward, "
            "create_graph=True, is not supported, as in mamba_ssm)")


def _chunk_scan_backward(use_cuda_bwd, saved_out, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                         seq_idx, cu_seqlens, dt_softplus, dt_limit, needs, dout, dfinal, dvarlen):
    """Gradients of (x, dt, A, B, C, D, z, dt_bias, initial_states), None where ``needs`` is
    False: the compiled backward when ``use_cuda_bwd`` and no varlen_states gradient, else the
    PyTorch forward again under autograd (``saved_out``: the ungated output, for the compiled one)."""
    if use_cuda_bwd and dvarlen is None:
        if dout is None:
            dout = torch.zeros_like(x)
        grads = _ops().ssd_backward_cuda(
            dout, x, dt, A, B, C, saved_out, chunk_size, D=D, z=z, dt_bias=dt_bias,
            initial_states=initial_states, dfinal_states=dfinal, seq_idx=seq_idx, dt_softplus=dt_softplus,
            dt_limit=dt_limit)
        return tuple(g if n else None for g, n in zip(grads, needs))
    inputs = (x, dt, A, B, C, D, z, dt_bias, initial_states)
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(bool(n)) if t is not None else None
                  for t, n in zip(inputs, needs)]
        res = ssd_forward(*leaves[:5], chunk_size, *leaves[5:], seq_idx, cu_seqlens, dt_softplus, dt_limit)
        pairs = [(o, g) for o, g in ((res[0], dout), (res[5], dfinal), (res[6], dvarlen))
                 if g is not None and o.requires_grad]
        wrt = [t for t, n in zip(leaves, needs) if t is not None and n]
        if not pairs or not wrt:
            return (None,) * len(inputs)
        got = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True))
    return tuple(next(got) if t is not None and n else None for t, n in zip(inputs, needs))


class MambaChunkScanCombinedFn(torch.autograd.Function):
    """The SSD chunk scan with its backward; ``apply(x, dt, A, B, C, chunk_size, D, z, dt_bias,
    initial_states, seq_idx, cu_seqlens, dt_softplus, dt_limit, return_final_states,
    return_varlen_states)`` with checked arguments (``mamba_chunk_scan_combined``).

    Forward: the compiled kernel for covered CUDA inputs (``_use_cuda``), else ``ssd_forward``.
    Backward: the compiled backward (``_ssd_ops.ssd_backward_cuda``) after a
    compiled forward, when varlen_states get no gradient; otherwise ``ssd_forward`` runs again
    under autograd on detached inputs and ``torch.autograd.grad`` takes the incoming gradients
    of out, final_states and varlen_states. Not differentiable twice.

    Kept for the backward. mamba_ssm 2.3.2 saves: out (out_x with z), x, dt, dA_cumsum, A, B,
    C, D, z, dt_bias, initial_states, seq_idx. We save: out_x with z, else out, only when the
    compiled backward will run (the recompute needs neither), then x, dt, A, B, C, D, z,
    dt_bias, initial_states, seq_idx (int32 after the kernel's conversion), and cu_seqlens
    with return_varlen_states (num_seqs + 1 integers; the original has no varlen backward). No
    dA_cumsum: both backwards recompute it.
    """

    @staticmethod
    def forward(ctx, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                dt_softplus, dt_limit, return_final_states, return_varlen_states):
        use_cuda, seq_idx = _use_cuda(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                                      cu_seqlens)
        out, out_x, _, _, _, final_states, varlen_states = _scan_forward(
            use_cuda, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
            dt_softplus, dt_limit)
        ctx.cuda_bwd = use_cuda and _cuda_backward()
        kept_out = (out_x if z is not None else out) if ctx.cuda_bwd else None
        ctx.save_for_backward(kept_out, x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx,
                              cu_seqlens if return_varlen_states else None)
        ctx.chunk_size, ctx.dt_softplus, ctx.dt_limit = chunk_size, dt_softplus, dt_limit
        ctx.return_final_states, ctx.return_varlen_states = return_final_states, return_varlen_states
        ctx.set_materialize_grads(False)
        if not return_varlen_states:
            return (out, final_states) if return_final_states else out
        return (out, final_states, varlen_states) if return_final_states else (out, varlen_states)

    @staticmethod
    def backward(ctx, dout, *rest):
        _no_double_backward()
        kept_out, x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens = ctx.saved_tensors
        dfinal = rest[0] if ctx.return_final_states else None
        dvarlen = rest[-1] if ctx.return_varlen_states else None
        n = ctx.needs_input_grad
        needs = (n[0], n[1], n[2], n[3], n[4], n[6], n[7], n[8], n[9])
        dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinit = _chunk_scan_backward(
            ctx.cuda_bwd, kept_out, x, dt, A, B, C, ctx.chunk_size, D, z, dt_bias, initial_states, seq_idx,
            cu_seqlens, ctx.dt_softplus, ctx.dt_limit, needs, dout, dfinal, dvarlen)
        return (dx, ddt, dA, dB, dC, None, dD, dz, ddt_bias, dinit) + (None,) * 6


def _chunk_scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus,
                dt_limit, return_final_states, return_varlen_states):
    """(out, final_states, varlen_states) of checked arguments, by the path that fits: the
    Function when autograd records; under torch.compile with gradients and no compiled backward,
    autograd through ``ssd_forward`` (traceable, no graph break); else the forward alone."""
    if _records(x, dt, A, B, C, D, z, dt_bias, initial_states):
        if not is_compiling() or (x.is_cuda and _use_cuda(x, dt, A, B, C, chunk_size, D, z, dt_bias,
                                                          initial_states, seq_idx, cu_seqlens)[0]
                                  and _cuda_backward()):
            res = MambaChunkScanCombinedFn.apply(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                                                 seq_idx, cu_seqlens, dt_softplus, dt_limit,
                                                 return_final_states, return_varlen_states)
            res = res if isinstance(res, tuple) else (res,)
            out = res[0]
            final_states = res[1] if return_final_states else None
            varlen_states = res[-1] if return_varlen_states else None
            return out, final_states, varlen_states
        use_cuda = False
    else:
        use_cuda, seq_idx = _use_cuda(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                                      cu_seqlens)
    res = _scan_forward(use_cuda, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                        cu_seqlens, dt_softplus, dt_limit)
    return res[0], res[5], res[6]



def mamba_chunk_scan_combined(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int,
    D: Optional[Tensor] = None, z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
    initial_states: Optional[Tensor] = None, seq_idx: Optional[Tensor] = None,
    cu_seqlens: Optional[Tensor] = None, dt_softplus: bool = False,
    dt_limit: Tuple[float, float] = NO_LIMIT, return_final_states: bool = False,
    return_varlen_states: bool = False,
) -> Union[Tensor, Tuple[Tensor, ...]]:
    """The SSD scan of x (batch, seqlen, nheads, headdim) with dt (batch, seqlen, nheads),
    A (nheads,), B and C (batch, seqlen, ngroups, dstate), D (nheads,) or (nheads, headdim),
    z like x (out = y * silu(z)), dt_bias (nheads,), initial_states (batch, nheads, headdim,
    dstate), seq_idx (batch, seqlen) int32 (the state restarts where it changes), cu_seqlens
    (num_seqs + 1,) for ``return_varlen_states`` only (batch 1; ignored otherwise).

    dt is dt + dt_bias, through softplus with ``dt_softplus``, clamped to ``dt_limit``
    (default (0, inf): negative dt become 0). Returns ``out`` (x's dtype); ``(out,
    final_states)`` with return_final_states (float32, float64 for float64 x); ``(out,
    varlen_states)`` with return_varlen_states ((num_seqs, nheads, headdim, dstate), C's
    dtype); ``(out, final_states, varlen_states)`` with both.
    """
    return_final_states, return_varlen_states = _ssd_checks.check_flags(
        return_final_states=return_final_states, return_varlen_states=return_varlen_states)
    size, limit, softplus = _ssd_checks.check_chunk_scan(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus, dt_limit)
    if return_varlen_states:
        _ssd_checks.check_cu_seqlens(cu_seqlens, x)
    else:
        cu_seqlens = None
    out, final_states, varlen_states = _chunk_scan(
        x, dt, A, B, C, size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, softplus, limit,
        return_final_states, return_varlen_states)
    if not return_varlen_states:
        return (out, final_states) if return_final_states else out
    return (out, final_states, varlen_states) if return_final_states else (out, varlen_states)


def mamba_chunk_scan(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int,
    D: Optional[Tensor] = None, z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
    dt_softplus: bool = False,
) -> Tensor:
    """The scan by chunks without the clamp of dt (the original's unfused form): out."""
    size, _, softplus = _ssd_checks.check_chunk_scan(x, dt, A, B, C, chunk_size, D, z, dt_bias,
                                                     dt_softplus=dt_softplus)
    return _chunk_scan(x, dt, A, B, C, size, D, z, dt_bias, None, None, None, softplus, INF_LIMIT,
                       False, False)[0]


def ssd_chunk_scan_combined_ref(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, chunk_size: int,
    D: Optional[Tensor] = None, z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
    dt_softplus: bool = False,
) -> Tensor:
    """Per-step reference of the same maths (a loop over time, differentiable by autograd;
    dt is not clamped; ``chunk_size`` is checked and otherwise unused). Runs in float32
    (float64 for float64 x) and returns x's dtype."""
    _, _, softplus = _ssd_checks.check_chunk_scan(x, dt, A, B, C, chunk_size, D, z, dt_bias,
                                                  dt_softplus=dt_softplus)
    real = compute_dtype(x)
    batch, seqlen, nheads, headdim = x.shape
    per_group = nheads // B.shape[2]
    d = process_dt(dt, dt_bias, softplus, INF_LIMIT, real)  # (b, l, h)
    xr = x.to(real)
    Bh = B.to(real).repeat_interleave(per_group, dim=2)  # (b, l, h, n)
    Ch = C.to(real).repeat_interleave(per_group, dim=2)
    decay = torch.exp(d * A.to(real))
    h = xr.new_zeros(batch, nheads, headdim, B.shape[3])
    ys = []
    for t in range(seqlen):
        h = decay[:, t, :, None, None] * h + (d[:, t, :, None] * xr[:, t])[..., None] * Bh[:, t, :, None, :]
        ys.append(torch.matmul(h, Ch[:, t, :, :, None])[..., 0])
    y = torch.stack(ys, dim=1) if ys else xr.new_zeros(batch, 0, nheads, headdim)
    if D is not None:
        Dr = D.to(real)
        y = y + xr * (Dr[:, None] if Dr.dim() == 1 else Dr)
    if z is not None:
        y = y * F.silu(z.to(real))
    return y.to(x.dtype)


def ssd_selective_scan(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor] = None,
    z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None, dt_softplus: bool = False,
    dt_limit: Tuple[float, float] = NO_LIMIT,
) -> Tensor:
    """The same maths through the Mamba-1 scan (``selective_scan_fn``), one channel per
    (head, dim): dt (batch, seqlen, nheads) or (batch, seqlen, nheads, headdim), A (nheads,) or
    (nheads * headdim, dstate), dt_bias (nheads,) or (nheads, headdim). As in the original,
    dt_limit is applied only when it is not the default (0, inf)."""
    softplus, limit = _ssd_checks.check_selective(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit)
    batch, seqlen, nheads, headdim = x.shape
    dstate = B.shape[3]
    dim = nheads * headdim
    wide = x.dtype == torch.float64
    param = torch.float64 if wide else torch.float32
    u = x.permute(0, 2, 3, 1).reshape(batch, dim, seqlen)
    if dt.dim() == 3:
        dt = dt[..., None].expand(batch, seqlen, nheads, headdim)
    delta = dt.permute(0, 2, 3, 1).reshape(batch, dim, seqlen)
    A_full = A[:, None, None].expand(nheads, headdim, dstate).reshape(dim, dstate) if A.dim() == 1 else A
    Bs, Cs = (t.permute(0, 2, 3, 1).to(x.dtype) for t in (B, C))  # (batch, ngroups, dstate, seqlen)
    D_full = None
    if D is not None:
        D_full = (D[:, None].expand(nheads, headdim) if D.dim() == 1 else D).reshape(dim).to(param)
    z_full = z.permute(0, 2, 3, 1).reshape(batch, dim, seqlen) if z is not None else None
    bias = None
    if dt_bias is not None:
        bias = (dt_bias[:, None].expand(nheads, headdim) if dt_bias.dim() == 1 else dt_bias).reshape(dim)
    if limit != NO_LIMIT:
        delta = process_dt(delta, bias[:, None] if bias is not None else None, softplus, limit, param)
        bias, softplus = None, False
    out = selective_scan_fn(u, delta.to(x.dtype), A_full.to(param), Bs, Cs, D_full, z_full,
                            bias.to(param) if bias is not None else None, softplus)
    return out.reshape(batch, nheads, headdim, seqlen).permute(0, 3, 1, 2)


def _activation_flag(activation: object) -> bool:
    if activation not in (None, "silu", "swish"):
        rule = 'must be None, "silu" or "swish"'
        raise error(NotImplementedError, "activation", rule, typed_repr(activation))
    return activation is not None


def mamba_conv1d_scan_ref(
    xBC: Tensor, conv1d_weight: Tensor, conv1d_bias: Optional[Tensor], dt: Tensor, A: Tensor,
    chunk_size: int, D: Optional[Tensor] = None, z: Optional[Tensor] = None,
    dt_bias: Optional[Tensor] = None, dt_softplus: bool = False,
    dt_limit: Tuple[float, float] = NO_LIMIT, activation: Optional[str] = "silu",
    headdim: Optional[int] = None, ngroups: int = 1,
) -> Tensor:
    """Reference of conv1d then scan: xBC (batch, seqlen, dim + 2 * ngroups * dstate) through
    the causal conv, split into x, B, C, then ``ssd_selective_scan``; out (batch, seqlen, dim).
    headdim is read from z (batch, seqlen, dim) when given, else from D, else must be given."""
    _activation_flag(activation)
    for name, t in (("xBC", xBC), ("dt", dt)):
        _ssd_checks.require_tensor(name, t)
    if xBC.dim() != 3:
        rule = "must be 3-D (batch, seqlen, dim + 2 * ngroups * dstate)"
        raise error(ValueError, "xBC", rule, shape_of(xBC))
    if dt.dim() not in (3, 4) or dt.shape[:2] != xBC.shape[:2]:
        rule = "must be (batch, seqlen, nheads) or (batch, seqlen, nheads, headdim), matching xBC"
        raise error(ValueError, "dt", rule, shape_of(dt))
    _ssd_checks.chunk_size_of(chunk_size)
    ngroups = _ssd_checks.positive_int("ngroups", ngroups)
    batch, seqlen, nheads = dt.shape[:3]
    if z is not None:
        dim = z.shape[-1]
        if dim % nheads:
            raise error(ValueError, "z", f"must have a last size divisible by nheads={nheads}", shape_of(z))
        headdim = dim // nheads
    elif D is not None and D.dim() == 2:
        headdim = D.shape[1]
    elif headdim is None:
        raise error(ValueError, "headdim", "must be given when neither z nor a 2-D D is", "None")
    dim = nheads * _ssd_checks.positive_int("headdim", headdim)
    if xBC.shape[-1] <= dim or (xBC.shape[-1] - dim) % (2 * ngroups):
        rule = f"must have dim + 2 * ngroups * dstate channels, dim={dim}, ngroups={ngroups}, dstate >= 1"
        raise error(ValueError, "xBC", rule, shape_of(xBC))
    conv = causal_conv1d_fn(xBC.transpose(1, 2), conv1d_weight, conv1d_bias, activation=activation)
    conv = conv.transpose(1, 2)
    dstate = (conv.shape[-1] - dim) // ngroups // 2
    x, B, C = torch.split(conv, [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    x = x.unflatten(-1, (nheads, -1))
    B, C = B.unflatten(-1, (ngroups, dstate)), C.unflatten(-1, (ngroups, dstate))
    zz = z.unflatten(-1, (nheads, -1)) if z is not None else None
    out = ssd_selective_scan(x, dt.to(x.dtype), A, B, C, D=D.float() if D is not None else None, z=zz,
                             dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)
    return out.flatten(-2)


def _split_parts(zxbcdt, conv1d_weight, conv1d_bias, seq_idx, activation, nheads, headdim, ngroups, dstate,
                 d_nonssm):
    """zxbcdt's parts: (zx0, z, x, B, C, dt), x/B/C out of the causal conv, in the scan's shapes."""
    dim = nheads * headdim
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * d_nonssm, dim, dim + 2 * ngroups * dstate, nheads], dim=-1)
    conv = causal_conv1d_fn(xBC.transpose(1, 2), conv1d_weight, conv1d_bias, seq_idx=seq_idx,
                            activation="silu" if activation is not None else None)
    x, B, C = torch.split(conv.transpose(1, 2), [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    return (zx0, z.unflatten(-1, (nheads, headdim)), x.unflatten(-1, (nheads, headdim)),
            B.unflatten(-1, (ngroups, dstate)), C.unflatten(-1, (ngroups, dstate)), dt)


def _swiglu(zx0: Tensor) -> Tensor:
    """silu(first half) * second half, in float32 (float64 for float64), zx0's dtype."""
    x0, x1 = (t.to(compute_dtype(zx0)) for t in zx0.chunk(2, dim=-1))
    return (F.silu(x0) * x1).to(zx0.dtype)


def _out_proj(out: Tensor, weight: Optional[Tensor], bias: Optional[Tensor]) -> Tensor:
    """The out projection, in the CUDA autocast dtype when autocast is on (as the original)."""
    if weight is None:
        return out
    dtype = _amp.autocast_dtype()
    if dtype is not None:
        out, weight = out.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    else:
        for name, t in (("outproj_weight", weight), ("outproj_bias", bias)):
            if t is not None and t.dtype != out.dtype:
                rule = f"must have zxbcdt's dtype {out.dtype} outside autocast"
                raise error(TypeError, name, rule, str(t.dtype))
    return F.linear(out, weight, bias)


def _split_composed(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states, seq_idx,
                    dt_limit, activation, rmsnorm_weight, rmsnorm_eps, outproj_weight, outproj_bias,
                    norm_before_gate, meta):
    """(out, final_states) composed of differentiable pieces: autograd records each (the conv's
    and the norm's Functions, the chunk scan's by ``_chunk_scan``). Runs without gradients, and
    under torch.compile with them (the Function's backward would break the graph)."""
    nheads, hd, groups, dstate, d_nonssm = meta
    with torch.autocast(device_type=zxbcdt.device.type, enabled=False):
        zx0, z, x, B, C, dt = _split_parts(zxbcdt, conv1d_weight, conv1d_bias, seq_idx, activation,
                                           nheads, hd, groups, dstate, d_nonssm)
        size, limit, _ = _ssd_checks.check_chunk_scan(x, dt, A, B, C, chunk_size, D, None, dt_bias,
                                                      initial_states, seq_idx, True, dt_limit)
        gate = z if rmsnorm_weight is None else None
        out, final_states, _ = _chunk_scan(x, dt, A, B, C, size, D, gate, dt_bias, initial_states, seq_idx,
                                           None, True, limit, True, False)
        out = out.flatten(-2)
        if rmsnorm_weight is not None:
            out = rmsnorm_fn(out, rmsnorm_weight, None, z=z.flatten(-2), eps=rmsnorm_eps,
                             group_size=nheads * hd // groups, norm_before_gate=norm_before_gate)
        if d_nonssm:
            out = torch.cat([_swiglu(zx0).to(out.dtype), out], dim=-1)
    return _out_proj(out, outproj_weight, outproj_bias), final_states


class MambaSplitConv1dScanCombinedFn(torch.autograd.Function):
    """Mamba-2's fused layer body with its backward (``mamba_split_conv1d_scan_combined``'s
    arguments, then ``meta`` = (nheads, headdim, ngroups, dstate, d_nonssm) from the checks).

    The forward keeps only what mamba_ssm 2.3.2 keeps, and the backward recomputes the rest: the
    causal conv of xBC (under autograd, for its gradients), the split into x, B, C, z, dt, the
    swiglu of zx0, the gated RMSNorm's output (``_layer_norm_bwd`` with the kept rstd, CUDA
    kernels for CUDA tensors), the SSD's gradients (``_chunk_scan_backward``: the compiled
    backward after a compiled forward, else ``ssd_forward`` again under autograd) and the out
    projection's.

    Kept for the backward, the original's list in its order: zxbcdt, conv1d_weight,
    conv1d_bias, out_x (the SSD output before the gate and the norm, (batch, seqlen, nheads,
    headdim) in zxbcdt's dtype), A, D, dt_bias, initial_states, seq_idx (int32 after the
    kernel's conversion), rmsnorm_weight, rstd (float32 (ngroups * batch * seqlen,), with the
    norm), outproj_weight, outproj_bias. Not differentiable twice.
    """

    @staticmethod
    def forward(ctx, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states, seq_idx,
                dt_limit, return_final_states, activation, rmsnorm_weight, rmsnorm_eps, outproj_weight,
                outproj_bias, headdim, ngroups, norm_before_gate, meta):
        nheads, hd, groups, dstate, d_nonssm = meta
        dim = nheads * hd
        batch, seqlen = zxbcdt.shape[:2]
        with torch.autocast(device_type=zxbcdt.device.type, enabled=False):
            zx0, z, x, B, C, dt = _split_parts(zxbcdt, conv1d_weight, conv1d_bias, seq_idx, activation,
                                               nheads, hd, groups, dstate, d_nonssm)
            size, limit, _ = _ssd_checks.check_chunk_scan(x, dt, A, B, C, chunk_size, D, None, dt_bias,
                                                          initial_states, seq_idx, True, dt_limit)
            gate = z if rmsnorm_weight is None else None
            use_cuda, seq_idx = _use_cuda(x, dt, A, B, C, size, D, gate, dt_bias, initial_states, seq_idx,
                                          None)
            out, out_x, _, _, _, final_states, _ = _scan_forward(
                use_cuda, x, dt, A, B, C, size, D, gate, dt_bias, initial_states, seq_idx, None, True, limit)
            ssd_y = out_x if gate is not None else out
            rstd = None
            y = out.flatten(-2)
            if rmsnorm_weight is not None:
                y, _, rstd = _layer_norm_fwd(ssd_y.reshape(batch * seqlen, dim), rmsnorm_weight, None,
                                             rmsnorm_eps, z=z.reshape(batch * seqlen, dim),
                                             group_size=dim // groups, norm_before_gate=norm_before_gate,
                                             is_rms_norm=True)
                y = y.reshape(batch, seqlen, dim)
            if d_nonssm:
                y = torch.cat([_swiglu(zx0).to(y.dtype), y], dim=-1)
        ctx.proj_dtype = _amp.autocast_dtype() if outproj_weight is not None else None
        out = _out_proj(y, outproj_weight, outproj_bias)
        ctx.save_for_backward(zxbcdt, conv1d_weight, conv1d_bias, ssd_y, A, D, dt_bias, initial_states,
                              seq_idx, rmsnorm_weight, rstd, outproj_weight, outproj_bias)
        ctx.cuda_bwd = use_cuda and _cuda_backward()
        ctx.meta, ctx.size, ctx.limit, ctx.activation = meta, size, limit, activation
        ctx.eps, ctx.norm_before_gate = rmsnorm_eps, norm_before_gate
        ctx.return_final_states = return_final_states
        return (out, final_states) if return_final_states else out

    @staticmethod
    def backward(ctx, dout, *rest):
        _no_double_backward()
        (zxbcdt, conv1d_weight, conv1d_bias, ssd_y, A, D, dt_bias, initial_states, seq_idx, rmsnorm_weight,
         rstd, outproj_weight, outproj_bias) = ctx.saved_tensors
        dfinal = rest[0] if ctx.return_final_states else None
        nheads, hd, groups, dstate, d_nonssm = ctx.meta
        dim = nheads * hd
        batch, seqlen = zxbcdt.shape[:2]
        n = ctx.needs_input_grad
        with torch.autocast(device_type=zxbcdt.device.type, enabled=False):
            with torch.enable_grad():  # the conv and split again, recorded for their gradients
                leaves = [t.detach().requires_grad_(bool(need)) if t is not None else None
                          for t, need in ((zxbcdt, n[0]), (conv1d_weight, n[1]), (conv1d_bias, n[2]))]
                zx0, z, x, B, C, dt = _split_parts(*leaves, seq_idx, ctx.activation, nheads, hd, groups,
                                                   dstate, d_nonssm)
                swiglu = _swiglu(zx0) if d_nonssm else None
            dy = dout
            pdtype = ctx.proj_dtype
            if outproj_weight is not None:  # through the out projection (in the autocast dtype, if any)
                weight = outproj_weight.to(pdtype) if pdtype is not None else outproj_weight
                dy = torch.matmul(dout.to(weight.dtype), weight).to(ssd_y.dtype)
            dy0, dy = dy.split([d_nonssm, dim], dim=-1)
            zd = z.detach()
            recompute = outproj_weight is not None
            drms = dz_norm = gated = None
            if rmsnorm_weight is not None:
                res = _layer_norm_bwd(dy.reshape(batch * seqlen, dim), ssd_y.reshape(batch * seqlen, dim),
                                      rmsnorm_weight, None, ctx.eps, None, rstd,
                                      zd.reshape(batch * seqlen, dim),
                                      group_size=dim // groups, norm_before_gate=ctx.norm_before_gate,
                                      is_rms_norm=True, recompute_output=recompute)
                dssd, drms, dz_norm = res[0].reshape(ssd_y.shape), res[1], res[3].reshape(zd.shape)
                gated, gate = (res[4] if recompute else None), None
            else:
                dssd, gate = dy.reshape(ssd_y.shape), zd
                if recompute:
                    real = compute_dtype(ssd_y)
                    gated = (ssd_y.to(real) * F.silu(zd.to(real))).to(ssd_y.dtype)
            conv = n[0] or n[1] or n[2]  # x, B, C come out of the conv
            needs = (conv, n[0], n[4], conv, conv, n[5], n[0] and gate is not None, n[3], n[7])
            dx, ddt, dA, dB, dC, dD, dz_ssd, ddt_bias, dinit = _chunk_scan_backward(
                ctx.cuda_bwd, ssd_y, x.detach(), dt.detach(), A, B.detach(), C.detach(), ctx.size, D, gate,
                dt_bias, initial_states, seq_idx, None, True, ctx.limit, needs, dssd, dfinal, None)
            dweight = dbias = None
            if outproj_weight is not None:
                do = dout.to(weight.dtype).reshape(batch * seqlen, dout.shape[-1])
                if n[14]:
                    y = gated.reshape(batch, seqlen, dim)
                    if d_nonssm:
                        y = torch.cat([swiglu.detach().to(y.dtype), y], dim=-1)
                    y = y.reshape(batch * seqlen, y.shape[-1]).to(weight.dtype)
                    dweight = (do.t() @ y).to(outproj_weight.dtype)
                if outproj_bias is not None and n[15]:
                    dbias = do.sum(0).to(outproj_bias.dtype)
            dz = dz_norm if dz_norm is not None else dz_ssd
            pairs = [(o, g) for o, g in ((swiglu, dy0), (z, dz), (x, dx), (B, dB), (C, dC), (dt, ddt))
                     if o is not None and g is not None and o.requires_grad]
            wrt = [t for t in leaves if t is not None and t.requires_grad]
            got = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g.to(o.dtype) for o, g in pairs],
                                           allow_unused=True) if pairs and wrt else ())
            dzxbcdt, dconv_w, dconv_b = (next(got) if t is not None and t.requires_grad else None
                                         for t in leaves)
        return (dzxbcdt, dconv_w, dconv_b, ddt_bias, dA, dD, None, dinit, None, None, None, None, drms, None,
                dweight, dbias, None, None, None, None)


def mamba_split_conv1d_scan_combined(
    zxbcdt: Tensor, conv1d_weight: Tensor, conv1d_bias: Optional[Tensor], dt_bias: Tensor, A: Tensor,
    D: Tensor, chunk_size: int, initial_states: Optional[Tensor] = None, seq_idx: Optional[Tensor] = None,
    dt_limit: Tuple[float, float] = NO_LIMIT, return_final_states: bool = False,
    activation: Optional[str] = "silu", rmsnorm_weight: Optional[Tensor] = None, rmsnorm_eps: float = 1e-6,
    outproj_weight: Optional[Tensor] = None, outproj_bias: Optional[Tensor] = None,
    headdim: Optional[int] = None, ngroups: int = 1, norm_before_gate: bool = True,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Mamba-2's fused layer body. zxbcdt (batch, seqlen, 2 * d_nonssm + 2 * dim + 2 * ngroups *
    dstate + nheads) is split into zx0 (swiglu'd, put before the SSM output when d_nonssm > 0),
    z, xBC (through the causal conv with ``conv1d_weight`` (dim + 2 * ngroups * dstate, width),
    ``conv1d_bias`` and ``activation``, seq_idx restarting it) and dt; the scan runs with
    dt_softplus and dt_bias, A, D ((nheads,) with ``headdim``, or (nheads, headdim)),
    initial_states, seq_idx and dt_limit; then the gated RMSNorm with ``rmsnorm_weight`` (dim,)
    over groups of dim / ngroups channels (``norm_before_gate``: norm(y) * silu(z), else
    norm(y * silu(z))), or y * silu(z) without it; then the out projection (out_dim, d_nonssm +
    dim) when given. Returns out, and ``(out, final_states)`` with return_final_states."""
    nheads, hd, groups, dstate, d_nonssm = _ssd_checks.check_split(
        zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, activation, rmsnorm_weight, rmsnorm_eps,
        outproj_weight, outproj_bias, headdim, ngroups)
    return_final_states, norm_before_gate = _ssd_checks.check_flags(
        return_final_states=return_final_states, norm_before_gate=norm_before_gate)
    batch, seqlen = zxbcdt.shape[:2]
    _ssd_checks.require_tensor("initial_states", initial_states, optional=True)
    _ssd_checks.require_tensor("seq_idx", seq_idx, optional=True)
    if seq_idx is not None:  # checked before the conv uses it
        _ssd_checks.require_shape("seq_idx", seq_idx, (batch, seqlen), "(batch, seqlen)")
        _ssd_checks.require_index("seq_idx", seq_idx)
    meta = (nheads, hd, groups, dstate, d_nonssm)
    tensors = (zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, initial_states, rmsnorm_weight,
               outproj_weight, outproj_bias)
    if _records(*tensors) and not is_compiling():
        res = MambaSplitConv1dScanCombinedFn.apply(
            zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, initial_states, seq_idx, dt_limit,
            return_final_states, activation, rmsnorm_weight, rmsnorm_eps, outproj_weight, outproj_bias,
            headdim, ngroups, norm_before_gate, meta)
        return res
    out, final_states = _split_composed(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                        initial_states, seq_idx, dt_limit, activation, rmsnorm_weight,
                                        rmsnorm_eps, outproj_weight, outproj_bias, norm_before_gate, meta)
    return (out, final_states) if return_final_states else out


def mamba_split_conv1d_scan_ref(
    zxbcdt: Tensor, conv1d_weight: Tensor, conv1d_bias: Optional[Tensor], dt_bias: Tensor, A: Tensor,
    D: Tensor, chunk_size: int, dt_limit: Tuple[float, float] = NO_LIMIT, activation: Optional[str] = "silu",
    rmsnorm_weight: Optional[Tensor] = None, rmsnorm_eps: float = 1e-6,
    outproj_weight: Optional[Tensor] = None, outproj_bias: Optional[Tensor] = None,
    headdim: Optional[int] = None, ngroups: int = 1, norm_before_gate: bool = True,
) -> Tensor:
    """Reference of the fused layer (no d_nonssm, seq_idx or initial states): the conv, the
    Mamba-1 scan (``ssd_selective_scan``), the gated RMSNorm over dim / ngroups channels, the
    out projection."""
    nheads, hd, groups, dstate, _ = _ssd_checks.check_split(
        zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, activation, rmsnorm_weight, rmsnorm_eps,
        outproj_weight, outproj_bias, headdim, ngroups, nonssm=False)
    norm_before_gate = _ssd_checks.require_bool("norm_before_gate", norm_before_gate)
    _ssd_checks.chunk_size_of(chunk_size)
    _, z, x, B, C, dt = _split_parts(zxbcdt, conv1d_weight, conv1d_bias, None, activation, nheads, hd, groups,
                                     dstate, 0)
    out = ssd_selective_scan(x, dt.to(x.dtype), A, B, C, D=D.float(), z=z if rmsnorm_weight is None else None,
                             dt_bias=dt_bias, dt_softplus=True, dt_limit=dt_limit).flatten(-2)
    if rmsnorm_weight is not None:
        out = rmsnorm_fn(out, rmsnorm_weight, None, z=z.flatten(-2), eps=rmsnorm_eps,
                         group_size=nheads * hd // groups, norm_before_gate=norm_before_gate)
    if outproj_weight is not None:
        out = F.linear(out, outproj_weight, outproj_bias)
    return out
