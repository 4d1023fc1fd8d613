"""torch.library glue shared by the compiled kernels' Python modules."""

from __future__ import annotations

from typing import Callable

import torch

NAMESPACE = "mamba_kernels"  # the ops' namespace (the library fragments of csrc/<kernel>/<binding>/*.cpp)


def register_fake(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering the fake (meta) implementation of ``mamba_kernels::<name>``, which
    torch.compile traces instead of the CUDA kernel (``impl_abstract`` before torch 2.4)."""
    qualname = f"{NAMESPACE}::{name}"
    if hasattr(torch.library, "register_fake"):
        return torch.library.register_fake(qualname)
    return torch.library.impl_abstract(qualname)
