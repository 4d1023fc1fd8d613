// Device helpers shared by the selective-scan forward and backward kernels: per-channel row
// tiles (16-byte vector I/O when the tensor allows it), the discretisation of delta, the decay
// exp(dt A) for real and complex A, and the dtype switch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "device_utils.cuh"
#include "selective_scan.h"

namespace mamba_kernels {
namespace selective_scan {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kSoftplusThreshold = 20.0f;

// Kept state k of channel bd (= b * dim + d): a pointer to its state 0, whose kF floats (2 for
// complex A) are followed by state n's at n * kF * ckpt_elem_step(p). Slot k is contiguous, or
// with ckpt_pairs interleaved with its pair's other slot: (b, d, count / 2, dstate, 2) order.
__device__ __forceinline__ int ckpt_elem_step(const ScanParams& p) { return p.ckpt_pairs ? 2 : 1; }
__device__ __forceinline__ float* ckpt_slot(const ScanParams& p, int64_t bd, int64_t k, int64_t nf, int kF) {
  const int64_t e = ckpt_elem_step(p);
  return p.ckpt + (bd * p.ckpt_count + (k & -e)) * nf + (k & (e - 1)) * kF;
}

// 2^x on the special-function unit (relative error about 2^-22; flushes denormal results).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A log2(e) with +-inf replaced by the largest finite float (NaN kept). The decay of every step
// with dt > 0 is unchanged (it still underflows to 0 or overflows to inf); a step with dt = 0
// -- the padding past the end of the sequence, or a softplus that underflowed -- keeps its
// state, which is the limit of exp(0 A), where the literal 0 * inf would make it NaN.
__host__ __device__ __forceinline__ float clamp_finite(float a) {
  constexpr float kMax = 3.4028234663852886e38f;
  return a < -kMax ? -kMax : (a > kMax ? kMax : a);
}

// log(1 + e^x), identity above the threshold, without branches. log1p(e) is formed as
// log(w) * e / (w - 1) with w = 1 + e (exact for tiny e, where w rounds to 1): three
// special-function operations instead of the long log1pf sequence. Results below 2^-126 flush
// to zero, as in the decay.
__device__ __forceinline__ float softplus(float x) {
  const float e = fast_exp2(x * kLog2e);
  const float w = 1.0f + e;
  float lg, r;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(lg) : "f"(w));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(w - 1.0f));
  const float l1p = w == 1.0f ? e : lg * kLn2 * (e * r);
  return x > kSoftplusThreshold ? x : l1p;
}

// d softplus(x) / dx = sigmoid(x) (1 above the threshold, where softplus is the identity).
__device__ __forceinline__ float softplus_grad(float x) {
  return x <= kSoftplusThreshold ? __fdividef(1.0f, 1.0f + __expf(-x)) : 1.0f;
}

// Element offset of (b, c, l) in a strided (batch, channel, length) tensor.
__device__ __forceinline__ int64_t offset3(const Strides3& s, int64_t b, int64_t c, int64_t l) {
  return b * s.b + c * s.c + l * s.l;
}

// kW consecutive steps of one channel as fp32. `vec`: unit stride along L and 16-byte aligned
// rows (checked by the binding), so a full tile moves as whole vectors; `valid` < kW reads
// the first `valid` steps and fills the rest with 0.
template <typename T, int kW>
__device__ __forceinline__ void load_row(float (&v)[kW], const T* base, int64_t s_l, int valid, bool vec) {
  constexpr int kBytes = kW * int(sizeof(T));
  if (vec && valid == kW) {
    if constexpr (kBytes >= 16) {
      constexpr int kE = 16 / int(sizeof(T));
#pragma unroll
      for (int i = 0; i < kW; i += kE) {
        Pack<T, kE> pk;
        load_pack(pk, base + i);
#pragma unroll
        for (int j = 0; j < kE; ++j) v[i + j] = to_float(pk.e[j]);
      }
    } else {
      Pack<T, kW> pk;
      load_pack(pk, base);
#pragma unroll
      for (int j = 0; j < kW; ++j) v[j] = to_float(pk.e[j]);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kW; ++i) v[i] = i < valid ? to_float(base[i * s_l]) : 0.0f;
}

template <typename T, int kW>
__device__ __forceinline__ void store_row(T* base, int64_t s_l, const float (&v)[kW], int valid, bool vec) {
  constexpr int kBytes = kW * int(sizeof(T));
  if (vec && valid == kW) {
    if constexpr (kBytes >= 16) {
      constexpr int kE = 16 / int(sizeof(T));
#pragma unroll
      for (int i = 0; i < kW; i += kE) {
        float part[kE];
#pragma unroll
        for (int j = 0; j < kE; ++j) part[j] = v[i + j];
        store_pack<T, kE>(base + i, part);
      }
    } else {
      store_pack<T, kW>(base, v);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kW; ++i) {
    if (i < valid) base[i * s_l] = from_float<T>(v[i]);
  }
}

// kW steps of one channel kept in their storage type (half the registers of fp32 for 16-bit
// types): what a thread prefetches for the next tile. kW * sizeof(T) must be a multiple of 16.
template <typename T, int kW>
struct RawRow {
  static constexpr int kE = 16 / int(sizeof(T));
  Pack<T, kE> part[kW / kE];
  __device__ __forceinline__ float get(int i) const { return to_float(part[i / kE].e[i % kE]); }
};

template <typename T, int kW>
__device__ __forceinline__ void load_raw_row(RawRow<T, kW>& r, const T* base, int64_t s_l, int valid, bool vec) {
  constexpr int kE = RawRow<T, kW>::kE;
  if (vec && valid == kW) {
#pragma unroll
    for (int i = 0; i < kW / kE; ++i) load_pack(r.part[i], base + i * kE);
    return;
  }
#pragma unroll
  for (int i = 0; i < kW; ++i) r.part[i / kE].e[i % kE] = i < valid ? base[i * s_l] : from_float<T>(0.0f);
}

// Whether a (batch, channel, L) tensor allows load_row/store_row's vector path.
__host__ __device__ __forceinline__ bool rows_vectorizable(const void* ptr, const Strides3& s, int elem_size) {
  const int64_t e = 16 / elem_size;
  return ptr != nullptr && s.l == 1 && reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && s.b % e == 0 &&
         s.c % e == 0;
}

// One step's decay a = exp(dt A): real, or complex (ar, ai) from A = (A2r / log2e) + i Ai.
__device__ __forceinline__ void decay_complex(float dt, float a2r, float ai, float& ar_out, float& ai_out) {
  const float mag = fast_exp2(dt * a2r);
  float s, c;
  sincosf(dt * ai, &s, &c);  // accurate: dt * Ai can be tens of radians
  ar_out = mag * c;
  ai_out = mag * s;
}

// The one switch from run-time (dtype, complex) to a compile-time instantiation.
template <typename Launch>
cudaError_t with_dtype_complex(DType dtype, bool is_complex, Launch&& launch) {
  auto by_kind = [&](auto tag) -> cudaError_t {
    if (is_complex) return launch(tag, std::true_type{});
    return launch(tag, std::false_type{});
  };
  switch (dtype) {
    case DType::kFloat32: return by_kind(TypeTag<float>{});
    case DType::kFloat16: return by_kind(TypeTag<__half>{});
    case DType::kBFloat16: return by_kind(TypeTag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

inline int pow2_at_least(int64_t v) {
  int r = 1;
  while (r < v) r *= 2;
  return r;
}

}  // namespace selective_scan
}  // namespace mamba_kernels
