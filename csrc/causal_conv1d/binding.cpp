// torch.library binding of the causal_conv1d kernels: checks every precondition a kernel relies
// on (so a direct op call cannot access memory out of bounds), turns tensors into plain
// parameter structs and launches on the current stream. Ops live in the `mamba_kernels`
// namespace; their fake implementations are registered from causal_conv1d/_ops.py.
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>

#include "causal_conv1d.h"
#include "check_msg.h"

namespace mamba_kernels {
namespace causal_conv1d {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;


DType to_dtype(const Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default:
      MK_CHECK_TYPE(false, "causal_conv1d: ", name, " must be float32, float16 or bfloat16, got ",
                       t.scalar_type());
  }
  return DType::kFloat32;
}

void check_cuda(const Tensor& t, const Tensor& x, const char* name) {
  MK_CHECK(t.is_cuda(), "causal_conv1d: ", name, " must be a CUDA tensor, got device ", t.device());
  MK_CHECK(t.device() == x.device(), "causal_conv1d: ", name, " must be on x's device ", x.device(),
              ", got ", t.device());
}

void check_shape(const Tensor& t, at::IntArrayRef want, const char* name) {
  MK_CHECK(t.sizes() == want, "causal_conv1d: ", name, " must have shape ", want, ", got ", t.sizes());
}

Strides3 strides3(const Tensor& t) {
  return Strides3{t.stride(0), t.stride(1), t.stride(2)};
}

// Channel-last iff dim has unit stride and seqlen a stride > 1 (causal-conv1d's rule, and
// causal_conv1d._checks.layout's).
bool is_channel_last(const Tensor& x) { return x.stride(1) == 1 && x.stride(2) > 1; }

// The vector path needs unit stride along the vector axis, and the base pointer and the two
// other strides aligned to a whole vector of `vec` elements.
bool vec_ok(const Tensor& t, bool channel_last, int vec) {
  const int64_t bytes = int64_t(vec) * int64_t(t.element_size());
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % uintptr_t(bytes) != 0) return false;
  const int64_t unit = channel_last ? t.stride(1) : t.stride(2);
  const int64_t other = channel_last ? t.stride(2) : t.stride(1);
  return unit == 1 && t.stride(0) % vec == 0 && other % vec == 0;
}

// fp32 contiguous copies of weight / bias (tiny), so kernels need no weight-dtype templates.
Tensor weight_f32(const Tensor& x, const Tensor& weight, int64_t dim) {
  check_cuda(weight, x, "weight");
  to_dtype(weight, "weight");
  MK_CHECK(weight.dim() == 2 && weight.size(0) == dim, "causal_conv1d: weight must have shape (dim=", dim,
              ", width), got ", weight.sizes());
  const int64_t width = weight.size(1);
  MK_CHECK(width >= 2 && width <= 4, "causal_conv1d: width (weight.shape[1]) must be between 2 and 4, got ",
              width);
  return weight.to(at::kFloat).contiguous();
}

OptTensor bias_f32(const Tensor& x, const OptTensor& bias, int64_t dim) {
  if (!bias.has_value()) return std::nullopt;
  check_cuda(*bias, x, "bias");
  to_dtype(*bias, "bias");
  check_shape(*bias, {dim}, "bias");
  return bias->to(at::kFloat).contiguous();
}

// A (batch, d1, d2) tensor in x's layout family; the same rule as
// causal_conv1d._checks.empty_like_layout, which the fake implementations use: dense x of the
// same shape keeps x's exact strides, anything else is dense channel-last or channel-first.
Tensor alloc_like_layout(const Tensor& x, int64_t d1, int64_t d2) {
  if (d1 == x.size(1) && d2 == x.size(2) && x.is_non_overlapping_and_dense()) return at::empty_like(x);
  // empty_strided, not a transposed tensor: an output that is a view may not be modified in
  // place once returned from an autograd.Function with several outputs.
  if (is_channel_last(x)) return at::empty_strided({x.size(0), d1, d2}, {d1 * d2, 1, d1}, x.options());
  return at::empty({x.size(0), d1, d2}, x.options());
}

