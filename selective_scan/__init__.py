"""Drop-in replacement for mamba_ssm's selective-scan Python API.

``selective_scan.selective_scan_interface`` mirrors ``mamba_ssm.ops.selective_scan_interface``
and ``selective_scan.selective_state_update`` mirrors
``mamba_ssm.ops.triton.selective_state_update``. ``selective_scan.layer_norm`` mirrors
``mamba_ssm.ops.triton.layer_norm`` in plain PyTorch; it is imported on demand, not here.
"""

from mamba_kernels.runtime import installed

from .selective_scan_interface import mamba_inner_fn, mamba_inner_ref, selective_scan_fn, selective_scan_ref
from .selective_state_update import selective_state_update

__all__ = [
    "__version__",
    "selective_scan_fn",
    "selective_scan_ref",
    "mamba_inner_fn",
    "mamba_inner_ref",
    "selective_state_update",
]


def __getattr__(name: str) -> str:
    """``__version__``: the installed version with its local label (mamba_kernels.runtime.installed),
    read at first use, not at import."""
    if name == "__version__":
        return installed.cached_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
