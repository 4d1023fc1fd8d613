"""Drop-in replacement for Dao-AILab's causal-conv1d Python API."""

from mamba_kernels.version import __version__

__all__ = ["__version__"]
