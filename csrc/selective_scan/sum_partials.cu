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

// in: (outer, rows, n, in_w) fp32, contiguous, its first w columns summed; out: element (o, k, j)
// at o * out_outer + k * out_row + j. The one-pass sums are n = 1 and w = in_w = out_outer.
struct Cols {
  int64_t rows, n, w, in_w, out_outer, out_row, total;
};

template <typename T>
__global__ void __launch_bounds__(kThreads) sum_partials_kernel(const float* __restrict__ in, T* __restrict__ out, Cols c) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= c.total) return;
  const int64_t per = c.n * c.w;
  const int64_t o = i / per, rem = i - o * per;
  const int64_t k = c.n == 1 ? 0 : rem / c.w, j = rem - k * c.w;
  const float* src = in + (o * c.rows * c.n + k) * c.in_w + j;
  const int64_t step = c.n * c.in_w;
  float acc = 0.0f;
  for (int64_t r = 0; r < c.rows; ++r) acc += src[r * step];
  out[o * c.out_outer + k * c.out_row + j] = from_float<T>(acc);
}

template <typename T>
cudaError_t launch(const float* in, void* out, int64_t col0, const Cols& c, cudaStream_t stream) {
  const int64_t blocks = (c.total + kThreads - 1) / kThreads;
  sum_partials_kernel<T><<<unsigned(blocks), kThreads, 0, stream>>>(in, static_cast<T*>(out) + col0, c);
  return cudaGetLastError();
}

cudaError_t launch_cols(const float* in, void* out, DType out_dtype, int64_t outer, int64_t col0, Cols c,
                        cudaStream_t stream) {
  c.total = outer * c.n * c.w;
  if (c.total == 0) return cudaSuccess;
  if ((c.total + kThreads - 1) / kThreads > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
  switch (out_dtype) {
    case DType::kFloat32: return launch<float>(in, out, col0, c, stream);
    case DType::kFloat16: return launch<__half>(in, out, col0, c, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16>(in, out, col0, c, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_sum_partials(const float* in, void* out, DType out_dtype, int64_t outer, int64_t rows,
                                int64_t inner, cudaStream_t stream) {
  return launch_cols(in, out, out_dtype, outer, 0, Cols{rows, 1, inner, inner, inner, 0, 0}, stream);
}

cudaError_t launch_sum_partials_cols(const float* in, void* out, DType out_dtype, int64_t outer, int64_t rows,
                                     int64_t n, int64_t w, int64_t in_w, int64_t out_outer, int64_t out_row,
                                     int64_t col0, cudaStream_t stream) {
  return launch_cols(in, out, out_dtype, outer, col0, Cols{rows, n, w, in_w, out_outer, out_row, 0}, stream);
}

}  // namespace selective_scan
}  // namespace mamba_kernels
