// Parameters and launchers of the selective-scan kernels (forward and backward). Plain data
// only: no torch here, so the .cu files compile without ATen headers.
//
// Math, per batch b, channel d, state n (complex A: complex h, B, C; y takes 2 Re):
//   dt_t = softplus(delta_t + delta_bias)  (softplus optional; identity above 20)
//   h_t  = exp(dt_t A) h_{t-1} + dt_t u_t B_t,   y_t = sum_n C_t h_t + D u_t,   out = y silu(z)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "device_info.h"
#include "dtype.h"

namespace mamba_kernels {
namespace selective_scan {

// Steps between two saved states: the forward stores h after every chunk (the backward
// restarts from them; the last one is the final state).
constexpr int kChunk = 64;

// B or C: variable (batch, ngroups, dstate, L [x2 interleaved re/im for complex]) in the input
// dtype with any strides, or fixed (dim, dstate [x2]) as a contiguous fp32 copy.
struct BCParams {
  const void* ptr = nullptr;
  bool variable = false;
  int64_t s_b = 0, s_g = 0, s_n = 0, s_l = 0;  // variable only, in elements
};

struct ScanParams {
  DType dtype = DType::kFloat32;  // of u, delta, z, out, dout, du, ddelta, dz, variable B/C
  bool is_complex = false;
  bool softplus = false;
  int64_t batch = 0, dim = 0, seqlen = 0, dstate = 0, ngroups = 1;

  const void* u = nullptr;
  Strides3 u_s;
  const void* delta = nullptr;
  Strides3 delta_s;
  const float* A = nullptr;  // (dim, dstate [x2]) contiguous fp32
  BCParams B, C;
  const float* D = nullptr;           // (dim,) or null
  const float* delta_bias = nullptr;  // (dim,) or null
  const void* z = nullptr;            // or null
  Strides3 z_s;

  // Forward outputs. out: y (ungated); null when not wanted (then, without z, only ckpt is written).
  // out_z: y * silu(z) when z is given (the backward writes it too when given, from y: the gated
  // output recomputed for a caller that did not keep it). ckpt: (batch, dim, ckpt_count, dstate [x2])
  // fp32, slot k the state after min((k + 1) 2^ckpt_shift, n_chunks) chunks; the backward reads
  // it with ckpt_shift 0 (a state per chunk, ckpt_count n_chunks) or, in the lane kernel, up to
  // bwd_max_state_shift, in pairs too.
  void* out = nullptr;
  Strides3 out_s;
  void* out_z = nullptr;
  Strides3 out_z_s;
  float* ckpt = nullptr;
  int ckpt_shift = 0;       // log2 of the chunks between kept states
  int64_t ckpt_count = 0;   // slots (the final state's, and at most one after it, which it fills too)
  bool ckpt_pairs = false;  // slots 2r and 2r + 1 interleaved state by state (the original's x layout)

