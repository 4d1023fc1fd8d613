// The importable module `selective_scan._cuda`. Loading it runs the TORCH_LIBRARY registrations
// of binding.cpp (scan forward, backward and decode step); the module carries BUILD_INFO for the
// runtime guard and the binding's functions: selective_scan_cuda's entries, from each build's
// compat_entry.cpp (classic/ or stable/, through MAMBA_KERNELS_COMPAT_ENTRY_METHODS of
// compat_entry_common.h).
#include "py_module.h"

namespace mamba_kernels {
extern PyMethodDef kBindingMethods[];
}  // namespace mamba_kernels

MAMBA_KERNELS_CUDA_MODULE_WITH("selective_scan CUDA kernels (ops registered as torch.ops.mamba_kernels.selective_*)",
                               mamba_kernels::kBindingMethods)