void check_launch(cudaError_t err, const char* what) {
  MK_CHECK(err == cudaSuccess, "causal_conv1d: ", what, " kernel launch failed: ", cudaGetErrorString(err));
}

// Shared by fwd and bwd: x, weight, bias, seq_idx and initial_states into params.
struct Common {
  ConvParams p;
  Tensor w32;
  OptTensor b32;
};

Common prepare(const Tensor& x, const Tensor& weight, const OptTensor& bias, const OptTensor& seq_idx,
               const OptTensor& initial_states, bool silu) {
  MK_CHECK(x.is_cuda(), "causal_conv1d: x must be a CUDA tensor, got device ", x.device());
  MK_CHECK(x.dim() == 3, "causal_conv1d: x must be 3-D (batch, dim, seqlen), got shape ", x.sizes());
  Common r;
  ConvParams& p = r.p;
  p.dtype = to_dtype(x, "x");
  p.batch = x.size(0);
  p.dim = x.size(1);
  p.seqlen = x.size(2);
  r.w32 = weight_f32(x, weight, p.dim);
  r.b32 = bias_f32(x, bias, p.dim);
  p.width = int(r.w32.size(1));
  p.channel_last = is_channel_last(x);
  p.silu = silu;
  p.x = x.data_ptr();
  p.x_s = strides3(x);
  p.weight = r.w32.data_ptr<float>();
  p.bias = r.b32.has_value() ? r.b32->data_ptr<float>() : nullptr;
  if (seq_idx.has_value()) {
    check_cuda(*seq_idx, x, "seq_idx");
    MK_CHECK_TYPE(seq_idx->scalar_type() == at::kInt, "causal_conv1d: seq_idx must be int32, got ",
                     seq_idx->scalar_type());
    check_shape(*seq_idx, {p.batch, p.seqlen}, "seq_idx");
    p.seq_idx = seq_idx->data_ptr<int32_t>();
    p.seq_s_b = seq_idx->stride(0);
    p.seq_s_l = seq_idx->stride(1);
  }
  if (initial_states.has_value()) {
    check_cuda(*initial_states, x, "initial_states");
    MK_CHECK_TYPE(initial_states->scalar_type() == x.scalar_type(),
                     "causal_conv1d: initial_states must have x's dtype ", x.scalar_type(), ", got ",
                     initial_states->scalar_type());
    check_shape(*initial_states, {p.batch, p.dim, p.width - 1}, "initial_states");
    p.initial_states = initial_states->data_ptr();
    p.init_s = strides3(*initial_states);
  }
  return r;
}

void check_state_like(const Tensor& t, const Tensor& x, const ConvParams& p, const char* name) {
  check_cuda(t, x, name);
  MK_CHECK_TYPE(t.scalar_type() == x.scalar_type(), "causal_conv1d: ", name, " must have x's dtype ",
                   x.scalar_type(), ", got ", t.scalar_type());
  check_shape(t, {p.batch, p.dim, p.width - 1}, name);
}

