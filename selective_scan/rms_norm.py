"""Row norms over the last dim: the maths shared by the non-learnable RMS norms mamba_inner_fn
applies to B, C and dt (FalconMamba) and by ``selective_scan.layer_norm`` (mamba_ssm's
layer_norm module), forward and backward, in one place.

Everything runs in the wide dtype (``compute_dtype``): float32 for 16-bit and float32 inputs,
float64 as soon as one input is float64.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

Tensor = torch.Tensor


def compute_dtype(*tensors: Optional[Tensor]) -> torch.dtype:
    """float64 when some given tensor is float64, else float32 (None entries are skipped)."""
    for t in tensors:
        if t is not None and t.dtype == torch.float64:
            return torch.float64
    return torch.float32


def row_stats(h: Tensor, eps: float, is_rms_norm: bool) -> Tuple[Optional[Tensor], Tensor]:
    """(mean, rstd) of each row of the wide tensor h, shaped h.shape[:-1]; mean is None for the
    RMS norm, whose rows are not centred. rstd = 1 / sqrt(mean of squares (centred) + eps)."""
    if is_rms_norm:
        return None, torch.rsqrt(h.square().mean(-1) + eps)
    mean = h.mean(-1)
    return mean, torch.rsqrt((h - mean.unsqueeze(-1)).square().mean(-1) + eps)


def normalized(h: Tensor, mean: Optional[Tensor], rstd: Tensor) -> Tensor:
    """x-hat: the rows of h centred (unless mean is None) and scaled by rstd, in h's dtype."""
    centred = h if mean is None else h - mean.to(h.dtype).unsqueeze(-1)
    return centred * rstd.to(h.dtype).unsqueeze(-1)


def normalized_grad(xhat: Tensor, rstd: Tensor, g: Tensor, is_rms_norm: bool) -> Tensor:
    """d/dh of the loss, given g = d/d(x-hat) (the upstream gradient times the weight), x-hat and
    rstd of the forward: rstd * (g - x-hat * mean(g * x-hat) [- mean(g)]), in xhat's dtype."""
    inner = g - xhat * (g * xhat).mean(-1, keepdim=True)
    if not is_rms_norm:
        inner = inner - g.mean(-1, keepdim=True)
    return inner * rstd.to(xhat.dtype).unsqueeze(-1)


def rms_norm_forward(
    x: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float = 1e-6, is_rms_norm: bool = True
) -> Tensor:
    """RMS (or layer) norm over the last dim in float32 (float64 for float64 x); returns x's dtype."""
    xf = x.to(compute_dtype(x))
    y = normalized(xf, *row_stats(xf, eps, is_rms_norm)) * weight.to(xf.dtype)
    if bias is not None:
        y = y + bias.to(xf.dtype)
    return y.to(x.dtype)


def rms_norm_backward(x: Tensor, weight: Tensor, eps: float, dy: Tensor) -> Tensor:
    """d/dx of ``rms_norm_forward(x, weight, None, eps)`` for upstream ``dy``, in x's dtype."""
    xf = x.to(compute_dtype(x))
    _, rstd = row_stats(xf, eps, True)
    g = dy.to(xf.dtype) * weight.to(xf.dtype)
    return normalized_grad(normalized(xf, None, rstd), rstd, g, True).to(x.dtype)
