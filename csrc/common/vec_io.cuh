// Storage types and vector memory access shared by the kernels: fp32 conversion of the
// activation dtypes, and loads / stores of kN elements as one aligned 4/8/16-byte access.
// Everything is computed in fp32; storage types are converted before any multiply.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace mamba_kernels {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Elements of T in one 16-byte vector, the widest single access.
template <typename T>
constexpr int kVec16 = 16 / int(sizeof(T));

// Raw storage for kN elements of T moved as one aligned access of kN * sizeof(T) bytes.
template <int kBytes>
struct RawWord;
template <>
struct RawWord<16> { using type = uint4; };
template <>
struct RawWord<8> { using type = uint2; };
template <>
struct RawWord<4> { using type = uint32_t; };
template <>
struct RawWord<2> { using type = unsigned short; };  // one 16-bit element (the unvectorised norm)

template <typename T, int kN>
union Pack {
  typename RawWord<kN * int(sizeof(T))>::type raw;
  T e[kN];
};

// ptr must be aligned to kN * sizeof(T) bytes (as must ptr in the stores below).
template <typename T, int kN>
__device__ __forceinline__ void load_pack(Pack<T, kN>& p, const T* ptr) {
  using W = typename RawWord<kN * int(sizeof(T))>::type;
  p.raw = *reinterpret_cast<const W*>(ptr);
}

// kN elements at ptr, converted to fp32.
template <typename T, int kN>
__device__ __forceinline__ void load_floats(float (&v)[kN], const T* ptr) {
  Pack<T, kN> p;
  load_pack(p, ptr);
#pragma unroll
  for (int i = 0; i < kN; ++i) v[i] = to_float(p.e[i]);
}

template <typename T, int kN>
__device__ __forceinline__ void store_pack(T* ptr, const float (&v)[kN]) {
  using W = typename RawWord<kN * int(sizeof(T))>::type;
  Pack<T, kN> p;
#pragma unroll
  for (int i = 0; i < kN; ++i) p.e[i] = from_float<T>(v[i]);
  *reinterpret_cast<W*>(ptr) = p.raw;
}

// Storage bits of a float in T (16-bit types rounded to nearest even), in the low bits.
__device__ __forceinline__ uint32_t bits_of(float v, float) { return __float_as_uint(v); }
__device__ __forceinline__ uint32_t bits_of(float v, __half) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ uint32_t bits_of(float v, __nv_bfloat16) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// store_pack for exactly 16 bytes, with the word built by integer ops: NVVM may split a
// union-punned vector store of 16-bit elements into 16-bit pieces; this stays one store.
template <typename T, int kN>
__device__ __forceinline__ void store16(T* ptr, const float (&v)[kN]) {
  static_assert(kN * sizeof(T) == 16, "16-byte vectors");
  constexpr int kPer = 4 / int(sizeof(T));  // elements per 32-bit word
  uint32_t u[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    u[q] = bits_of(v[q * kPer], T());
    if (kPer == 2) u[q] |= bits_of(v[q * kPer + kPer - 1], T()) << 16;
  }
  __stwb(reinterpret_cast<uint4*>(ptr), make_uint4(u[0], u[1], u[2], u[3]));  // one 16-byte store
}

}  // namespace mamba_kernels
