// Decode update: convolve seqlen new tokens against the cached history and update the cache.
// Shift-register mode: the state becomes the last state_len columns of cat(state, x).
// Circular mode (cache_seqlens): token i goes to column (cache_seqlens[b] + i) mod state_len and
// the history is the W-1 columns before cache_seqlens[b] mod state_len, circularly.
// conv_state_indices[b] < 0 marks a padded request: output 0, no state touched.
#include <algorithm>
#include <climits>

#include "conv_common.cuh"

namespace mamba_kernels {
namespace causal_conv1d {
namespace {

using Policy = UpdatePolicy;

// One thread per (batch, channel); blockIdx.y walks the batch, so no index division.
// Every state value a thread needs is loaded before its first store, so the loads overlap
// (a store to the row may alias a later load as far as the compiler knows).
template <typename T, int W>
__global__ void __launch_bounds__(Policy::kThreads) update_kernel(const UpdateParams p) {
  constexpr int kMaxRegState = Policy::kMaxRegState;
  const int64_t c = int64_t(blockIdx.x) * Policy::kThreads + threadIdx.x;
  if (c >= p.dim) return;
  float w[W];
#pragma unroll
  for (int k = 0; k < W; ++k) w[k] = weight_at(p.weight, c * W + k);
  const float bias = bias_at(p.bias, c);
  const int64_t L = p.state_len;
  const bool circular = p.cache_seqlens != nullptr;
  for (int64_t b = blockIdx.y; b < p.batch; b += gridDim.y) {
    const T* xr = static_cast<const T*>(p.x) + b * p.x_s.b + c * p.x_s.c;
    T* outr = static_cast<T*>(p.out) + b * p.out_s.b + c * p.out_s.c;
    const int64_t entry = p.state_indices != nullptr ? p.state_indices[b * p.state_indices_s] : b;
    if (entry < 0 || entry >= p.num_entries) {
      // Padding gives exact zeros; an index past the cache gives NaN rather than a stray access.
      const float fill = entry < 0 ? 0.0f : __int_as_float(0x7fc00000);
      for (int64_t i = 0; i < p.seqlen; ++i) outr[i * p.out_s.l] = from_float<T>(fill);
      continue;
    }
    T* st = static_cast<T*>(p.conv_state) + entry * p.state_s.b + c * p.state_s.c;
    const int64_t head = circular ? floor_mod(p.cache_seqlens[b * p.cache_seqlens_s], L) : 0;
    const bool in_regs = !circular && L <= kMaxRegState;
    T old[kMaxRegState];
    float h[W - 1];  // the W-1 inputs before the current token, oldest first
    if (in_regs) {
#pragma unroll
      for (int j = 0; j < kMaxRegState; ++j) old[j] = j < L ? st[j * p.state_s.l] : from_float<T>(0.0f);
#pragma unroll
      for (int q = 0; q < W - 1; ++q) {
        const int64_t col = L - (W - 1) + q;
        float v = 0.0f;
#pragma unroll
        for (int j = 0; j < kMaxRegState; ++j) v = j == col ? to_float(old[j]) : v;
        h[q] = v;
      }
    } else {
#pragma unroll
      for (int q = 0; q < W - 1; ++q) {
        const int64_t col = circular ? floor_mod(head - (W - 1) + q, L) : L - (W - 1) + q;
        h[q] = to_float(st[col * p.state_s.l]);
      }
    }
    for (int64_t i = 0; i < p.seqlen; ++i) {
      const float xi = to_float(xr[i * p.x_s.l]);
      float acc = bias;
#pragma unroll
      for (int k = 0; k < W - 1; ++k) acc += w[k] * h[k];
      acc += w[W - 1] * xi;
      outr[i * p.out_s.l] = from_float<T>(p.silu ? silu(acc) : acc);
#pragma unroll
      for (int k = 0; k < W - 2; ++k) h[k] = h[k + 1];
      h[W - 2] = xi;
    }
    if (circular) {
      for (int64_t i = 0; i < p.seqlen; ++i) st[floor_mod(head + i, L) * p.state_s.l] = xr[i * p.x_s.l];
    } else if (in_regs) {
      // new[j] = cat(state, x)[seqlen + j], the old values taken from registers
#pragma unroll
      for (int j = 0; j < kMaxRegState; ++j) {
        if (j >= L) break;
        const int64_t src = p.seqlen + j;
        T v = from_float<T>(0.0f);
#pragma unroll
        for (int m = 0; m < kMaxRegState; ++m) v = m == src ? old[m] : v;
        st[j * p.state_s.l] = src < L ? v : xr[(src - L) * p.x_s.l];
      }
    } else {
      // new[j] = cat(state, x)[seqlen + j]; ascending j only reads columns not yet written.
      for (int64_t j = 0; j < L; ++j) {
        const int64_t src = p.seqlen + j;
        st[j * p.state_s.l] = src < L ? st[src * p.state_s.l] : xr[(src - L) * p.x_s.l];
      }
    }
  }
}

// Lean decode kernel: shift-register mode with state_len == kL, kL in {W-1, W} (vLLM-style and
// mamba_ssm-style caches). The kernel is latency-bound: what counts is how many loads are in
// flight and how few rounds of threads the GPU needs. A thread takes one channel of
// kRows batch rows (the weights are loaded once for them); every load of the first token
// (state rows and x) is issued before any store, so a thread waits for memory about once.
// Few registers, no loop over the batch, no selects. The thread keeps each state row in
// registers as a window over cat(state, x); once the tokens are consumed the window IS the new
// state row, so the row is read once and written once. Values stay in T: the cache moves
// bit-exactly.
template <typename T, int W, int kL>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kMinBlocksShift) update_shift_kernel(const UpdateParams p) {
  static_assert(kL == W - 1 || kL == W, "lean path: state_len is W-1 or W");
  constexpr int kRows = Policy::kRows;
  const int c = int(blockIdx.x) * Policy::kThreads + int(threadIdx.x);  // dim <= INT_MAX - kThreads
  if (c >= p.dim) return;
  const int n = int(p.seqlen);  // <= INT_MAX (launcher)
  float w[W];
#pragma unroll
  for (int k = 0; k < W; ++k) w[k] = weight_at(p.weight, int64_t(c) * W + k);
  const float bias = bias_at(p.bias, c);

  // Phase 1, loads only: each row's cache entry, state row and first token.
  int64_t entry[kRows];
  T win[kRows][kL];  // the last kL values of cat(state, x) consumed so far, oldest first
  T x0[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int b = int(blockIdx.y) * kRows + r;
    entry[r] = -1;
    x0[r] = from_float<T>(0.0f);
#pragma unroll
    for (int j = 0; j < kL; ++j) win[r][j] = from_float<T>(0.0f);
    if (b >= p.batch) continue;
    entry[r] = p.state_indices != nullptr ? int64_t(p.state_indices[b * p.state_indices_s]) : b;
    if (entry[r] < 0 || entry[r] >= p.num_entries) continue;
    const T* st = static_cast<const T*>(p.conv_state) + entry[r] * p.state_s.b + c * p.state_s.c;
#pragma unroll
    for (int j = 0; j < kL; ++j) win[r][j] = st[j * p.state_s.l];
    if (n > 0) x0[r] = static_cast<const T*>(p.x)[b * p.x_s.b + c * p.x_s.c];
  }

  // Phase 2: outputs, then the new state rows.
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int b = int(blockIdx.y) * kRows + r;
    if (b >= p.batch) continue;
    const T* xr = static_cast<const T*>(p.x) + b * p.x_s.b + c * p.x_s.c;
    T* outr = static_cast<T*>(p.out) + b * p.out_s.b + c * p.out_s.c;
    if (entry[r] < 0 || entry[r] >= p.num_entries) {
      // Padding gives exact zeros; an index past the cache gives NaN rather than a stray access.
      const T fill = from_float<T>(entry[r] < 0 ? 0.0f : __int_as_float(0x7fc00000));
      for (int i = 0; i < n; ++i) outr[i * p.out_s.l] = fill;
      continue;
    }
    for (int i = 0; i < n; ++i) {
      const T xi = i == 0 ? x0[r] : xr[i * p.x_s.l];
      float acc = bias;
#pragma unroll
      for (int k = 0; k < W - 1; ++k) acc += w[k] * to_float(win[r][kL - (W - 1) + k]);
      acc += w[W - 1] * to_float(xi);
      outr[i * p.out_s.l] = from_float<T>(p.silu ? silu(acc) : acc);
#pragma unroll
      for (int j = 0; j < kL - 1; ++j) win[r][j] = win[r][j + 1];
      win[r][kL - 1] = xi;
    }
    T* st = static_cast<T*>(p.conv_state) + entry[r] * p.state_s.b + c * p.state_s.c;
#pragma unroll
    for (int j = 0; j < kL; ++j) st[j * p.state_s.l] = win[r][j];
  }
}

template <typename T, int W>
cudaError_t update_launch(const UpdateParams& p, cudaStream_t stream) {
  constexpr int kThreads = Policy::kThreads;
  constexpr int kRows = Policy::kRows;
  const unsigned cblocks = unsigned((p.dim + kThreads - 1) / kThreads);
  const dim3 grid(cblocks, unsigned(std::min<int64_t>(p.batch, 65535)));
  const int64_t lean_rows = (p.batch + kRows - 1) / kRows;
  const bool lean = p.cache_seqlens == nullptr && lean_rows <= 65535 && p.dim <= INT_MAX - kThreads &&
                    p.seqlen <= INT_MAX && (p.state_len == W - 1 || p.state_len == W);
  const dim3 lean_grid(cblocks, unsigned(lean_rows));
  if (lean && p.state_len == W - 1) {
    update_shift_kernel<T, W, W - 1><<<lean_grid, kThreads, 0, stream>>>(p);
  } else if (lean) {
    update_shift_kernel<T, W, W><<<lean_grid, kThreads, 0, stream>>>(p);
  } else {
    update_kernel<T, W><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_update(const UpdateParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.dim == 0) return cudaSuccess;
  return with_dtype_width(p.dtype, p.width, [&](auto t, auto w) {
    return update_launch<typename decltype(t)::type, decltype(w)::value>(p, stream);
  });
}

}  // namespace causal_conv1d
}  // namespace mamba_kernels
