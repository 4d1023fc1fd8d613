// Shared host code of the causal_conv1d ops (see conv_host.h): the same checks, messages and
// parameter fills for the classic and the stable binding.
#include "conv_host.h"

#include <cstdint>

#include "check_msg.h"

namespace mamba_kernels {
namespace causal_conv1d {
namespace {

DType to_dtype(const TensorRef& t, const char* name) {
  switch (t.scalar) {
    case Scalar::kFloat32: return DType::kFloat32;
    case Scalar::kFloat16: return DType::kFloat16;
    case Scalar::kBFloat16: return DType::kBFloat16;
    default:
      MK_CHECK_TYPE(false, "causal_conv1d: ", name, " must be float32, float16 or bfloat16, got ", t.dtype_name);
  }
  return DType::kFloat32;
}

void check_cuda(const TensorRef& t, const TensorRef& x, const char* name) {
  MK_CHECK(t.is_cuda, "causal_conv1d: ", name, " must be a CUDA tensor, got device ", t.device());
  MK_CHECK(t.same_device(x), "causal_conv1d: ", name, " must be on x's device ", x.device(), ", got ", t.device());
}

void check_shape(const TensorRef& t, std::initializer_list<int64_t> want, const char* name) {
  MK_CHECK(t.has_shape(want), "causal_conv1d: ", name, " must have shape ", want, ", got ", t.shape());
}

Strides3 strides3(const TensorRef& t) { return Strides3{t.stride(0), t.stride(1), t.stride(2)}; }

// Channel-last iff dim has unit stride and seqlen a stride > 1 (causal-conv1d's rule, and
// causal_conv1d._checks.layout's).
bool is_channel_last(const TensorRef& x) { return x.stride(1) == 1 && x.stride(2) > 1; }

// The vector path needs unit stride along the vector axis, and the base pointer and the two
// other strides aligned to a whole vector of `vec` elements.
bool vec_ok(const TensorRef& t, bool channel_last, int vec) {
  const int64_t bytes = int64_t(vec) * t.element_size;
  if (reinterpret_cast<uintptr_t>(t.data) % uintptr_t(bytes) != 0) return false;
  const int64_t unit = channel_last ? t.stride(1) : t.stride(2);
  const int64_t other = channel_last ? t.stride(2) : t.stride(1);
  return unit == 1 && t.stride(0) % vec == 0 && other % vec == 0;
}

// A contiguous weight or bias for the kernels, in its own dtype.
WeightRef weight_ref(const TensorRef& t, const char* name) {
  WeightRef w;
  w.ptr = t.data;
  w.dtype = to_dtype(t, name);
  return w;
}

// weight (dim, width) with width 2..4; returns width.
int check_weight(const TensorRef& x, const TensorRef& weight, int64_t dim) {
  check_cuda(weight, x, "weight");
  to_dtype(weight, "weight");
  MK_CHECK(weight.dim == 2 && weight.size(0) == dim, "causal_conv1d: weight must have shape (dim=", dim,
           ", width), got ", weight.shape());
  const int64_t width = weight.size(1);
  MK_CHECK(width >= 2 && width <= 4, "causal_conv1d: width (weight.shape[1]) must be between 2 and 4, got ", width);
  return int(width);
}

void check_bias(const TensorRef& x, const TensorRef& bias, int64_t dim) {
  if (!bias.present) return;
  check_cuda(bias, x, "bias");
  to_dtype(bias, "bias");
  check_shape(bias, {dim}, "bias");
}

void check_state_like(const TensorRef& t, const TensorRef& x, const ConvParams& p, const char* name) {
  check_cuda(t, x, name);
  MK_CHECK_TYPE(t.scalar == x.scalar, "causal_conv1d: ", name, " must have x's dtype ", x.dtype_name, ", got ",
                t.dtype_name);
  check_shape(t, {p.batch, p.dim, p.width - 1}, name);
}

void check_launch(cudaError_t err, const char* what) {
  MK_CHECK(err == cudaSuccess, "causal_conv1d: ", what, " kernel launch failed: ", cudaGetErrorString(err));
}

// What prepare and prepare_update both read from x, weight and bias (messages name `op`).
template <class Params>
void prepare_common(Params& p, const char* op, const TensorRef& x, const TensorRef& weight, const TensorRef& bias,
                    bool silu) {
  MK_CHECK(x.is_cuda, op, ": x must be a CUDA tensor, got device ", x.device());
  MK_CHECK(x.dim == 3, op, ": x must be 3-D (batch, dim, seqlen), got shape ", x.shape());
  p.dtype = to_dtype(x, "x");
  p.batch = x.size(0);
  p.dim = x.size(1);
  p.seqlen = x.size(2);
  p.width = check_weight(x, weight, p.dim);
  check_bias(x, bias, p.dim);
  p.silu = silu;
}

}  // namespace

ConvParams prepare(const TensorRef& x, const TensorRef& weight, const TensorRef& bias, const TensorRef& seq_idx,
                   const TensorRef& initial_states, bool silu) {
  ConvParams p;
  prepare_common(p, "causal_conv1d", x, weight, bias, silu);
  p.channel_last = is_channel_last(x);
  p.x = x.data;
  p.x_s = strides3(x);
  if (seq_idx.present) {
    check_cuda(seq_idx, x, "seq_idx");
    MK_CHECK_TYPE(seq_idx.scalar == Scalar::kInt32, "causal_conv1d: seq_idx must be int32, got ", seq_idx.dtype_name);
    check_shape(seq_idx, {p.batch, p.seqlen}, "seq_idx");
    p.seq_idx = static_cast<const int32_t*>(seq_idx.data);
    p.seq_s_b = seq_idx.stride(0);
    p.seq_s_l = seq_idx.stride(1);
  }
  if (initial_states.present) {
    check_cuda(initial_states, x, "initial_states");
    MK_CHECK_TYPE(initial_states.scalar == x.scalar, "causal_conv1d: initial_states must have x's dtype ",
                  x.dtype_name, ", got ", initial_states.dtype_name);
    check_shape(initial_states, {p.batch, p.dim, p.width - 1}, "initial_states");
    p.initial_states = initial_states.data;
    p.init_s = strides3(initial_states);
  }
  return p;
}

void set_weights(ConvParams& p, const TensorRef& weight, const TensorRef& bias) {
  p.weight = weight_ref(weight, "weight");
  p.bias = bias.present ? weight_ref(bias, "bias") : WeightRef();
}

Alloc3 layout_like(const TensorRef& x, int64_t d1, int64_t d2) {
  const int64_t b = x.size(0);
  if (d1 == x.size(1) && d2 == x.size(2) && non_overlapping_and_dense(x)) {
    return Alloc3{{b, d1, d2}, {x.stride(0), x.stride(1), x.stride(2)}};
  }
  if (is_channel_last(x)) return Alloc3{{b, d1, d2}, {d1 * d2, 1, d1}};
  return Alloc3{{b, d1, d2}, {d1 * d2, d2, 1}};
}

void set_out(ConvParams& p, const TensorRef& out) {
  p.out = out.data;
  p.out_s = strides3(out);
}

void set_final_states(ConvParams& p, const TensorRef& x, const TensorRef& final_states_out) {
  check_state_like(final_states_out, x, p, "final_states_out");
  p.final_states = final_states_out.data;
  p.final_s = strides3(final_states_out);
}

void launch_fwd_checked(ConvParams& p, const TensorRef& x, const TensorRef& out, cudaStream_t stream) {
  const int vec = vec_elems(p.dtype, p.channel_last, false);
  p.vec_in = vec_ok(x, p.channel_last, vec);
  p.vec_out = vec_ok(out, p.channel_last, vec);
  check_launch(launch_fwd(p, stream), "causal_conv1d_fwd");
}

void check_bwd_grads(const ConvParams& p, const TensorRef& x, const TensorRef& dout, const TensorRef& dx) {
  (void)p;
  check_cuda(dout, x, "dout");
  MK_CHECK_TYPE(dout.scalar == x.scalar, "causal_conv1d: dout must have x's dtype ", x.dtype_name, ", got ",
                dout.dtype_name);
  MK_CHECK(dout.same_shape(x), "causal_conv1d: dout must have shape ", x.shape(), ", got ", dout.shape());
  check_cuda(dx, x, "dx");
  MK_CHECK_TYPE(dx.scalar == x.scalar, "causal_conv1d: dx must have x's dtype ", x.dtype_name, ", got ",
                dx.dtype_name);
  MK_CHECK(dx.same_shape(x), "causal_conv1d: dx must have shape ", x.shape(), ", got ", dx.shape());
}

bool dout_needs_relayout(const ConvParams& p, const TensorRef& dout) {
  const bool unit = p.channel_last ? dout.stride(1) == 1 : dout.stride(2) == 1;
  return !unit && p.seqlen > 1 && p.dim > 1;
}

void set_bwd_tensors(ConvParams& p, const TensorRef& x, const TensorRef& dout, const TensorRef& dx,
                     const TensorRef& dfinal_states, const TensorRef& dinitial_states) {
  p.dout = dout.data;
  p.dout_s = strides3(dout);
  p.dx = dx.data;
  p.dx_s = strides3(dx);
  if (dfinal_states.present) {
    check_state_like(dfinal_states, x, p, "dfinal_states");
    p.dfinal_states = dfinal_states.data;
    p.dfinal_s = strides3(dfinal_states);
  }
  if (dinitial_states.present) {
    p.dinitial_states = dinitial_states.data;
    p.dinit_s = strides3(dinitial_states);
  }
}

bool use_deterministic(const ConvParams& p, bool deterministic) {
  return deterministic && p.seqlen > 0 && p.batch > 0;
}

int64_t workspace_rows(const ConvParams& p) { return bwd_num_partials(p); }

void set_bwd_reductions(ConvParams& p, float* dweight, float* dbias, float* workspace) {
  p.dweight = dweight;
  p.dbias = dbias;
  p.workspace = workspace;
}

void launch_bwd_checked(ConvParams& p, const TensorRef& x, const TensorRef& dout, const TensorRef& dx,
                        cudaStream_t stream) {
  const int vec = vec_elems(p.dtype, p.channel_last, true);
  p.vec_in = vec_ok(x, p.channel_last, vec) && vec_ok(dout, p.channel_last, vec);
  p.vec_out = vec_ok(dx, p.channel_last, vec);
  if (!p.deterministic && p.dim > 0) {  // the atomic path adds into dweight / dbias: zero them first
    const size_t bytes = size_t(p.dim) * sizeof(float);
    cudaError_t err = cudaMemsetAsync(p.dweight, 0, bytes * size_t(p.width), stream);
    if (err == cudaSuccess && p.dbias != nullptr) err = cudaMemsetAsync(p.dbias, 0, bytes, stream);
    MK_CHECK(err == cudaSuccess, "causal_conv1d_bwd: zeroing dweight / dbias failed: ", cudaGetErrorString(err));
  }
  check_launch(launch_bwd(p, stream), "causal_conv1d_bwd");
}

UpdateParams prepare_update(const TensorRef& x, const TensorRef& conv_state, const TensorRef& weight,
                            const TensorRef& bias, bool silu, const TensorRef& cache_seqlens,
                            const TensorRef& conv_state_indices) {
  UpdateParams p;
  prepare_common(p, "causal_conv1d_update", x, weight, bias, silu);
  check_cuda(conv_state, x, "conv_state");
  MK_CHECK_TYPE(conv_state.scalar == x.scalar, "causal_conv1d_update: conv_state must have x's dtype ",
                x.dtype_name, ", got ", conv_state.dtype_name);
  MK_CHECK(conv_state.dim == 3 && conv_state.size(1) == p.dim,
           "causal_conv1d_update: conv_state must have shape (entries, dim=", p.dim, ", state_len), got ",
           conv_state.shape());
  p.num_entries = conv_state.size(0);
  p.state_len = conv_state.size(2);
  MK_CHECK(p.state_len >= p.width - 1, "causal_conv1d_update: conv_state.shape[2] (state_len) must be >= width - 1 = ",
           p.width - 1, ", got ", p.state_len);
  if (conv_state_indices.present) {
    const TensorRef& ix = conv_state_indices;
    check_cuda(ix, x, "conv_state_indices");
    MK_CHECK_TYPE(ix.scalar == Scalar::kInt32, "causal_conv1d_update: conv_state_indices must be int32, got ",
                  ix.dtype_name);
    check_shape(ix, {p.batch}, "conv_state_indices");
    p.state_indices = static_cast<const int32_t*>(ix.data);
    p.state_indices_s = ix.stride(0);
  } else {
    MK_CHECK(p.num_entries == p.batch, "causal_conv1d_update: conv_state.shape[0] must equal batch=", p.batch,
             " without conv_state_indices, got ", p.num_entries);
  }
  if (cache_seqlens.present) {
    const TensorRef& cs = cache_seqlens;
    check_cuda(cs, x, "cache_seqlens");
    MK_CHECK_TYPE(cs.scalar == Scalar::kInt32, "causal_conv1d_update: cache_seqlens must be int32, got ",
                  cs.dtype_name);
    check_shape(cs, {p.batch}, "cache_seqlens");
    p.cache_seqlens = static_cast<const int32_t*>(cs.data);
    p.cache_seqlens_s = cs.stride(0);
  }
  p.x = x.data;
  p.x_s = strides3(x);
  p.conv_state = conv_state.data;
  p.state_s = strides3(conv_state);
  return p;
}

void set_update_weights(UpdateParams& p, const TensorRef& weight, const TensorRef& bias) {
  p.weight = weight_ref(weight, "weight");
  p.bias = bias.present ? weight_ref(bias, "bias") : WeightRef();
}

void launch_update_checked(UpdateParams& p, const TensorRef& out, cudaStream_t stream) {
  p.out = out.data;
  p.out_s = strides3(out);
  check_launch(launch_update(p, stream), "causal_conv1d_update");
}

}  // namespace causal_conv1d
}  // namespace mamba_kernels
