// The lane-per-state layout of the selective-scan kernels for real A and dstate <= 16 (the
// models' case): 16 lanes own one channel, lane n its state n, so a warp holds two channels and
// a block of 256 threads sixteen channels of one (batch, group). Per step a lane does one ex2
// and two FMAs; what depends on the step but not the state (softplus, dt * u, the gate) is
// computed once per channel, each lane taking its own steps, and shared through the warp's
// shared memory; sums over the states (y, and the backward's du / ddelta) are reduce-scatters
// over the 16 lanes, after which lane s holds step s of a 16-step group. Sixteen lanes per
// channel give four times the resident warps of two threads per channel at the same dstate.
#pragma once

#include "scan_common.cuh"

namespace mamba_kernels {
namespace selective_scan {

struct LanePolicy {
  static constexpr int kLanes = 16;                    // lanes per channel, one state each
  static constexpr int kThreads = 256;                 // 16 channels per block
  static constexpr int kChannels = kThreads / kLanes;  // channels per block
  static constexpr int kTile = 32;                     // steps per B/C tile in shared memory
  static constexpr int kGroup = kLanes;                // steps per reduce-scatter
  static constexpr int kRowPad = 4;                    // a B/C tile row is kTile + 4 floats
  static constexpr int kRow = kTile + kRowPad;
  static_assert(kChunk % kTile == 0, "a checkpoint falls at a tile end");
};

// Whether the lane kernels take a problem: real A with at most one state per lane.
__host__ __device__ inline bool lanes_fit(int64_t dstate, bool is_complex) {
  return !is_complex && dstate >= 1 && dstate <= LanePolicy::kLanes;
}

// c ? a : b on values in registers, as bit operations. A plain ?: on two array elements may be
// compiled as a select of their addresses, which moves the whole array to local memory.
__device__ __forceinline__ float select(bool c, float a, float b) {
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
    v[i] = select(upper, hi, lo) + __shfl_xor_sync(kFullMask, select(upper, lo, hi), kO);
  }
}

// v[0, kP) summed over each aligned group of kP lanes (kP = 1, 2, 4, 8 or 16), scattered:
// afterwards lane s of a group (s = lane index mod kP) holds in v[0] the sum of everyone's
// v[s]. log2(kP) rounds, kP - 1 shuffles, adding in a fixed order (bitwise repeatable). All 32
// lanes must call it.
template <int kP>
__device__ __forceinline__ void reduce_scatter(float (&v)[kP], int s) {
  if constexpr (kP >= 16) reduce_scatter_round<8, 8>(v, s);
  if constexpr (kP >= 8) reduce_scatter_round<4, 4>(v, s);
  if constexpr (kP >= 4) reduce_scatter_round<2, 2>(v, s);
  if constexpr (kP >= 2) reduce_scatter_round<1, 1>(v, s);
}
__device__ __forceinline__ void reduce_scatter16(float (&v)[16], int s) { reduce_scatter<16>(v, s); }

// v[0..15] summed over each aligned group of kP lanes, scattered: afterwards lane s of a group
// holds in v[0, 16 / kP) the sums of everyone's v[s * 16 / kP + j]; 16 - 16 / kP shuffles.
template <int kP>
__device__ __forceinline__ void reduce_scatter16_over(float (&v)[16], int s) {
  if constexpr (kP >= 2) reduce_scatter_round<8, kP / 2>(v, s);
  if constexpr (kP >= 4) reduce_scatter_round<4, kP / 4>(v, s);
  if constexpr (kP >= 8) reduce_scatter_round<2, kP / 8>(v, s);
  if constexpr (kP >= 16) reduce_scatter_round<1, kP / 16>(v, s);
}

// kQ consecutive steps [t, t + kQ) of a (batch, channel, L) row in storage type, zero beyond
// `stop`; one vector access when `vec` (unit stride, rows aligned to kQ elements) and the
// steps are all inside.
template <typename T, int kQ>
struct Steps {
  T e[kQ];
};
template <typename T, int kQ>
__device__ __forceinline__ void load_steps(Steps<T, kQ>& r, const T* row, int64_t s_l, int64_t t, int64_t stop,
                                           bool vec) {
  constexpr int kBytes = kQ * int(sizeof(T));
  if constexpr (kBytes == 4 || kBytes == 8 || kBytes == 16) {
    if (vec && t + kQ <= stop) {
      Pack<T, kQ> pk;
      load_pack(pk, row + t);
#pragma unroll
      for (int j = 0; j < kQ; ++j) r.e[j] = pk.e[j];
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kQ; ++j) r.e[j] = t + j < stop ? row[(t + j) * s_l] : from_float<T>(0.0f);
}
template <typename T, int kQ>
__device__ __forceinline__ void store_steps(T* row, int64_t s_l, int64_t t, int64_t stop, const float (&v)[kQ],
                                            bool vec) {
  constexpr int kBytes = kQ * int(sizeof(T));
  if constexpr (kBytes == 4 || kBytes == 8 || kBytes == 16) {
    if (vec && t + kQ <= stop) {
      store_pack<T, kQ>(row + t, v);
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kQ; ++j) {
    if (t + j < stop) row[(t + j) * s_l] = from_float<T>(v[j]);
  }
}

// Whether a (batch, channel, L) tensor allows kQ-element vector access along L.
__host__ __device__ inline bool steps_vec(const void* ptr, const Strides3& s, int elem_size, int kq) {
  const int bytes = kq * elem_size;
  if (ptr == nullptr || s.l != 1 || (bytes != 4 && bytes != 8 && bytes != 16)) return false;
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0 && s.b % kq == 0 && s.c % kq == 0;
}

// Four consecutive steps [t, t + 4) of one row of variable B or C as fp32, zero beyond
// `stop` (the sequence end) or for n >= dstate; one 4-element vector load when `vec`.
template <typename T>
__device__ __forceinline__ void load_bc4(float (&v)[4], const T* row, int64_t s_l, int64_t t, int64_t stop,
                                         bool ok, bool vec) {
  if (ok && vec && t + 4 <= stop) {
    load_floats<T, 4>(v, row + t);
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = (ok && t + i < stop) ? to_float(row[(t + i) * s_l]) : 0.0f;
}

// Whether a variable B/C allows load_bc4's vector path: unit stride along L and every row
// start aligned to 4 elements.
__host__ __device__ inline bool bc_vec4(const BCParams& bc, int elem_size) {
  const int64_t bytes = 4 * int64_t(elem_size);
  return bc.variable && bc.s_l == 1 && reinterpret_cast<uintptr_t>(bc.ptr) % bytes == 0 && bc.s_b % 4 == 0 &&
         bc.s_g % 4 == 0 && bc.s_n % 4 == 0;
}

}  // namespace selective_scan
}  // namespace mamba_kernels
