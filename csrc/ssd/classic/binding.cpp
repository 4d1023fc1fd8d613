// The classic (torch 2.1 to 2.9, per-minor) torch.library binding of the SSD forward and backward ops: its
// body and schema (ssd_ops.h) over ATen (classic/tensor.h). stable/ registers the same. The
// namespace's other ops are registered by csrc/selective_scan/classic/binding.cpp: a second
// fragment and a second CUDA impl block of one namespace are legal in another translation unit.
#include <torch/library.h>

#include "classic/tensor.h"

namespace mamba_kernels {
namespace api = classic;
}  // namespace mamba_kernels

#include "../ssd_ops.h"

namespace mamba_kernels {
namespace ssd {

TORCH_LIBRARY_FRAGMENT(mamba_kernels, m) {
  for (const char* schema : kSsdSchemas) m.def(schema);
}

TORCH_LIBRARY_IMPL(mamba_kernels, CUDA, m) {
  m.impl("ssd_chunk_scan_fwd", &ssd_fwd);
  m.impl("ssd_chunk_scan_bwd", &ssd_bwd);
}

}  // namespace ssd
}  // namespace mamba_kernels
