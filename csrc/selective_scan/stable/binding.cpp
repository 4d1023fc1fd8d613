// The stable-ABI binding of the selective-scan forward and backward (one binary for every torch
// from its TORCH_TARGET_VERSION on): torch::stable::Tensor in, TensorRefs to the shared host
// code (scan_host.h: checks, parameters, launches), tensors allocated, converted and reduced
// through the stable C shim. Same op names and schemas as classic/binding.cpp; the fake
// implementations are registered from selective_scan/_ops.py.
#include <cstdint>
#include <optional>
#include <tuple>

#include "../scan_host.h"
#include "stable/tensor.h"

namespace mamba_kernels {
namespace selective_scan {
namespace {

using stable::OptTensor;
using stable::ScalarType;
using stable::Tensor;
using stable::tref;
namespace ops = torch::stable;

float* f32_ptr(const Tensor& t) { return static_cast<float*>(t.data_ptr()); }

// A (dim, dstate) real or complex, or fixed B/C: contiguous fp32 (dim, dstate [x2]).
Tensor params_f32(const Tensor& t, bool is_complex) {
  if (!is_complex) return ops::contiguous(t);
  return ops::contiguous(stable::call_unary("aten::view_as_real", stable::call_unary("aten::resolve_conj", t)));
}
OptTensor contiguous(const OptTensor& t) { return t.has_value() ? OptTensor(ops::contiguous(*t)) : std::nullopt; }

// The fp32 copies ScanParams points into; they live as long as the op call.
struct F32Params {
  Tensor A;
  OptTensor B, C, D, bias;
};

F32Params to_f32(ScanParams& p, const Tensor& A, const Tensor& B, const Tensor& C, const OptTensor& D,
                 const OptTensor& delta_bias) {
  F32Params f{params_f32(A, p.is_complex), std::nullopt, std::nullopt, contiguous(D), contiguous(delta_bias)};
  if (!p.B.variable) f.B = params_f32(B, p.is_complex);
  if (!p.C.variable) f.C = params_f32(C, p.is_complex);
  set_f32_params(p, tref(f.A), tref(f.B), tref(f.C), tref(f.D), tref(f.bias));
  return f;
}

// (out, out_z, ckpt): see classic/binding.cpp.
std::tuple<Tensor, Tensor, Tensor> scan_fwd(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                                            const Tensor& C, const OptTensor& D, const OptTensor& z,
                                            const OptTensor& delta_bias, bool delta_softplus, bool keep_y) {
  const TensorRef ur = tref(u);
  ScanParams p = prepare(ur, tref(delta), tref(A), tref(B), tref(C), tref(D), tref(z), tref(delta_bias),
                         delta_softplus);
  const stable::DeviceGuard guard(ur.device_index);
  const F32Params f = to_f32(p, A, B, C, D, delta_bias);
  const bool want_y = !z.has_value() || keep_y;
  const Tensor out = want_y ? ops::empty_like(delta) : ops::new_empty(u, {0});
  const Tensor out_z = z.has_value() ? ops::empty_like(delta) : ops::new_empty(u, {0});
  const Tensor ckpt = ops::new_empty(u, {p.batch, p.dim, n_chunks(p.seqlen), state_floats(p)}, ScalarType::Float);
  set_fwd_outputs(p, want_y ? tref(out) : TensorRef(), z.has_value() ? tref(out_z) : TensorRef(), f32_ptr(ckpt));
  const int64_t nws = fwd_workspace_floats(p);
  const Tensor ws = ops::new_empty(u, {nws}, ScalarType::Float);
  launch_fwd_checked(p, nws > 0 ? f32_ptr(ws) : nullptr, stable::current_stream(ur.device_index));
  return {out, out_z, ckpt};
}

// (du, ddelta, dA, dB, dC, dD, ddelta_bias): see classic/binding.cpp.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> scan_bwd(
    const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C, const OptTensor& D,
    const OptTensor& z, const OptTensor& delta_bias, const Tensor& dout, const Tensor& ckpt, const OptTensor& y,
    const Tensor& dz, bool delta_softplus) {
  const TensorRef ur = tref(u);
  ScanParams p = prepare(ur, tref(delta), tref(A), tref(B), tref(C), tref(D), tref(z), tref(delta_bias),
                         delta_softplus);
  set_bwd_inputs(p, ur, tref(z), tref(dout), tref(ckpt), tref(y), tref(dz));
  const stable::DeviceGuard guard(ur.device_index);
  const F32Params f = to_f32(p, A, B, C, D, delta_bias);
  const Tensor du = ops::empty_like(u), ddelta = ops::empty_like(delta);
  const int64_t nf = state_floats(p);
  const Tensor dA_part = ops::new_empty(u, {p.batch, p.dim, nf}, ScalarType::Float);
  const Tensor dD_part = D.has_value() ? ops::new_empty(u, {p.batch, p.dim}, ScalarType::Float)
                                       : ops::new_empty(u, {0}, ScalarType::Float);
  const Tensor dbias_part = delta_bias.has_value() ? ops::new_empty(u, {p.batch, p.dim}, ScalarType::Float)
                                                   : ops::new_empty(u, {0}, ScalarType::Float);
  auto part = [&](const BCParams& bc) {
    int64_t dims[5];
    const int n = part_shape(p, bc, dims);
    return ops::new_empty(u, torch::headeronly::IntHeaderOnlyArrayRef(dims, size_t(n)), ScalarType::Float);
  };
  const Tensor dB_part = part(p.B), dC_part = part(p.C);
  set_bwd_outputs(p, tref(du), tref(ddelta), f32_ptr(dA_part), D.has_value() ? f32_ptr(dD_part) : nullptr,
                  delta_bias.has_value() ? f32_ptr(dbias_part) : nullptr, f32_ptr(dB_part), f32_ptr(dC_part));
  launch_bwd_checked(p, stable::current_stream(ur.device_index));

  // Partial sums reduced in a fixed order (torch's reductions use no atomics here).
  auto sum_dim = [](const Tensor& t, int64_t d) { return ops::sum(t, torch::headeronly::IntHeaderOnlyArrayRef(d)); };
  auto as_param = [&](const Tensor& summed, const Tensor& like) {  // (dim, nf) fp32 -> like's dtype
    if (!p.is_complex) return ops::to(summed, like.scalar_type());
    return stable::call_unary("aten::view_as_complex", ops::view(summed, {p.dim, p.dstate, 2}));
  };
  const Tensor dA = as_param(sum_dim(dA_part, 0), A);
  auto finish_bc = [&](const Tensor& partial, const BCParams& bc, const Tensor& like) {
    if (!bc.variable) return as_param(sum_dim(partial, 0), like);
    return ops::to(partial.size(2) == 1 ? ops::select(partial, 2, 0) : sum_dim(partial, 2), u.scalar_type());
  };
  const Tensor dB = finish_bc(dB_part, p.B, B), dC = finish_bc(dC_part, p.C, C);
  const Tensor dD = D.has_value() ? sum_dim(dD_part, 0) : dD_part;
  const Tensor dbias = delta_bias.has_value() ? sum_dim(dbias_part, 0) : dbias_part;
  return {du, ddelta, dA, dB, dC, dD, dbias};
}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(mamba_kernels, m) {
  m.def(
      "selective_scan_fwd(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, "
      "Tensor? delta_bias, bool delta_softplus, bool keep_y) -> (Tensor, Tensor, Tensor)");
  m.def(
      "selective_scan_bwd(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, "
      "Tensor? delta_bias, Tensor dout, Tensor ckpt, Tensor? y, Tensor(a!) dz, bool delta_softplus) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(mamba_kernels, CUDA, m) {
  m.impl("selective_scan_fwd", TORCH_BOX(&scan_fwd));
  m.impl("selective_scan_bwd", TORCH_BOX(&scan_bwd));
}

}  // namespace selective_scan
}  // namespace mamba_kernels
