// The stable torch.library binding of the gated norm ops (forward and backward of Mamba-2's
// RMSNorm / LayerNorm): their bodies and schemas (norm_ops.h) over stable/tensor.h. A second
// fragment and implementation block of the mamba_kernels namespace in this extension (the
// selective-scan ops have theirs): the dispatcher merges them.
#include "stable/tensor.h"

namespace mamba_kernels {
namespace api = stable;
}  // namespace mamba_kernels

#include "../norm_ops.h"

namespace mamba_kernels {
namespace layernorm_gated {

STABLE_TORCH_LIBRARY_FRAGMENT(mamba_kernels, m) {
  for (const char* schema : kNormSchemas) m.def(schema);
}

STABLE_TORCH_LIBRARY_IMPL(mamba_kernels, CUDA, m) {
  m.impl("layernorm_gated_fwd", TORCH_BOX(&norm_fwd));
  m.impl("layernorm_gated_bwd", TORCH_BOX(&norm_bwd));
}

}  // namespace layernorm_gated
}  // namespace mamba_kernels