  // Backward. y: the forward's ungated output (needed with z). dz is written when z is given.
  const void* dout = nullptr;
  Strides3 dout_s;
  const void* y = nullptr;
  Strides3 y_s;
  void* du = nullptr;
  Strides3 du_s;
  void* ddelta = nullptr;
  Strides3 ddelta_s;
  void* dz = nullptr;
  Strides3 dz_s;
  // fp32 partial sums, reduced by launch_sum_jobs (fixed order: deterministic):
  float* dA_part = nullptr;      // (batch, dim, dstate [x2])
  float* dD_part = nullptr;      // (batch, dim) or null
  float* dbias_part = nullptr;   // (batch, dim) or null
  float* dB_part = nullptr;      // variable: (batch, ngroups, row_blocks, dstate, part_len [x2]); fixed: (batch, dim, dstate [x2])
  float* dC_part = nullptr;
  // The backward in windows (the lane kernel with spaced states, bwd_window_chunks): this
  // launch's chunks [chunk_lo, chunk_hi) (chunk_hi -1: to the end), the steps a variable dB/dC
  // partial row holds (part_len: L in one pass, the window's steps in windows, its first
  // column step chunk_lo * kChunk), and the running sums that cross a window boundary,
  // (batch, dim, 16 lanes, kBwdCarry) fp32: read unless the launch starts at the last chunk,
  // written unless it ends at chunk 0 (which reduces them as one pass does).
  int64_t chunk_lo = 0, chunk_hi = -1;
  int64_t part_len = 0;
  float* carry = nullptr;
};

// Threads that share one channel's states, and channels per block, for each kernel.
int fwd_threads_per_row(int64_t dstate, bool is_complex);
int bwd_threads_per_row(int64_t dstate, bool is_complex);
int64_t bwd_row_blocks(const ScanParams& p);  // rows of dB/dC partials per (batch, group)
// The most chunks apart (as a power of two) the backward's saved states may be for this
// problem: 4 (1024 steps) where the lane kernel runs (real A, dstate <= 16), else 0 (a state
// every chunk, contiguous slots).
int bwd_max_state_shift(const ScanParams& p);

// Segments the forward cuts the sequence into (1: one pass), and the fp32 workspace it then
// needs: batch * dim * segments * (dstate [x2] + 1) floats, passed to launch_fwd.
int64_t fwd_segments(const ScanParams& p);
cudaError_t launch_fwd(const ScanParams& p, float* seg_workspace, cudaStream_t stream);
cudaError_t launch_bwd(const ScanParams& p, cudaStream_t stream);
// The lane-per-state kernels for real A and dstate <= 16 (fwd_lanes.cu, bwd_lanes.cu), which
// launch_fwd / launch_bwd pick for such problems.
cudaError_t launch_fwd_lanes(const ScanParams& p, cudaStream_t stream);
cudaError_t launch_bwd_lanes(const ScanParams& p, cudaStream_t stream);
int64_t bwd_lanes_row_blocks(const ScanParams& p);

// The backward's fp32 partial sums reduced into its gradients, several in one launch
// (sum_partials.cu). A job sums over r, in the order of r in fp32, rounded once to its output
// dtype: in (outer, rows, n, in_w) fp32 contiguous, of which the first w columns go to out's
// elements o * out_outer + k * out_row + col0 + j (k < n, j < w). add() is the plain case, in
// (outer, rows, inner) and out (outer, inner), both contiguous. A complex64 output is written
// as its interleaved fp32 (re, im) pairs.
constexpr int kMaxSumJobs = 6;
struct SumJob {
  const float* in;
  void* out;
  DType dtype;
  int64_t outer, rows, n, w, in_w, out_outer, out_row, col0;
};
struct SumJobs {
  SumJob job[kMaxSumJobs];
  int count = 0;
  bool overflow = false;  // more than kMaxSumJobs added: the launch refuses
  void add(const float* in, void* out, DType out_dtype, int64_t outer, int64_t rows, int64_t inner);
  void add_cols(const float* in, void* out, DType out_dtype, int64_t outer, int64_t rows, int64_t n, int64_t w,
                int64_t in_w, int64_t out_outer, int64_t out_row, int64_t col0);
};
// Every job of `jobs` in one launch (none: nothing is launched).
cudaError_t launch_sum_jobs(const SumJobs& jobs, cudaStream_t stream);

// Floats of running sums a lane carries from one backward window to the next (ScanParams.carry):
// the adjoint, dA, fixed dB and dC, dD and ddelta_bias.
constexpr int kBwdCarry = 6;
// Chunks per backward window: 0 for one pass (whenever the states are a chunk apart, one
// window would cover the sequence, or windows would not take less memory), else the chunks
// between saved states.
int64_t bwd_window_chunks(const ScanParams& p);
// Floats of ScanParams.carry for a windowed backward: batch x dim x 16 lanes x kBwdCarry.
int64_t bwd_carry_floats(const ScanParams& p);

}  // namespace selective_scan
}  // namespace mamba_kernels
