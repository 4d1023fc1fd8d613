"""Drop-in for ``mamba_ssm.ops.selective_scan_interface``.

Same names, positional order, defaults, shapes, dtypes, output layouts and in-place
contracts as mamba_ssm 2.3.2.post1 (tests/test_selective_scan_api_surface.py pins them). Deliberate
differences, both towards the maths:

* ``return_last_state`` with a fixed (2-D) B returns the true state h, like
  ``selective_scan_ref``; mamba_ssm's CUDA kernel returns h / B there (state-spaces/mamba#371).
* ``mamba_inner_fn`` back-propagates through the non-learnable B/C/dt RMS norms (their
  weights still get no gradient); mamba_ssm's backward skips the norms' Jacobian.
"""

from .mamba_inner import MambaInnerFn, mamba_inner_fn, mamba_inner_ref
from .rms_norm import rms_norm_forward
from .scan_fn import SelectiveScanFn, selective_scan_fn, selective_scan_ref

__all__ = [
    "SelectiveScanFn",
    "selective_scan_fn",
    "selective_scan_ref",
    "MambaInnerFn",
    "mamba_inner_fn",
    "mamba_inner_ref",
    "rms_norm_forward",
]
