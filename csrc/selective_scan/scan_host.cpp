// Shared host code of the selective-scan ops (see scan_host.h): the same checks, messages and
// parameter fills for the classic and the stable binding.
#include "scan_host.h"

#include <algorithm>
#include <cstdint>

#include "check_msg.h"

namespace mamba_kernels {
namespace selective_scan {
namespace {

constexpr int64_t kMaxDstate = 256;

DType to_dtype(const TensorRef& t) {
  switch (t.scalar) {
    case Scalar::kFloat32: return DType::kFloat32;
    case Scalar::kFloat16: return DType::kFloat16;
    case Scalar::kBFloat16: return DType::kBFloat16;
    default:
      MK_CHECK_TYPE(false, "selective_scan: u must be float32, float16 or bfloat16, got ", t.dtype_name);
  }
  return DType::kFloat32;
}

void check_device(const TensorRef& t, const TensorRef& u, const char* name) {
  MK_CHECK(t.is_cuda && t.same_device(u), "selective_scan: ", name, " must be on u's device ", u.device(), ", got ",
           t.device());
}

void check_like_u(const TensorRef& t, const TensorRef& u, const char* name) {
  check_device(t, u, name);
  MK_CHECK(t.same_shape(u), "selective_scan: ", name, " must have shape ", u.shape(), " (like u), got ", t.shape());
  MK_CHECK_TYPE(t.scalar == u.scalar, "selective_scan: ", name, " must have u's dtype ", u.dtype_name, ", got ",
                t.dtype_name);
}

Strides3 strides3(const TensorRef& t) { return Strides3{t.stride(0), t.stride(1), t.stride(2)}; }

// A (dim, dstate) real or complex, or a fixed B/C in A's dtype.
void check_params(const TensorRef& t, const TensorRef& u, int64_t dim, int64_t dstate, bool is_complex,
                  const char* name) {
  check_device(t, u, name);
  MK_CHECK(t.dim == 2 && t.size(0) == dim && t.size(1) == dstate, "selective_scan: ", name, " must have shape [", dim,
           ", ", dstate, "], got ", t.shape());
  const Scalar want = is_complex ? Scalar::kComplex64 : Scalar::kFloat32;
  MK_CHECK_TYPE(t.scalar == want, "selective_scan: ", name, " must be ", is_complex ? "ComplexFloat" : "Float",
                ", got ", t.dtype_name);
}

// D or delta_bias: float32 (dim,).
void check_vec(const TensorRef& t, const TensorRef& u, int64_t dim, const char* name) {
  if (!t.present) return;
  check_device(t, u, name);
  MK_CHECK(t.dim == 1 && t.size(0) == dim, "selective_scan: ", name, " must have shape [", dim, "], got ", t.shape());
  MK_CHECK_TYPE(t.scalar == Scalar::kFloat32, "selective_scan: ", name, " must be float32, got ", t.dtype_name);
}

// An output written in place: no axis of size > 1 with stride 0 (elements written twice).
void check_no_self_overlap(const TensorRef& t, const char* name) {
  for (int i = 0; i < 3; ++i) {
    MK_CHECK(t.stride(i) != 0 || t.size(i) <= 1, "selective_scan: ", name, " must not overlap itself (stride 0 in dim ",
             i, "), got strides ", t.stride_list());
  }
}

int64_t numel(const TensorRef& t) {
  int64_t n = 1;
  for (int64_t i = 0; i < t.dim; ++i) n *= t.size(i);
  return n;
}

void check_launch(cudaError_t err, const char* what) {
  MK_CHECK(err == cudaSuccess, "selective_scan: ", what, " kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace

ScanParams prepare(const TensorRef& u, const TensorRef& delta, const TensorRef& A, const TensorRef& B,
                   const TensorRef& C, const TensorRef& D, const TensorRef& z, const TensorRef& delta_bias,
                   bool softplus) {
  MK_CHECK(u.is_cuda, "selective_scan: u must be a CUDA tensor, got device ", u.device());
  MK_CHECK(u.dim == 3, "selective_scan: u must be 3-D (batch, dim, L), got shape ", u.shape());
  ScanParams p;
  p.dtype = to_dtype(u);
  p.batch = u.size(0);
  p.dim = u.size(1);
  p.seqlen = u.size(2);
  p.softplus = softplus;
  check_like_u(delta, u, "delta");
  MK_CHECK(A.dim == 2, "selective_scan: A must be 2-D (dim, dstate), got shape ", A.shape());
  p.dstate = A.size(1);
  MK_CHECK(p.dstate >= 1 && p.dstate <= kMaxDstate, "selective_scan: dstate (A.shape[1]) must be between 1 and ",
           kMaxDstate, ", got ", p.dstate);
  p.is_complex = A.is_complex;
  check_params(A, u, p.dim, p.dstate, p.is_complex, "A");
  const int64_t lf = p.seqlen * (p.is_complex ? 2 : 1);
  int64_t groups = -1;
  auto bc = [&](const TensorRef& t, BCParams& out, const char* name) {
    if (t.dim == 2) {
      check_params(t, u, p.dim, p.dstate, p.is_complex, name);
      out.variable = false;  // the binding passes its fp32 copy to set_f32_params
      return;
    }
    check_device(t, u, name);
    MK_CHECK(t.dim == 4 && t.size(0) == p.batch && t.size(1) >= 1 && t.size(2) == p.dstate && t.size(3) == lf,
             "selective_scan: variable ", name, " must have shape [", p.batch, ", ngroups, ", p.dstate, ", ", lf,
             "], got ", t.shape());
    MK_CHECK_TYPE(t.scalar == u.scalar, "selective_scan: variable ", name, " must have u's dtype ", u.dtype_name,
                  ", got ", t.dtype_name);
    MK_CHECK(groups < 0 || groups == t.size(1), "selective_scan: B and C must have the same ngroups, got ", groups,
             " and ", t.size(1));
    groups = t.size(1);
    out.ptr = t.data;
    out.variable = true;
    out.s_b = t.stride(0);
    out.s_g = t.stride(1);
    out.s_n = t.stride(2);
    out.s_l = t.stride(3);
  };
  bc(B, p.B, "B");
  bc(C, p.C, "C");
  p.ngroups = groups > 0 ? groups : 1;
  MK_CHECK(p.dim % p.ngroups == 0, "selective_scan: dim must be divisible by ngroups, got dim=", p.dim,
           " and ngroups=", p.ngroups);
  check_vec(D, u, p.dim, "D");
  check_vec(delta_bias, u, p.dim, "delta_bias");
  p.u = u.data;
  p.u_s = strides3(u);
  p.delta = delta.data;
  p.delta_s = strides3(delta);
  if (z.present) {
    check_like_u(z, u, "z");
    p.z = z.data;
    p.z_s = strides3(z);
  }
  return p;
}

void set_f32_params(ScanParams& p, const TensorRef& A32, const TensorRef& B32, const TensorRef& C32,
                    const TensorRef& D32, const TensorRef& bias32) {
  p.A = static_cast<const float*>(A32.data);
  if (!p.B.variable) p.B.ptr = B32.data;
  if (!p.C.variable) p.C.ptr = C32.data;
  p.D = D32.present ? static_cast<const float*>(D32.data) : nullptr;
  p.delta_bias = bias32.present ? static_cast<const float*>(bias32.data) : nullptr;
}

int64_t fwd_workspace_floats(const ScanParams& p) {
  const int64_t nseg = fwd_segments(p);
  return nseg > 1 ? p.batch * p.dim * nseg * (state_floats(p) + 1) : 0;
}

namespace {

// log2 of the chunks in state_steps, which must be kChunk times a power of two: the kernels
// test chunk ends with a mask.
int state_shift(int64_t state_steps) {
  int shift = 0;
  while (shift < 24 && (int64_t(kChunk) << shift) < state_steps) ++shift;
  MK_CHECK(state_steps == (int64_t(kChunk) << shift),
           "selective_scan: state_steps must be ", kChunk, " times a power of two up to 2^24, got ", state_steps);
  return shift;
}

}  // namespace

int64_t set_fwd_states(ScanParams& p, int64_t state_steps, int64_t state_count, bool state_pairs) {
  const int shift = state_shift(state_steps);
  const int64_t need = (p.seqlen + state_steps - 1) / state_steps;
  if (state_count == -1) state_count = need;
  MK_CHECK(state_count == need || (p.seqlen > 0 && state_count == need + 1),
           "selective_scan: state_count must be -1, ceil(L / state_steps) = ", need,
           p.seqlen > 0 ? " or one more" : "", " (L = ", p.seqlen, ", state_steps = ", state_steps, "), got ",
           state_count);
  MK_CHECK(!state_pairs || state_count % 2 == 0, "selective_scan: state_pairs needs an even state_count, got ",
           state_count);
  p.ckpt_shift = shift;
  p.ckpt_count = state_count;
  p.ckpt_pairs = state_pairs;
  return state_count;
}

void set_fwd_outputs(ScanParams& p, const TensorRef& out, const TensorRef& out_z, float* ckpt) {
  if (out.present) {
    p.out = out.data;
    p.out_s = strides3(out);
  }
  if (out_z.present) {
    p.out_z = out_z.data;
    p.out_z_s = strides3(out_z);
  }
  p.ckpt = ckpt;
}

void launch_fwd_checked(const ScanParams& p, float* workspace, cudaStream_t stream) {
  check_launch(launch_fwd(p, workspace, stream), "selective_scan_fwd");
}

void set_bwd_inputs(ScanParams& p, const TensorRef& u, const TensorRef& z, const TensorRef& dout,
                    const TensorRef& ckpt, const TensorRef& y, const TensorRef& dz, const TensorRef& out_z,
                    int64_t state_steps, bool state_pairs) {
  check_like_u(dout, u, "dout");
  const int64_t nf = state_floats(p);
  check_device(ckpt, u, "ckpt");
  const int shift = state_shift(state_steps);
  const int max_shift = bwd_max_state_shift(p);
  MK_CHECK(shift <= max_shift && (!state_pairs || max_shift > 0), "selective_scan: the backward takes states ",
           kChunk << max_shift, max_shift > 0 ? " steps apart at most" : " steps apart, not in pairs",
           " for this problem (state_steps above ", kChunk, " and state_pairs need real A and dstate <= 16), got state_steps ",
           state_steps, state_pairs ? " with state_pairs" : "");
  // The slots the forward wrote: ceil(L / state_steps), or one more (the final state twice) for
  // spaced or paired states; pairs come two slots a row of 2 nf floats, so their count is even.
  const int64_t need = (p.seqlen + state_steps - 1) / state_steps;
  const bool more_ok = (shift > 0 || state_pairs) && p.seqlen > 0;
  const int64_t per_row = state_pairs ? 2 : 1;
  const int64_t given = ckpt.dim == 4 ? ckpt.size(2) * per_row : -1;
  const int64_t nc = more_ok && given == need + 1 ? need + 1 : need;
  const int64_t rows = state_pairs ? (nc + 1) / 2 : nc, row_floats = per_row * nf;
  // torch's default contiguity, for the 4-D shape the check below requires: every axis of
  // size > 1 has the row-major stride (an empty tensor is contiguous).
  bool contiguous = true;
  if (ckpt.dim == 4 && p.batch * p.dim * rows * row_floats != 0) {
    const int64_t dense[4] = {p.dim * rows * row_floats, rows * row_floats, row_floats, 1};
    for (int i = 0; i < 4; ++i) contiguous = contiguous && (ckpt.size(i) <= 1 || ckpt.stride(i) == dense[i]);
  }
  MK_CHECK(ckpt.scalar == Scalar::kFloat32 && contiguous && ckpt.has_shape({p.batch, p.dim, rows, row_floats}),
           "selective_scan: ckpt must be the forward's contiguous float32 states of shape [", p.batch, ", ", p.dim,
           ", ", rows, more_ok && !state_pairs ? " (or one more)" : "", ", ", row_floats, "] for state_steps ",
           state_steps, state_pairs ? " in pairs" : "", ", got ", ckpt.shape());
  p.ckpt_shift = shift;
  p.ckpt_count = nc;
  p.ckpt_pairs = state_pairs;
  p.part_len = p.seqlen;  // one pass; a windowed backward sets the window's steps (bwd_window_chunks)
  if (z.present) {
    MK_CHECK(y.present, "selective_scan: y (the forward's ungated output) is required with z");
    check_like_u(y, u, "y");
    check_like_u(dz, u, "dz");
    check_no_self_overlap(dz, "dz");
    p.y = y.data;
    p.y_s = strides3(y);
    p.dz = dz.data;
    p.dz_s = strides3(dz);
  }
  if (out_z.present && numel(out_z) > 0) {
    MK_CHECK(z.present, "selective_scan: out_z (the recomputed gated output) needs z; pass an empty tensor without z");
    check_like_u(out_z, u, "out_z");
    check_no_self_overlap(out_z, "out_z");
    p.out_z = out_z.data;
    p.out_z_s = strides3(out_z);
  }
  p.dout = dout.data;
  p.dout_s = strides3(dout);
  p.ckpt = static_cast<float*>(ckpt.data);
}

int64_t part_floats(const ScanParams& p, const BCParams& bc) {
  if (bc.variable) return p.batch * p.ngroups * bwd_row_blocks(p) * p.dstate * p.part_len * (p.is_complex ? 2 : 1);
  return p.batch * p.dim * state_floats(p);
}

void set_bwd_outputs(ScanParams& p, const TensorRef& du, const TensorRef& ddelta, float* dA_part, float* dD_part,
                     float* dbias_part, float* dB_part, float* dC_part) {
  p.du = du.data;
  p.du_s = strides3(du);
  p.ddelta = ddelta.data;
  p.ddelta_s = strides3(ddelta);
  p.dA_part = dA_part;
  p.dD_part = dD_part;
  p.dbias_part = dbias_part;
  p.dB_part = dB_part;
  p.dC_part = dC_part;
}

namespace {

void launch_bwd_checked(const ScanParams& p, cudaStream_t stream) {
  check_launch(launch_bwd(p, stream), "selective_scan_bwd");
}

// The partial sums reduced into the parameter gradients, added to `jobs`; a variable B/C's
// only with with_bc (a windowed backward sums those window by window).
void add_param_sums(SumJobs& jobs, const ScanParams& p, const ParamGrads& g, bool with_bc) {
  // launch_bwd writes no partial sums when it has nothing to do; every parameter gradient is
  // then zero, a sum over no rows.
  const bool ran = p.batch > 0 && p.dim > 0 && p.seqlen > 0;
  const int64_t rows = ran ? p.batch : 0;
  const int64_t nf = state_floats(p);
  // A fixed parameter (A, fixed B/C: fp32 or complex64) sums its (batch, dim, nf) partials over
  // the batch; a variable B/C (u's dtype) its (batch, ngroups, row_blocks, dstate, L [x2]) ones
  // over the row blocks.
  auto sum_bc = [&](const BCParams& bc, const float* part, void* out) {
    if (!bc.variable) {
      jobs.add(part, out, DType::kFloat32, 1, rows, p.dim * nf);
    } else if (with_bc) {
      const int64_t blocks = ran ? bwd_row_blocks(p) : 0;
      jobs.add(part, out, p.dtype, p.batch * p.ngroups, blocks, p.dstate * p.seqlen * (p.is_complex ? 2 : 1));
    }
  };
  jobs.add(p.dA_part, g.dA, DType::kFloat32, 1, rows, p.dim * nf);
  sum_bc(p.B, p.dB_part, g.dB);
  sum_bc(p.C, p.dC_part, g.dC);
  if (g.dD != nullptr) jobs.add(p.dD_part, g.dD, DType::kFloat32, 1, rows, p.dim);
  if (g.dbias != nullptr) jobs.add(p.dbias_part, g.dbias, DType::kFloat32, 1, rows, p.dim);
}

void sum_jobs_checked(const SumJobs& jobs, cudaStream_t stream) {
  check_launch(launch_sum_jobs(jobs, stream), "selective_scan_bwd partial sums");
}

}  // namespace

void run_bwd_checked(ScanParams& p, const ParamGrads& g, cudaStream_t stream) {
  const int64_t win = bwd_window_chunks(p);
  SumJobs last;  // the sums after the last launch, in one launch
  if (win == 0) {
    launch_bwd_checked(p, stream);
    add_param_sums(last, p, g, true);
    sum_jobs_checked(last, stream);
    return;
  }
  // Windows of `win` chunks, the last first; each one's variable dB/dC columns summed as soon as
  // it has run, from partial rows of the window's steps (p.part_len), which the next reuses.
  const int64_t nc = (p.seqlen + kChunk - 1) / kChunk, blocks = bwd_row_blocks(p);
  for (int64_t hi = nc, lo; hi > 0; hi = lo) {
    lo = (hi - 1) / win * win;
    p.chunk_lo = lo;
    p.chunk_hi = hi;
    launch_bwd_checked(p, stream);
    const int64_t t0 = lo * kChunk, w = std::min(hi * kChunk, p.seqlen) - t0;
    SumJobs cols;
    auto sum_cols = [&](const BCParams& bc, const float* part, void* out) {
      if (bc.variable) {
        cols.add_cols(part, out, p.dtype, p.batch * p.ngroups, blocks, p.dstate, w, p.part_len, p.dstate * p.seqlen,
                      p.seqlen, t0);
      }
    };
    sum_cols(p.B, p.dB_part, g.dB);
    sum_cols(p.C, p.dC_part, g.dC);
    if (lo == 0) {
      add_param_sums(cols, p, g, false);  // the last window's columns and the parameters, together
    }
    sum_jobs_checked(cols, stream);
  }
  p.chunk_lo = 0;
  p.chunk_hi = -1;
}

}  // namespace selective_scan
}  // namespace mamba_kernels
