"""mamba-kernels: drop-in causal_conv1d and selective-scan kernels, their build and their doctor.

Importing this package does not import torch; ``backends()`` does.
"""

from .runtime import dispatch, installed


def __getattr__(name: str) -> str:
    """``__version__``: the installed version with its local label (installed.version), read at
    first use, not at import (the CLI's fast verbs never read distribution metadata)."""
    if name == "__version__":
        return installed.cached_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def backends():
    """Per kernel family, the backend CUDA tensors get now and the reason (see dispatch)."""
    return dispatch.backends()


__all__ = ["__version__", "backends"]
