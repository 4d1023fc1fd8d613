// The stable-ABI binding of the causal_conv1d ops (one binary for every torch from its
// TORCH_TARGET_VERSION on): their bodies and schemas (conv_ops.h) over the stable C shim
// (stable/tensor.h: direct shim calls, none through the dispatcher by name but empty_like of a
// strided view). classic/ registers the same.
#include "stable/tensor.h"

namespace mamba_kernels {
namespace api = stable;
}  // namespace mamba_kernels

#include "../conv_ops.h"

namespace mamba_kernels {
namespace causal_conv1d {

STABLE_TORCH_LIBRARY_FRAGMENT(mamba_kernels, m) {
  for (const char* schema : kConvSchemas) m.def(schema);
}

STABLE_TORCH_LIBRARY_IMPL(mamba_kernels, CUDA, m) {
  m.impl("causal_conv1d_fwd", TORCH_BOX(&conv_fwd));
  m.impl("causal_conv1d_fwd_final_states", TORCH_BOX(&conv_fwd_final_states));
  m.impl("causal_conv1d_bwd", TORCH_BOX(&conv_bwd));
  m.impl("causal_conv1d_update", TORCH_BOX(&conv_update));
}

}  // namespace causal_conv1d
}  // namespace mamba_kernels
