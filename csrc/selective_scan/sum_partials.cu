// The backward's last step: its fp32 partial sums reduced to the parameter gradients.
//
// One kernel, no template: every sum a backward needs at one point (dA, dB, dC, dD,
// ddelta_bias; or a window's dB and dC columns) is a job of one launch, each job with its own
// output dtype, because each launch costs the host more than these sums cost the GPU. One
// thread per output element adds the rows of its column one after another in fp32, in row
// order: no atomics and no tree, so a result is the same run after run, and it is rounded to
// the output dtype once. Threads of a warp own consecutive columns, so every row's read
// coalesces.
#include <cstdint>

#include "device_utils.cuh"
#include "scan_policy.cuh"
#include "selective_scan.h"

namespace mamba_kernels {
namespace selective_scan {
namespace {

constexpr int kThreads = SumPartialsPolicy::kThreads;

// Blocks of the launch that sum job c.
__host__ __device__ inline int64_t job_blocks(const SumJob& c) {
  return (c.outer * c.n * c.w + kThreads - 1) / kThreads;
}

__device__ __forceinline__ void store_as(void* out, int64_t at, DType dtype, float v) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(out)[at] = v; break;
    case DType::kFloat16: static_cast<__half*>(out)[at] = from_float<__half>(v); break;
    case DType::kBFloat16: static_cast<__nv_bfloat16*>(out)[at] = from_float<__nv_bfloat16>(v); break;
  }
}

// The jobs' blocks follow one another in job order. Job c: in (outer, rows, n, in_w) fp32,
// contiguous, its first w columns summed; out element (o, k, j) at o * out_outer + k * out_row
// + col0 + j.
__global__ void __launch_bounds__(kThreads) sum_partials_kernel(const __grid_constant__ SumJobs jobs) {
  int q = 0;
  int64_t first = 0;  // job q's first block
  while (q + 1 < jobs.count && int64_t(blockIdx.x) >= first + job_blocks(jobs.job[q])) {
    first += job_blocks(jobs.job[q++]);
  }
  const SumJob& c = jobs.job[q];
  const int64_t i = (int64_t(blockIdx.x) - first) * kThreads + threadIdx.x;
  if (i >= c.outer * c.n * c.w) return;
  const int64_t per = c.n * c.w;
  const int64_t o = i / per, rem = i - o * per;
  const int64_t k = c.n == 1 ? 0 : rem / c.w, j = rem - k * c.w;
  const float* src = c.in + (o * c.rows * c.n + k) * c.in_w + j;
  const int64_t step = c.n * c.in_w;
  float acc = 0.0f;
  for (int64_t r = 0; r < c.rows; ++r) acc += src[r * step];
  store_as(c.out, o * c.out_outer + k * c.out_row + c.col0 + j, c.dtype, acc);
}

}  // namespace

void SumJobs::add(const float* in, void* out, DType out_dtype, int64_t outer, int64_t rows, int64_t inner) {
  add_cols(in, out, out_dtype, outer, rows, 1, inner, inner, inner, 0, 0);
}

void SumJobs::add_cols(const float* in, void* out, DType out_dtype, int64_t outer, int64_t rows, int64_t n,
                       int64_t w, int64_t in_w, int64_t out_outer, int64_t out_row, int64_t col0) {
  if (outer * n * w == 0) return;
  if (count == kMaxSumJobs) {
    overflow = true;
    return;
  }
  job[count++] = SumJob{in, out, out_dtype, outer, rows, n, w, in_w, out_outer, out_row, col0};
}

cudaError_t launch_sum_jobs(const SumJobs& s, cudaStream_t stream) {
  if (s.overflow) return cudaErrorInvalidValue;
  if (s.count == 0) return cudaSuccess;
  int64_t blocks = 0;
  for (int q = 0; q < s.count; ++q) blocks += job_blocks(s.job[q]);
  if (blocks > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
  sum_partials_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(s);
  return cudaGetLastError();
}

}  // namespace selective_scan
}  // namespace mamba_kernels
