// The host side of the causal_conv1d ops that both bindings share: every precondition check
// (with its message), the parameter fills, the output layouts and the launches. The ops
// (conv_ops.h, over either binding's tensor API) only turn their tensors into TensorRefs,
// allocate, convert and copy. No torch here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "causal_conv1d.h"
#include "tensor_ref.h"

namespace mamba_kernels {
namespace causal_conv1d {

// x, weight, bias, seq_idx and initial_states checked and filled into a ConvParams (weight and
// bias excepted: the binding passes contiguous ones, in their own dtype, to set_weights).
ConvParams prepare(const TensorRef& x, const TensorRef& weight, const TensorRef& bias, const TensorRef& seq_idx,
                   const TensorRef& initial_states, bool silu);
void set_weights(ConvParams& p, const TensorRef& weight, const TensorRef& bias);

// The layout of a (batch, d1, d2) tensor in x's layout family (the rule of
// causal_conv1d._checks.empty_like_layout, which the fake implementations use): dense x of
// the same shape keeps x's exact strides, anything else is dense channel-last or channel-first.
// A plain strided tensor, never a transposed view: an output that is a view may not be
// modified in place once returned from an autograd.Function with several outputs.
Alloc3 layout_like(const TensorRef& x, int64_t d1, int64_t d2);

// Forward: the output, then final_states_out (checked; the binding copies initial states into
// it when seqlen is 0, as no kernel runs), then the launch.
void set_out(ConvParams& p, const TensorRef& out);
void set_final_states(ConvParams& p, const TensorRef& x, const TensorRef& final_states_out);
void launch_fwd_checked(ConvParams& p, const TensorRef& x, const TensorRef& out, cudaStream_t stream);

// Backward: dout and dx checked; whether dout must be re-laid out like x first (another layout,
// or broadcast with a zero stride along the vector axis) so the kernel streams it with vector
// loads; dfinal_states; the fp32 reductions' sizes; the launch.
void check_bwd_grads(const ConvParams& p, const TensorRef& x, const TensorRef& dout, const TensorRef& dx);
bool dout_needs_relayout(const ConvParams& p, const TensorRef& dout);
void set_bwd_tensors(ConvParams& p, const TensorRef& x, const TensorRef& dout, const TensorRef& dx,
                     const TensorRef& dfinal_states, const TensorRef& dinitial_states);
// deterministic: torch's deterministic-algorithms flag; false when nothing runs. The
// deterministic path needs a workspace of workspace_rows(p) x dim x (width + 1) floats; the
// atomic one none (null), and launch_bwd_checked zeroes dweight / dbias for it on the stream.
bool use_deterministic(const ConvParams& p, bool deterministic);
int64_t workspace_rows(const ConvParams& p);
// dweight (dim, width) and dbias (dim,) (null without bias): uninitialized fp32, contiguous.
void set_bwd_reductions(ConvParams& p, float* dweight, float* dbias, float* workspace);
void launch_bwd_checked(ConvParams& p, const TensorRef& x, const TensorRef& dout, const TensorRef& dx,
                        cudaStream_t stream);

// Decode update: every check and fill but weight/bias (set_update_weights) and out.
UpdateParams prepare_update(const TensorRef& x, const TensorRef& conv_state, const TensorRef& weight,
                            const TensorRef& bias, bool silu, const TensorRef& cache_seqlens,
                            const TensorRef& conv_state_indices);
void set_update_weights(UpdateParams& p, const TensorRef& weight, const TensorRef& bias);
void launch_update_checked(UpdateParams& p, const TensorRef& out, cudaStream_t stream);

}  // namespace causal_conv1d
}  // namespace mamba_kernels
