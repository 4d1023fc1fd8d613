// Device helpers shared by the kernels: activations, index helpers and the dtype / width
// dispatch. Includes the conversion and vector I/O (vec_io.cuh) and reductions (reduce.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "dtype.h"
#include "reduce.cuh"
#include "vec_io.cuh"

namespace mamba_kernels {

// Threads one SM holds, for the architecture being compiled: 1024 on sm_75 (Turing), at least
// 1536 from sm_80 on (2048 on sm_80/90/100; 1536 on sm_86/89/120). The host pass, which ignores
// launch bounds, takes the later value.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr int kMaxThreadsPerSm = 1024;
#else
constexpr int kMaxThreadsPerSm = 1536;
#endif

// A __launch_bounds__ minimum of resident blocks per SM that the SM can hold: ``blocks`` of
// ``threads``, or as many as fit (ptxas warns "threads per SM out of range" and ignores a
// minimum above it).
constexpr int fit_blocks_per_sm(int threads, int blocks) {
  return blocks * threads > kMaxThreadsPerSm ? kMaxThreadsPerSm / threads : blocks;
}

__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.0f + __expf(-z)); }

// d silu(z) / dz = s * (1 + z * (1 - s)), s = sigmoid(z)
__device__ __forceinline__ float silu_grad(float z) {
  const float s = __fdividef(1.0f, 1.0f + __expf(-z));
  return s * (1.0f + z * (1.0f - s));
}

// Element i of a buffer whose dtype is known only at run time, as fp32 (a uniform switch
// between three typed loads).
__device__ __forceinline__ float load_as_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBFloat16: return to_float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kFloat16: return to_float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
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
