// What the decode step's kernels (update_full.cu, update_lean.cu, update_row.cu) and its
// launcher (update.cu) share: the launch shape, 16-byte state chunks, the slot lookup and the
// arithmetic of a chunk's step, which every kernel runs in the same order (so all give the same
// bits). Each kernel kind's launcher is declared at the end and defined beside its kernel.
#pragma once

#include <cstdint>
#include <type_traits>

#include "device_utils.cuh"
#include "scan_policy.cuh"
#include "state_update.h"

namespace mamba_kernels {
namespace selective_scan {
namespace decode {

constexpr int kThreads = UpdatePolicy::kThreads;
constexpr int kMaxLanes = UpdatePolicy::kMaxLanes;

struct AnyDtype {};  // the operand's dtype is read at run time (the generic kernel)

enum Mode : int { kOne = 0, kPair = 1, kWide = 2 };

// n / d for 0 <= n and a fixed 0 < d. When both are below 2^31 (the launcher checks d; the
// kernel checks n), a multiply-high and a shift: q = (umulhi(n, m) + n) >> l with
// l = ceil(log2 d), m = floor(2^32 (2^l - d) / d) + 1, exact for every such n and d. Else a
// 64-bit division (a long subroutine, for sizes no GPU holds today).
__device__ __forceinline__ uint32_t div_by(uint32_t n, uint32_t m, uint32_t l) { return (__umulhi(n, m) + n) >> l; }

struct Divider {
  int64_t d = 1;
  uint32_t m = 1, l = 0;
  bool fits = true;  // d < 2^31

  Divider() = default;
  explicit Divider(int64_t div) : d(div), m(0), l(0), fits(div < (int64_t(1) << 31)) {
    if (!fits) return;
    while ((int64_t(1) << l) < div) ++l;
    m = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << l) - uint64_t(div))) / uint64_t(div) + 1);
  }
  __device__ __forceinline__ int64_t div(int64_t n) const {
    if (fits && (n >> 31) == 0) return int64_t(div_by(uint32_t(n), m, l));
    return n / d;
  }
};

// Host-chosen launch shape, passed by value with the params; uniform over the launch.
struct Shape {
  int lanes_log2 = 0;  // threads per row = 1 << lanes_log2
  int mode = kOne;
  int64_t dblocks = 1;       // blocks along the channel axis
  int64_t block_offset = 0;  // of this launch's first block (launches of at most 2^31 - 1)
  Divider by_dblocks, by_nheads, by_group;  // dblocks, nheads, heads_per_group
  bool state_vec = false;                           // 16-byte state accesses are aligned
  bool A_vec = false, B_vec = false, C_vec = false;  // whole-chunk reads of that operand
  bool A_bcast = false;  // A has stride 0 along the states (one value per channel)
};

// --------------------------------------------------------------------- element conversion

template <typename T>
struct Bits;  // T's bits in the low part of a 32-bit word, and back
template <>
struct Bits<float> {
  static __device__ __forceinline__ float to_f(uint32_t u) { return __uint_as_float(u); }
  static __device__ __forceinline__ uint32_t of(float v) { return __float_as_uint(v); }
};
template <>
struct Bits<__half> {
  static __device__ __forceinline__ float to_f(uint32_t u) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(u & 0xffffu)));
  }
  static __device__ __forceinline__ uint32_t of(float v) { return __half_as_ushort(__float2half_rn(v)); }
};
template <>
struct Bits<__nv_bfloat16> {
  static __device__ __forceinline__ float to_f(uint32_t u) { return __uint_as_float(u << 16); }
  static __device__ __forceinline__ uint32_t of(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};

template <typename T>
__device__ __forceinline__ uint32_t raw_at(const T* p, int64_t i) {
  if constexpr (sizeof(T) == 4) {
    return reinterpret_cast<const uint32_t*>(p)[i];
  } else {
    return reinterpret_cast<const unsigned short*>(p)[i];
  }
}

// ------------------------------------------------------------------------------- chunks

// V consecutive elements of T along the state axis, kept as raw 32-bit words (16-bit values
// two to a word) and converted at use: half the registers of fp32 copies for 16-bit data, and
// stores built from integer words stay single vector stores.
template <typename T, int V>
struct Chunk {
  static constexpr int kPerWord = 4 / int(sizeof(T));
  static constexpr int kWords = V / kPerWord;
  static_assert(kWords == 2 || kWords % 4 == 0, "a chunk is 8 bytes or whole 16-byte words");
  uint32_t u[kWords];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int w = 0; w < kWords; ++w) u[w] = 0;
  }
  __device__ __forceinline__ float get(int i) const {
    if constexpr (kPerWord == 1) {
      return Bits<T>::to_f(u[i]);
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      const uint32_t w = u[i / 2];
      return __uint_as_float((i & 1) ? (w & 0xffff0000u) : (w << 16));
    } else {
      return Bits<T>::to_f((i & 1) ? u[i / 2] >> 16 : u[i / 2]);
    }
  }
  __device__ __forceinline__ void set(int i, float v) {
    if constexpr (kPerWord == 1) {
      u[i] = Bits<T>::of(v);
    } else if (i & 1) {
      u[i / 2] = (u[i / 2] & 0xffffu) | (Bits<T>::of(v) << 16);
    } else {
      u[i / 2] = (u[i / 2] & 0xffff0000u) | Bits<T>::of(v);
    }
  }
  // Whole chunk from / to p (aligned to min(16, V * sizeof(T)) bytes): 8- or 16-byte accesses.
  __device__ __forceinline__ void load_vec(const T* p) {
    if constexpr (kWords == 2) {
      const uint2 w = *reinterpret_cast<const uint2*>(p);
      u[0] = w.x, u[1] = w.y;
    } else {
#pragma unroll
      for (int q = 0; q < kWords / 4; ++q) {
        const uint4 w = reinterpret_cast<const uint4*>(p)[q];
        u[4 * q] = w.x, u[4 * q + 1] = w.y, u[4 * q + 2] = w.z, u[4 * q + 3] = w.w;
      }
    }
  }
  __device__ __forceinline__ void store_vec(T* p) const {
    if constexpr (kWords == 2) {
      *reinterpret_cast<uint2*>(p) = make_uint2(u[0], u[1]);
    } else {
#pragma unroll
      for (int q = 0; q < kWords / 4; ++q) {
        reinterpret_cast<uint4*>(p)[q] = make_uint4(u[4 * q], u[4 * q + 1], u[4 * q + 2], u[4 * q + 3]);
      }
    }
  }
  // Elements i < valid from p at `stride` elements apart; the rest 0. (A chunk past the row is
  // all zeros: it then adds nothing to the row's sum.)
  __device__ __forceinline__ void load_elems(const T* p, int64_t stride, int valid) {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      uint32_t word = 0;
#pragma unroll
      for (int k = 0; k < kPerWord; ++k) {
        const int i = w * kPerWord + k;
        if (i < valid) word |= raw_at(p, i * stride) << (16 * k);
      }
      u[w] = word;
    }
  }
  __device__ __forceinline__ void store_elems(T* p, int64_t stride, int valid) const {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if (i < valid) {
        const uint32_t w = u[i / kPerWord];
        if constexpr (kPerWord == 1) {
          reinterpret_cast<uint32_t*>(p)[i * stride] = w;
        } else {
          reinterpret_cast<unsigned short*>(p)[i * stride] = static_cast<unsigned short>((i & 1) ? w >> 16 : w);
        }
      }
    }
  }
};

