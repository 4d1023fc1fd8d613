// Device-side pieces shared by the causal_conv1d kernels, and their tuning policies.
#pragma once

#include "causal_conv1d.h"
#include "device_info.h"
#include "device_utils.cuh"
#include "halo.cuh"

namespace mamba_kernels {
namespace causal_conv1d {

// Tuning constants, one policy per kernel family: every kernel and launcher reads its block
// size, items per thread, tile and chunk sizes from here. Compile-time switches are only what
// changes an inner loop (dtype, width, seq_idx masks, the backward's silu', the update's state
// window); see docs/KERNELS.md.
// Where the numbers come from: all were set by hand on 2026-11-29 (a7568f8 to ee6fe5e), none
// A/B-timed against other values; that day's H200 pass (2287cb5) timed only the result
// (docs/notes/bench-passes.md, "causal_conv1d on H200": forward at 94-97 % of copy bandwidth
// channel-first, 76-83 % channel-last). Each constant below names its commit.
struct FwdPolicy {
  static constexpr int kThreads = 128;  // 4 independent warps per block; by hand, a7568f8
  static constexpr int kWarps = kThreads / 32;
  // fwd_channel_first(_lean): a warp owns kTilesCF consecutive tiles of 32 lanes x kVec16 positions.
  static constexpr int kTilesCF = 4;  // by hand, a7568f8; at 94-97 % of copy in the 2026-11-29 pass
  // fwd_channel_last: time steps loaded before their first use (16-32 KB in flight per warp).
  // By hand: 8 in a7568f8, 4 for 16-bit types in 8e0f7b9; not measured at other depths.
  template <typename T>
  static constexpr int kUnrollCL = sizeof(T) == 4 ? 8 : 4;
  // fwd_channel_last_tile: tiles of kTileL time steps x kTileC channels, 128-byte rows for every
  // dtype (so shared memory and registers, hence occupancy, do not depend on it).
  static constexpr int kTileL = 64;  // by hand, 0ed6295 / 45488c2 (fp32: 40 registers); not timed at other lengths
  template <typename T>
  static constexpr int kTileC = 128 / int(sizeof(T));  // structural: a 128-byte row
  // Channel-last segments (cl_seg_len; the channel-last backward uses the same): from kSegMaxCL
  // time steps per warp, halved down to kSegMinCL while fewer than kSegWarpsPerSm warps per SM.
  // By hand: 256 in a7568f8; in 8e0f7b9 the floor 16 -> 32, the warps per SM 128 -> 32. Not measured.
  static constexpr int kSegMaxCL = 256;
  static constexpr int kSegMinCL = 32;
  static constexpr int kSegWarpsPerSm = 32;
  // __launch_bounds__ minimum resident blocks per SM (each caps the registers per thread), as
  // many as the SM holds where fewer fit (fit_blocks_per_sm). By hand (8e0f7b9; the lean
  // kernel's 0ed6295), not timed at other caps.
  static constexpr int kMinBlocksCF = fit_blocks_per_sm(kThreads, 6);
  static constexpr int kMinBlocksCFLean = fit_blocks_per_sm(kThreads, 8);
  static constexpr int kMinBlocksCL = fit_blocks_per_sm(kThreads, 3);
};

struct BwdPolicy {
  static constexpr int kThreads = 128;
  static constexpr int kWarps = kThreads / 32;
  // bwd_channel_first: tiles per warp segment (it holds x, dout and dpre: fewer tiles, more
  // warps than the forward); also the lean kernel's chunk in deterministic mode, so that both
  // write the same workspace rows. By hand, 8e0f7b9; not timed at other values.
  static constexpr int kTilesCF = 2;
  // bwd_channel_first_lean: up to kMaxTilesCFLean tiles per warp, halved while that leaves
  // fewer than kCFLeanWarpsPerSm warps per SM (about four waves). By hand, b781d2e (72 registers, no
  // spills), written without a GPU; 0.91x the original at (4, 4096, 8192) bf16 in the 2026-11-29 pass.
  static constexpr int kMaxTilesCFLean = 16;
  static constexpr int kCFLeanWarpsPerSm = 32 * 4;
  // bwd_channel_last: channels per lane (it holds 3 sliding windows per channel, so fewer than
  // a 16-byte vector's worth to bound registers) and time steps per load block. By hand, a7568f8.
  static constexpr int kVecCL = 4;
  static constexpr int kUnrollCL = 4;
  // bwd_channel_last_lean: the same, leaner. By hand, ee6fe5e (80 registers), not timed at other values.
  static constexpr int kVecCLLean = 2;
  static constexpr int kUnrollCLLean = 4;
  // reduce_partials (deterministic mode): block size, partial rows loaded before they are added.
  // By hand, a7568f8 (256 threads, 8 loads), never timed: deterministic mode is not benchmarked.
  static constexpr int kReduceThreads = 256;
  static constexpr int kReduceLoads = 8;
  // __launch_bounds__ minimum resident blocks per SM (fit_blocks_per_sm). By hand (8e0f7b9,
  // a160639, ee6fe5e), not timed at other caps.
  static constexpr int kMinBlocksCF = fit_blocks_per_sm(kThreads, 4);
  static constexpr int kMinBlocksCFLean = fit_blocks_per_sm(kThreads, 6);
  static constexpr int kMinBlocksCL = fit_blocks_per_sm(kThreads, 2);
  static constexpr int kMinBlocksCLLean = fit_blocks_per_sm(kThreads, 6);
};

struct UpdatePolicy {
  static constexpr int kThreads = 128;  // one channel per thread; by hand, a7568f8
  // update_kernel: state rows up to this long are read once into registers.
  static constexpr int kMaxRegState = 8;  // by hand, 8e0f7b9, not timed
  // update_shift_kernel: batch rows per thread (the weights are loaded once for them).
  static constexpr int kRows = 2;  // by hand, 418a70a (40 registers); decode then 1.34-1.39x the original
  // 12 blocks of 128 threads from sm_80 on; sm_75 holds 8 (fit_blocks_per_sm). Structural: 12 x 128
  // = 1536 threads, a full sm_90 SM at its 40 registers (418a70a; 16 before it, in 07d5098).
  static constexpr int kMinBlocksShift = fit_blocks_per_sm(kThreads, 12);
};

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

// Element i of a per-channel parameter (weight or bias), read in its dtype as fp32.
__device__ __forceinline__ float weight_at(const WeightRef& w, int64_t i) { return load_as_float(w.ptr, w.dtype, i); }

// bias[c], or 0 without a bias.
__device__ __forceinline__ float bias_at(const WeightRef& b, int64_t c) {
  return b.ptr != nullptr ? weight_at(b, c) : 0.0f;
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

// The channel-last left halo: x at positions t0 - (W - 1) + q, q < W - 1, of the kN channels from
// c0 (nc of them real, 0 for the rest) into h[q]; whole packs when vin and the position is inside
// the sequence, else element reads through x_ext (the initial states before 0).
template <typename T, int W, int kN>
__device__ __forceinline__ void load_left_halo(float (*h)[kN], const ConvParams& p, const T* xb, int64_t b,
                                               int64_t c0, int nc, int64_t t0, bool vin) {
#pragma unroll
  for (int q = 0; q < W - 1; ++q) {
    const int64_t pos = t0 - (W - 1) + q;
    if (vin && pos >= 0) {
      Pack<T, kN> hv;
      load_pack(hv, xb + pos * p.x_s.l);
#pragma unroll
      for (int i = 0; i < kN; ++i) h[q][i] = to_float(hv.e[i]);
    } else {
#pragma unroll
      for (int i = 0; i < kN; ++i) h[q][i] = i < nc ? x_ext(p, xb + i * p.x_s.c, b, c0 + i, pos) : 0.0f;
    }
  }
}

// seq_idx of position pos; positions before 0 belong to the initial states, which are tagged
// with the row's first segment (causal-conv1d 1.7.0 semantics).
__device__ __forceinline__ int seq_at(const ConvParams& p, int64_t b, int64_t pos) {
  const int32_t* row = p.seq_idx + b * p.seq_s_b;
  return pos >= 0 ? row[pos * p.seq_s_l] : row[0];
}

// Epilogue of a channel-first backward warp: its dweight / dbias partials of channel c, summed
// over the warp in place (a fixed order); lane 0 writes them to workspace row
// b * nparts + part (deterministic mode) or adds them atomically (one atomic per value per warp).
// The row index is formed here, where it is used: passing it precomputed changed register use.
template <int W>
__device__ __forceinline__ void warp_flush_dweight(const ConvParams& p, float (&dw)[W], float& db, int lane, int64_t c,
                                                   int64_t b, int64_t nparts, int64_t part) {
  warp_sum(dw, db);
  if (lane == 0) {
    if (p.deterministic) {
      float* ws = p.workspace + ((b * nparts + part) * p.dim + c) * (W + 1);
#pragma unroll
      for (int k = 0; k < W; ++k) ws[k] = dw[k];
      ws[W] = db;
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) atomicAdd(p.dweight + c * W + k, dw[k]);
      if (p.dbias != nullptr) atomicAdd(p.dbias + c, db);
    }
  }
}

// Epilogue of a channel-last backward block: its kWarps warps hold dweight / dbias partials
// of the same 32 * kN channels from cbase (lane l: channels l*kN ..), each warp for its own
// time segment. They are summed in warp order through shared memory `red` (one row of
// (W+1) * 32 * kN per warp), then written to workspace row b * nparts + part or added
// atomically. I: the caller's channel index type (32-bit in the lean kernel). Synchronises
// the block.
template <int W, int kN, int kWarps, int kThreads, typename I>
__device__ __forceinline__ void block_flush_dweight(const ConvParams& p, float (&red)[kWarps][W + 1][32 * kN],
                                                    const float (&dw)[W][kN], const float (&db)[kN], int warp,
                                                    int lane, I cbase, I dim, int64_t b, int64_t nparts,
                                                    int64_t part) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
#pragma unroll
    for (int k = 0; k < W; ++k) red[warp][k][lane * kN + i] = dw[k][i];
    red[warp][W][lane * kN + i] = db[i];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < (W + 1) * 32 * kN; e += kThreads) {
    const int k = e / (32 * kN);
    const int ci = e % (32 * kN);
    const I c = cbase + ci;
    if (c < dim) {
      const float v = sum_over_warps(red, k, ci);
      if (p.deterministic) {
        p.workspace[((b * nparts + part) * p.dim + c) * (W + 1) + k] = v;
      } else if (k < W) {
        atomicAdd(p.dweight + int64_t(c) * W + k, v);
      } else if (p.dbias != nullptr) {
        atomicAdd(p.dbias + c, v);
      }
    }
  }
  __syncthreads();
}

