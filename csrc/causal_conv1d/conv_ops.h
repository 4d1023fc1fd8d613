// The causal_conv1d ops, written once for both bindings: their schemas, and their
// bodies, which pass TensorRefs to the shared host code (conv_host.h: checks,
// parameters, launches) and allocate, convert and copy tensors through the binding's tensor
// API `api`: classic/tensor.h (ATen) or stable/tensor.h (the stable C shim), the same names and
// signatures. A binding's .cpp declares `namespace api = classic;` (or stable) inside namespace
// mamba_kernels, includes this file once, and registers conv_fwd, conv_fwd_final_states,
// conv_bwd and conv_update with its own library macros. The fake implementations are
// registered from causal_conv1d/_ops.py.
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>

#include "conv_host.h"

namespace mamba_kernels {
namespace causal_conv1d {

// The ops' schemas, as both bindings define them.
inline constexpr const char* kConvSchemas[] = {
    "causal_conv1d_fwd(Tensor x, Tensor weight, Tensor? bias, Tensor? seq_idx, Tensor? initial_states, "
    "bool silu_activation) -> Tensor",
    "causal_conv1d_fwd_final_states(Tensor x, Tensor weight, Tensor? bias, Tensor? seq_idx, "
    "Tensor? initial_states, Tensor(a!) final_states_out, bool silu_activation) -> Tensor",
    "causal_conv1d_bwd(Tensor x, Tensor weight, Tensor? bias, Tensor dout, Tensor? seq_idx, "
    "Tensor? initial_states, Tensor? dfinal_states, Tensor(a!) dx, bool return_dinitial_states, "
    "bool silu_activation) -> (Tensor, Tensor, Tensor)",
    "causal_conv1d_update(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias, "
    "bool silu_activation, Tensor? cache_seqlens, Tensor? conv_state_indices) -> Tensor",
};

namespace {

using api::OptTensor;
using api::ScalarType;
using api::Tensor;
using api::tref;

// weight / bias as contiguous tensors in their own dtype (a copy only when they are not
// contiguous already: tiny); the kernels read them through weight_at (conv_common.cuh), so a
// model's bf16 conv weights cost no conversion kernels per call.
Tensor dense(const Tensor& t) { return api::contiguous_as(t, t.scalar_type()); }
OptTensor dense(const OptTensor& t) { return t.has_value() ? OptTensor(dense(*t)) : std::nullopt; }

// An fp32 reduction result in the parameter's dtype (the tensor itself when that is fp32).
Tensor as_dtype(const Tensor& t32, const Tensor& like) {
  const ScalarType dtype = like.scalar_type();
  if (dtype == ScalarType::Float) return t32;
  const auto sizes = t32.sizes();
  const Tensor out = api::empty(t32, sizes.data(), int64_t(sizes.size()), dtype);
  api::copy_(out, t32);
  return out;
}

Tensor fwd_impl(const Tensor& x, const Tensor& weight, const OptTensor& bias, const OptTensor& seq_idx,
                const OptTensor& initial_states, const OptTensor& final_states_out, bool silu_activation) {
  const TensorRef xr = tref(x);
  ConvParams p = prepare(xr, tref(weight), tref(bias), tref(seq_idx), tref(initial_states), silu_activation);
  const api::DeviceGuard guard(xr.device_index);
  const Tensor w = dense(weight);
  const OptTensor bi = dense(bias);
  set_weights(p, tref(w), tref(bi));
  const Tensor out = api::alloc(x, layout_like(xr, p.dim, p.seqlen), x.scalar_type());
  const TensorRef outr = tref(out);
  set_out(p, outr);
  if (final_states_out.has_value()) {
    set_final_states(p, xr, tref(*final_states_out));
    if (p.seqlen == 0) {  // no kernel runs: the final states are the initial ones (or zeros)
      if (initial_states.has_value()) {
        api::copy_(*final_states_out, *initial_states);
      } else {
        api::zero_(*final_states_out);
      }
    }
  }
  launch_fwd_checked(p, xr, outr, api::current_stream(xr.device_index));
  return out;
}

// Two ops, with and without final states: an Optional mutated argument passed None breaks
// inductor's lowering of the functionalized op (torch 2.11 and 2.14).
Tensor conv_fwd(const Tensor& x, const Tensor& weight, const OptTensor& bias, const OptTensor& seq_idx,
                const OptTensor& initial_states, bool silu_activation) {
  return fwd_impl(x, weight, bias, seq_idx, initial_states, std::nullopt, silu_activation);
}

Tensor conv_fwd_final_states(const Tensor& x, const Tensor& weight, const OptTensor& bias, const OptTensor& seq_idx,
                             const OptTensor& initial_states, const Tensor& final_states_out, bool silu_activation) {
  return fwd_impl(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation);
}

std::tuple<Tensor, Tensor, Tensor> conv_bwd(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                                            const Tensor& dout_in, const OptTensor& seq_idx,
                                            const OptTensor& initial_states, const OptTensor& dfinal_states,
                                            const Tensor& dx, bool return_dinitial_states, bool silu_activation) {
  const TensorRef xr = tref(x);
  ConvParams p = prepare(xr, tref(weight), tref(bias), tref(seq_idx), tref(initial_states), silu_activation);
  check_bwd_grads(p, xr, tref(dout_in), tref(dx));
  const api::DeviceGuard guard(xr.device_index);
  const Tensor w = dense(weight);
  const OptTensor bi = dense(bias);
  set_weights(p, tref(w), tref(bi));
  Tensor dout = dout_in;
  if (dout_needs_relayout(p, tref(dout_in))) {
    dout = api::alloc(x, layout_like(xr, p.dim, p.seqlen), x.scalar_type());
    api::copy_(dout, dout_in);
  }
  const Tensor dinit = return_dinitial_states
                           ? api::alloc(x, layout_like(xr, p.dim, p.width - 1), x.scalar_type())
                           : api::empty(x, {0}, x.scalar_type());
  const TensorRef doutr = tref(dout), dxr = tref(dx);
  set_bwd_tensors(p, xr, doutr, dxr, tref(dfinal_states), return_dinitial_states ? tref(dinit) : TensorRef());
  p.deterministic = use_deterministic(p, api::deterministic_algorithms());
  const int64_t nbias = bias.has_value() ? p.dim : 0;
  const Tensor dw32 = api::empty(x, {p.dim, p.width}, ScalarType::Float);
  const Tensor db32 = api::empty(x, {nbias}, ScalarType::Float);
  OptTensor ws;  // emplaced, not `cond ? OptTensor(...) : nullopt` (GCC 12 warns maybe-uninitialized)
  if (p.deterministic) ws.emplace(api::empty(x, {workspace_rows(p), p.dim, p.width + 1}, ScalarType::Float));
  set_bwd_reductions(p, static_cast<float*>(dw32.data_ptr()),
                     bias.has_value() ? static_cast<float*>(db32.data_ptr()) : nullptr,
                     ws.has_value() ? static_cast<float*>(ws->data_ptr()) : nullptr);
  if (p.seqlen == 0 && return_dinitial_states) {  // no kernel runs: dinit is dfinal (or zeros)
    if (dfinal_states.has_value()) {
      api::copy_(dinit, *dfinal_states);
    } else {
      api::zero_(dinit);
    }
  }
  launch_bwd_checked(p, xr, doutr, dxr, api::current_stream(xr.device_index));
  const Tensor dweight = as_dtype(dw32, weight);
  const Tensor dbias = bias.has_value() ? as_dtype(db32, *bias) : api::empty(weight, {0}, weight.scalar_type());
  return {dweight, dbias, dinit};
}

Tensor conv_update(const Tensor& x, const Tensor& conv_state, const Tensor& weight, const OptTensor& bias,
                   bool silu_activation, const OptTensor& cache_seqlens, const OptTensor& conv_state_indices) {
  const TensorRef xr = tref(x);
  UpdateParams p = prepare_update(xr, tref(conv_state), tref(weight), tref(bias), silu_activation,
                                  tref(cache_seqlens), tref(conv_state_indices));
  const api::DeviceGuard guard(xr.device_index);
  const Tensor w = dense(weight);
  const OptTensor bi = dense(bias);
  set_update_weights(p, tref(w), tref(bi));
  const Tensor out = api::empty_like(x, xr);
  launch_update_checked(p, tref(out), api::current_stream(xr.device_index));
  return out;
}

}  // namespace

}  // namespace causal_conv1d
}  // namespace mamba_kernels
