"""Drop-in replacement for mamba_ssm's selective-scan Python API.

``selective_scan.selective_scan_interface`` mirrors ``mamba_ssm.ops.selective_scan_interface``
and these mirror the modules of ``mamba_ssm.ops.triton`` of the same names:
``selective_state_update``, ``layernorm_gated`` (Mamba-2's gated RMSNorm), ``ssd_combined``
(Mamba-2's SSD scan) and ``layer_norm`` (the LM's fused add + norm). The last three are not
re-exported here, so importing the package does not import them. ``for_mamba_ssm`` serves them
to mamba_ssm in place of its Triton modules, on request.
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
