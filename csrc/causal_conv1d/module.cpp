// The importable module `causal_conv1d._cuda`. Loading it runs binding.cpp's TORCH_LIBRARY
// registrations; the module itself only carries BUILD_INFO for the runtime guard.
#include "py_module.h"

MAMBA_KERNELS_CUDA_MODULE("causal_conv1d CUDA kernels (ops registered as torch.ops.mamba_kernels.causal_conv1d_*)")
