// Device-side pieces shared by the forward and backward kernels.
#pragma once

#include "causal_conv1d.h"
#include "device_utils.cuh"

namespace mamba_kernels {
namespace causal_conv1d {

constexpr int kThreads = 128;  // 4 independent warps per block
constexpr int kWarps = kThreads / 32;

// Elements per vector access: 16 bytes (kVec16, vec_io.cuh), except the channel-last backward,
// which keeps 4 channels per lane to bound its register use (it holds 3 sliding windows per channel).
constexpr int kVecClBwd = 4;

// Channel-first kernels: a warp owns kTilesCF consecutive tiles of 32 lanes x kN positions.
constexpr int kTilesCF = 4;
constexpr int kTilesBwdCF = 2;  // the backward holds x, dout and dpre: fewer tiles, more warps

// item -> (segment, channel, batch) of a channel-first warp; 32-bit division when it fits
// (64-bit division is a long instruction sequence on the GPU).
__device__ __forceinline__ void split_item(int64_t item, int64_t nseg, int64_t dim, int64_t items, int64_t& seg,
                                           int64_t& c, int64_t& b) {
  if (items <= 0xffffffffLL) {
    const uint32_t it = uint32_t(item), ns = uint32_t(nseg), d = uint32_t(dim);
    const uint32_t row = it / ns;
    seg = it - row * ns;
    b = row / d;
    c = row - uint32_t(b) * d;
  } else {
    const int64_t row = item / nseg;
    seg = item - row * nseg;
    b = row / dim;
    c = row - b * dim;
  }
}

// x at position pos (pos < seqlen) of row (b, c): positions before 0 come from the initial
// states when given, else they are zero.
template <typename T>
__device__ __forceinline__ float x_ext(const ConvParams& p, const T* xrow, int64_t b, int64_t c,
                                       int64_t pos) {
  if (pos >= 0) return to_float(xrow[pos * p.x_s.l]);
  if (p.initial_states == nullptr) return 0.0f;
  const int64_t k = p.width - 1 + pos;  // 0 .. width-2
  return to_float(static_cast<const T*>(p.initial_states)[b * p.init_s.b + c * p.init_s.c +
                                                          k * p.init_s.l]);
}

// seq_idx of position pos; positions before 0 belong to the initial states, which are tagged
// with the row's first segment (causal-conv1d 1.7.0 semantics).
__device__ __forceinline__ int seq_at(const ConvParams& p, int64_t b, int64_t pos) {
  const int32_t* row = p.seq_idx + b * p.seq_s_b;
  return pos >= 0 ? row[pos * p.seq_s_l] : row[0];
}

// Channel-last segment length (time steps per warp): the largest power of two from 256 down
// to 16 that still yields enough warps to fill the GPU a few times over.
int64_t cl_seg_len(const ConvParams& p, int vec);
int num_sms_current_device();

}  // namespace causal_conv1d
}  // namespace mamba_kernels
