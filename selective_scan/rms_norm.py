"""The non-learnable RMS norms mamba_inner_fn applies to B, C and dt (FalconMamba)."""

from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor


def _wide(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def rms_norm_forward(
    x: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float = 1e-6, is_rms_norm: bool = True
) -> Tensor:
    """RMS (or layer) norm over the last dim in float32 (float64 for float64 x); returns x's dtype."""
    xf = x.to(_wide(x))
    if not is_rms_norm:
        xf = xf - xf.mean(-1, keepdim=True)
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.to(xf.dtype)
    if bias is not None:
        y = y + bias.to(xf.dtype)
    return y.to(x.dtype)


def rms_norm_backward(x: Tensor, weight: Tensor, eps: float, dy: Tensor) -> Tensor:
    """d/dx of ``rms_norm_forward(x, weight, None, eps)`` for upstream ``dy``, in x's dtype."""
    xf = x.to(_wide(x))
    r = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    n = xf * r
    g = dy.to(xf.dtype) * weight.to(xf.dtype)
    return (r * (g - n * (g * n).mean(-1, keepdim=True))).to(x.dtype)
