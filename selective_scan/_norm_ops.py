"""The compiled gated-norm kernels (csrc/layernorm_gated/) as torch.library custom ops.

Importing this module loads ``selective_scan._cuda``, whose C++ side registers
``torch.ops.mamba_kernels.layernorm_gated_{fwd,bwd}`` (CUDA implementations). Here we add their
fake (meta) implementations, so ``torch.compile(fullgraph=True)`` traces them without graph
breaks.

Contract of the ops (the binding checks every rule; every output is an annotated in-place
argument the caller allocates, so views of larger buffers can be written):
  fwd(x, weight, bias, z, out, mean, rstd, eps, group_size, norm_before_gate, is_rms_norm) -> ()
    x, z, out (rows, n) of one float32/16 or bfloat16 dtype, unit channel stride, any row
    stride; weight, bias (n,) contiguous, any of the three dtypes; mean (None for the RMSNorm)
    and rstd float32 (ngroups * rows,), group-major; group_size * x.element_size() <= 16 KiB.
  bwd(dy, x, weight, bias, z, mean, rstd, dx, dz, out, dweight, dbias, eps, group_size,
      norm_before_gate, is_rms_norm) -> ()
    dy, dx, dz (with z), out (the recomputed forward output, or None) as x; dweight, dbias
    (with bias) (n,) contiguous in weight's and bias's dtypes.
"""

from __future__ import annotations

import torch

from mamba_kernels.runtime.library import eager_entry, register_fake

from . import _cuda  # noqa: F401  (loading it registers the ops)

_ops = torch.ops.mamba_kernels


@register_fake("layernorm_gated_fwd")
def _fwd_fake(x, weight, bias, z, out, mean, rstd, eps, group_size, norm_before_gate, is_rms_norm):
    return None  # writes out, mean and rstd in place


@register_fake("layernorm_gated_bwd")
def _bwd_fake(
    dy,
    x,
    weight,
    bias,
    z,
    mean,
    rstd,
    dx,
    dz,
    out,
    dweight,
    dbias,
    eps,
    group_size,
    norm_before_gate,
    is_rms_norm,
):
    return None  # writes dx, dz, out, dweight and dbias in place


fwd = _ops.layernorm_gated_fwd
bwd = _ops.layernorm_gated_bwd
# each op's eager C++ entry; callers choose with library.pick (torch.compile traces fwd and bwd)
fwd_entry = eager_entry(fwd)
bwd_entry = eager_entry(bwd)
