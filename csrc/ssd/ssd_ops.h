// The SSD chunked-scan forward and backward ops, written once for both bindings: its schema, and its body,
// which passes TensorRefs to the shared host code (ssd_host.h: checks, parameters, launches)
// and allocates its outputs through the binding's tensor API `api`: classic/tensor.h (ATen) or
// stable/tensor.h (the stable C shim), the same names and signatures. A binding's .cpp declares
// `namespace api = classic;` (or stable) inside namespace mamba_kernels, includes this file
// once, and registers ssd_fwd and ssd_bwd with its own library macros. The fake implementation is
// registered from selective_scan/_ssd_ops.py.
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>

#include "ssd_host.h"

namespace mamba_kernels {
namespace ssd {

// The op's schema, as both bindings define it.
inline constexpr const char* kSsdSchemas[] = {
    "ssd_chunk_scan_fwd(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, int chunk_size, Tensor? D, "
    "Tensor? z, Tensor? dt_bias, Tensor? initial_states, Tensor? seq_idx, Tensor? cu_seqlens, bool dt_softplus, "
    "float dt_limit_lo, float dt_limit_hi) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    "ssd_chunk_scan_bwd(Tensor dout, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor out, "
    "int chunk_size, Tensor? D, Tensor? z, Tensor? dt_bias, Tensor? initial_states, Tensor? dfinal_states, "
    "Tensor? seq_idx, bool dt_softplus, float dt_limit_lo, float dt_limit_hi) -> (Tensor, Tensor, Tensor, Tensor, "
    "Tensor, Tensor, Tensor, Tensor, Tensor)",
};

namespace {

using api::OptTensor;
using api::ScalarType;
using api::Tensor;
using api::tref;

// (out, out_x, dt_out, dA_cumsum, states, final_states, varlen_states): out of x's shape and
// dtype (y silu(z) with z); out_x y before the gate (empty without z); dt_out and dA_cumsum fp32
// (batch, nheads, nchunks, chunk_size); states fp32 (batch, nchunks, nheads, headdim, dstate),
// the state entering each chunk; final_states fp32 (batch, nheads, headdim, dstate);
// varlen_states fp32 (nseqs, nheads, headdim, dstate), each packed sequence's final state (empty
// without cu_seqlens).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> ssd_fwd(
    const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B, const Tensor& C, int64_t chunk_size,
    const OptTensor& D, const OptTensor& z, const OptTensor& dt_bias, const OptTensor& initial_states,
    const OptTensor& seq_idx, const OptTensor& cu_seqlens, bool dt_softplus, double dt_limit_lo,
    double dt_limit_hi) {
  const TensorRef xr = tref(x);
  SsdFwdParams p = prepare_ssd_fwd(xr, tref(dt), tref(A), tref(B), tref(C), chunk_size, tref(D), tref(z),
                                   tref(dt_bias), tref(initial_states), tref(seq_idx), tref(cu_seqlens),
                                   dt_softplus, dt_limit_lo, dt_limit_hi);
  const api::DeviceGuard guard(xr.device_index);
  const ScalarType dtype = x.scalar_type(), f32 = ScalarType::Float;
  const Tensor out = api::empty(x, {p.batch, p.seqlen, p.nheads, p.headdim}, dtype);
  const Tensor out_x = z.has_value() ? api::empty(x, {p.batch, p.seqlen, p.nheads, p.headdim}, dtype)
                                     : api::empty(x, {0}, dtype);
  const Tensor dt_out = api::empty(x, {p.batch, p.nheads, p.nchunks, p.chunk}, f32);
  const Tensor dA_cumsum = api::empty(x, {p.batch, p.nheads, p.nchunks, p.chunk}, f32);
  const Tensor states = api::empty(x, {p.batch, p.nchunks, p.nheads, p.headdim, p.dstate}, f32);
  const Tensor final_states = api::empty(x, {p.batch, p.nheads, p.headdim, p.dstate}, f32);
  const Tensor varlen_states = cu_seqlens.has_value() ? api::empty(x, {p.nseqs, p.nheads, p.headdim, p.dstate}, f32)
                                                      : api::empty(x, {0}, f32);
  int64_t cb_sizes[5];
  cb_shape(p, cb_sizes);
  const Tensor cb = api::empty(x, cb_sizes, 5, f32);  // workspace: C B^T per chunk and group
  launch_ssd_fwd_checked(p, tref(out), tref(out_x), tref(dt_out), tref(dA_cumsum), tref(states), tref(final_states),
                         tref(varlen_states), tref(cb), api::current_stream(xr.device_index));
  return {out, out_x, dt_out, dA_cumsum, states, final_states, varlen_states};
}

// (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states), contiguous: dx, dz like x; ddt like
// dt; dA like A; dB, dC like B; dD like D; ddt_bias like dt_bias; dinitial_states like
// initial_states; an empty (0,) tensor where the input is None. out: y before the gate (read
// only with z). The forward's intermediates are recomputed into one fp32 workspace.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> ssd_bwd(
    const Tensor& dout, const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B, const Tensor& C,
    const Tensor& out, int64_t chunk_size, const OptTensor& D, const OptTensor& z, const OptTensor& dt_bias,
    const OptTensor& initial_states, const OptTensor& dfinal_states, const OptTensor& seq_idx, bool dt_softplus,
    double dt_limit_lo, double dt_limit_hi) {
  const TensorRef xr = tref(x);
  SsdBwdParams p = prepare_ssd_bwd(tref(dout), xr, tref(dt), tref(A), tref(B), tref(C), tref(out), chunk_size, tref(D),
                                   tref(z), tref(dt_bias), tref(initial_states), tref(dfinal_states), tref(seq_idx),
                                   dt_softplus, dt_limit_lo, dt_limit_hi);
  const api::DeviceGuard guard(xr.device_index);
  const SsdFwdParams& f = p.f;
  const ScalarType xt = x.scalar_type();
  const Tensor dx = api::empty(x, {f.batch, f.seqlen, f.nheads, f.headdim}, xt);
  const Tensor ddt = api::empty(x, {f.batch, f.seqlen, f.nheads}, dt.scalar_type());
  const Tensor dA = api::empty(x, {f.nheads}, A.scalar_type());
  const Tensor dB = api::empty(x, {f.batch, f.seqlen, f.ngroups, f.dstate}, xt);
  const Tensor dC = api::empty(x, {f.batch, f.seqlen, f.ngroups, f.dstate}, xt);
  const Tensor dD = !D.has_value() ? api::empty(x, {0}, xt)
                    : p.dD_per_channel ? api::empty(x, {f.nheads, f.headdim}, (*D).scalar_type())
                                       : api::empty(x, {f.nheads}, (*D).scalar_type());
  const Tensor dz = z.has_value() ? api::empty(x, {f.batch, f.seqlen, f.nheads, f.headdim}, xt) : api::empty(x, {0}, xt);
  const Tensor ddt_bias = dt_bias.has_value() ? api::empty(x, {f.nheads}, (*dt_bias).scalar_type())
                                              : api::empty(x, {0}, xt);
  const Tensor dinit = initial_states.has_value()
                           ? api::empty(x, {f.batch, f.nheads, f.headdim, f.dstate}, (*initial_states).scalar_type())
                           : api::empty(x, {0}, xt);
  int64_t counts[kSsdBwdPieces];
  const Tensor ws = api::empty(x, {ssd_bwd_workspace_floats(p, counts)}, ScalarType::Float);
  BwdOutputs o;
  o.x_scalar = xr.scalar;
  o.dx = tref(dx);
  o.ddt = tref(ddt);
  o.dA = tref(dA);
  o.dB = tref(dB);
  o.dC = tref(dC);
  if (D.has_value()) o.dD = tref(dD);
  if (z.has_value()) o.dz = tref(dz);
  if (dt_bias.has_value()) o.ddt_bias = tref(ddt_bias);
  if (initial_states.has_value()) o.dinit = tref(dinit);
  launch_ssd_bwd_checked(p, o, tref(ws), api::current_stream(xr.device_index));
  return {dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinit};
}

}  // namespace

}  // namespace ssd
}  // namespace mamba_kernels
