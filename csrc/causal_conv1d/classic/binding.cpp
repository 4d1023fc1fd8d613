// The classic (torch 2.1 to 2.9, per-minor) torch.library binding of the causal_conv1d ops:
// at::Tensor in, TensorRefs to the shared host code (conv_host.h: checks, parameters, launch),
// tensors allocated and converted with ATen. Ops live in the `mamba_kernels` namespace; their
// fake implementations are registered from causal_conv1d/_ops.py. The stable-ABI binding
// (stable/binding.cpp) registers the same ops with the same schemas.
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "classic/tensor.h"
#include "../conv_host.h"

namespace mamba_kernels {
namespace causal_conv1d {
namespace {

using classic::OptTensor;
using classic::tref;
using classic::Tensor;

// fp32 contiguous copies of weight / bias (tiny), so kernels need no weight-dtype templates.
Tensor f32(const Tensor& t) { return t.to(at::kFloat).contiguous(); }
OptTensor f32(const OptTensor& t) { return t.has_value() ? OptTensor(f32(*t)) : std::nullopt; }

Tensor fwd_impl(const Tensor& x, const Tensor& weight, const OptTensor& bias, const OptTensor& seq_idx,
                const OptTensor& initial_states, const OptTensor& final_states_out, bool silu_activation) {
  const c10::cuda::CUDAGuard guard(x.device());
  const TensorRef xr = tref(x);
  ConvParams p = prepare(xr, tref(weight), tref(bias), tref(seq_idx), tref(initial_states), silu_activation);
  const Tensor w32 = f32(weight);
  const OptTensor b32 = f32(bias);
  set_weights(p, tref(w32), tref(b32));
  const Tensor out = classic::alloc(x, layout_like(xr, p.dim, p.seqlen), x.scalar_type());
  const TensorRef outr = tref(out);
  set_out(p, outr);
  if (final_states_out.has_value()) {
    set_final_states(p, xr, tref(*final_states_out));
    if (p.seqlen == 0) {  // no kernel runs: the final states are the initial ones (or zeros)
      if (initial_states.has_value()) {
        final_states_out->copy_(*initial_states);
      } else {
        final_states_out->zero_();
      }
    }
  }
  launch_fwd_checked(p, xr, outr, classic::current_stream());
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
  const c10::cuda::CUDAGuard guard(x.device());
  const TensorRef xr = tref(x);
  ConvParams p = prepare(xr, tref(weight), tref(bias), tref(seq_idx), tref(initial_states), silu_activation);
  const Tensor w32 = f32(weight);
  const OptTensor b32 = f32(bias);
  set_weights(p, tref(w32), tref(b32));
  check_bwd_grads(p, xr, tref(dout_in), tref(dx));
  Tensor dout = dout_in;
  if (dout_needs_relayout(p, tref(dout_in))) {
    dout = classic::alloc(x, layout_like(xr, p.dim, p.seqlen), x.scalar_type());
    dout.copy_(dout_in);
  }
  const Tensor dinit = return_dinitial_states
                           ? classic::alloc(x, layout_like(xr, p.dim, p.width - 1), x.scalar_type())
                           : at::empty({0}, x.options());
  const TensorRef doutr = tref(dout), dxr = tref(dx);
  set_bwd_tensors(p, xr, doutr, dxr, tref(dfinal_states), return_dinitial_states ? tref(dinit) : TensorRef());
  p.deterministic = use_deterministic(p, at::globalContext().deterministicAlgorithms());
  const auto f32opt = x.options().dtype(at::kFloat);
  const int64_t nbias = bias.has_value() ? p.dim : 0;
  const Tensor dw32 = at::empty({p.dim, p.width}, f32opt);
  const Tensor db32 = at::empty({nbias}, f32opt);
  Tensor ws;
  if (p.deterministic) ws = at::empty({workspace_rows(p), p.dim, p.width + 1}, f32opt);
  set_bwd_reductions(p, dw32.data_ptr<float>(), bias.has_value() ? db32.data_ptr<float>() : nullptr,
                     p.deterministic ? ws.data_ptr<float>() : nullptr);
  if (p.seqlen == 0 && return_dinitial_states) {  // no kernel runs: dinit is dfinal (or zeros)
    if (dfinal_states.has_value()) {
      dinit.copy_(*dfinal_states);
    } else {
      dinit.zero_();
    }
  }
  launch_bwd_checked(p, xr, doutr, dxr, classic::current_stream());
  const Tensor dweight = dw32.to(weight.scalar_type());
  const Tensor dbias = bias.has_value() ? db32.to(bias->scalar_type()) : at::empty({0}, weight.options());
  return {dweight, dbias, dinit};
}

Tensor conv_update(const Tensor& x, const Tensor& conv_state, const Tensor& weight, const OptTensor& bias,
                   bool silu_activation, const OptTensor& cache_seqlens, const OptTensor& conv_state_indices) {
  const TensorRef xr = tref(x);
  MK_CHECK(xr.is_cuda, "causal_conv1d_update: x must be a CUDA tensor, got device ", xr.device);
  const c10::cuda::CUDAGuard guard(x.device());
  UpdateParams p = prepare_update(xr, tref(conv_state), tref(weight), tref(bias), silu_activation, tref(cache_seqlens),
                                  tref(conv_state_indices));
  const Tensor w32 = f32(weight);
  const OptTensor b32 = f32(bias);
  set_update_weights(p, tref(w32), tref(b32));
  const Tensor out = at::empty_like(x);
  launch_update_checked(p, tref(out), classic::current_stream());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mamba_kernels, m) {
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

TORCH_LIBRARY_IMPL(mamba_kernels, CUDA, m) {
  m.impl("causal_conv1d_fwd", &conv_fwd);
  m.impl("causal_conv1d_fwd_final_states", &conv_fwd_final_states);
  m.impl("causal_conv1d_bwd", &conv_bwd);
  m.impl("causal_conv1d_update", &conv_update);
}

}  // namespace causal_conv1d
}  // namespace mamba_kernels
