// The host side of the selective-scan ops that both bindings share: every precondition check
// (with its message), the parameter fills, the sizes of what the binding allocates, and the
// launches, including the backward's reduction of its partial sums. The ops (scan_ops.h,
// update_ops.h, over either binding's tensor API) only turn their tensors into TensorRefs,
// allocate and convert. No torch here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "selective_scan.h"
#include "state_update.h"
#include "tensor_ref.h"

namespace mamba_kernels {
namespace selective_scan {

// ---- selective_scan_fwd / selective_scan_bwd

// Checks u, delta, A, B, C, D, z and delta_bias and fills everything but the parameters the
// kernels read as contiguous fp32 copies (A, fixed B/C, D, delta_bias): the binding makes
// those (A complex: its real view of the resolved conjugate) and passes them to set_f32_params.
// B or C is fixed when 2-D (dim, dstate), variable when 4-D.
ScanParams prepare(const TensorRef& u, const TensorRef& delta, const TensorRef& A, const TensorRef& B,
                   const TensorRef& C, const TensorRef& D, const TensorRef& z, const TensorRef& delta_bias,
                   bool softplus);
void set_f32_params(ScanParams& p, const TensorRef& A32, const TensorRef& B32, const TensorRef& C32,
                    const TensorRef& D32, const TensorRef& bias32);

inline int64_t n_chunks(int64_t seqlen) { return (seqlen + kChunk - 1) / kChunk; }
// State floats per (batch, channel): dstate, twice that for complex A.
inline int64_t state_floats(const ScanParams& p) { return p.dstate * (p.is_complex ? 2 : 1); }
// Floats of the forward's segment workspace (0: one pass, none needed).
int64_t fwd_workspace_floats(const ScanParams& p);

// The forward's kept states: one every state_steps steps (kChunk times a power of two), in
// state_count slots: -1 for ceil(L / state_steps), or that plus one when L > 0 (the final state
// then fills the last two). state_pairs interleaves slots 2r and 2r + 1 state by state (an even
// count): the original's x layout, (batch, dim, count / 2, dstate, 2). Checks them and fills
// p.ckpt_*; returns the slot count the binding allocates.
int64_t set_fwd_states(ScanParams& p, int64_t state_steps, int64_t state_count, bool state_pairs);
// Forward outputs: out (null when not wanted), out_z (null without z), ckpt; then the launch.
void set_fwd_outputs(ScanParams& p, const TensorRef& out, const TensorRef& out_z, float* ckpt);
// workspace: fwd_workspace_floats(p) floats, or null when that is 0.
void launch_fwd_checked(const ScanParams& p, float* workspace, cudaStream_t stream);

// Backward: dout, ckpt, and with z also y and dz checked and filled; out_z (y silu(z), written
// by the backward) when it has elements. ckpt holds the forward's states as set_fwd_states laid
// them out: every state_steps steps (kChunk, the default, or up to 2^bwd_max_state_shift
// chunks apart, in which case the backward recomputes the chunk starts between them), in pairs
// or not.
void set_bwd_inputs(ScanParams& p, const TensorRef& u, const TensorRef& z, const TensorRef& dout,
                    const TensorRef& ckpt, const TensorRef& y, const TensorRef& dz, const TensorRef& out_z,
                    int64_t state_steps, bool state_pairs);
// Floats of the dB / dC partial sums: variable (batch, ngroups, row_blocks, dstate, part_len [x2]),
// fixed (batch, dim, dstate [x2]).
int64_t part_floats(const ScanParams& p, const BCParams& bc);
void set_bwd_outputs(ScanParams& p, const TensorRef& du, const TensorRef& ddelta, float* dA_part, float* dD_part,
                     float* dbias_part, float* dB_part, float* dC_part);
// The parameter gradients, each allocated by the binding in the shape and dtype of its
// parameter, contiguous: dA like A, dB / dC like B / C (fixed: fp32 or complex64 (dim, dstate);
// variable: u's dtype (batch, ngroups, dstate, L [x2])), dD / ddelta_bias fp32 (dim,). Null
// where the parameter is absent (D, delta_bias).
struct ParamGrads {
  void* dA = nullptr;
  void* dB = nullptr;
  void* dC = nullptr;
  float* dD = nullptr;
  float* dbias = nullptr;
};
// The backward's launches and the reduction of its partial sums into the gradients, on the
// stream, in a fixed order (launch_sum_jobs: every sum due at one point in one launch): one
// pass, or with spaced states and a sequence longer than the space between them, where they take
// less memory, windows of that many steps, the last first (bwd_window_chunks: the binding then sizes the partials by
// p.part_len and gives p.carry bwd_carry_floats floats). Every gradient is bitwise the same
// either way.
void run_bwd_checked(ScanParams& p, const ParamGrads& g, cudaStream_t stream);

// ---- selective_state_update

// Every check and fill but the output (set_update_output after allocating it like x).
StateUpdateParams prepare_state_update(const TensorRef& state, const TensorRef& x, const TensorRef& dt,
                                       const TensorRef& A, const TensorRef& B, const TensorRef& C,
                                       const TensorRef& D, const TensorRef& z, const TensorRef& dt_bias,
                                       bool dt_softplus, const TensorRef& state_batch_indices);
void launch_state_update_checked(StateUpdateParams& p, const TensorRef& state, const TensorRef& out,
                                 cudaStream_t stream);

}  // namespace selective_scan
}  // namespace mamba_kernels
