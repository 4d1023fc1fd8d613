// The classic torch.library binding of the selective_state_update decode kernel: at::Tensor in,
// TensorRefs to the shared checks and fill (scan_host.h, update_host.cpp); the only
// allocation is the output. The fake implementation is in selective_scan/_update_ops.py.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>

#include "classic/tensor.h"
#include "../scan_host.h"

namespace mamba_kernels {
namespace selective_scan {
namespace {

using classic::OptTensor;
using classic::tref;
using classic::Tensor;

Tensor state_update(const Tensor& state, const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B,
                    const Tensor& C, const OptTensor& D, const OptTensor& z, const OptTensor& dt_bias,
                    bool dt_softplus, const OptTensor& state_batch_indices) {
  const TensorRef sr = tref(state);
  StateUpdateParams p = prepare_state_update(sr, tref(x), tref(dt), tref(A), tref(B), tref(C), tref(D), tref(z),
                                             tref(dt_bias), dt_softplus, tref(state_batch_indices));
  const c10::cuda::CUDAGuard guard(state.device());
  const Tensor out = at::empty_like(x);
  launch_state_update_checked(p, sr, tref(out), classic::current_stream());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mamba_kernels, m) {
  m.def(
      "selective_state_update(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
      "Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, Tensor? state_batch_indices) -> Tensor");
}

TORCH_LIBRARY_IMPL(mamba_kernels, CUDA, m) { m.impl("selective_state_update", &state_update); }

}  // namespace selective_scan
}  // namespace mamba_kernels
