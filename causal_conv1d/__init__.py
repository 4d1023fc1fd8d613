"""Drop-in replacement for Dao-AILab's causal-conv1d Python API."""

from mamba_kernels.version import __version__

from .causal_conv1d_interface import causal_conv1d_fn, causal_conv1d_update

__all__ = ["__version__", "causal_conv1d_fn", "causal_conv1d_update"]
