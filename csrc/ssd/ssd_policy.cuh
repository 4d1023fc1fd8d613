// The SSD forward's tuning constants, in one place (csrc/ssd/fwd.cu reads only these).
//
// Two policies: one for 16-bit activations, whose tile products run on tensor cores (bf16 / fp16
// operands, fp32 accumulation; on sm_75 the same tiles are multiplied with FMAs), and one for
// fp32 activations, multiplied with fp32 FMAs (no tf32 rounding).
#pragma once

namespace mamba_kernels {
namespace ssd {

template <bool kHalf>
struct SsdPolicy;

// 16-bit activations: 4 warps, each owning a 16-row strip of a 64-row tile.
template <>
struct SsdPolicy<true> {
  static constexpr int kThreads = 128;
  // chunk-state kernel: a (kStateP x kStateN) tile of the chunk's state, kStateK steps at a time
  static constexpr int kStateP = 64;
  static constexpr int kStateN = 64;
  static constexpr int kStateK = 64;
  // chunk-scan kernel: kScanT steps x kScanP channels of the output; the intra-chunk sum over
  // s-blocks of kScanT steps; the contractions over the state kScanK at a time
  static constexpr int kScanT = 64;
  static constexpr int kScanP = 64;
  static constexpr int kScanK = 64;
  static constexpr int kPadS = 8;  // shared-memory row padding, in 16-bit elements (16 bytes)
  static constexpr int kPadF = 4;  // of the fp32 staging tile, in floats (16 bytes)
};

// fp32 activations: FMA products, smaller tiles (the same shared memory in 4-byte elements).
template <>
struct SsdPolicy<false> {
  static constexpr int kThreads = 128;
  static constexpr int kStateP = 64;
  static constexpr int kStateN = 64;
  static constexpr int kStateK = 32;
  static constexpr int kScanT = 32;
  static constexpr int kScanP = 64;
  static constexpr int kScanK = 32;
  static constexpr int kPadS = 1;  // odd row lengths: column reads stay conflict-free
  static constexpr int kPadF = 1;
};

// The backward's tiles (csrc/ssd/bwd.cu): kTile steps a tile (t and s alike), kP channels,
// kN state columns, contractions kK at a time; same padding rules as the forward's.
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

// The backward's per-step reduction (one thread a step of a chunk) and parameter sums.
struct SsdBwdStepPolicy {
  static constexpr int kThreads = 256;  // kSsdMaxChunk
};

// The state-passing kernel: one thread per state element, the chunks in sequence.
struct SsdPassPolicy {
  static constexpr int kThreads = 256;
};

}  // namespace ssd
}  // namespace mamba_kernels
