// The stable-ABI binding of the SSD forward and backward ops (one binary for every torch from its
// TORCH_TARGET_VERSION on): its body and schema (ssd_ops.h) over the stable C shim
// (stable/tensor.h). classic/ registers the same. The namespace's other ops are registered by
// csrc/selective_scan/stable/binding.cpp: a second fragment and a second CUDA impl block of one
// namespace are legal in another translation unit.
#include "stable/tensor.h"

namespace mamba_kernels {
namespace api = stable;
}  // namespace mamba_kernels

#include "../ssd_ops.h"

namespace mamba_kernels {
namespace ssd {

STABLE_TORCH_LIBRARY_FRAGMENT(mamba_kernels, m) {
  for (const char* schema : kSsdSchemas) m.def(schema);
}

STABLE_TORCH_LIBRARY_IMPL(mamba_kernels, CUDA, m) {
  m.impl("ssd_chunk_scan_fwd", TORCH_BOX(&ssd_fwd));
  m.impl("ssd_chunk_scan_bwd", TORCH_BOX(&ssd_bwd));
}

}  // namespace ssd
}  // namespace mamba_kernels
