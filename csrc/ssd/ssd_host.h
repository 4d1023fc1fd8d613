// The host side of the SSD forward op that both bindings share: every precondition check (with
// its message), the parameter fill, the shapes of what the binding allocates, and the launch.
// The op (ssd_ops.h, over either binding's tensor API) only turns its tensors into TensorRefs
// and allocates. No torch here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ssd.h"
#include "tensor_ref.h"

namespace mamba_kernels {
namespace ssd {

// Checks every input and fills everything but the outputs. dt is clamped into dt_limit (lo, hi)
// after bias and softplus, the default (0, inf) included.
SsdFwdParams prepare_ssd_fwd(const TensorRef& x, const TensorRef& dt, const TensorRef& A, const TensorRef& B,
                             const TensorRef& C, int64_t chunk_size, const TensorRef& D, const TensorRef& z,
                             const TensorRef& dt_bias, const TensorRef& initial_states, const TensorRef& seq_idx,
                             const TensorRef& cu_seqlens, bool dt_softplus, double dt_limit_lo, double dt_limit_hi);

// The outputs the binding allocates, contiguous: out (and out_x with z) of x's shape and dtype;
// dt_out and dA_cumsum fp32 (batch, nheads, nchunks, chunk_size); states fp32
// (batch, nchunks, nheads, headdim, dstate); final_states fp32 (batch, nheads, headdim, dstate);
// varlen_states fp32 (nseqs, nheads, headdim, dstate) with cu_seqlens (else not read); the
// workspace cb fp32 (batch, nchunks, ngroups, chunk_size, chunk_size) (cb_shape).
// Checked and filled here, then the launches.
void launch_ssd_fwd_checked(SsdFwdParams& p, const TensorRef& out, const TensorRef& out_x, const TensorRef& dt_out,
                            const TensorRef& dA_cumsum, const TensorRef& states, const TensorRef& final_states,
                            const TensorRef& varlen_states, const TensorRef& cb, cudaStream_t stream);

// The backward: checks every input (messages name ssd_chunk_scan_bwd) and fills everything
// but the outputs and workspaces. out (y before the gate) is read only with z.
SsdBwdParams prepare_ssd_bwd(const TensorRef& dout, const TensorRef& x, const TensorRef& dt, const TensorRef& A,
                             const TensorRef& B, const TensorRef& C, const TensorRef& out, int64_t chunk_size,
                             const TensorRef& D, const TensorRef& z, const TensorRef& dt_bias,
                             const TensorRef& initial_states, const TensorRef& dfinal_states, const TensorRef& seq_idx,
                             bool dt_softplus, double dt_limit_lo, double dt_limit_hi);

// The backward's outputs, contiguous, as the binding allocates them: dx, dB, dC, dz in x's dtype;
// ddt, dA, dD, ddt_bias, dinit in their inputs' dtypes and shapes (absent where the input is).
struct BwdOutputs {
  Scalar x_scalar = Scalar::kFloat32;
  TensorRef dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinit;
};

// The fp32 workspace's element count (counts: its pieces, in order).
constexpr int kSsdBwdPieces = 12;
int64_t ssd_bwd_workspace_floats(SsdBwdParams& p, int64_t (&counts)[kSsdBwdPieces]);

// Checked and filled here (the workspace carved into the recomputed forward intermediates and
// the backward's own buffers), then the launches.
void launch_ssd_bwd_checked(SsdBwdParams& p, const BwdOutputs& o, const TensorRef& workspace, cudaStream_t stream);

// The workspace's shape, (batch, nchunks, ngroups, chunk_size, chunk_size).
inline void cb_shape(const SsdFwdParams& p, int64_t (&sizes)[5]) {
  sizes[0] = p.batch;
  sizes[1] = p.nchunks;
  sizes[2] = p.ngroups;
  sizes[3] = p.chunk;
  sizes[4] = p.chunk;
}

}  // namespace ssd
}  // namespace mamba_kernels
