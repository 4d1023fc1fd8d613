"""amp decorators as mamba_ssm uses them (``device_type="cuda"``), on any torch we support."""

from __future__ import annotations

import functools

import torch

if hasattr(torch.amp, "custom_fwd"):  # torch >= 2.4
    custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")
    custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="cuda")
else:  # pragma: no cover - older torch
    custom_fwd = torch.cuda.amp.custom_fwd
    custom_bwd = torch.cuda.amp.custom_bwd


def autocast_dtype():
    """The CUDA autocast dtype when CUDA autocast is on, else None."""
    if not torch.is_autocast_enabled():
        return None
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype("cuda")
    return torch.get_autocast_gpu_dtype()  # pragma: no cover - older torch
