// The SSD forward's tuning constants, in one place (csrc/ssd/fwd.cu reads only these).
//
// Two policies: one for 16-bit activations, whose tile products run on tensor cores (bf16 / fp16
// operands, fp32 accumulation; on sm_75 the same tiles are multiplied with FMAs), and one for
// fp32 activations, multiplied with fp32 FMAs (no tf32 rounding).
//
// Where the numbers come from: the tiles and block sizes were set by hand when the kernels were
// written (4a79a50 forward, 4e35f97 backward, 2026-12-07) and never timed at other values; the
// twenty-first and twenty-second passes (H100, docs/notes/bench-passes.md) timed only the result
// against Triton. The state passes' kDepth and the parameter sums' layout were measured (below).
#pragma once

namespace mamba_kernels {
namespace ssd {

template <bool kHalf>
struct SsdPolicy;

// 16-bit activations: 4 warps, each owning a 16-row strip of a 64-row tile.
template <>
struct SsdPolicy<true> {
  static constexpr int kThreads = 128;  // structural: 4 warps x 16-row strips of a 64-row tile
  // chunk-state kernel: a (kStateP x kStateN) tile of the chunk's state, kStateK steps at a time
  // (all six tile sizes: by hand, 4a79a50, not timed at other sizes)
  static constexpr int kStateP = 64;
  static constexpr int kStateN = 64;
  static constexpr int kStateK = 64;
  // chunk-scan kernel: kScanT steps x kScanP channels of the output; the intra-chunk sum over
  // s-blocks of kScanT steps; the contractions over the state kScanK at a time
  static constexpr int kScanT = 64;
  static constexpr int kScanP = 64;
  static constexpr int kScanK = 64;
  static constexpr int kPadS = 8;  // structural: shared-memory row padding, in 16-bit elements (16 bytes)
  static constexpr int kPadF = 4;  // structural: of the fp32 staging tile, in floats (16 bytes)
};

// fp32 activations: FMA products, smaller tiles (the same shared memory in 4-byte elements).
template <>
struct SsdPolicy<false> {
  // By hand, 4a79a50: half the 16-bit form's K and T so the tiles fill the same shared memory; not timed.
  static constexpr int kThreads = 128;
  static constexpr int kStateP = 64;
  static constexpr int kStateN = 64;
  static constexpr int kStateK = 32;
  static constexpr int kScanT = 32;
  static constexpr int kScanP = 64;
  static constexpr int kScanK = 32;
  static constexpr int kPadS = 1;  // structural: odd row lengths: column reads stay conflict-free
  static constexpr int kPadF = 1;  // structural: the same
};

// The backward's tiles (csrc/ssd/bwd.cu): kTile steps a tile (t and s alike), kP channels,
// kN state columns, contractions kK at a time; same padding rules as the forward's. The forward's
// sizes, copied by hand in 4e35f97, not timed at other values.
template <bool kHalf>
struct SsdBwdPolicy;

template <>
struct SsdBwdPolicy<true> {
  static constexpr int kThreads = 128;  // 4 warps, a 16-row strip each of a 64-row tile
  static constexpr int kTile = 64;
  static constexpr int kP = 64;
  static constexpr int kN = 64;
  static constexpr int kK = 64;
  static constexpr int kPadS = 8;
  static constexpr int kPadF = 4;
};

template <>
struct SsdBwdPolicy<false> {
  static constexpr int kThreads = 128;
  static constexpr int kTile = 32;
  static constexpr int kP = 64;
  static constexpr int kN = 64;
  static constexpr int kK = 32;
  static constexpr int kPadS = 1;
  static constexpr int kPadF = 1;
};

// chunk_dcb: a group's heads are split over enough blocks for about kBlocksPerSm blocks an SM
// (per SM, times the device's count), each split's d(C B^T) summed into its own slab, the slabs
// added in order where chunk_dbc reads them. One block per tile and group walked all 80 heads of
// the 2.7B layer: 640 blocks, 20 % occupancy, 3.1 ms of 14 (22nd bench pass).
struct SsdDcbPolicy {
  // about two waves at the 5-6 blocks an SM its 39 KB of shared memory allow; by hand, not timed yet
  static constexpr int64_t kBlocksPerSm = 12;
};

// chunk_dbc: the same for its heads: each split's dC and dB over its heads in an fp32 slab, the
// slabs added in order by dbc_sum. One block per (step tile, state tile, group) walked all 80
// heads of the 2.7B layer: 512 blocks, 2.5 ms of 14 (22nd bench pass).
struct SsdDbcPolicy {
  static constexpr int64_t kBlocksPerSm = 12;  // by hand, as chunk_dcb's; not timed yet
};

// The backward's per-step reduction (one thread a step of a chunk) and parameter sums.
struct SsdBwdStepPolicy {
  static constexpr int kThreads = 256;  // structural: kSsdMaxChunk, one thread a step
};

// The state-passing kernels (forward and reverse): a thread owns kVec consecutive state
// elements and walks the chunks in sequence, kDepth chunks at a time: their states are loaded
// before any is used, so kVec * kDepth loads a thread are in flight instead of one (the walk is
// a chain of dependent steps, bound by memory latency: one load a step ran at 0.2 TB/s on an
// H100, 1.7 ms for the 2.7B layer's states, 21st bench pass).
struct SsdPassPolicy {
  static constexpr int kThreads = 256;  // by hand, 4a79a50, not timed at other sizes
  static constexpr int kVec = 4;    // structural: one 16-byte access a chunk (when headdim * dstate % 4 == 0)
  // Twenty-second pass (H100, f66d759), 2.7B layer bf16: with kVec, 1.72 -> 0.12 ms; other depths not tried.
  static constexpr int kDepth = 4;  // chunks loaded ahead
};

// The parameter sums (dA, dt_bias, D): one block an output element, a fixed-order strided sum
// a thread, then a fixed tree across the block.
struct SsdParamSumPolicy {
  // Twenty-second pass (H100, f66d759): a block an output, 1.35 -> 0.04 ms; 256 itself by hand, not varied.
  static constexpr int kThreads = 256;
};

}  // namespace ssd
}  // namespace mamba_kernels
