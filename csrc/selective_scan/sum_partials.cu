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

struct Job {
  const float* in;
  void* out;  // already offset by the job's col0
  DType dtype;
  int64_t rows, n, w, in_w, out_outer, out_row;
  int64_t total;   // outputs: outer x n x w
  int64_t block0;  // the job's first block in the grid
};

struct Jobs {
  Job job[kMaxSumJobs];
  int count;
};

__device__ __forceinline__ void store_as(void* out, int64_t at, DType dtype, float v) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(out)[at] = v; break;
    case DType::kFloat16: static_cast<__half*>(out)[at] = from_float<__half>(v); break;
    case DType::kBFloat16: static_cast<__nv_bfloat16*>(out)[at] = from_float<__nv_bfloat16>(v); break;
  }
}

// in: (outer, rows, n, in_w) fp32, contiguous, its first w columns summed; out: element (o, k, j)
// at o * out_outer + k * out_row + j.
__global__ void __launch_bounds__(kThreads) sum_partials_kernel(const __grid_constant__ Jobs jobs) {
  int q = 0;
  while (q + 1 < jobs.count && int64_t(blockIdx.x) >= jobs.job[q + 1].block0) ++q;
  const Job& c = jobs.job[q];
  const int64_t i = (int64_t(blockIdx.x) - c.block0) * kThreads + threadIdx.x;
  if (i >= c.total) return;
  const int64_t per = c.n * c.w;
  const int64_t o = i / per, rem = i - o * per;
  const int64_t k = c.n == 1 ? 0 : rem / c.w, j = rem - k * c.w;
  const float* src = c.in + (o * c.rows * c.n + k) * c.in_w + j;
  const int64_t step = c.n * c.in_w;
  float acc = 0.0f;
  for (int64_t r = 0; r < c.rows; ++r) acc += src[r * step];
  store_as(c.out, o * c.out_outer + k * c.out_row + j, c.dtype, acc);
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
  Jobs jobs{};
  int64_t blocks = 0;
  for (int q = 0; q < s.count; ++q) {
    const SumJob& a = s.job[q];
    Job& j = jobs.job[q];
    j.in = a.in;
    j.out = static_cast<char*>(a.out) + a.col0 * dtype_size(a.dtype);
    j.dtype = a.dtype;
    j.rows = a.rows;
    j.n = a.n;
    j.w = a.w;
    j.in_w = a.in_w;
    j.out_outer = a.out_outer;
    j.out_row = a.out_row;
    j.total = a.outer * a.n * a.w;
    j.block0 = blocks;
    blocks += (j.total + kThreads - 1) / kThreads;
  }
  jobs.count = s.count;
  if (blocks > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
  sum_partials_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(jobs);
  return cudaGetLastError();
}

}  // namespace selective_scan
}  // namespace mamba_kernels
