// Parameters and launcher of the Mamba-2 SSD chunked-scan forward (csrc/ssd/fwd.cu). Plain data
// only: no torch here, so the .cu files compile without ATen headers.
//
// Per (batch b, head h; group g = h / heads_per_group), chunks of chunk_size steps:
//   dt_t  = clamp(softplus?(dt_t + dt_bias_h), dt_lo, dt_hi)     (softplus only with dt_softplus;
//                                                                  the clamp always, (0, inf) by default)
//   cs_t  = sum of dt_s * A_h over the chunk's steps s <= t       (dA_cumsum)
//   S_c   = sum_t exp(cs_last - cs_t) dt_t x_t B_t^T               (the chunk's own state)
//   H_c   = exp(cs_last(c - 1)) H_(c-1) + S_(c-1), H_0 = initial   (the state entering chunk c)
//   y_t   = exp(cs_t) C_t H_c + sum_{s <= t in c} (C_t . B_s) exp(cs_t - cs_s) dt_s x_s + D x_t
//   out_t = y_t * silu(z_t)                                         (with z; out_x keeps y_t)
// With seq_idx, a state never crosses a change of seq_idx (nondecreasing, as packed
// sequences give; the state before step 0 counts as sequence 0).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dtype.h"

namespace mamba_kernels {
namespace ssd {

// An operand read in place: base pointer, dtype, element strides of its (up to 4) axes; an
// axis it lacks (or of size 1) has stride 0.
struct Operand {
  const void* ptr = nullptr;  // null: an absent optional operand
  DType dtype = DType::kFloat32;
  int64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  // 16 consecutive bytes of a row (along the last axis) may be read as one vector: the last
  // axis is unit-stride, the base 16-byte aligned, the other strides multiples of 16 bytes.
  bool vec16 = false;
};

struct SsdFwdParams {
  DType dtype = DType::kFloat32;  // x, B, C, z and the outputs out / out_x
  int64_t batch = 0, seqlen = 0, nheads = 0, headdim = 0, dstate = 0;
  int64_t heads_per_group = 1, ngroups = 1;
  int64_t chunk = 256, nchunks = 0;
  bool dt_softplus = false;
  // dt is clamped into [dt_lo, dt_hi] after bias and softplus, always (so by default, (0, inf),
  // a negative dt without softplus is 0); a NaN stays NaN.
  float dt_lo = 0.0f, dt_hi = 0.0f;

  Operand x;               // (batch, seqlen, head, p)
  Operand dt;              // (batch, seqlen, head)
  Operand A;               // (head,)
  Operand B, C;            // (batch, seqlen, group, n)
  Operand D;               // (head, p): s1 == 0 for a (nheads,) D; may be absent
  Operand z;               // like x; may be absent
  Operand dt_bias;         // (head,); may be absent
  Operand init;            // (batch, head, p, n); may be absent
  const int32_t* seq_idx = nullptr;  // (batch, seqlen) or null
  int64_t seq_s0 = 0, seq_s1 = 0;
  // (nseqs + 1,) int32 or int64 sequence offsets of a packed batch (batch 1), or null: then
  // varlen_states gets each sequence's final state (with seq_idx marking the same sequences).
  const void* cu_seqlens = nullptr;
  bool cu_seqlens_64 = false;
  int64_t cu_s0 = 1, nseqs = 0;

