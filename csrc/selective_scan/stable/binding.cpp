// The stable-ABI binding of the selective-scan ops (forward, backward, decode step; one binary
// for every torch from its TORCH_TARGET_VERSION on): their bodies and schemas (scan_ops.h,
// update_ops.h) over the stable C shim (stable/tensor.h: direct shim calls, none through the
// dispatcher by name but empty_like of a strided view). classic/ registers the same.
#include "stable/tensor.h"

namespace mamba_kernels {
namespace api = stable;
}  // namespace mamba_kernels

#include "../scan_ops.h"
#include "../update_ops.h"

namespace mamba_kernels {
namespace selective_scan {

STABLE_TORCH_LIBRARY_FRAGMENT(mamba_kernels, m) {
  for (const char* schema : kScanSchemas) m.def(schema);
  for (const char* schema : kUpdateSchemas) m.def(schema);
}

STABLE_TORCH_LIBRARY_IMPL(mamba_kernels, CUDA, m) {
  m.impl("selective_scan_fwd", TORCH_BOX(&scan_fwd));
  m.impl("selective_scan_bwd", TORCH_BOX(&scan_bwd));
  m.impl("selective_state_update", TORCH_BOX(&state_update));
}

}  // namespace selective_scan
}  // namespace mamba_kernels
