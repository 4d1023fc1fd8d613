"""mamba-kernels: drop-in causal_conv1d and selective-scan kernels, their build and their doctor.

Importing this package does not import torch; ``backends()`` does.
"""

from .version import __version__


def backends():
    """Per kernel family, the backend CUDA tensors get now and the reason (see dispatch)."""
    from .dispatch import backends as _backends

    return _backends()


__all__ = ["__version__", "backends"]
