"""``causal_conv1d_cuda``: the module name causal-conv1d's compiled extension has, which older
mamba_ssm releases and their forks call directly, provided by mamba-kernels on its own kernels
(causal_conv1d/cuda_compat.py lists the accepted forms of each function)."""

from causal_conv1d.cuda_compat import causal_conv1d_bwd, causal_conv1d_fwd, causal_conv1d_update

__all__ = ["causal_conv1d_fwd", "causal_conv1d_bwd", "causal_conv1d_update"]
