"""Drop-in replacement for Dao-AILab's causal-conv1d Python API."""

from mamba_kernels.runtime import installed

from .causal_conv1d_interface import causal_conv1d_fn, causal_conv1d_update

__all__ = ["__version__", "causal_conv1d_fn", "causal_conv1d_update"]


def __getattr__(name: str) -> str:
    """``__version__``: the installed version with its local label (mamba_kernels.runtime.installed),
    read at first use, not at import."""
    if name == "__version__":
        return installed.cached_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
