// The selective-scan forward and backward ops, written once for both bindings: their schemas,
// and their bodies, which pass TensorRefs to the shared host code (scan_host.h: checks,
// parameters, launches) and allocate, convert and copy tensors through the binding's tensor
// API `api`: classic/tensor.h (ATen) or stable/tensor.h (the stable C shim), the same names and
// signatures. A binding's .cpp declares `namespace api = classic;` (or stable) inside namespace
// mamba_kernels, includes this file once, and registers scan_fwd and scan_bwd with its own
// library macros. The fake implementations are registered from selective_scan/_ops.py.
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>

#include "scan_host.h"

namespace mamba_kernels {
namespace selective_scan {

// The ops' schemas, as both bindings define them.
inline constexpr const char* kScanSchemas[] = {
    "selective_scan_fwd(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, "
    "Tensor? delta_bias, bool delta_softplus, bool keep_y, int state_steps=64, int state_count=-1, "
    "bool state_pairs=False) -> (Tensor, Tensor, Tensor)",
    "selective_scan_bwd(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, "
    "Tensor? delta_bias, Tensor dout, Tensor ckpt, Tensor? y, Tensor(a!) dz, Tensor(b!) out_z, bool delta_softplus, "
    "int state_steps=64, bool state_pairs=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
};

namespace {

using api::OptTensor;
using api::ScalarType;
using api::Tensor;
using api::tref;

float* f32_ptr(const Tensor& t) { return static_cast<float*>(t.data_ptr()); }

// A (dim, dstate) real or complex, or fixed B/C: contiguous fp32 (dim, dstate [x2]). A real one
// is used as is when already contiguous; a complex one is always copied, which resolves a
// conjugate view (the shim cannot tell one apart), and read as interleaved floats.
Tensor params_f32(const Tensor& t, bool is_complex) {
  return is_complex ? api::contiguous_as(t, ScalarType::ComplexFloat, true)
                    : api::contiguous_as(t, ScalarType::Float);
}

// The fp32 copies ScanParams points into; they live as long as the op call.
struct F32Params {
  Tensor A;
  OptTensor B, C, D, bias;
};

F32Params to_f32(ScanParams& p, const Tensor& A, const Tensor& B, const Tensor& C, const OptTensor& D,
                 const OptTensor& delta_bias) {
  F32Params f{params_f32(A, p.is_complex), std::nullopt, std::nullopt, api::contiguous_as(D, ScalarType::Float),
              api::contiguous_as(delta_bias, ScalarType::Float)};
  if (!p.B.variable) f.B = params_f32(B, p.is_complex);
  if (!p.C.variable) f.C = params_f32(C, p.is_complex);
  set_f32_params(p, tref(f.A), tref(f.B), tref(f.C), tref(f.D), tref(f.bias));
  return f;
}

// A new contiguous tensor of t's shape and dtype (t.new_empty(t.shape)).
Tensor empty_as(const Tensor& t) {
  const auto sizes = t.sizes();
  return api::empty(t, sizes.data(), int64_t(sizes.size()), t.scalar_type());
}

// (out, out_z, ckpt). out: y without the z gate (empty unless keep_y: with neither keep_y nor z
// the forward writes only the states, which a backward that recomputes them needs);
// out_z: y * silu(z) (empty without z); ckpt: fp32 (batch, dim, state_count, dstate [x2]),
// slot k the state after min((k + 1) * state_steps, L) steps; with state_pairs, slots 2r and
// 2r + 1 interleaved state by state in row r of (batch, dim, state_count / 2, 2 dstate [x2])
// (set_fwd_states). The backward reads these states as they were laid out
// (its state_steps and state_pairs): a state every kChunk steps by default; up to 1024 steps
// apart, in pairs too, where the lane kernels run (set_bwd_inputs).
std::tuple<Tensor, Tensor, Tensor> scan_fwd(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                                            const Tensor& C, const OptTensor& D, const OptTensor& z,
                                            const OptTensor& delta_bias, bool delta_softplus, bool keep_y,
                                            int64_t state_steps, int64_t state_count, bool state_pairs) {
  const TensorRef ur = tref(u), deltar = tref(delta);
  ScanParams p = prepare(ur, deltar, tref(A), tref(B), tref(C), tref(D), tref(z), tref(delta_bias), delta_softplus);
  const int64_t slots = set_fwd_states(p, state_steps, state_count, state_pairs);
  const api::DeviceGuard guard(ur.device_index);
  const F32Params f = to_f32(p, A, B, C, D, delta_bias);
  const bool want_y = keep_y;
  const ScalarType dtype = u.scalar_type();
  const Tensor out = want_y ? api::empty_like(delta, deltar) : api::empty(u, {0}, dtype);
  const Tensor out_z = z.has_value() ? api::empty_like(delta, deltar) : api::empty(u, {0}, dtype);
  // with state_pairs the states come in x's shape, two slots a row, so no caller reshapes them
  const int64_t nf = state_floats(p);
  const Tensor ckpt = state_pairs ? api::empty(u, {p.batch, p.dim, slots / 2, 2 * nf}, ScalarType::Float)
                                  : api::empty(u, {p.batch, p.dim, slots, nf}, ScalarType::Float);
  set_fwd_outputs(p, want_y ? tref(out) : TensorRef(), z.has_value() ? tref(out_z) : TensorRef(), f32_ptr(ckpt));
  const int64_t nws = fwd_workspace_floats(p);
  OptTensor ws;  // emplaced, not `cond ? OptTensor(...) : nullopt` (GCC 12 warns maybe-uninitialized)
  if (nws > 0) ws.emplace(api::empty(u, {nws}, ScalarType::Float));
  launch_fwd_checked(p, ws.has_value() ? f32_ptr(*ws) : nullptr, api::current_stream(ur.device_index));
  return {out, out_z, ckpt};
}

// (du, ddelta, dA, dB, dC, dD, ddelta_bias). dz (z's shape; empty without z) is written in
// place, and so is out_z = y silu(z) when it is not empty (z's shape: the gated output, which a
// caller that did not keep it needs again, recomputed in the same pass). dB/dC: fixed -> B's shape and dtype; variable -> (batch, ngroups, dstate, L [x2]) in
// u's dtype. dD / ddelta_bias are empty when D / delta_bias are absent. ckpt: the forward's
// states, laid out by the forward's state_steps and state_pairs, which the call repeats.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> scan_bwd(
    const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C, const OptTensor& D,
    const OptTensor& z, const OptTensor& delta_bias, const Tensor& dout, const Tensor& ckpt, const OptTensor& y,
    const Tensor& dz, const Tensor& out_z, bool delta_softplus, int64_t state_steps, bool state_pairs) {
  const TensorRef ur = tref(u), deltar = tref(delta);
  ScanParams p = prepare(ur, deltar, tref(A), tref(B), tref(C), tref(D), tref(z), tref(delta_bias), delta_softplus);
  set_bwd_inputs(p, ur, tref(z), tref(dout), tref(ckpt), tref(y), tref(dz), tref(out_z), state_steps, state_pairs);
  const api::DeviceGuard guard(ur.device_index);
  const F32Params f = to_f32(p, A, B, C, D, delta_bias);
  const Tensor du = api::empty_like(u, ur), ddelta = api::empty_like(delta, deltar);
  // A windowed backward (spaced states, a sequence longer than the space, where windows take
  // less memory than one pass): partial rows of a window's steps, reused window after window,
  // and the running sums carried between them.
  const int64_t window = bwd_window_chunks(p);
  if (window > 0) p.part_len = window * kChunk;
  // Every fp32 partial sum (and the carried sums) in one allocation: each allocation costs the
  // host more than a small backward's sums cost the GPU. Each piece starts on 256 bytes.
  const int64_t pieces[] = {
      p.batch * p.dim * state_floats(p),       // dA
      D.has_value() ? p.batch * p.dim : 0,      // dD
      delta_bias.has_value() ? p.batch * p.dim : 0,  // ddelta_bias
      part_floats(p, p.B),                      // dB
      part_floats(p, p.C),                      // dC
      window > 0 ? bwd_carry_floats(p) : 0,     // carried sums
  };
  constexpr int64_t kAlign = 64;
  int64_t total = 0, at[6];
  for (int i = 0; i < 6; ++i) {
    at[i] = total;
    total += (pieces[i] + kAlign - 1) / kAlign * kAlign;
  }
  const Tensor ws = api::empty(u, {total}, ScalarType::Float);
  float* const base = f32_ptr(ws);
  auto piece = [&](int i) { return pieces[i] > 0 ? base + at[i] : nullptr; };
  p.carry = piece(5);
  set_bwd_outputs(p, tref(du), tref(ddelta), piece(0), piece(1), piece(2), piece(3), piece(4));

  // The gradients shaped and typed like their parameters, the partial sums reduced into them in
  // a fixed order by the shared host code.
  const Tensor dA = empty_as(A), dB = empty_as(B), dC = empty_as(C);
  const ScalarType f32 = ScalarType::Float;
  const Tensor dD = api::empty(u, {D.has_value() ? p.dim : 0}, f32);
  const Tensor dbias = api::empty(u, {delta_bias.has_value() ? p.dim : 0}, f32);
  ParamGrads g;
  g.dA = dA.data_ptr();
  g.dB = dB.data_ptr();
  g.dC = dC.data_ptr();
  g.dD = D.has_value() ? f32_ptr(dD) : nullptr;
  g.dbias = delta_bias.has_value() ? f32_ptr(dbias) : nullptr;
  run_bwd_checked(p, g, api::current_stream(ur.device_index));
  return {du, ddelta, dA, dB, dC, dD, dbias};
}

}  // namespace

}  // namespace selective_scan
}  // namespace mamba_kernels
