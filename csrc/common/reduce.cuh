// Warp and block reductions shared by the conv and scan kernels. Every sum here adds in a
// fixed order (a butterfly over lanes, then warps in index order), so a result does not depend
// on scheduling: repeated runs agree bitwise. Blocks are 1-D and made of whole warps.
#pragma once

#include <cuda_runtime.h>

namespace mamba_kernels {

constexpr unsigned kFullMask = 0xffffffffu;  // every lane of the warp takes part
constexpr int kWarpSize = 32;

// Sum of v over each aligned group of kWidth consecutive lanes (kWidth a power of two, 1..32);
// every lane of a group gets the group's total. All 32 lanes must call it.
template <int kWidth>
__device__ __forceinline__ float warp_sum_width(float v) {
  static_assert(kWidth >= 1 && kWidth <= kWarpSize && (kWidth & (kWidth - 1)) == 0,
                "group width: a power of two up to 32");
#pragma unroll
  for (int off = kWidth / 2; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

// Sum of v over the warp (butterfly), returned in every lane.
__device__ __forceinline__ float warp_sum(float v) { return warp_sum_width<kWarpSize>(v); }

// Element-wise warp_sum of kN values in place. One butterfly for all of them: the kN
// shuffles of a round are independent, so their latencies overlap.
template <int kN>
__device__ __forceinline__ void warp_sum(float (&v)[kN]) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off >>= 1) {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] += __shfl_xor_sync(kFullMask, v[i], off);
  }
}

// warp_sum of kN values and one more kept apart (say, a weight gradient and its bias), in
// place, with one butterfly for all of them.
template <int kN>
__device__ __forceinline__ void warp_sum(float (&v)[kN], float& u) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off >>= 1) {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] += __shfl_xor_sync(kFullMask, v[i], off);
    u += __shfl_xor_sync(kFullMask, u, off);
  }
}

// *dst += the warp's total of v, as one atomic from lane 0 (32x fewer atomics than per lane).
__device__ __forceinline__ void warp_sum_atomic_add(float v, float* dst) {
  v = warp_sum(v);
  if ((threadIdx.x & (kWarpSize - 1)) == 0) atomicAdd(dst, v);
}

// dst[i] += the warp's total of v[i], i < kN: one butterfly, then kN atomics from lane 0.
template <int kN>
__device__ __forceinline__ void warp_sum_atomic_add(float (&v)[kN], float* dst) {
  warp_sum(v);
  if ((threadIdx.x & (kWarpSize - 1)) == 0) {
#pragma unroll
    for (int i = 0; i < kN; ++i) atomicAdd(dst + i, v[i]);
  }
}

// Sum of v over a block of kWarps warps, returned in every thread. smem: kWarps floats of
// shared memory, free again when the call returns. Synchronises the block twice, so every
// thread must call it.
template <int kWarps>
__device__ __forceinline__ float block_sum(float v, float* smem) {
  v = warp_sum(v);
  const int warp = int(threadIdx.x) / kWarpSize;
  if ((threadIdx.x & (kWarpSize - 1)) == 0) smem[warp] = v;
  __syncthreads();
  float total = smem[0];
#pragma unroll
  for (int r = 1; r < kWarps; ++r) total += smem[r];
  __syncthreads();  // every thread has read smem before anyone may reuse it
  return total;
}

// Fixed-order sums of per-warp partials in shared memory, red[r] written by warp r: element
// i (or [k][i]) of red[0] + red[1] + ... + red[kWarps-1]. The caller writes the partials and
// synchronises first; the block's threads then share the elements out among themselves.
template <int kWarps, int L>
__device__ __forceinline__ float sum_over_warps(const float (&red)[kWarps][L], int i) {
  float v = red[0][i];
#pragma unroll
  for (int r = 1; r < kWarps; ++r) v += red[r][i];
  return v;
}

template <int kWarps, int K, int L>
__device__ __forceinline__ float sum_over_warps(const float (&red)[kWarps][K][L], int k, int i) {
  float v = red[0][k][i];
#pragma unroll
  for (int r = 1; r < kWarps; ++r) v += red[r][k][i];
  return v;
}

// c ? a : b on values in registers, as bit operations. A plain ?: on two array elements may be
// compiled as a select of their addresses, which moves the whole array to local memory.
__device__ __forceinline__ float select_bits(bool c, float a, float b) {
  const unsigned m = 0u - unsigned(c);
  return __uint_as_float((__float_as_uint(a) & m) | (__float_as_uint(b) & ~m));
}

// One round of a reduce-scatter: lanes kO apart exchange halves of v[0, 2 kHalf); each keeps
// the sum of the half its bit selects in v[0, kHalf).
template <int kHalf, int kO, int kN>
__device__ __forceinline__ void reduce_scatter_round(float (&v)[kN], int s) {
  const bool upper = (s & kO) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float lo = v[i], hi = v[i + kHalf];
    v[i] = select_bits(upper, hi, lo) + __shfl_xor_sync(kFullMask, select_bits(upper, lo, hi), kO);
  }
}

// v[0, kN) (kN = 16 or 32) summed over each aligned group of kP lanes, scattered: afterwards
// lane s of a group holds in v[0, kN / kP) the sums of everyone's v[s * kN / kP + j];
// kN - kN / kP shuffles, adding in a fixed order (bitwise repeatable: a step's sum is the same
// tree of lanes whatever kN). All 32 lanes must call it.
template <int kP, int kN>
__device__ __forceinline__ void reduce_scatter_over(float (&v)[kN], int s) {
  static_assert(kN == 16 || kN == 32, "16 or 32 values");
  if constexpr (kP >= 2) reduce_scatter_round<kN / 2, kP / 2>(v, s);
  if constexpr (kP >= 4) reduce_scatter_round<kN / 4, kP / 4>(v, s);
  if constexpr (kP >= 8) reduce_scatter_round<kN / 8, kP / 8>(v, s);
  if constexpr (kP >= 16) reduce_scatter_round<kN / 16, kP / 16>(v, s);
}

}  // namespace mamba_kernels