// Channel-last segment length (time steps per warp): the largest power of two from kSegMaxCL
// down to kSegMinCL (FwdPolicy) that still yields enough warps to fill the GPU a few times over.
int64_t cl_seg_len(const ConvParams& p, int vec);

// The channel-last grid, one place for the forward's and the backward's kernels, their launchers
// and the backward's partial-row count: a block is (batch b, a run tb of kWarps segments, 32 lanes
// x kN channels from cg); warp w takes segment tb * kWarps + w. (The lean backward keeps its own
// 32-bit copy: this 64-bit form made it 9 % slower at bf16 W 4, 24th bench pass.)
template <int kN, int kWarps>
struct ClGrid {
  int64_t ncg, nseg, ntb;  // channel groups, segments, runs of kWarps segments
  int64_t blocks;
  __host__ __device__ ClGrid(int64_t batch, int64_t dim, int64_t seqlen, int64_t seg_len)
      : ncg((dim + 32 * kN - 1) / (32 * kN)),
        nseg((seqlen + seg_len - 1) / seg_len),
        ntb((nseg + kWarps - 1) / kWarps),
        blocks(batch * ntb * ncg) {}
  struct Cell {
    int64_t cg, tb, b, seg, c0;  // c0: the lane's first channel
  };
  __device__ __forceinline__ Cell cell(int64_t blk, int warp, int lane) const {
    Cell c;
    c.cg = blk % ncg;
    c.tb = (blk / ncg) % ntb;
    c.b = blk / ncg / ntb;
    c.seg = c.tb * kWarps + warp;
    c.c0 = c.cg * 32 * kN + int64_t(lane) * kN;
    return c;
  }
};

}  // namespace causal_conv1d
}  // namespace mamba_kernels