// ----------------------------------------------------------------------- the step

// The slot row b reads and writes: b itself, or state_batch_indices[b] (int64 or int32 indices,
// `stride` apart). Every decode kernel reads it here, in its own offset type I.
template <typename I>
__device__ __forceinline__ int64_t slot_of(const void* idx, bool idx_64, I stride, I b) {
  if (idx == nullptr) return b;
  const I o = b * stride;
  return idx_64 ? static_cast<const int64_t*>(idx)[o] : int64_t(static_cast<const int32_t*>(idx)[o]);
}

__device__ __forceinline__ float softplus(float v) { return v <= 20.0f ? log1pf(expf(v)) : v; }

// Butterfly sum over the row's lanes (all 32 lanes of the warp call it; `lanes` is uniform).
__device__ __forceinline__ float row_sum(float v, int lanes) {
#pragma unroll
  for (int off = 1; off < kMaxLanes; off <<= 1) {
    if (off < lanes) v += __shfl_xor_sync(kFullMask, v, off);
  }
  return v;
}

// One chunk of a row's step: state = exp(a dt) state + B (dt x), in place; returns the chunk's
// part of the output, sum C state. A chunk that is not there was read as zeros (state, A, B
// and C), so it adds exactly 0. Every decode kernel runs it, in this order of operations.
template <typename S, typename TA, typename T, int V>
__device__ __forceinline__ float chunk_step(Chunk<S, V>& s, const Chunk<TA, V>& a, const Chunk<T, V>& B,
                                            const Chunk<T, V>& C, float dtv, float dtx) {
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const float v = __expf(a.get(i) * dtv) * s.get(i) + B.get(i) * dtx;
    acc += C.get(i) * v;
    s.set(i, v);
  }
  return acc;
}

// --------------------------------------------------------------------------- launchers

// Every (state, activation) dtype pair update.cu launches, as X(S, T): the kind files instantiate
// their launchers over it.
#define MK_DECODE_DTYPE_PAIRS(X)                                                 \
  X(float, float) X(float, __half) X(float, __nv_bfloat16)                       \
  X(__half, float) X(__half, __half) X(__half, __nv_bfloat16)                    \
  X(__nv_bfloat16, float) X(__nv_bfloat16, __half) X(__nv_bfloat16, __nv_bfloat16)

// state_update_kernel<S, T> (update_full.cu), T an activation dtype or AnyDtype.
template <typename S, typename T>
cudaError_t launch_kernel(const StateUpdateParams& p, Shape sh, cudaStream_t stream);

// state_update_lean<S, T, kP> (update_lean.cu), which picks kP.
template <typename S, typename T>
cudaError_t launch_lean(const StateUpdateParams& p, const Shape& sh, cudaStream_t stream);

// state_update_row<S, T, kMamba1> (update_row.cu), which picks kMamba1.
template <typename S, typename T>
cudaError_t launch_row(const StateUpdateParams& p, const Shape& sh, cudaStream_t stream);

}  // namespace decode
}  // namespace selective_scan
}  // namespace mamba_kernels
