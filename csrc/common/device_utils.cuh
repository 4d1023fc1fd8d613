// Device helpers shared by the kernels: fp32 conversion, 16/8-byte vector I/O, activations.
// Everything is computed in fp32; storage types are converted before any multiply.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "dtype.h"
#include "reduce.cuh"

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

// Raw storage for kN elements of T moved as one aligned access of kN * sizeof(T) bytes.
template <int kBytes>
struct RawWord;
template <>
struct RawWord<16> { using type = uint4; };
template <>
struct RawWord<8> { using type = uint2; };
template <>
struct RawWord<4> { using type = uint32_t; };

template <typename T, int kN>
union Pack {
  typename RawWord<kN * int(sizeof(T))>::type raw;
  T e[kN];
};

template <typename T, int kN>
__device__ __forceinline__ void load_pack(Pack<T, kN>& p, const T* ptr) {
  using W = typename RawWord<kN * int(sizeof(T))>::type;
  p.raw = *reinterpret_cast<const W*>(ptr);
}

template <typename T, int kN>
__device__ __forceinline__ void store_pack(T* ptr, const float (&v)[kN]) {
  using W = typename RawWord<kN * int(sizeof(T))>::type;
  Pack<T, kN> p;
#pragma unroll
  for (int i = 0; i < kN; ++i) p.e[i] = from_float<T>(v[i]);
  *reinterpret_cast<W*>(ptr) = p.raw;
}

__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.0f + __expf(-z)); }

// d silu(z) / dz = s * (1 + z * (1 - s)), s = sigmoid(z)
__device__ __forceinline__ float silu_grad(float z) {
  const float s = __fdividef(1.0f, 1.0f + __expf(-z));
  return s * (1.0f + z * (1.0f - s));
}

// Floor modulo (result in [0, n)) for any sign of a, like Python's %.
__device__ __forceinline__ int64_t floor_mod(int64_t a, int64_t n) {
  const int64_t r = a % n;
  return r < 0 ? r + n : r;
}

// The one switch from run-time (dtype, width) to a compile-time instantiation: calls
// launch(TypeTag<T>{}, std::integral_constant<int, W>{}) for W in 2..4. C++17 generic
// lambdas read T and W back with decltype (no template lambdas: MSVC-friendly).
template <typename T>
struct TypeTag {
  using type = T;
};

template <typename Launch>
cudaError_t with_dtype_width(DType dtype, int width, Launch&& launch) {
  auto by_width = [&](auto tag) -> cudaError_t {
    switch (width) {
      case 2: return launch(tag, std::integral_constant<int, 2>{});
      case 3: return launch(tag, std::integral_constant<int, 3>{});
      case 4: return launch(tag, std::integral_constant<int, 4>{});
      default: return cudaErrorInvalidValue;
    }
  };
  switch (dtype) {
    case DType::kFloat32: return by_width(TypeTag<float>{});
    case DType::kFloat16: return by_width(TypeTag<__half>{});
    case DType::kBFloat16: return by_width(TypeTag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace mamba_kernels
