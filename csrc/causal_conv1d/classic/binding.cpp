// The classic (torch 2.1 to 2.9, per-minor) torch.library binding of the causal_conv1d ops:
// their bodies and schemas (conv_ops.h) over ATen (classic/tensor.h). stable/ registers the same.
#include <torch/library.h>

#include "classic/tensor.h"

namespace mamba_kernels {
namespace api = classic;
}  // namespace mamba_kernels

#include "../conv_ops.h"

namespace mamba_kernels {
namespace causal_conv1d {

TORCH_LIBRARY_FRAGMENT(mamba_kernels, m) {
  for (const char* schema : kConvSchemas) m.def(schema);
}

TORCH_LIBRARY_IMPL(mamba_kernels, CUDA, m) {
  m.impl("causal_conv1d_fwd", &conv_fwd);
  m.impl("causal_conv1d_fwd_final_states", &conv_fwd_final_states);
  m.impl("causal_conv1d_bwd", &conv_bwd);
  m.impl("causal_conv1d_update", &conv_update);
}

}  // namespace causal_conv1d
}  // namespace mamba_kernels
