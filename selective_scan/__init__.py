"""Drop-in replacement for mamba_ssm's selective-scan Python API."""

from mamba_kernels.version import __version__

__all__ = ["__version__"]
