// torch.library binding of the selective-scan forward and backward: checks every precondition
// the kernels rely on (a direct op call cannot read or write out of bounds), turns tensors into
// ScanParams and launches on the current stream. Ops live in the `mamba_kernels` namespace;
// their fake implementations are registered from selective_scan/_ops.py.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/view_as_complex.h>
#include <ATen/ops/view_as_real.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "check_msg.h"
#include "selective_scan.h"

namespace mamba_kernels {
namespace selective_scan {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
constexpr int64_t kMaxDstate = 256;

DType to_dtype(const Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default:
      MK_CHECK_TYPE(false, "selective_scan: u must be float32, float16 or bfloat16, got ", t.scalar_type());
  }
  return DType::kFloat32;
}

void check_device(const Tensor& t, const Tensor& u, const char* name) {
  MK_CHECK(t.is_cuda() && t.device() == u.device(), "selective_scan: ", name, " must be on u's device ",
           u.device(), ", got ", t.device());
}

void check_like_u(const Tensor& t, const Tensor& u, const char* name) {
  check_device(t, u, name);
  MK_CHECK(t.sizes() == u.sizes(), "selective_scan: ", name, " must have shape ", u.sizes(), " (like u), got ",
           t.sizes());
  MK_CHECK_TYPE(t.scalar_type() == u.scalar_type(), "selective_scan: ", name, " must have u's dtype ",
                u.scalar_type(), ", got ", t.scalar_type());
}

Strides3 strides3(const Tensor& t) { return Strides3{t.stride(0), t.stride(1), t.stride(2)}; }

// A (dim, dstate) real or complex, or fixed B/C in A's dtype: contiguous fp32 (dim, dstate [x2]).
Tensor params_f32(const Tensor& t, const Tensor& u, int64_t dim, int64_t dstate, bool is_complex, const char* name) {
  check_device(t, u, name);
  MK_CHECK(t.dim() == 2 && t.size(0) == dim && t.size(1) == dstate, "selective_scan: ", name,
           " must have shape [", dim, ", ", dstate, "], got ", t.sizes());
  const auto want = is_complex ? at::kComplexFloat : at::kFloat;
  MK_CHECK_TYPE(t.scalar_type() == want, "selective_scan: ", name, " must be ", c10::toString(want), ", got ",
                t.scalar_type());
  return (is_complex ? at::view_as_real(t.resolve_conj()) : t).contiguous();
}

OptTensor vec_f32(const OptTensor& t, const Tensor& u, int64_t dim, const char* name) {
  if (!t.has_value()) return std::nullopt;
  check_device(*t, u, name);
  MK_CHECK(t->dim() == 1 && t->size(0) == dim, "selective_scan: ", name, " must have shape [", dim, "], got ",
           t->sizes());
  MK_CHECK_TYPE(t->scalar_type() == at::kFloat, "selective_scan: ", name, " must be float32, got ",
                t->scalar_type());
  return t->contiguous();
}

struct Prepared {
  ScanParams p;
  Tensor A32, Bf, Cf;
  OptTensor D32, bias32;
};

Prepared prepare(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                 const OptTensor& D, const OptTensor& z, const OptTensor& delta_bias, bool softplus) {
  MK_CHECK(u.is_cuda(), "selective_scan: u must be a CUDA tensor, got device ", u.device());
  MK_CHECK(u.dim() == 3, "selective_scan: u must be 3-D (batch, dim, L), got shape ", u.sizes());
  Prepared r;
  ScanParams& p = r.p;
  p.dtype = to_dtype(u);
  p.batch = u.size(0);
  p.dim = u.size(1);
  p.seqlen = u.size(2);
  p.softplus = softplus;
  check_like_u(delta, u, "delta");
  MK_CHECK(A.dim() == 2, "selective_scan: A must be 2-D (dim, dstate), got shape ", A.sizes());
  p.dstate = A.size(1);
  MK_CHECK(p.dstate >= 1 && p.dstate <= kMaxDstate, "selective_scan: dstate (A.shape[1]) must be between 1 and ",
           kMaxDstate, ", got ", p.dstate);
  p.is_complex = A.is_complex();
  r.A32 = params_f32(A, u, p.dim, p.dstate, p.is_complex, "A");
  p.A = r.A32.data_ptr<float>();
  const int64_t lf = p.seqlen * (p.is_complex ? 2 : 1);
  int64_t groups = -1;
  auto bc = [&](const Tensor& t, Tensor& fixed, BCParams& out, const char* name) {
    if (t.dim() == 2) {
      fixed = params_f32(t, u, p.dim, p.dstate, p.is_complex, name);
      out.ptr = fixed.data_ptr();
      out.variable = false;
      return;
    }
    check_device(t, u, name);
    MK_CHECK(t.dim() == 4 && t.size(0) == p.batch && t.size(1) >= 1 && t.size(2) == p.dstate && t.size(3) == lf,
             "selective_scan: variable ", name, " must have shape [", p.batch, ", ngroups, ", p.dstate, ", ", lf,
             "], got ", t.sizes());
    MK_CHECK_TYPE(t.scalar_type() == u.scalar_type(), "selective_scan: variable ", name, " must have u's dtype ",
                  u.scalar_type(), ", got ", t.scalar_type());
    MK_CHECK(groups < 0 || groups == t.size(1), "selective_scan: B and C must have the same ngroups, got ", groups,
             " and ", t.size(1));
    groups = t.size(1);
    out.ptr = t.data_ptr();
    out.variable = true;
    out.s_b = t.stride(0);
    out.s_g = t.stride(1);
    out.s_n = t.stride(2);
    out.s_l = t.stride(3);
  };
  bc(B, r.Bf, p.B, "B");
  bc(C, r.Cf, p.C, "C");
  p.ngroups = groups > 0 ? groups : 1;
  MK_CHECK(p.dim % p.ngroups == 0, "selective_scan: dim must be divisible by ngroups, got dim=", p.dim,
           " and ngroups=", p.ngroups);
  r.D32 = vec_f32(D, u, p.dim, "D");
  r.bias32 = vec_f32(delta_bias, u, p.dim, "delta_bias");
  p.D = r.D32.has_value() ? r.D32->data_ptr<float>() : nullptr;
  p.delta_bias = r.bias32.has_value() ? r.bias32->data_ptr<float>() : nullptr;
  p.u = u.data_ptr();
  p.u_s = strides3(u);
  p.delta = delta.data_ptr();
  p.delta_s = strides3(delta);
  if (z.has_value()) {
    check_like_u(*z, u, "z");
    p.z = z->data_ptr();
    p.z_s = strides3(*z);
  }
  return r;
}

int64_t n_chunks(int64_t seqlen) { return (seqlen + kChunk - 1) / kChunk; }

void check_launch(cudaError_t err, const char* what) {
  MK_CHECK(err == cudaSuccess, "selective_scan: ", what, " kernel launch failed: ", cudaGetErrorString(err));
}

// (out, out_z, ckpt). out: y without the z gate (empty when z is given and keep_y is false);
// out_z: y * silu(z) (empty without z); ckpt: the state after every kChunk steps, fp32
// (batch, dim, n_chunks, dstate [x2]); its last chunk is the final state.
std::tuple<Tensor, Tensor, Tensor> scan_fwd(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                                            const Tensor& C, const OptTensor& D, const OptTensor& z,
                                            const OptTensor& delta_bias, bool delta_softplus, bool keep_y) {
  const c10::cuda::CUDAGuard guard(u.device());
  Prepared r = prepare(u, delta, A, B, C, D, z, delta_bias, delta_softplus);
  ScanParams& p = r.p;
  const bool want_y = !z.has_value() || keep_y;
  Tensor out = want_y ? at::empty_like(delta) : at::empty({0}, u.options());
  Tensor out_z = z.has_value() ? at::empty_like(delta) : at::empty({0}, u.options());
  const int64_t nf = p.dstate * (p.is_complex ? 2 : 1);
  Tensor ckpt = at::empty({p.batch, p.dim, n_chunks(p.seqlen), nf}, u.options().dtype(at::kFloat));
  if (want_y) {
    p.out = out.data_ptr();
    p.out_s = strides3(out);
  }
  if (z.has_value()) {
    p.out_z = out_z.data_ptr();
    p.out_z_s = strides3(out_z);
  }
  p.ckpt = ckpt.data_ptr<float>();
  const int64_t nseg = fwd_segments(p);
  Tensor ws = at::empty({nseg > 1 ? p.batch * p.dim * nseg * (nf + 1) : 0}, u.options().dtype(at::kFloat));
  check_launch(launch_fwd(p, nseg > 1 ? ws.data_ptr<float>() : nullptr, c10::cuda::getCurrentCUDAStream().stream()),
               "selective_scan_fwd");
  return {out, out_z, ckpt};
}

// (du, ddelta, dA, dB, dC, dD, ddelta_bias). dz (z's shape; empty without z) is written in
// place. dB/dC: fixed -> B's shape and dtype; variable -> (batch, ngroups, dstate, L [x2]) in
// u's dtype. dD / ddelta_bias are empty when D / delta_bias are absent.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> scan_bwd(
    const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C, const OptTensor& D,
    const OptTensor& z, const OptTensor& delta_bias, const Tensor& dout, const Tensor& ckpt, const OptTensor& y,
    const Tensor& dz, bool delta_softplus) {
  const c10::cuda::CUDAGuard guard(u.device());
  Prepared r = prepare(u, delta, A, B, C, D, z, delta_bias, delta_softplus);
  ScanParams& p = r.p;
  check_like_u(dout, u, "dout");
  const int64_t nf = p.dstate * (p.is_complex ? 2 : 1);
  check_device(ckpt, u, "ckpt");
  MK_CHECK(ckpt.scalar_type() == at::kFloat && ckpt.is_contiguous() && ckpt.dim() == 4 &&
               ckpt.size(0) == p.batch && ckpt.size(1) == p.dim && ckpt.size(2) == n_chunks(p.seqlen) &&
               ckpt.size(3) == nf,
           "selective_scan: ckpt must be the forward's contiguous float32 states of shape [", p.batch, ", ", p.dim,
           ", ", n_chunks(p.seqlen), ", ", nf, "], got ", ckpt.sizes());
  if (z.has_value()) {
    MK_CHECK(y.has_value(), "selective_scan: y (the forward's ungated output) is required with z");
    check_like_u(*y, u, "y");
    check_like_u(dz, u, "dz");
    for (int i = 0; i < 3; ++i) {
      MK_CHECK(dz.stride(i) != 0 || dz.size(i) <= 1, "selective_scan: dz must not overlap itself (stride 0 in dim ",
               i, "), got strides ", dz.strides());
    }
    p.y = y->data_ptr();
    p.y_s = strides3(*y);
    p.dz = dz.data_ptr();
    p.dz_s = strides3(dz);
  }
  p.dout = dout.data_ptr();
  p.dout_s = strides3(dout);
  Tensor du = at::empty_like(u), ddelta = at::empty_like(delta);
  p.du = du.data_ptr();
  p.du_s = strides3(du);
  p.ddelta = ddelta.data_ptr();
  p.ddelta_s = strides3(ddelta);
  const auto f32 = u.options().dtype(at::kFloat);
  Tensor dA_part = at::empty({p.batch, p.dim, nf}, f32);
  Tensor dD_part = D.has_value() ? at::empty({p.batch, p.dim}, f32) : at::empty({0}, f32);
  Tensor dbias_part = delta_bias.has_value() ? at::empty({p.batch, p.dim}, f32) : at::empty({0}, f32);
  const int64_t lf = p.seqlen * (p.is_complex ? 2 : 1);
  const int64_t rb = bwd_row_blocks(p);
  auto part = [&](const BCParams& bc) {
    return bc.variable ? at::empty({p.batch, p.ngroups, rb, p.dstate, lf}, f32) : at::empty({p.batch, p.dim, nf}, f32);
  };
  Tensor dB_part = part(p.B), dC_part = part(p.C);
  p.dA_part = dA_part.data_ptr<float>();
  p.dD_part = D.has_value() ? dD_part.data_ptr<float>() : nullptr;
  p.dbias_part = delta_bias.has_value() ? dbias_part.data_ptr<float>() : nullptr;
  p.dB_part = dB_part.data_ptr<float>();
  p.dC_part = dC_part.data_ptr<float>();
  p.ckpt = const_cast<float*>(ckpt.data_ptr<float>());
  check_launch(launch_bwd(p, c10::cuda::getCurrentCUDAStream().stream()), "selective_scan_bwd");

  // Partial sums reduced in a fixed order (torch's reductions use no atomics here).
  auto as_param = [&](const Tensor& summed, const Tensor& like) {  // (dim, nf) fp32 -> like's dtype
    if (!p.is_complex) return summed.to(like.scalar_type());
    return at::view_as_complex(summed.view({p.dim, p.dstate, 2}));
  };
  Tensor dA = as_param(dA_part.sum(0), A);
  auto finish_bc = [&](const Tensor& partial, const BCParams& bc, const Tensor& like) {
    if (!bc.variable) return as_param(partial.sum(0), like);
    return (rb == 1 ? partial.select(2, 0) : partial.sum(2)).to(u.scalar_type());
  };
  Tensor dB = finish_bc(dB_part, p.B, B), dC = finish_bc(dC_part, p.C, C);
  Tensor dD = D.has_value() ? dD_part.sum(0) : dD_part;
  Tensor dbias = delta_bias.has_value() ? dbias_part.sum(0) : dbias_part;
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
