"""``selective_scan_cuda``: the module name mamba_ssm imports for its compiled selective scan,
provided by mamba-kernels with the same ``fwd``/``bwd`` contract (selective_scan/cuda_compat.py
says what it returns and how its scan-state tensor differs)."""

from selective_scan.cuda_compat import bwd, fwd

__all__ = ["fwd", "bwd"]
