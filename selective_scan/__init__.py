"""Drop-in replacement for mamba_ssm's selective-scan Python API.

``selective_scan.selective_scan_interface`` mirrors ``mamba_ssm.ops.selective_scan_interface``,
``selective_scan.selective_state_update`` mirrors
``mamba_ssm.ops.triton.selective_state_update`` and ``selective_scan.layernorm_gated`` mirrors
``mamba_ssm.ops.triton.layernorm_gated`` (Mamba-2's gated RMSNorm). ``selective_scan.ssd_combined``
mirrors ``mamba_ssm.ops.triton.ssd_combined`` (Mamba-2's SSD scan; its names are not re-exported
here, so importing the package does not import it).
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