Tensor fwd_impl(const Tensor& x, const Tensor& weight, const OptTensor& bias, const OptTensor& seq_idx,
                const OptTensor& initial_states, const OptTensor& final_states_out, bool silu_activation) {
  const c10::cuda::CUDAGuard guard(x.device());
  Common r = prepare(x, weight, bias, seq_idx, initial_states, silu_activation);
  ConvParams& p = r.p;
  Tensor out = alloc_like_layout(x, p.dim, p.seqlen);
  p.out = out.data_ptr();
  p.out_s = strides3(out);
  if (final_states_out.has_value()) {
    check_state_like(*final_states_out, x, p, "final_states_out");
    if (p.seqlen == 0) {  // no kernel runs: the final states are the initial ones (or zeros)
      if (initial_states.has_value()) {
        final_states_out->copy_(*initial_states);
      } else {
        final_states_out->zero_();
      }
    }
    p.final_states = final_states_out->data_ptr();
    p.final_s = strides3(*final_states_out);
  }
  const int vec = vec_elems(p.dtype, p.channel_last, false);
  p.vec_in = vec_ok(x, p.channel_last, vec);
  p.vec_out = vec_ok(out, p.channel_last, vec);
  check_launch(launch_fwd(p, c10::cuda::getCurrentCUDAStream().stream()), "causal_conv1d_fwd");
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
  Common r = prepare(x, weight, bias, seq_idx, initial_states, silu_activation);
  ConvParams& p = r.p;
  check_cuda(dout_in, x, "dout");
  MK_CHECK_TYPE(dout_in.scalar_type() == x.scalar_type(), "causal_conv1d: dout must have x's dtype ",
                   x.scalar_type(), ", got ", dout_in.scalar_type());
  check_shape(dout_in, x.sizes(), "dout");
  check_cuda(dx, x, "dx");
  MK_CHECK_TYPE(dx.scalar_type() == x.scalar_type(), "causal_conv1d: dx must have x's dtype ",
                   x.scalar_type(), ", got ", dx.scalar_type());
  check_shape(dx, x.sizes(), "dx");
  // dout in another layout (or broadcast with a zero stride along the vector axis) is re-laid
  // out like x once, so the kernel streams it with vector loads.
  Tensor dout = dout_in;
  const bool dout_unit = p.channel_last ? dout.stride(1) == 1 : dout.stride(2) == 1;
  if (!dout_unit && p.seqlen > 1 && p.dim > 1) {
    dout = alloc_like_layout(x, p.dim, p.seqlen);
    dout.copy_(dout_in);
  }
  p.dout = dout.data_ptr();
  p.dout_s = strides3(dout);
  p.dx = dx.data_ptr();
  p.dx_s = strides3(dx);
  if (dfinal_states.has_value()) {
    check_state_like(*dfinal_states, x, p, "dfinal_states");
    p.dfinal_states = dfinal_states->data_ptr();
    p.dfinal_s = strides3(*dfinal_states);
  }
  Tensor dinit;
  if (return_dinitial_states) {
    dinit = alloc_like_layout(x, p.dim, p.width - 1);
    p.dinitial_states = dinit.data_ptr();
    p.dinit_s = strides3(dinit);
  } else {
    dinit = at::empty({0}, x.options());
  }
  p.deterministic = at::globalContext().deterministicAlgorithms();
  const auto f32 = x.options().dtype(at::kFloat);
  Tensor dw32, db32, ws;
  if (p.deterministic && p.seqlen > 0 && p.batch > 0) {
    dw32 = at::empty({p.dim, p.width}, f32);
    db32 = at::empty({bias.has_value() ? p.dim : 0}, f32);
    ws = at::empty({bwd_num_partials(p), p.dim, p.width + 1}, f32);
    p.workspace = ws.data_ptr<float>();
  } else {
    p.deterministic = false;
    dw32 = at::zeros({p.dim, p.width}, f32);
    db32 = at::zeros({bias.has_value() ? p.dim : 0}, f32);
  }
  p.dweight = dw32.data_ptr<float>();
  p.dbias = bias.has_value() ? db32.data_ptr<float>() : nullptr;
  if (p.seqlen == 0 && return_dinitial_states) {  // no kernel runs: dinit is dfinal (or zeros)
    if (dfinal_states.has_value()) {
      dinit.copy_(*dfinal_states);
    } else {
      dinit.zero_();
    }
  }
  const int vec = vec_elems(p.dtype, p.channel_last, true);
  p.vec_in = vec_ok(x, p.channel_last, vec) && vec_ok(dout, p.channel_last, vec);
  p.vec_out = vec_ok(dx, p.channel_last, vec);
  check_launch(launch_bwd(p, c10::cuda::getCurrentCUDAStream().stream()), "causal_conv1d_bwd");
  Tensor dweight = dw32.to(weight.scalar_type());
  Tensor dbias = bias.has_value() ? db32.to(bias->scalar_type()) : at::empty({0}, weight.options());
  return {dweight, dbias, dinit};
}

