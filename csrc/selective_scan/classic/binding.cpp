// The classic (torch 2.1 to 2.9, per-minor) torch.library binding of the selective-scan
// forward and backward: at::Tensor in, TensorRefs to the shared host code (scan_host.h:
// checks, parameters, launches, reductions), tensors allocated and converted with ATen. Ops live
// in the `mamba_kernels` namespace; their fake implementations are registered from
// selective_scan/_ops.py. stable/binding.cpp registers the same ops with the same schemas.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/view_as_real.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "classic/tensor.h"
#include "../scan_host.h"

namespace mamba_kernels {
namespace selective_scan {
namespace {

using classic::OptTensor;
using classic::tref;
using classic::Tensor;

// A (dim, dstate) real or complex, or fixed B/C: contiguous fp32 (dim, dstate [x2]).
Tensor params_f32(const Tensor& t) {
  return (t.is_complex() ? at::view_as_real(t.resolve_conj()) : t).contiguous();
}
OptTensor contiguous(const OptTensor& t) { return t.has_value() ? OptTensor(t->contiguous()) : std::nullopt; }

// The fp32 copies ScanParams points into; they live as long as the op call.
struct F32Params {
  Tensor A;
  OptTensor B, C, D, bias;
};

F32Params to_f32(ScanParams& p, const Tensor& A, const Tensor& B, const Tensor& C, const OptTensor& D,
                 const OptTensor& delta_bias) {
  F32Params f{params_f32(A), std::nullopt, std::nullopt, contiguous(D), contiguous(delta_bias)};
  if (!p.B.variable) f.B = params_f32(B);
  if (!p.C.variable) f.C = params_f32(C);
  set_f32_params(p, tref(f.A), tref(f.B), tref(f.C), tref(f.D), tref(f.bias));
  return f;
}

// (out, out_z, ckpt). out: y without the z gate (empty when z is given and keep_y is false);
// out_z: y * silu(z) (empty without z); ckpt: the state after every kChunk steps, fp32
// (batch, dim, n_chunks, dstate [x2]); its last chunk is the final state.
std::tuple<Tensor, Tensor, Tensor> scan_fwd(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                                            const Tensor& C, const OptTensor& D, const OptTensor& z,
                                            const OptTensor& delta_bias, bool delta_softplus, bool keep_y) {
  ScanParams p = prepare(tref(u), tref(delta), tref(A), tref(B), tref(C), tref(D), tref(z), tref(delta_bias), delta_softplus);
  const c10::cuda::CUDAGuard guard(u.device());
  const F32Params f = to_f32(p, A, B, C, D, delta_bias);
  const bool want_y = !z.has_value() || keep_y;
  const Tensor out = want_y ? at::empty_like(delta) : at::empty({0}, u.options());
  const Tensor out_z = z.has_value() ? at::empty_like(delta) : at::empty({0}, u.options());
  const auto f32 = u.options().dtype(at::kFloat);
  const Tensor ckpt = at::empty({p.batch, p.dim, n_chunks(p.seqlen), state_floats(p)}, f32);
  set_fwd_outputs(p, want_y ? tref(out) : TensorRef(), z.has_value() ? tref(out_z) : TensorRef(),
                  ckpt.data_ptr<float>());
  const Tensor ws = at::empty({fwd_workspace_floats(p)}, f32);
  launch_fwd_checked(p, ws.numel() > 0 ? ws.data_ptr<float>() : nullptr, classic::current_stream());
  return {out, out_z, ckpt};
}

// (du, ddelta, dA, dB, dC, dD, ddelta_bias). dz (z's shape; empty without z) is written in
// place. dB/dC: fixed -> B's shape and dtype; variable -> (batch, ngroups, dstate, L [x2]) in
// u's dtype. dD / ddelta_bias are empty when D / delta_bias are absent.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> scan_bwd(
    const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C, const OptTensor& D,
    const OptTensor& z, const OptTensor& delta_bias, const Tensor& dout, const Tensor& ckpt, const OptTensor& y,
    const Tensor& dz, bool delta_softplus) {
  const TensorRef ur = tref(u);
  ScanParams p = prepare(ur, tref(delta), tref(A), tref(B), tref(C), tref(D), tref(z), tref(delta_bias), delta_softplus);
  set_bwd_inputs(p, ur, tref(z), tref(dout), tref(ckpt), tref(y), tref(dz));
  const c10::cuda::CUDAGuard guard(u.device());
  const F32Params f = to_f32(p, A, B, C, D, delta_bias);
  const Tensor du = at::empty_like(u), ddelta = at::empty_like(delta);
  const auto f32 = u.options().dtype(at::kFloat);
  const int64_t nf = state_floats(p);
  const Tensor dA_part = at::empty({p.batch, p.dim, nf}, f32);
  const Tensor dD_part = D.has_value() ? at::empty({p.batch, p.dim}, f32) : at::empty({0}, f32);
  const Tensor dbias_part = delta_bias.has_value() ? at::empty({p.batch, p.dim}, f32) : at::empty({0}, f32);
  auto part = [&](const BCParams& bc) {
    int64_t dims[5];
    const int n = part_shape(p, bc, dims);
    return at::empty(at::IntArrayRef(dims, n), f32);
  };
  const Tensor dB_part = part(p.B), dC_part = part(p.C);
  set_bwd_outputs(p, tref(du), tref(ddelta), dA_part.data_ptr<float>(), D.has_value() ? dD_part.data_ptr<float>() : nullptr,
                  delta_bias.has_value() ? dbias_part.data_ptr<float>() : nullptr, dB_part.data_ptr<float>(),
                  dC_part.data_ptr<float>());
  launch_bwd_checked(p, classic::current_stream());

  // The partial sums reduced in a fixed order by the shared host code, straight into
  // gradients shaped and typed like their parameters.
  const Tensor dA = at::empty(A.sizes(), A.options());
  const Tensor dB = at::empty(B.sizes(), B.options()), dC = at::empty(C.sizes(), C.options());
  const Tensor dD = D.has_value() ? at::empty({p.dim}, f32) : dD_part;
  const Tensor dbias = delta_bias.has_value() ? at::empty({p.dim}, f32) : dbias_part;
  ParamGrads g;
  g.dA = dA.data_ptr();
  g.dB = dB.data_ptr();
  g.dC = dC.data_ptr();
  g.dD = D.has_value() ? dD.data_ptr<float>() : nullptr;
  g.dbias = delta_bias.has_value() ? dbias.data_ptr<float>() : nullptr;
  sum_partials_checked(p, g, classic::current_stream());
  return {du, ddelta, dA, dB, dC, dD, dbias};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mamba_kernels, m) {
  m.def(
      "selective_scan_fwd(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, "
      "Tensor? delta_bias, bool delta_softplus, bool keep_y) -> (Tensor, Tensor, Tensor)");
  m.def(
      "selective_scan_bwd(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? z, "
      "Tensor? delta_bias, Tensor dout, Tensor ckpt, Tensor? y, Tensor(a!) dz, bool delta_softplus) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mamba_kernels, CUDA, m) {
  m.impl("selective_scan_fwd", &scan_fwd);
  m.impl("selective_scan_bwd", &scan_bwd);
}

}  // namespace selective_scan
}  // namespace mamba_kernels
