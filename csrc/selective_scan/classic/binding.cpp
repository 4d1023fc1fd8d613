// The classic (torch 2.1 to 2.9, per-minor) torch.library binding of the selective-scan ops
// (forward, backward, decode step): their bodies and schemas (scan_ops.h, update_ops.h) over
// ATen (classic/tensor.h). stable/ registers the same.
#include <torch/library.h>

#include "classic/tensor.h"

namespace mamba_kernels {
namespace api = classic;
}  // namespace mamba_kernels

#include "../scan_ops.h"
#include "../update_ops.h"

namespace mamba_kernels {
namespace selective_scan {

TORCH_LIBRARY_FRAGMENT(mamba_kernels, m) {
  for (const char* schema : kScanSchemas) m.def(schema);
  for (const char* schema : kUpdateSchemas) m.def(schema);
}

TORCH_LIBRARY_IMPL(mamba_kernels, CUDA, m) {
  m.impl("selective_scan_fwd", &scan_fwd);
  m.impl("selective_scan_bwd", &scan_bwd);
  m.impl("selective_state_update", &state_update);
}

}  // namespace selective_scan
}  // namespace mamba_kernels
