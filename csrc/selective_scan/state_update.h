// Parameters and launcher of the selective_state_update decode kernel (one token of the scan).
// Plain data only: no torch here, so the .cu files compile without ATen headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dtype.h"

namespace mamba_kernels {
namespace selective_scan {

// A read-only operand of the step: base pointer, storage dtype and element strides. The axes
// are named by the operand (see StateUpdateParams); an axis the operand lacks has stride 0.
struct StepOperand {
  const void* ptr = nullptr;  // null: an absent optional operand (D, z, dt_bias)
  DType dtype = DType::kFloat32;
  int64_t s0 = 0, s1 = 0, s2 = 0;
};

// One decode step in the heads form (the binding maps the 3-D layout to nheads == 1):
//   dt'   = softplus(dt + dt_bias) (softplus only with dt_softplus; identity above 20)
//   state = exp(dt' * A) * state + dt' * x * B
//   out   = (sum_n C * state + D * x) * silu(z)   (D and the gate only when given)
// Every operand is read in place with its own dtype and strides. The kernel is compiled for
// each (state dtype, activation dtype) pair with fp32 A, and once per state dtype for any other
// mix of dtypes or layouts (update.cu says which runs when).
struct StateUpdateParams {
  DType state_dtype = DType::kFloat32;
  int64_t batch = 0, nheads = 0, dim = 0, dstate = 0;
  int64_t heads_per_group = 1;  // nheads / ngroups: head h reads B and C of group h / this
  int64_t nslots = 0;           // state.shape[0]
  bool dt_softplus = false;

  void* state = nullptr;  // (slot, head, dim, n), read and written in place
  int64_t state_s0 = 0, state_s1 = 0, state_s2 = 0, state_s3 = 0;

  StepOperand x, dt, z;    // (batch, head, dim); z may be absent
  StepOperand A;           // (head, dim, n)
  StepOperand B, C;        // (batch, group, n)
  StepOperand D, dt_bias;  // (head, dim, -), either may be absent

  void* out = nullptr;  // (batch, head, dim), x's dtype
  int64_t out_s0 = 0, out_s1 = 0, out_s2 = 0;

  // (batch,) int32 or int64, or null (row b uses slot b). A negative index is a padded row:
  // output 0, no slot touched. An index >= nslots touches no memory either: its output is NaN,
  // so a bad index shows instead of being read as padding.
  const void* slot_idx = nullptr;
  bool slot_idx_64 = false;
  int64_t slot_idx_s = 1;
};

constexpr int64_t kStateUpdateMaxDstate = 256;

// Returns the launch's cudaError_t (cudaSuccess when there is nothing to do), or
// cudaErrorInvalidValue for a dstate above kStateUpdateMaxDstate.
cudaError_t launch_state_update(const StateUpdateParams& p, cudaStream_t stream);

}  // namespace selective_scan
}  // namespace mamba_kernels
