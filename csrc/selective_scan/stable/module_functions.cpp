// The stable build's module functions: none. The classic build's selective_scan_cuda entries
// (classic/compat_entry.cpp) read Python tensors through the running torch's C++ ABI, which a
// stable-ABI binary cannot.
#include <Python.h>

namespace mamba_kernels {
PyMethodDef kBindingMethods[] = {{nullptr, nullptr, 0, nullptr}};
}  // namespace mamba_kernels
