// Helpers of the SSD's state-passing walks (csrc/ssd/fwd.cu, csrc/ssd/bwd.cu) and the backward's
// sums: a thread's run of consecutive state elements, and a deterministic block sum.
#pragma once

#include <cuda_runtime.h>

namespace mamba_kernels {
namespace ssd {

// kV consecutive fp32 state elements of one thread, moved as one 16-byte access when kV is 4
// (the caller guarantees the alignment: our contiguous fp32 buffers, offsets multiples of 4).
template <int kV>
struct Lanes {
  static_assert(kV == 1 || kV == 4, "one float or one float4");
  float v[kV];

  __device__ __forceinline__ void fill(float x) {
#pragma unroll
    for (int i = 0; i < kV; ++i) v[i] = x;
  }
  __device__ __forceinline__ void load(const float* src) {
    if constexpr (kV == 4) {
      const float4 q = *reinterpret_cast<const float4*>(src);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
      v[0] = *src;
    }
  }
  __device__ __forceinline__ void store(float* dst) const {
    if constexpr (kV == 4) {
      *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      *dst = v[0];
    }
  }
};

// The sum of v over the block, valid in every thread; every thread must call it. A fixed tree:
// xor shuffles within each warp (lane 0's result, the same pairing every run), then the warps'
// sums in warp order. red holds at least NT / 32 floats.
template <int NT>
__device__ __forceinline__ float block_sum(float v, float* red) {
  static_assert(NT % 32 == 0, "whole warps");
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float r = 0.0f;
#pragma unroll
  for (int w = 0; w < NT / 32; ++w) r += red[w];
  __syncthreads();
  return r;
}

}  // namespace ssd
}  // namespace mamba_kernels