Tensor conv_update(const Tensor& x, const Tensor& conv_state, const Tensor& weight, const OptTensor& bias,
                   bool silu_activation, const OptTensor& cache_seqlens, const OptTensor& conv_state_indices) {
  MK_CHECK(x.is_cuda(), "causal_conv1d_update: x must be a CUDA tensor, got device ", x.device());
  MK_CHECK(x.dim() == 3, "causal_conv1d_update: x must be 3-D (batch, dim, seqlen), got shape ", x.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  UpdateParams p;
  p.dtype = to_dtype(x, "x");
  p.batch = x.size(0);
  p.dim = x.size(1);
  p.seqlen = x.size(2);
  Tensor w32 = weight_f32(x, weight, p.dim);
  OptTensor b32 = bias_f32(x, bias, p.dim);
  p.width = int(w32.size(1));
  p.silu = silu_activation;
  check_cuda(conv_state, x, "conv_state");
  MK_CHECK_TYPE(conv_state.scalar_type() == x.scalar_type(),
                   "causal_conv1d_update: conv_state must have x's dtype ", x.scalar_type(), ", got ",
                   conv_state.scalar_type());
  MK_CHECK(conv_state.dim() == 3 && conv_state.size(1) == p.dim,
              "causal_conv1d_update: conv_state must have shape (entries, dim=", p.dim, ", state_len), got ",
              conv_state.sizes());
  p.num_entries = conv_state.size(0);
  p.state_len = conv_state.size(2);
  MK_CHECK(p.state_len >= p.width - 1, "causal_conv1d_update: conv_state.shape[2] (state_len) must be >= width - 1 = ",
              p.width - 1, ", got ", p.state_len);
  if (conv_state_indices.has_value()) {
    const Tensor& ix = *conv_state_indices;
    check_cuda(ix, x, "conv_state_indices");
    MK_CHECK_TYPE(ix.scalar_type() == at::kInt, "causal_conv1d_update: conv_state_indices must be int32, got ",
                     ix.scalar_type());
    check_shape(ix, {p.batch}, "conv_state_indices");
    p.state_indices = ix.data_ptr<int32_t>();
    p.state_indices_s = ix.stride(0);
  } else {
    MK_CHECK(p.num_entries == p.batch, "causal_conv1d_update: conv_state.shape[0] must equal batch=", p.batch,
                " without conv_state_indices, got ", p.num_entries);
  }
  if (cache_seqlens.has_value()) {
    const Tensor& cs = *cache_seqlens;
    check_cuda(cs, x, "cache_seqlens");
    MK_CHECK_TYPE(cs.scalar_type() == at::kInt, "causal_conv1d_update: cache_seqlens must be int32, got ",
                     cs.scalar_type());
    check_shape(cs, {p.batch}, "cache_seqlens");
    p.cache_seqlens = cs.data_ptr<int32_t>();
    p.cache_seqlens_s = cs.stride(0);
  }
  Tensor out = at::empty_like(x);
  p.x = x.data_ptr();
  p.x_s = strides3(x);
  p.out = out.data_ptr();
  p.out_s = strides3(out);
  p.conv_state = conv_state.data_ptr();
  p.state_s = strides3(conv_state);
  p.weight = w32.data_ptr<float>();
  p.bias = b32.has_value() ? b32->data_ptr<float>() : nullptr;
  check_launch(launch_update(p, c10::cuda::getCurrentCUDAStream().stream()), "causal_conv1d_update");
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
