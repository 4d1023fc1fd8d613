// The host side of the gated norm ops that both bindings share: every precondition the kernels
// rely on (with its message, naming the argument, the rule and the value), the parameter fills
// and the launches. The ops (norm_ops.h, over either binding's tensor API) only turn their
// tensors into TensorRefs and allocate the backward's workspace. No torch here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "norm_gated.h"
#include "tensor_ref.h"

namespace mamba_kernels {
namespace layernorm_gated {

// layernorm_gated_fwd: x (rows, n) and z (x's shape and dtype, or absent) read with any row
// stride and unit channel stride; weight, bias (n,) contiguous; out written (x's shape, dtype
// and layout rules); mean (absent for RMS) and rstd float32 (ngroups * rows,) contiguous.
NormFwdParams prepare_fwd(const TensorRef& x, const TensorRef& weight, const TensorRef& bias, const TensorRef& z,
                          const TensorRef& out, const TensorRef& mean, const TensorRef& rstd, double eps,
                          int64_t group_size, bool norm_before_gate, bool is_rms_norm);
void launch_fwd_checked(const NormFwdParams& p, cudaStream_t stream);

// layernorm_gated_bwd: dy, dx (x's shape and dtype); dz with z; out (the recomputed output) or
// absent; dweight, dbias (n,) contiguous in weight's and bias's dtypes.
NormBwdParams prepare_bwd(const TensorRef& dy, const TensorRef& x, const TensorRef& weight, const TensorRef& bias,
                          const TensorRef& z, const TensorRef& mean, const TensorRef& rstd, const TensorRef& dx,
                          const TensorRef& dz, const TensorRef& out, const TensorRef& dweight,
                          const TensorRef& dbias, double eps, int64_t group_size, bool norm_before_gate,
                          bool is_rms_norm);
// Floats of workspace the backward needs (0: none).
int64_t bwd_workspace_floats(const NormBwdParams& p, int device_index);
void launch_bwd_checked(const NormBwdParams& p, float* workspace, int device_index, cudaStream_t stream);

}  // namespace layernorm_gated
}  // namespace mamba_kernels
