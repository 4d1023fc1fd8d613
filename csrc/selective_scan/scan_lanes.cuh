// Shared pieces of the lane kernels for real A and dstate <= 16 (the models' case), where a
// channel's states are spread over several lanes of a warp (fwd_lanes.cu: 4, 2 or 1 states per
// lane; bwd_lanes.cu: one). What depends on the step but not on the state (softplus, dt * u, the
// gate) is computed once per channel and shared through the warp's shared memory; sums over
// the states are reduce-scatters over the channel's lanes, after which each lane holds whole
// steps. Spreading the states gives four to sixteen times the resident warps of two threads
// per channel at the same dstate.
#pragma once

#include "scan_common.cuh"
#include "scan_policy.cuh"

namespace mamba_kernels {
namespace selective_scan {


// Whether the lane kernels take a problem: real A with at most one state per lane.
__host__ __device__ inline bool lanes_fit(int64_t dstate, bool is_complex) {
  return !is_complex && dstate >= 1 && dstate <= LanePolicy::kLanes;
}

// kQ consecutive steps [t, t + kQ) of a (batch, channel, L) row in storage type, zero beyond
// `stop`; one vector access when `vec` (unit stride, rows aligned to kQ elements) and the
// steps are all inside. Steps that fit one vector are kept as its raw words and converted only
// where read (at()): unpacking 16-bit elements on arrival would wait for the load there and
// undo the prefetch.
template <typename T, int kQ, bool kWords = (kQ * sizeof(T) == 4 || kQ * sizeof(T) == 8 || kQ * sizeof(T) == 16)>
struct Steps {
  T e[kQ];
  __device__ __forceinline__ float at(int j) const { return to_float(e[j]); }
  __device__ __forceinline__ void set(int j, T v) { e[j] = v; }
};
template <typename T, int kQ>
struct Steps<T, kQ, true> {
  static constexpr int kPer = 4 / int(sizeof(T));  // elements per 32-bit word
  static constexpr int kWords = kQ / kPer;
  uint32_t w[kWords];  // 32-bit words throughout: no 16-bit registers to unpack into on arrival
  __device__ __forceinline__ float at(int j) const {
    const uint32_t word = w[j / kPer];
    if constexpr (sizeof(T) == 4) {
      return __uint_as_float(word);
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      return __uint_as_float(j % 2 ? word & 0xffff0000u : word << 16);
    } else {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(j % 2 ? word >> 16 : word & 0xffffu)));
    }
  }
  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = 0;
  }
  __device__ __forceinline__ void set(int j, T v) {  // after clear()
    uint32_t bits;
    if constexpr (sizeof(T) == 4) {
      bits = __float_as_uint(v);
    } else {
      bits = *reinterpret_cast<const unsigned short*>(&v);
    }
    w[j / kPer] |= bits << (32 / kPer * (j % kPer));
  }
  __device__ __forceinline__ void load(const T* ptr) {
    using W = typename RawWord<kQ * int(sizeof(T))>::type;
    const W v = *reinterpret_cast<const W*>(ptr);
    static_assert(sizeof(W) == sizeof(w), "one vector");
    memcpy(w, &v, sizeof(w));
  }
};
// The kQ steps from `at` (a lane's first step; stride s_l), of which `left` (possibly <= 0)
// are inside the sequence; the rest read as zero. Kernels advance `at` one tile at a time, so
// no step index is multiplied by a stride.
template <typename T, int kQ, bool kW>
__device__ __forceinline__ void load_steps_at(Steps<T, kQ, kW>& r, const T* at, int64_t s_l, int64_t left,
                                              bool vec) {
  if constexpr (kW) {
    if (vec && left >= kQ) {
      r.load(at);
      return;
    }
    r.clear();
#pragma unroll
    for (int j = 0; j < kQ; ++j) {
      if (j < left) r.set(j, at[j * s_l]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kQ; ++j) r.set(j, j < left ? at[j * s_l] : from_float<T>(0.0f));
  }
}
template <typename T, int kQ, bool kW>
__device__ __forceinline__ void load_steps(Steps<T, kQ, kW>& r, const T* row, int64_t s_l, int64_t t, int64_t stop,
                                           bool vec) {
  load_steps_at(r, row + t * s_l, s_l, stop - t, vec);
}
// Stores the first `left` of kQ steps at `at` (one vector store when `vec` and all are inside).
template <typename T, int kQ>
__device__ __forceinline__ void store_steps_at(T* at, int64_t s_l, int64_t left, const float (&v)[kQ], bool vec) {
  constexpr int kBytes = kQ * int(sizeof(T));
  if constexpr (kBytes == 4 || kBytes == 8 || kBytes == 16) {
    if (vec && left >= kQ) {
      store_pack<T, kQ>(at, v);
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kQ; ++j) {
    if (j < left) at[j * s_l] = from_float<T>(v[j]);
  }
}
template <typename T, int kQ>
__device__ __forceinline__ void store_steps(T* row, int64_t s_l, int64_t t, int64_t stop, const float (&v)[kQ],
                                            bool vec) {
  store_steps_at(row + t * s_l, s_l, stop - t, v, vec);
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
