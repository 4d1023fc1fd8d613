// The backward's last step: its fp32 partial sums reduced to the parameter gradients.
//
// Template instantiations: 3, one per output dtype (fp32, fp16, bf16). One thread per output
// element adds the rows of its column one after another in fp32, in row order: no atomics and
// no tree, so a result is the same run after run, and it is rounded to the output dtype once.
// Threads of a warp own consecutive columns, so every row's read coalesces.
#include <cstdint>

#include "device_utils.cuh"
#include "scan_policy.cuh"
#include "selective_scan.h"

namespace mamba_kernels {
namespace selective_scan {
namespace {

constexpr int kThreads = SumPartialsPolicy::kThreads;

// in: (outer, rows, inner) fp32, contiguous; out: (outer, inner) of T, contiguous.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    sum_partials_kernel(const float* __restrict__ in, T* __restrict__ out, int64_t rows, int64_t inner,
                        int64_t total) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= total) return;
  const int64_t o = i / inner;
  const float* src = in + o * rows * inner + (i - o * inner);
  float acc = 0.0f;
  for (int64_t r = 0; r < rows; ++r) acc += src[r * inner];
  out[i] = from_float<T>(acc);
}

template <typename T>
cudaError_t launch(const float* in, void* out, int64_t rows, int64_t inner, int64_t total, cudaStream_t stream) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  sum_partials_kernel<T><<<unsigned(blocks), kThreads, 0, stream>>>(in, static_cast<T*>(out), rows, inner, total);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_sum_partials(const float* in, void* out, DType out_dtype, int64_t outer, int64_t rows,
                                int64_t inner, cudaStream_t stream) {
  const int64_t total = outer * inner;
  if (total == 0) return cudaSuccess;
  if ((total + kThreads - 1) / kThreads > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
  switch (out_dtype) {
    case DType::kFloat32: return launch<float>(in, out, rows, inner, total, stream);
    case DType::kFloat16: return launch<__half>(in, out, rows, inner, total, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16>(in, out, rows, inner, total, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace selective_scan
}  // namespace mamba_kernels
