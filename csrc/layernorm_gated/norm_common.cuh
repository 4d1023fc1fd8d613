// Device code shared by the gated norm's forward and backward (norm_gated.h has the maths and
// the policy): the team layout, the team reduction, typed pack loads of the per-channel
// parameters, and the host-side choice of team and vector path.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "device_utils.cuh"
#include "norm_gated.h"

namespace mamba_kernels {
namespace layernorm_gated {

// Elements of T per pack: a 16-byte vector, or one element (kVec false); a thread holds
// kBytes of the group.
template <typename T, bool kVec, int kBytes>
struct PackOf {
  static constexpr int kElems = kVec ? kVectorBytes / int(sizeof(T)) : 1;
  static constexpr int kPerThread = kBytes / (kElems * int(sizeof(T)));  // packs a thread holds
};

// Where a thread sits: its team (one group of one row at a time) and its lane in the team. A
// team of one warp may share its block with others; a larger team is the whole block.
struct TeamPos {
  int lane;        // 0 .. team - 1
  int team_id;     // the team's index in the block
  int warp;        // the warp's index in the team
  int teams;       // teams per block
  int team_warps;  // warps per team
};

__device__ __forceinline__ TeamPos team_pos(int team) {
  TeamPos t;
  t.lane = int(threadIdx.x) & (team - 1);
  t.team_id = int(threadIdx.x) / team;
  t.warp = t.lane / kWarpSize;
  t.teams = int(blockDim.x) / team;
  t.team_warps = team / kWarpSize;
  return t;
}

// Sum of kN values over the team, in every thread of it, in a fixed order (warp butterfly,
// then the warps in index order). A team of several warps is the whole block; it passes
// through one barrier, so every thread of the block must call it. smem: 2 * kN * kMaxTeam / 32
// floats; `phase` (0 or 1) picks which half: two consecutive calls must use different halves
// (the second call's barrier is what tells the first call's readers are done).
template <int kN>
__device__ __forceinline__ void team_sum(float (&v)[kN], const TeamPos& t, float* smem, int phase) {
  warp_sum(v);
  if (t.team_warps == 1) return;
  float* slot = smem + phase * kN * (kMaxTeam / kWarpSize);
  if ((t.lane & (kWarpSize - 1)) == 0) {
#pragma unroll
    for (int i = 0; i < kN; ++i) slot[i * (kMaxTeam / kWarpSize) + t.warp] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    float s = 0.f;
    for (int w = 0; w < t.team_warps; ++w) s += slot[i * (kMaxTeam / kWarpSize) + w];
    v[i] = s;
  }
}

// kN consecutive per-channel parameters (weight or bias) of run-time dtype `dt` at element `i`
// of base, as fp32; vectorised when kN > 1 (base aligned to 16 bytes, i a multiple of kN).
template <typename W, int kN>
__device__ __forceinline__ void load_param_typed(float (&v)[kN], const void* base, int64_t i) {
  constexpr int kChunk = kN * int(sizeof(W)) > kVectorBytes ? kVectorBytes / int(sizeof(W)) : kN;
  const W* p = static_cast<const W*>(base) + i;
#pragma unroll
  for (int c = 0; c < kN; c += kChunk) {
    float part[kChunk];
    load_floats<W, kChunk>(part, p + c);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) v[c + j] = part[j];
  }
}

template <int kN>
__device__ __forceinline__ void load_param(float (&v)[kN], const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::kBFloat16: load_param_typed<__nv_bfloat16, kN>(v, base, i); break;
    case DType::kFloat16: load_param_typed<__half, kN>(v, base, i); break;
    default: load_param_typed<float, kN>(v, base, i); break;
  }
}

// Stores a pack: one 16-byte store built by integer ops for a vector, else the element.
template <typename T, int kN>
__device__ __forceinline__ void store_out(T* ptr, const float (&v)[kN]) {
  if constexpr (kN * int(sizeof(T)) == kVectorBytes) {
    store16<T, kN>(ptr, v);
  } else {
    store_pack<T, kN>(ptr, v);
  }
}

__device__ __forceinline__ float sigmoid(float z) { return __fdividef(1.0f, 1.0f + __expf(-z)); }

// --- host side: the launch shape -------------------------------------------------------------

struct TeamShape {
  int team = 0;     // threads per group
  int block = 0;    // threads per block
  bool vec = false; // 16-byte packs
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) % kVectorBytes) == 0; }

// The vector path needs every row of every operand to start on 16 bytes: aligned bases, row
// strides and the group size in whole vectors.
inline bool vector_ok(const RowOperand& o, int64_t elems) {
  return o.ptr == nullptr || (aligned16(o.ptr) && o.row % elems == 0);
}

// The team for a group of `group_size` elements of `elem_bytes` (packs of `pack_elems`): the
// smallest power of two that holds the group at `thread_bytes` a thread, up to `max_team`; 0
// when none does.
inline int team_for(int64_t group_size, int elem_bytes, int pack_elems, int thread_bytes, int max_team) {
  const int64_t packs = (group_size + pack_elems - 1) / pack_elems;
  const int64_t per_thread = thread_bytes / (int64_t(pack_elems) * elem_bytes);
  const int64_t need = (packs + per_thread - 1) / per_thread;
  int team = kMinTeam;
  while (team < need && team < max_team) team *= 2;
  return team >= need ? team : 0;
}

inline TeamShape team_shape(int64_t group_size, int elem_bytes, bool vec, int thread_bytes, int max_team) {
  TeamShape s;
  s.vec = vec;
  s.team = team_for(group_size, elem_bytes, vec ? kVectorBytes / elem_bytes : 1, thread_bytes, max_team);
  // a team of several warps is the whole block (its sums pass block barriers); one-warp teams
  // share a block of kMinBlock threads
  s.block = s.team > kMinTeam ? s.team : kMinBlock;
  return s;
}

// Grid size for `units` teams of `s` (capped: the kernels stride over the rest).
inline unsigned grid_for(int64_t units, const TeamShape& s) {
  const int64_t teams = s.block / s.team;
  const int64_t blocks = (units + teams - 1) / teams;
  return unsigned(blocks < 0x7fffffff ? blocks : 0x7fffffff);
}

}  // namespace layernorm_gated
}  // namespace mamba_kernels
