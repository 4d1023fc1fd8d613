// The stable-ABI binding of the selective_state_update decode kernel: torch::stable::Tensor in,
// TensorRefs to the shared checks and fill (scan_host.h, update_host.cpp); the only allocation
// is the output (stable/tensor.h's empty_like, a direct shim call). Same op and schema as
// classic/update_binding.cpp; the fake implementation is in selective_scan/_update_ops.py.
#include <optional>

#include "../scan_host.h"
#include "stable/tensor.h"

namespace mamba_kernels {
namespace selective_scan {
namespace {

using stable::OptTensor;
using stable::Tensor;
using stable::tref;

Tensor state_update(const Tensor& state, const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B,
                    const Tensor& C, const OptTensor& D, const OptTensor& z, const OptTensor& dt_bias,
                    bool dt_softplus, const OptTensor& state_batch_indices) {
  const TensorRef sr = tref(state), xr = tref(x);
  StateUpdateParams p = prepare_state_update(sr, xr, tref(dt), tref(A), tref(B), tref(C), tref(D), tref(z),
                                             tref(dt_bias), dt_softplus, tref(state_batch_indices));
  const stable::DeviceGuard guard(sr.device_index);
  const Tensor out = stable::empty_like(x, xr);
  launch_state_update_checked(p, sr, tref(out), stable::current_stream(sr.device_index));
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(mamba_kernels, m) {
  m.def(
      "selective_state_update(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
      "Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, Tensor? state_batch_indices) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(mamba_kernels, CUDA, m) { m.impl("selective_state_update", TORCH_BOX(&state_update)); }

}  // namespace selective_scan
}  // namespace mamba_kernels
