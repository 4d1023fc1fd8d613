// Tuning of every selective-scan kernel in one place: block sizes, register caps (the launch
// bounds), tiles and the occupancy targets the grids are sized by. Each struct belongs to one
// kernel family; the kernels read their shapes from here and hold no literals of their own.
// Each tuned number carries the measurement that set it (docs/notes/bench-passes.md: pass, GPU,
// shape, what it beat), or says that it was set by hand and in which commit; "structural:" marks
// a value the layout forces.
#pragma once

#include <cstdint>

#include "device_utils.cuh"
#include "selective_scan.h"

namespace mamba_kernels {
namespace selective_scan {

// fwd.cu: the general forward (complex A, dstate > 16).
struct FwdPolicy {
  // kThreads, kMinBlocks, kTile: set by hand in 5965955 / d302bf2 (2026-11-30), never timed at other values.
  static constexpr int kThreads = 128;
  static constexpr int kMinBlocks = fit_blocks_per_sm(kThreads, 3);  // __launch_bounds__
  static constexpr int kTile = 16;      // steps per tile (one B/C tile in shared memory)
  // First H200 scan pass (2026-11-30), (8, 2048, 2048, 16) bf16: 4 floats (twice the warps) 0.81 ms, 8 0.65 ms.
  static constexpr int kSliceFloats = 8;  // floats of state per thread: 8 real or 4 complex states
  // Same pass: prefetch plus double-buffered tiles took the forward 0.94 -> 0.65 ms; 4 was not varied.
  static constexpr int kPrefetch = 4;   // B (and C) tile elements per thread held for the next tile
  // kMinWarpsPerSm, kTargetWarpsPerSm, kMinSegment: set by hand in d302bf2, not measured since.
  static constexpr int kMinWarpsPerSm = 4;    // below this, cut the sequence into segments
  static constexpr int kTargetWarpsPerSm = 8;
  static constexpr int64_t kMinSegment = 1024;  // steps; a multiple of kChunk
};

// bwd.cu: the general backward.
struct BwdPolicy {
  // kThreads, kStates, window(): set by hand in 5965955 (2026-11-30); the first H200 scan pass profiled
  // the result (238-255 registers, 8 warps per SM) but timed no other value.
  static constexpr int kThreads = 128;
  static constexpr int kStates = 4;            // states per thread
  // Chunk-sized tiles (4009445), with three other changes: backward 4.2 -> 3.9 ms, first H200 scan pass.
  static constexpr int kTileFloats = 64 * 64;  // B (and C) floats per shared tile, at most
  static constexpr int kRowPad = 4;            // structural: keeps rows of per-step arrays in distinct banks
  template <bool kComplex>
  __host__ __device__ static constexpr int window() { return kComplex ? 4 : 8; }  // steps in registers
};

// The lane kernels for real A and dstate <= 16 (scan_lanes.cuh).
struct LanePolicy {
  static constexpr int kLanes = 16;                    // structural: dstate <= 16, one state per lane
  // Set by hand in a0967a0 (2026-12-01); only the backward still uses it (2 blocks per SM at 128 registers).
  static constexpr int kThreads = 256;                 // threads per block
  static constexpr int kChannels = kThreads / kLanes;  // channels per block at one state per lane
  static constexpr int kGroup = kLanes;                // structural: steps per reduce-scatter
  // The lane forward takes the most states per lane that still leave this many warps per SM.
  // 11, not 12: batch x dim = 6144 (batch 4 at d_inner 1536, a small model's training step)
  // then runs 2 states per lane, 11.6 warps per SM in one wave, instead of 1 per lane in 1.16
  // waves of 20 warps, whose tail ran nearly alone. Scan v2 third pass (H200, 2026-12-01):
  // (4, 1536, 2048) bf16 forward 0.246 (profiled) -> 0.173 ms; the fifth pass's forced-kS table agrees at 5 shapes.
  static constexpr int kMinFwdWarpsPerSm = 11;
  static_assert(kChunk % kGroup == 0, "a checkpoint falls at a group end");
};

// fwd_lanes.cu, for kS states per lane.
template <int kS>
struct FwdLanesPolicy {
  static constexpr int kP = LanePolicy::kLanes / kS;     // lanes per channel
  // 128-thread blocks: finer than 256 at the wave's end, and at the register caps below
  // (96 registers) 20 warps per SM. Scan v2 second pass (H200, 2026-12-01): 256 -> 128 threads (with B/C both
  // variable at compile time) took the (4, 5120, 2048) bf16 forward from 0.80x to 1.38x the original.
  static constexpr int kThreads = 128;
  static constexpr int kCh = kThreads / kP;  // channels per block
  // steps per tile, one reduce-scatter: 32 at one state per lane, where the tile's fixed work
  // (discretising, loads, stores, the barrier) is shared by the fewest states and a longer
  // tile gives each lane twice the independent work between barriers; else 16. Sixteenth pass
  // (H200, 998fd51): (2, 2048, 8192) bf16 forward 0.542 -> 0.467 ms (the 128-register cap alone: 0.532).
  static constexpr int kTile = kS == 1 ? 2 * LanePolicy::kGroup : LanePolicy::kGroup;
  static constexpr int kQ = kTile / kP;                  // consecutive steps each lane owns per tile
  static constexpr int kTRow = 20;               // structural: [step][state] tile rows: 80 B, conflict-free
  static constexpr int kNRow = kTile + 4;        // structural: [state][step] tile rows, padded off the banks
  // B/C tile per buffer: [state][step] for one state per lane, where a lane reads 4 steps of
  // its state at once; [step][state] for more, where it reads its kS states.
  static constexpr int kTileFloats = kS == 1 ? LanePolicy::kLanes * kNRow : kTile * kTRow;
  // Staging a B/C tile: each loader thread takes kLoadGroups runs of 4 consecutive steps
  // (structural: a 4-step vector load, ec28805)
  static constexpr int kLoadGroups = kTile / LanePolicy::kGroup;
  static constexpr int kLoadSteps = 4 * kLoadGroups;
  static constexpr int kLoaders = 2 * LanePolicy::kLanes * kTile / kLoadSteps;  // threads staging a tile
  // 5 blocks (20 warps) an SM at 96 registers; one state per lane runs at few channels (at most
  // about 16 warps an SM), where 4 blocks of up to 128 registers hold them all. 5: the v2 second
  // pass's 128-thread step (above); 4: sixteenth pass, where it lets 32 partial sums fit unspilled.
  static constexpr int kMinBlocks = fit_blocks_per_sm(kThreads, kS == 1 ? 4 : 5);  // __launch_bounds__
  static_assert(kLoaders <= kThreads, "every tile value has a loader");
};

// bwd_lanes.cu.
struct BwdLanesPolicy {
  static constexpr int kWin = 16;                        // structural (= kGroup): steps recomputed at once
  static constexpr int kWins = kChunk / kWin;            // windows per chunk
  static constexpr int kRow = kChunk + 4;                // structural: a state row of a B/C chunk tile, padded
  static constexpr int kWarps = LanePolicy::kThreads / kWarpSize;
  // Set by hand in a0967a0 (128 registers a thread), not timed at other counts (ninth pass: its cost at few channels).
  static constexpr int kBlocksPerSm = fit_blocks_per_sm(LanePolicy::kThreads, 2);  // grid target, launch bound
  // Kept states at most 2^kMaxStateShift chunks apart (1024 steps): the chunk starts between
  // two of them are recomputed into shared memory, a float per thread and chunk (16 KB).
  // Set in 33f775b by that shared memory, not timed at other spacings (ninth pass timed this one).
  static constexpr int kMaxStateShift = 4;
  static_assert(kWin == LanePolicy::kGroup, "one reduce-scatter per window");
};

// sum_partials.cu.
struct SumPartialsPolicy {
  static constexpr int kThreads = 256;  // set by hand in c333410, not measured since
};

// update*.cu: the decode step (selective_state_update).
struct UpdatePolicy {
  // Set by hand in 2b347e3 / 14d7074 (2026-12-01), not timed at other block sizes.
  static constexpr int kThreads = 128;  // most threads per block; fewer when the channel axis is short
  // "pair" (two batch rows per thread) once the launch keeps at least this many threads per SM:
  // about two waves at this kernel's occupancy. Set as 2^18 threads on the H100 / H200 (132 SMs:
  // 2^18 / 132 rounded down to 64, so every launch that took "pair" there still does). 2^18 was set
  // by hand in 14d7074 ("about two waves"); no A/B of the threshold is recorded. Below it, more
  // threads (one row each) spread the work more evenly than more bytes per thread would.
  static constexpr int64_t kPairMinThreadsPerSm = 1984;
  static constexpr int kMaxLanes = 32;  // structural: a row's lanes sum in one warp (32 x 16-byte chunks)
  // The lean kernel (update_lean.cu) gives a warp all of a row's passes from this many rows (batch
  // x heads x dim) per SM on; below it one pass per warp. Set on the H200 (132 SMs) at dim 5120:
  // one pass was faster at batch 1 (5120 rows), all passes from batch 16 (81920 rows) on
  // (fourth pass, 2026-12-01: 2.8 against 3.7 us at batch 1, 6.5 against 6.9-7.4 at batch 16).
  static constexpr int64_t kLeanFullRowsPerSm = 256;
  // From kLeanFullRowsPerSm up to this many rows per SM, a warp with a multiple of four passes (fp32
  // states of 16 or more) takes them four at a time, every load issued before the first use:
  // one wait on memory per warp where pairs wait twice, at the cost of registers (6 blocks per
  // SM instead of 8), which the largest launches need for bytes in flight. Eighth pass (H200, dim
  // 5120, graph): quads 0.4 us faster at batch 16, equal at 64, 1.3 us slower at 256 than pairs.
  static constexpr int64_t kLeanQuadMaxRowsPerSm = 4096;
  // Up to this many rows per SM a dense launch takes the row kernel (update_row.cu). Set at dim 5120
  // in a CUDA graph on the H200 (132 SMs): 1.80 us a step at batch 1 against the lean kernel's
  // 1.93, the same within run noise at batch 16 and 64 (327680 rows), slower at 256.
  static constexpr int64_t kRowMaxRowsPerSm = 4096;
  // Register caps: each decode kernel's __launch_bounds__ minimum of kThreads blocks per SM
  // (the row kernel has none), from the dtypes' sizes in bytes, lowered to what the SM holds.
  // state_update_kernel: 8 (64 registers, which the typed kernels need without spilling); 6
  // (80) for the generic kernel (T = AnyDtype) and for fp32 activations with a 16-bit state (8
  // fp32 values per B/C chunk). Set from ptxas register counts (60-64 / 78-80, no spills) in
  // 14d7074, not timed at other caps.
  __host__ __device__ static constexpr int full_min_blocks(bool generic, int state_bytes, int act_bytes) {
    return fit_blocks_per_sm(kThreads, generic || act_bytes > state_bytes ? 6 : 8);
  }
  // state_update_lean<S, T, kP>: as many as the registers of kP interleaved passes allow without
  // spilling: a pass holds a chunk of state and one of A (8 fp32 values for 16-bit states), and
  // fp32 activations double B and C. Pairs at 8 (63 registers) beat four passes at 6 at batch 256,
  // 53.3 against 63.0 us (fourth pass); kP = 4's 5 / 4: ebddb53 (79 registers, 6 blocks resident; eighth
  // pass); kP = 1's 10 / 12 from its 36-48 registers (54189bb). None timed at other caps.
  __host__ __device__ static constexpr int lean_min_blocks(int kP, int state_bytes, int act_bytes) {
    const bool wide = state_bytes == 2 || act_bytes == 4;
    const int blocks = kP == 4 ? (wide ? 4 : 5) : kP == 1 ? (act_bytes > state_bytes ? 10 : 12) : (wide ? 6 : 8);
    return fit_blocks_per_sm(kThreads, blocks);
  }
};

}  // namespace selective_scan
}  // namespace mamba_kernels
