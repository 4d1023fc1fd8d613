// The importable module `selective_scan._cuda`. Loading it runs the TORCH_LIBRARY registrations
// of binding.cpp (scan forward, backward and decode step); the module carries BUILD_INFO for the
// runtime guard and the binding's functions: the classic build's selective_scan_cuda entries
// (classic/compat_entry.cpp), none in the stable build (stable/module_functions.cpp).
#include "py_module.h"

namespace mamba_kernels {
extern PyMethodDef kBindingMethods[];
}  // namespace mamba_kernels

MAMBA_KERNELS_CUDA_MODULE_WITH("selective_scan CUDA kernels (ops registered as torch.ops.mamba_kernels.selective_*)",
                               mamba_kernels::kBindingMethods)
