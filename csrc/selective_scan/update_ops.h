// The selective_state_update op, written once for both bindings: its schema, and its body,
// which passes TensorRefs to the shared host code (scan_host.h, update_host.cpp: checks,
// parameters, launch) and allocates its output through the binding's tensor API `api`:
// classic/tensor.h (ATen) or stable/tensor.h (the stable C shim), the same names and
// signatures. A binding's .cpp declares `namespace api = classic;` (or stable) inside namespace
// mamba_kernels, includes this file once, and registers state_update with its own library
// macros. The fake implementation is registered from selective_scan/_update_ops.py.
#pragma once

#include <optional>

#include "scan_host.h"

namespace mamba_kernels {
namespace selective_scan {

// The op's schema, as both bindings define it.
inline constexpr const char* kUpdateSchemas[] = {
    "selective_state_update(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
    "Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, Tensor? state_batch_indices) -> Tensor",
};

namespace {

using api::OptTensor;
using api::Tensor;
using api::tref;

Tensor state_update(const Tensor& state, const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B,
                    const Tensor& C, const OptTensor& D, const OptTensor& z, const OptTensor& dt_bias,
                    bool dt_softplus, const OptTensor& state_batch_indices) {
  const TensorRef sr = tref(state), xr = tref(x);
  StateUpdateParams p = prepare_state_update(sr, xr, tref(dt), tref(A), tref(B), tref(C), tref(D), tref(z),
                                             tref(dt_bias), dt_softplus, tref(state_batch_indices));
  const api::DeviceGuard guard(sr.device_index);
  const Tensor out = api::empty_like(x, xr);
  launch_state_update_checked(p, sr, tref(out), api::current_stream(sr.device_index));
  return out;
}

}  // namespace

}  // namespace selective_scan
}  // namespace mamba_kernels