  // Outputs, written with these strides (x's dtype for out / out_x, fp32 for the rest).
  void* out = nullptr;  // (batch, seqlen, head, p)
  int64_t out_s0 = 0, out_s1 = 0, out_s2 = 0, out_s3 = 0;
  void* out_x = nullptr;  // like out; null without z
  int64_t outx_s0 = 0, outx_s1 = 0, outx_s2 = 0, outx_s3 = 0;
  float* dt_out = nullptr;     // (batch, head, nchunks, chunk), contiguous
  float* dA_cumsum = nullptr;  // (batch, head, nchunks, chunk), contiguous
  float* states = nullptr;     // (batch, nchunks, head, p, n), contiguous
  float* final_states = nullptr;  // (batch, head, p, n), contiguous
  float* varlen_states = nullptr;  // (nseqs, head, p, n), contiguous; with cu_seqlens only
  // Workspace (batch, nchunks, group, chunk, chunk), contiguous: C_t . B_s of each chunk and
  // group for s, t in the chunk, written for the tiles at and below the diagonal.
  float* cb = nullptr;
};

// The limits the launcher relies on (the host code checks them before the launch).
constexpr int64_t kSsdMaxChunk = 256;
constexpr int64_t kSsdMaxGridYZ = 65535;

// Runs the kernels on the stream; returns the first launch error (cudaSuccess when there
// is nothing to do), or cudaErrorInvalidValue for a chunk outside 1..kSsdMaxChunk.
cudaError_t launch_ssd_fwd(const SsdFwdParams& p, cudaStream_t stream);

// The forward's first three launches only (chunk_cb, chunk_state, state_pass): cb, dt_out,
// dA_cumsum and the entering states, as the backward recomputes them (final_states may be null).
cudaError_t launch_ssd_fwd_states(const SsdFwdParams& p, cudaStream_t stream);

// The backward (csrc/ssd/bwd.cu). f holds the forward's inputs and, as buffers, the
// intermediates the backward recomputes (dt_out, dA_cumsum, states, cb; final_states null).
// Every output and workspace below is contiguous.
struct SsdBwdParams {
  SsdFwdParams f;
  Operand dout;    // (batch, seqlen, head, p)
  Operand out;     // y before the gate (batch, seqlen, head, p); read only with z
  Operand dfinal;  // (batch, head, p, n); may be absent

  // Outputs: dx, dz (x's dtype; dz only with z), dB, dC (x's dtype), ddt (ddt_dtype,
  // (batch, seqlen, head)), dA (dA_dtype, (head,)), dD (dD_dtype, (head,) or (head, p)), ddt_bias
  // (ddt_bias_dtype, (head,)), dinit (dinit_dtype, (batch, head, p, n)); null where absent.
  void *dx = nullptr, *dz = nullptr, *dB = nullptr, *dC = nullptr, *ddt = nullptr, *dA = nullptr;
  void *dD = nullptr, *ddt_bias = nullptr, *dinit = nullptr;
  DType ddt_dtype = DType::kFloat32, dA_dtype = DType::kFloat32, dD_dtype = DType::kFloat32;
  DType ddt_bias_dtype = DType::kFloat32, dinit_dtype = DType::kFloat32;
  bool dD_per_channel = false;

  // fp32 workspaces (sizes from ssd_bwd_workspace).
  void* dy = nullptr;           // (batch, seqlen, head, p) in x's dtype: dout silu(z) (dout without z)
  float* dstates = nullptr;     // (batch, nchunks, head, p, n): the state gradients
  float* dcb = nullptr;         // (dcb_splits, batch, nchunks, group, chunk, chunk): d(C_t . B_s), summed over
                                // each split's heads of the group (the splits are added in order when read)
  float* step_part = nullptr;   // (batch, head, nchunks, nslots, chunk): per-step partial sums
  float* decay_part = nullptr;  // (batch, head, nchunks, pass_blocks)
  float* head_part = nullptr;   // (batch * nchunks, 2, head): dA and ddt_bias partials
  float* dD_part = nullptr;     // (batch * nchunks * stiles, head, p)
  float* dbc_part = nullptr;    // (dbc_splits, 2, batch, seqlen, group, n): each split's dC and dB over its
                                // heads of the group, added in order by dbc_sum (dbc_splits > 1 only)
  int64_t nslots = 0, pass_blocks = 0, stiles = 0, ptiles = 0, dcb_splits = 1, dbc_splits = 1;
};

// The backward's workspace counts (in floats) for p.f's shapes and dtype on the current device;
// fills nslots, pass_blocks, stiles, ptiles, dcb_splits, dbc_splits.
struct SsdBwdWorkspace {
  int64_t dy, dstates, dcb, step_part, decay_part, head_part, dD_part, dbc_part;
};
SsdBwdWorkspace ssd_bwd_workspace(SsdBwdParams& p);

// Runs the recomputation and the backward's kernels on the stream; returns the first launch
// error.
cudaError_t launch_ssd_bwd(const SsdBwdParams& p, cudaStream_t stream);

}  // namespace ssd
}  // namespace mamba_kernels
