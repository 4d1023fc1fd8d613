// The importable module `selective_scan._cuda`. Loading it runs the TORCH_LIBRARY registrations
// of binding.cpp (scan forward, backward and decode step); the module itself only carries
// BUILD_INFO for the runtime guard.
#include "py_module.h"

MAMBA_KERNELS_CUDA_MODULE("selective_scan CUDA kernels (ops registered as torch.ops.mamba_kernels.selective_*)")
