// Parameters and launchers of the causal_conv1d kernels. Plain data only: no torch here,
// so the .cu files compile without ATen headers (smaller compile units, less for MSVC to parse).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dtype.h"

namespace mamba_kernels {
namespace causal_conv1d {

// A per-channel parameter (weight (dim, width) or bias (dim,)), contiguous, in its own dtype:
// models keep the conv's weights in the activation dtype, and a copy to fp32 on every call cost
// two extra kernel launches per call (conv_common.cuh: weight_at reads it as fp32).
struct WeightRef {
  const void* ptr = nullptr;  // null: absent (bias only)
  DType dtype = DType::kFloat32;
};

// Full-sequence convolution, forward and backward. x is (batch, dim, seqlen) with any strides;
// channel_last selects the kernel whose vector accesses run along dim (stride(1) == 1).
struct ConvParams {
  DType dtype = DType::kFloat32;  // of x, out, states, dout, dx
  int width = 4;                  // 2..4
  int64_t batch = 0, dim = 0, seqlen = 0;
  bool channel_last = false;
  bool silu = false;
  bool deterministic = false;  // backward: fixed-order reduction instead of atomics
  // Vector (16/8-byte) accesses are allowed for the inputs (x, dout) / outputs (out, dx):
  // unit stride along the vector axis, aligned base and other strides. Otherwise scalar path.
  bool vec_in = false, vec_out = false;

  const void* x = nullptr;
  Strides3 x_s;
  WeightRef weight;  // (dim, width)
  WeightRef bias;    // (dim,) or absent
  const int32_t* seq_idx = nullptr;  // (batch, seqlen) or null
  int64_t seq_s_b = 0, seq_s_l = 0;
  const void* initial_states = nullptr;  // (batch, dim, width - 1) or null
  Strides3 init_s;
  void* final_states = nullptr;  // (batch, dim, width - 1) or null; forward writes it
  Strides3 final_s;

  void* out = nullptr;  // forward output
  Strides3 out_s;

  const void* dout = nullptr;  // backward
  Strides3 dout_s;
  void* dx = nullptr;
  Strides3 dx_s;
  const void* dfinal_states = nullptr;  // or null
  Strides3 dfinal_s;
  void* dinitial_states = nullptr;  // or null
  Strides3 dinit_s;
  // Atomic mode: accumulated into (zeroed) dweight (dim, width) and dbias (dim,), both fp32.
  // Deterministic mode: per-partial sums go to workspace (n_partials, dim, width + 1), then
  // reduce_partials() sums them in a fixed order into dweight / dbias.
  float* dweight = nullptr;
  float* dbias = nullptr;  // or null
  float* workspace = nullptr;
};

// Token-by-token update of a decode cache.
struct UpdateParams {
  DType dtype = DType::kFloat32;  // of x, out, conv_state
  int width = 4;
  int64_t batch = 0, dim = 0, seqlen = 0;
  int64_t state_len = 0, num_entries = 0;
  bool silu = false;
  const void* x = nullptr;
  Strides3 x_s;
  void* out = nullptr;
  Strides3 out_s;
  void* conv_state = nullptr;  // (num_entries, dim, state_len), mutated
  Strides3 state_s;
  WeightRef weight;  // (dim, width)
  WeightRef bias;    // (dim,) or absent
  const int32_t* cache_seqlens = nullptr;  // (batch,) or null: circular-buffer mode
  int64_t cache_seqlens_s = 1;
  const int32_t* state_indices = nullptr;  // (batch,) or null; < 0 marks a padded request
  int64_t state_indices_s = 1;
};

// Each launcher returns the launch's cudaError_t (cudaSuccess when nothing was launched).
cudaError_t launch_fwd(const ConvParams& p, cudaStream_t stream);
// Number of partial sums the backward writes in deterministic mode (workspace rows).
int64_t bwd_num_partials(const ConvParams& p);
cudaError_t launch_bwd(const ConvParams& p, cudaStream_t stream);
cudaError_t launch_update(const UpdateParams& p, cudaStream_t stream);

// Bytes of alignment and the element multiple a tensor needs for the vector path.
int vec_elems(DType dtype, bool channel_last, bool backward);

}  // namespace causal_conv1d
}  // namespace mamba_kernels
