// torch.library binding of the selective_state_update decode kernel: O(1) checks of every
// precondition the kernel relies on (so a direct op call cannot access memory out of bounds),
// then tensors become a plain StateUpdateParams and the kernel runs on the current stream.
// Nothing is copied or converted: every operand is read in place with its dtype and strides,
// and the only allocation is the output. The fake implementation is in
// selective_scan/_update_ops.py.
//
// Not checked here, because it needs the index values (a device sync): that state_batch_indices
// are below state.shape[0] and distinct. The kernel turns an index past the cache into a NaN
// output without touching memory; rows sharing a slot race (see selective_state_update.py).
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "check_msg.h"
#include "state_update.h"

namespace mamba_kernels {
namespace selective_scan {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

#define SSU_FN "selective_state_update: "

DType step_dtype(const Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default:
      MK_CHECK_TYPE(false, SSU_FN, name, " must be float32, float16 or bfloat16 on the CUDA kernel, got ",
                    t.scalar_type());
  }
  return DType::kFloat32;
}

void check_device(const Tensor& t, const Tensor& state, const char* name) {
  MK_CHECK(t.device() == state.device(), SSU_FN, name, " must be on state's device ", state.device(), ", got ",
           t.device());
}

void check_shape(const Tensor& t, at::IntArrayRef want, const char* name, const char* rule) {
  MK_CHECK(t.sizes() == want, SSU_FN, name, " must have shape ", want, " (", rule, "), got ", t.sizes());
}

// Stride of axis i, or 0 when the axis has one element: its index is always 0, and a zero
// stride keeps an arbitrary one from defeating the kernel's vector-alignment test.
int64_t stride_of(const Tensor& t, int64_t i) { return t.size(i) == 1 ? 0 : t.stride(i); }

// A checked operand with logical axes (a0, a1, a2); an axis index of -1 means the tensor lacks
// that axis (stride 0).
StepOperand operand(const Tensor& t, const Tensor& state, const char* name, int a0, int a1, int a2) {
  check_device(t, state, name);
  StepOperand o;
  o.ptr = t.data_ptr();
  o.dtype = step_dtype(t, name);
  o.s0 = a0 < 0 ? 0 : stride_of(t, a0);
  o.s1 = a1 < 0 ? 0 : stride_of(t, a1);
  o.s2 = a2 < 0 ? 0 : stride_of(t, a2);
  return o;
}

Tensor state_update(const Tensor& state, const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B,
                    const Tensor& C, const OptTensor& D, const OptTensor& z, const OptTensor& dt_bias,
                    bool dt_softplus, const OptTensor& state_batch_indices) {
  MK_CHECK(state.is_cuda(), SSU_FN "state must be a CUDA tensor, got device ", state.device());
  MK_CHECK(state.dim() == 3 || state.dim() == 4,
           SSU_FN "state must be (batch, dim, dstate) or (batch, nheads, dim, dstate), got shape ", state.sizes());
  const bool heads = state.dim() == 4;
  StateUpdateParams p;
  p.state_dtype = step_dtype(state, "state");
  p.nslots = state.size(0);
  p.nheads = heads ? state.size(1) : 1;
  p.dim = state.size(heads ? 2 : 1);
  p.dstate = state.size(heads ? 3 : 2);
  MK_CHECK(p.dstate <= kStateUpdateMaxDstate, SSU_FN "dstate (state.shape[-1]) must be <= ",
           kStateUpdateMaxDstate, " on the CUDA kernel, got ", p.dstate);
  MK_CHECK(at::has_internal_overlap(state) != at::MemOverlap::Yes,
           SSU_FN "state is written in place, so no two of its elements may share memory (an expanded "
              "tensor?); got strides ",
           state.strides());
  const c10::cuda::CUDAGuard guard(state.device());

  MK_CHECK(x.dim() == (heads ? 3 : 2), SSU_FN "x must be ", heads ? "(batch, nheads, dim)" : "(batch, dim)",
           ", got shape ", x.sizes());
  p.batch = x.size(0);
  // Expected shapes without the heads axis when state is 3-D (fixed arrays: no allocation).
  const int64_t lead_a[3] = {p.batch, heads ? p.nheads : p.dim, p.dim};
  const at::IntArrayRef lead(lead_a, heads ? 3 : 2);
  const char* lead_rule = heads ? "(batch, nheads, dim), matching state" : "(batch, dim), matching state";
  check_shape(x, lead, "x", lead_rule);
  check_shape(dt, lead, "dt", lead_rule);
  // Logical axes: batch, head, dim (and n); -1 where the 3-D layout has no head axis.
  const int hx = heads ? 1 : -1, dx = heads ? 2 : 1;
  p.x = operand(x, state, "x", 0, hx, dx);
  p.dt = operand(dt, state, "dt", 0, hx, dx);
  if (z.has_value()) {
    check_shape(*z, lead, "z", lead_rule);
    p.z = operand(*z, state, "z", 0, hx, dx);
  }

  const int ha = heads ? 0 : -1, da = heads ? 1 : 0;
  const int64_t A_a[3] = {heads ? p.nheads : p.dim, heads ? p.dim : p.dstate, p.dstate};
  check_shape(A, at::IntArrayRef(A_a, heads ? 3 : 2), "A", heads ? "(nheads, dim, dstate), matching state" : "(dim, dstate), matching state");
  p.A = operand(A, state, "A", ha, da, da + 1);

  MK_CHECK(B.dim() == (heads ? 3 : 2), SSU_FN "B must be ", heads ? "(batch, ngroups, dstate)" : "(batch, dstate)",
           ", got shape ", B.sizes());
  const int64_t ngroups = heads ? B.size(1) : 1;
  MK_CHECK(ngroups >= 1 && p.nheads % ngroups == 0, SSU_FN "nheads must be divisible by ngroups (B.shape[1]): nheads=",
           p.nheads, ", ngroups=", ngroups);
  p.heads_per_group = p.nheads / ngroups;
  const int64_t bc_a[3] = {p.batch, heads ? ngroups : p.dstate, p.dstate};
  const at::IntArrayRef bc(bc_a, heads ? 3 : 2);
  check_shape(B, bc, "B", "(batch, [ngroups,] dstate)");
  check_shape(C, bc, "C", "same as B");
  const int hb = heads ? 1 : -1, nb = heads ? 2 : 1;
  p.B = operand(B, state, "B", 0, hb, nb);
  p.C = operand(C, state, "C", 0, hb, nb);

  const int64_t per_channel_a[2] = {heads ? p.nheads : p.dim, p.dim};
  const at::IntArrayRef per_channel(per_channel_a, heads ? 2 : 1);
  const char* per_channel_rule = heads ? "(nheads, dim), one value per channel" : "(dim,), one value per channel";
  if (D.has_value()) {
    check_shape(*D, per_channel, "D", per_channel_rule);
    p.D = operand(*D, state, "D", ha, da, -1);
  }
  if (dt_bias.has_value()) {
    check_shape(*dt_bias, per_channel, "dt_bias", per_channel_rule);
    p.dt_bias = operand(*dt_bias, state, "dt_bias", ha, da, -1);
  }
  p.dt_softplus = dt_softplus;

  if (state_batch_indices.has_value()) {
    const Tensor& ix = *state_batch_indices;
    check_device(ix, state, "state_batch_indices");
    MK_CHECK_TYPE(ix.scalar_type() == at::kInt || ix.scalar_type() == at::kLong,
                  SSU_FN "state_batch_indices must be int32 or int64, got ", ix.scalar_type());
    check_shape(ix, {p.batch}, "state_batch_indices", "(batch,)");
    p.slot_idx = ix.data_ptr();
    p.slot_idx_64 = ix.scalar_type() == at::kLong;
    p.slot_idx_s = stride_of(ix, 0);
  } else {
    MK_CHECK(p.nslots == p.batch, SSU_FN "without state_batch_indices, state.shape[0] must equal the batch ", p.batch,
             ", got ", p.nslots);
  }

  p.state = state.data_ptr();
  p.state_s0 = stride_of(state, 0);
  p.state_s1 = heads ? stride_of(state, 1) : 0;
  p.state_s2 = stride_of(state, heads ? 2 : 1);
  p.state_s3 = stride_of(state, heads ? 3 : 2);

  Tensor out = at::empty_like(x);
  const StepOperand o = operand(out, state, "out", 0, hx, dx);
  p.out = out.data_ptr();
  p.out_s0 = o.s0;
  p.out_s1 = o.s1;
  p.out_s2 = o.s2;
  const cudaError_t err = launch_state_update(p, c10::cuda::getCurrentCUDAStream().stream());
  MK_CHECK(err == cudaSuccess, SSU_FN "kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

#undef SSU_FN

}  // namespace

TORCH_LIBRARY_FRAGMENT(mamba_kernels, m) {
  m.def(
      "selective_state_update(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
      "Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, Tensor? state_batch_indices) -> Tensor");
}

TORCH_LIBRARY_IMPL(mamba_kernels, CUDA, m) { m.impl("selective_state_update", &state_update); }

}  // namespace selective_scan
}  // namespace mamba_kernels
