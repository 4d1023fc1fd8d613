// Shared host code of selective_state_update (see scan_host.h): O(1) checks of every
// precondition the kernel relies on, so a direct op call cannot access memory out of bounds,
// and the StateUpdateParams fill. Nothing is copied or converted: every operand is read in
// place with its dtype and strides.
//
// Not checked, because it needs the index values (a device sync): that state_batch_indices
// are below state.shape[0] and distinct. The kernel turns an index past the cache into a NaN
// output without touching memory; rows sharing a slot race (see selective_state_update.py).
#include <cstdint>

#include "check_msg.h"
#include "scan_host.h"

namespace mamba_kernels {
namespace selective_scan {
namespace {

#define SSU_FN "selective_state_update: "

DType step_dtype(const TensorRef& t, const char* name) {
  switch (t.scalar) {
    case Scalar::kFloat32: return DType::kFloat32;
    case Scalar::kFloat16: return DType::kFloat16;
    case Scalar::kBFloat16: return DType::kBFloat16;
    default:
      MK_CHECK_TYPE(false, SSU_FN, name, " must be float32, float16 or bfloat16 on the CUDA kernel, got ",
                    t.dtype_name);
  }
  return DType::kFloat32;
}

void check_device(const TensorRef& t, const TensorRef& state, const char* name) {
  MK_CHECK(t.same_device(state), SSU_FN, name, " must be on state's device ", state.device(), ", got ", t.device());
}

void check_shape(const TensorRef& t, const int64_t* want, int64_t n, const char* name, const char* rule) {
  MK_CHECK(t.has_shape(want, n), SSU_FN, name, " must have shape ", IntList{want, n}, " (", rule, "), got ",
           t.shape());
}

// Stride of axis i, or 0 when the axis has one element: its index is always 0, and a zero
// stride keeps an arbitrary one from defeating the kernel's vector-alignment test.
int64_t stride_of(const TensorRef& t, int64_t i) { return t.size(i) == 1 ? 0 : t.stride(i); }

// A checked operand with logical axes (a0, a1, a2); an axis index of -1 means the tensor lacks
// that axis (stride 0).
StepOperand operand(const TensorRef& t, const TensorRef& state, const char* name, int a0, int a1, int a2) {
  check_device(t, state, name);
  StepOperand o;
  o.ptr = t.data;
  o.dtype = step_dtype(t, name);
  o.s0 = a0 < 0 ? 0 : stride_of(t, a0);
  o.s1 = a1 < 0 ? 0 : stride_of(t, a1);
  o.s2 = a2 < 0 ? 0 : stride_of(t, a2);
  return o;
}

}  // namespace

StateUpdateParams prepare_state_update(const TensorRef& state, const TensorRef& x, const TensorRef& dt,
                                       const TensorRef& A, const TensorRef& B, const TensorRef& C,
                                       const TensorRef& D, const TensorRef& z, const TensorRef& dt_bias,
                                       bool dt_softplus, const TensorRef& state_batch_indices) {
  MK_CHECK(state.is_cuda, SSU_FN "state must be a CUDA tensor, got device ", state.device());
  MK_CHECK(state.dim == 3 || state.dim == 4,
           SSU_FN "state must be (batch, dim, dstate) or (batch, nheads, dim, dstate), got shape ", state.shape());
  const bool heads = state.dim == 4;
  StateUpdateParams p;
  p.state_dtype = step_dtype(state, "state");
  p.nslots = state.size(0);
  p.nheads = heads ? state.size(1) : 1;
  p.dim = state.size(heads ? 2 : 1);
  p.dstate = state.size(heads ? 3 : 2);
  MK_CHECK(p.dstate >= 1, SSU_FN "dstate (state.shape[-1]) must be >= 1, got ", p.dstate);
  MK_CHECK(p.dstate <= kStateUpdateMaxDstate, SSU_FN "dstate (state.shape[-1]) must be <= ", kStateUpdateMaxDstate,
           " on the CUDA kernel, got ", p.dstate);
  MK_CHECK(!has_internal_overlap(state),
           SSU_FN "state is written in place, so no two of its elements may share memory (an expanded "
                  "tensor?); got strides ",
           state.stride_list());

  MK_CHECK(x.dim == (heads ? 3 : 2), SSU_FN "x must be ", heads ? "(batch, nheads, dim)" : "(batch, dim)",
           ", got shape ", x.shape());
  p.batch = x.size(0);
  // Expected shapes without the heads axis when state is 3-D (fixed arrays: no allocation).
  const int64_t lead[3] = {p.batch, heads ? p.nheads : p.dim, p.dim};
  const int64_t nlead = heads ? 3 : 2;
  const char* lead_rule = heads ? "(batch, nheads, dim), matching state" : "(batch, dim), matching state";
  check_shape(x, lead, nlead, "x", lead_rule);
  check_shape(dt, lead, nlead, "dt", lead_rule);
  // Logical axes: batch, head, dim (and n); -1 where the 3-D layout has no head axis.
  const int hx = heads ? 1 : -1, dx = heads ? 2 : 1;
  p.x = operand(x, state, "x", 0, hx, dx);
  p.dt = operand(dt, state, "dt", 0, hx, dx);
  if (z.present) {
    check_shape(z, lead, nlead, "z", lead_rule);
    p.z = operand(z, state, "z", 0, hx, dx);
  }

  const int ha = heads ? 0 : -1, da = heads ? 1 : 0;
  const int64_t A_a[3] = {heads ? p.nheads : p.dim, heads ? p.dim : p.dstate, p.dstate};
  check_shape(A, A_a, heads ? 3 : 2, "A",
              heads ? "(nheads, dim, dstate), matching state" : "(dim, dstate), matching state");
  p.A = operand(A, state, "A", ha, da, da + 1);

  MK_CHECK(B.dim == (heads ? 3 : 2), SSU_FN "B must be ", heads ? "(batch, ngroups, dstate)" : "(batch, dstate)",
           ", got shape ", B.shape());
  const int64_t ngroups = heads ? B.size(1) : 1;
  MK_CHECK(ngroups >= 1 && p.nheads % ngroups == 0, SSU_FN "nheads must be divisible by ngroups (B.shape[1]): nheads=",
           p.nheads, ", ngroups=", ngroups);
  p.heads_per_group = p.nheads / ngroups;
  const int64_t bc[3] = {p.batch, heads ? ngroups : p.dstate, p.dstate};
  check_shape(B, bc, heads ? 3 : 2, "B", "(batch, [ngroups,] dstate)");
  check_shape(C, bc, heads ? 3 : 2, "C", "same as B");
  const int hb = heads ? 1 : -1, nb = heads ? 2 : 1;
  p.B = operand(B, state, "B", 0, hb, nb);
  p.C = operand(C, state, "C", 0, hb, nb);

  const int64_t per_channel[2] = {heads ? p.nheads : p.dim, p.dim};
  const int64_t nper = heads ? 2 : 1;
  const char* per_channel_rule = heads ? "(nheads, dim), one value per channel" : "(dim,), one value per channel";
  if (D.present) {
    check_shape(D, per_channel, nper, "D", per_channel_rule);
    p.D = operand(D, state, "D", ha, da, -1);
  }
  if (dt_bias.present) {
    check_shape(dt_bias, per_channel, nper, "dt_bias", per_channel_rule);
    p.dt_bias = operand(dt_bias, state, "dt_bias", ha, da, -1);
  }
  p.dt_softplus = dt_softplus;

  if (state_batch_indices.present) {
    const TensorRef& ix = state_batch_indices;
    check_device(ix, state, "state_batch_indices");
    MK_CHECK_TYPE(ix.scalar == Scalar::kInt32 || ix.scalar == Scalar::kInt64,
                  SSU_FN "state_batch_indices must be int32 or int64, got ", ix.dtype_name);
    const int64_t batch[1] = {p.batch};
    check_shape(ix, batch, 1, "state_batch_indices", "(batch,)");
    p.slot_idx = ix.data;
    p.slot_idx_64 = ix.scalar == Scalar::kInt64;
    p.slot_idx_s = stride_of(ix, 0);
  } else {
    MK_CHECK(p.nslots == p.batch, SSU_FN "without state_batch_indices, state.shape[0] must equal the batch ", p.batch,
             ", got ", p.nslots);
  }

  p.state = state.data;
  p.state_s0 = stride_of(state, 0);
  p.state_s1 = heads ? stride_of(state, 1) : 0;
  p.state_s2 = stride_of(state, heads ? 2 : 1);
  p.state_s3 = stride_of(state, heads ? 3 : 2);
  return p;
}

void launch_state_update_checked(StateUpdateParams& p, const TensorRef& state, const TensorRef& out,
                                 cudaStream_t stream) {
  const bool heads = state.dim == 4;
  const int hx = heads ? 1 : -1, dx = heads ? 2 : 1;
  const StepOperand o = operand(out, state, "out", 0, hx, dx);
  p.out = out.data;
  p.out_s0 = o.s0;
  p.out_s1 = o.s1;
  p.out_s2 = o.s2;
  const cudaError_t err = launch_state_update(p, stream);
  MK_CHECK(err == cudaSuccess, SSU_FN "kernel launch failed: ", cudaGetErrorString(err));
}

#undef SSU_FN

}  // namespace selective_scan
}  // namespace mamba_kernels
