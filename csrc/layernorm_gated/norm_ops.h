// The gated norm ops, written once for both bindings: their schemas, and their bodies, which
// pass TensorRefs to the shared host code (norm_host.h: checks, parameters, launches) and
// allocate the backward's workspace through the binding's tensor API `api`: classic/tensor.h
// (ATen) or stable/tensor.h (the stable C shim), the same names and signatures. A binding's
// .cpp declares `namespace api = classic;` (or stable) inside namespace mamba_kernels, includes
// this file once, and registers the ops with its own library macros. Every output is an
// annotated in-place argument the caller allocates (so Mamba-2's fused layer can pass views of
// its own buffers); the fake implementations are registered from selective_scan/_norm_ops.py.
#pragma once

#include <optional>

#include "norm_host.h"

namespace mamba_kernels {
namespace layernorm_gated {

// The ops' schemas, as both bindings define them.
inline constexpr const char* kNormSchemas[] = {
    "layernorm_gated_fwd(Tensor x, Tensor weight, Tensor? bias, Tensor? z, Tensor(a!) out, Tensor(b!)? mean, "
    "Tensor(c!) rstd, float eps, int group_size, bool norm_before_gate, bool is_rms_norm) -> ()",
    "layernorm_gated_bwd(Tensor dy, Tensor x, Tensor weight, Tensor? bias, Tensor? z, Tensor? mean, Tensor rstd, "
    "Tensor(a!) dx, Tensor(b!)? dz, Tensor(c!)? out, Tensor(d!) dweight, Tensor(e!)? dbias, float eps, "
    "int group_size, bool norm_before_gate, bool is_rms_norm) -> ()",
};

namespace {

using api::OptTensor;
using api::ScalarType;
using api::Tensor;
using api::tref;

void norm_fwd(const Tensor& x, const Tensor& weight, const OptTensor& bias, const OptTensor& z, const Tensor& out,
              const OptTensor& mean, const Tensor& rstd, double eps, int64_t group_size, bool norm_before_gate,
              bool is_rms_norm) {
  const TensorRef xr = tref(x);
  const NormFwdParams p = prepare_fwd(xr, tref(weight), tref(bias), tref(z), tref(out), tref(mean), tref(rstd), eps,
                                      group_size, norm_before_gate, is_rms_norm);
  const api::DeviceGuard guard(xr.device_index);
  launch_fwd_checked(p, api::current_stream(xr.device_index));
}

void norm_bwd(const Tensor& dy, const Tensor& x, const Tensor& weight, const OptTensor& bias, const OptTensor& z,
              const OptTensor& mean, const Tensor& rstd, const Tensor& dx, const OptTensor& dz, const OptTensor& out,
              const Tensor& dweight, const OptTensor& dbias, double eps, int64_t group_size, bool norm_before_gate,
              bool is_rms_norm) {
  const TensorRef xr = tref(x);
  const NormBwdParams p =
      prepare_bwd(tref(dy), xr, tref(weight), tref(bias), tref(z), tref(mean), tref(rstd), tref(dx), tref(dz),
                  tref(out), tref(dweight), tref(dbias), eps, group_size, norm_before_gate, is_rms_norm);
  const api::DeviceGuard guard(xr.device_index);
  const int64_t floats = bwd_workspace_floats(p, xr.device_index);
  std::optional<Tensor> ws;
  if (floats > 0) ws.emplace(api::empty(x, {floats}, ScalarType::Float));
  float* wsp = ws.has_value() ? static_cast<float*>(tref(*ws).data) : nullptr;
  launch_bwd_checked(p, wsp, xr.device_index, api::current_stream(xr.device_index));
}

}  // namespace

}  // namespace layernorm_gated
}  // namespace mamba_kernels
