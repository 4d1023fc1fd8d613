// The importable module `causal_conv1d._cuda`. Loading it runs binding.cpp's TORCH_LIBRARY
// registrations; the module itself only carries BUILD_INFO for the runtime guard.
#include "py_module.h"

namespace {
PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_cuda",
    "causal_conv1d CUDA kernels (ops registered as torch.ops.mamba_kernels.causal_conv1d_*)",
    -1,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};
}  // namespace

PyMODINIT_FUNC PyInit__cuda(void) { return mamba_kernels::make_module(&module_def); }
