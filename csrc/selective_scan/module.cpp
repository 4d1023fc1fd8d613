// The importable module `selective_scan._cuda`. Loading it runs the TORCH_LIBRARY registrations
// of binding.cpp (scan forward/backward) and update_binding.cpp (decode step); the module itself
// only carries BUILD_INFO for the runtime guard.
#include "py_module.h"

namespace {
PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_cuda",
    "selective_scan CUDA kernels (ops registered as torch.ops.mamba_kernels.selective_scan_*)",
    -1,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};
}  // namespace

PyMODINIT_FUNC PyInit__cuda(void) { return mamba_kernels::make_module(&module_def); }
