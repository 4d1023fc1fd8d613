// Parameters, policy and launchers of the gated RMSNorm / LayerNorm kernels (Mamba-2's norm):
// over groups of `group_size` consecutive channels of each row,
//   rms:   y = x * rstd * w (+ b),           rstd = 1 / sqrt(mean(x^2) + eps)
//   layer: y = (x - mean) * rstd * w (+ b),  rstd = 1 / sqrt(mean((x - mean)^2) + eps)
// with the gate z: y * silu(z) when norm_before_gate, else the norm of x * silu(z).
// Plain data only: no torch here, so the .cu files compile without ATen headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dtype.h"

namespace mamba_kernels {
namespace layernorm_gated {

// --- policy ------------------------------------------------------------------------------------
// A group is normalised by one team of threads (a power of two, kMinTeam and up), each
// thread holding a fixed share of the group in registers as whole packs of 16 bytes (one
// vector access; one element when the operands do not allow vectors), so every operand is read
// once. One-warp teams share blocks of kMinBlock threads; a larger team is its own block. The
// largest group a team holds, kMaxGroupBytes, is the kernels' limit (both passes); a larger one
// runs in PyTorch.
//   forward:  64 bytes a thread, teams up to 256 (x and z packs only: ~100 registers)
//   backward: 32 bytes a thread, teams up to 512 (x, z, dy packs and fp32 dw, db sums per
//             channel; at 64 bytes it needed 200 registers, 8 warps per SM)
// Where the numbers come from: set by hand from ptxas register counts in 2dbbc9b / 45f9464
// (2026-12-07), none timed at other values; the twenty-first pass (H100, docs/notes/bench-passes.md)
// timed only the result against Triton (forward 0.65-0.85x, forward + backward 0.64-1.54x).
constexpr int kMinTeam = 32;  // structural: a warp; a team of one warp reduces with shuffles only
constexpr int kMinBlock = 128;  // by hand, 2dbbc9b: four one-warp teams a block
constexpr int kVectorBytes = 16;  // structural: one 16-byte vector access
constexpr int kFwdThreadBytes = 64;  // by hand, 2dbbc9b: ~100 registers with x and z packs
constexpr int kFwdMaxTeam = 256;     // by hand, 2dbbc9b: with 64 bytes a thread, groups of 16 KiB
constexpr int kBwdThreadBytes = 32;  // by hand, 2dbbc9b: 64 needed 200 registers (above)
constexpr int kBwdMaxTeam = 512;     // structural: the forward's largest group at 32 bytes a thread
constexpr int kMaxTeam = 512;  // the larger of the two (shared-memory slots of team_sum)
constexpr int64_t kMaxGroupBytes = int64_t(kFwdMaxTeam) * kFwdThreadBytes;  // 16 KiB
static_assert(int64_t(kBwdMaxTeam) * kBwdThreadBytes == kMaxGroupBytes, "both passes hold the same groups");
// The backward gives each team a chunk of rows of one group and sums its weight and bias
// gradients in registers: chunks of kBwdThreadsPerSm threads per SM (about what stays resident
// at its register use) keep the GPU busy; a second kernel adds the per-chunk partial sums in
// chunk order, so the result does not depend on scheduling.
// By hand in 45f9464 (1024 before, in 2dbbc9b), from the register count, not timed at other values.
constexpr int kBwdThreadsPerSm = 512;  // what stays resident at 128 registers a thread
constexpr int kReduceThreads = 128;  // by hand, 2dbbc9b, not timed

// A row-major operand of (rows, n): element (r, c) at ptr + r * row + c.
struct RowOperand {
  void* ptr = nullptr;  // null: absent (no gate, no recomputed output)
  int64_t row = 0;
};

struct NormFwdParams {
  DType dtype = DType::kFloat32;    // x, z, out
  DType w_dtype = DType::kFloat32;  // weight
  DType b_dtype = DType::kFloat32;  // bias
  int64_t rows = 0, n = 0, group_size = 0, ngroups = 0;
  RowOperand x, z, out;
  const void* w = nullptr;  // (n,), contiguous
  const void* b = nullptr;  // (n,), contiguous; null: no bias
  float* mean = nullptr;    // (ngroups * rows), group-major: (group k, row r) at k * rows + r; null for RMS
  float* rstd = nullptr;    // same layout
  float eps = 0.f;
  bool norm_before_gate = true;
  bool rms = true;
};

struct NormBwdParams {
  DType dtype = DType::kFloat32;  // x, z, dy, dx, dz, out
  DType w_dtype = DType::kFloat32;
  DType b_dtype = DType::kFloat32;
  int64_t rows = 0, n = 0, group_size = 0, ngroups = 0;
  RowOperand x, z, dy, dx, dz, out;  // out: the recomputed forward output, or absent
  const void* w = nullptr;
  const void* b = nullptr;
  const float* mean = nullptr;  // the forward's, same layout; null for RMS
  const float* rstd = nullptr;
  void* dw = nullptr;  // (n,), weight's dtype
  void* db = nullptr;  // (n,), bias's dtype; null without bias
  float eps = 0.f;
  bool norm_before_gate = true;
  bool rms = true;
};

// Floats of workspace the backward needs for these sizes on the current device (0 when empty).
int64_t norm_bwd_workspace(const NormBwdParams& p, int device_index);

// Each returns the launch's cudaError_t (cudaSuccess when there is nothing to do).
cudaError_t launch_norm_fwd(const NormFwdParams& p, cudaStream_t stream);
cudaError_t launch_norm_bwd(const NormBwdParams& p, float* workspace, int device_index, cudaStream_t stream);

}  // namespace layernorm_gated
}  // namespace mamba_kernels
