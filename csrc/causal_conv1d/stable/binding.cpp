// The stable-ABI binding of the causal_conv1d ops (one binary for every torch from its
// TORCH_TARGET_VERSION on): torch::stable::Tensor in, TensorRefs to the shared host code
// (conv_host.h: checks, parameters, launch), tensors allocated, converted and copied through
// direct calls of the stable C shim (stable/tensor.h), none through the dispatcher by name
// but empty_like of a strided view. Same op names and schemas as classic/binding.cpp; the fake
// implementations are registered from causal_conv1d/_ops.py.
#include <cstdint>
#include <optional>
#include <tuple>

#include "../conv_host.h"
#include "stable/tensor.h"

namespace mamba_kernels {
namespace causal_conv1d {
namespace {

using stable::OptTensor;
using stable::ScalarType;
using stable::Tensor;
using stable::tref;

// weight / bias as fp32 contiguous tensors (copies only when they are not already: tiny), so
// kernels need no weight-dtype templates.
Tensor f32(const Tensor& t) { return stable::contiguous_as(t, ScalarType::Float); }
OptTensor f32(const OptTensor& t) { return stable::contiguous_as(t, ScalarType::Float); }

// An fp32 reduction result in the parameter's dtype (the tensor itself when that is fp32).
Tensor as_dtype(const Tensor& t32, const Tensor& like) {
  const ScalarType dtype = like.scalar_type();
  if (dtype == ScalarType::Float) return t32;
  const auto sizes = t32.sizes();
  const Tensor out = stable::empty(t32, sizes.data(), int64_t(sizes.size()), dtype);
  stable::copy_(out, t32);
  return out;
}

Tensor fwd_impl(const Tensor& x, const Tensor& weight, const OptTensor& bias, const OptTensor& seq_idx,
                const OptTensor& initial_states, const OptTensor& final_states_out, bool silu_activation) {
  const TensorRef xr = tref(x);
  ConvParams p = prepare(xr, tref(weight), tref(bias), tref(seq_idx), tref(initial_states), silu_activation);
  const stable::DeviceGuard guard(xr.device_index);
  const Tensor w32 = f32(weight);
  const OptTensor b32 = f32(bias);
  set_weights(p, tref(w32), tref(b32));
  const Tensor out = stable::alloc(x, layout_like(xr, p.dim, p.seqlen), x.scalar_type());
  const TensorRef outr = tref(out);
  set_out(p, outr);
  if (final_states_out.has_value()) {
    set_final_states(p, xr, tref(*final_states_out));
    if (p.seqlen == 0) {  // no kernel runs: the final states are the initial ones (or zeros)
      if (initial_states.has_value()) {
        stable::copy_(*final_states_out, *initial_states);
      } else {
        stable::zero_(*final_states_out);
      }
    }
  }
  launch_fwd_checked(p, xr, outr, stable::current_stream(xr.device_index));
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
  const stable::DeviceGuard guard(xr.device_index);
  const Tensor w32 = f32(weight);
  const OptTensor b32 = f32(bias);
  set_weights(p, tref(w32), tref(b32));
  Tensor dout = dout_in;
  if (dout_needs_relayout(p, tref(dout_in))) {
    dout = stable::alloc(x, layout_like(xr, p.dim, p.seqlen), x.scalar_type());
    stable::copy_(dout, dout_in);
  }
  const Tensor dinit = return_dinitial_states
                           ? stable::alloc(x, layout_like(xr, p.dim, p.width - 1), x.scalar_type())
                           : stable::empty(x, {0}, x.scalar_type());
  const TensorRef doutr = tref(dout), dxr = tref(dx);
  set_bwd_tensors(p, xr, doutr, dxr, tref(dfinal_states), return_dinitial_states ? tref(dinit) : TensorRef());
  p.deterministic = use_deterministic(p, stable::deterministic_algorithms());
  const int64_t nbias = bias.has_value() ? p.dim : 0;
  const Tensor dw32 = stable::empty(x, {p.dim, p.width}, ScalarType::Float);
  const Tensor db32 = stable::empty(x, {nbias}, ScalarType::Float);
  const OptTensor ws = p.deterministic
                           ? OptTensor(stable::empty(x, {workspace_rows(p), p.dim, p.width + 1}, ScalarType::Float))
                           : std::nullopt;
  set_bwd_reductions(p, static_cast<float*>(dw32.data_ptr()),
                     bias.has_value() ? static_cast<float*>(db32.data_ptr()) : nullptr,
                     ws.has_value() ? static_cast<float*>(ws->data_ptr()) : nullptr);
  if (p.seqlen == 0 && return_dinitial_states) {  // no kernel runs: dinit is dfinal (or zeros)
    if (dfinal_states.has_value()) {
      stable::copy_(dinit, *dfinal_states);
    } else {
      stable::zero_(dinit);
    }
  }
  launch_bwd_checked(p, xr, doutr, dxr, stable::current_stream(xr.device_index));
  const Tensor dweight = as_dtype(dw32, weight);
  const Tensor dbias = bias.has_value() ? as_dtype(db32, *bias) : stable::empty(weight, {0}, weight.scalar_type());
  return {dweight, dbias, dinit};
}

Tensor conv_update(const Tensor& x, const Tensor& conv_state, const Tensor& weight, const OptTensor& bias,
                   bool silu_activation, const OptTensor& cache_seqlens, const OptTensor& conv_state_indices) {
  const TensorRef xr = tref(x);
  UpdateParams p = prepare_update(xr, tref(conv_state), tref(weight), tref(bias), silu_activation,
                                  tref(cache_seqlens), tref(conv_state_indices));
  const stable::DeviceGuard guard(xr.device_index);
  const Tensor w32 = f32(weight);
  const OptTensor b32 = f32(bias);
  set_update_weights(p, tref(w32), tref(b32));
  const Tensor out = stable::empty_like(x, xr);
  launch_update_checked(p, tref(out), stable::current_stream(xr.device_index));
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(mamba_kernels, m) {
  m.def(
      "causal_conv1d_fwd(Tensor x, Tensor weight, Tensor? bias, Tensor? seq_idx, Tensor? initial_states, "
      "bool silu_activation) -> Tensor");
  m.def(
      "causal_conv1d_fwd_final_states(Tensor x, Tensor weight, Tensor? bias, Tensor? seq_idx, "
      "Tensor? initial_states, Tensor(a!) final_states_out, bool silu_activation) -> Tensor");
  m.def(
      "causal_conv1d_bwd(Tensor x, Tensor weight, Tensor? bias, Tensor dout, Tensor? seq_idx, "
      "Tensor? initial_states, Tensor? dfinal_states, Tensor(a!) dx, bool return_dinitial_states, "
      "bool silu_activation) -> (Tensor, Tensor, Tensor)");
  m.def(
      "causal_conv1d_update(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias, "
      "bool silu_activation, Tensor? cache_seqlens, Tensor? conv_state_indices) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(mamba_kernels, CUDA, m) {
  m.impl("causal_conv1d_fwd", TORCH_BOX(&conv_fwd));
  m.impl("causal_conv1d_fwd_final_states", TORCH_BOX(&conv_fwd_final_states));
  m.impl("causal_conv1d_bwd", TORCH_BOX(&conv_bwd));
  m.impl("causal_conv1d_update", TORCH_BOX(&conv_update));
}

}  // namespace causal_conv1d
}  // namespace mamba_kernels
