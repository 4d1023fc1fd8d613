// Shared host code of the SSD forward (see ssd_host.h): O(1) checks of every precondition the
// kernels rely on, so a direct op call cannot access memory out of bounds, and the
// SsdFwdParams fill. Nothing is copied or converted: every operand is read in place with its
// dtype and strides (64-bit offsets).
//
// Not checked, because it needs the values (a device sync): that seq_idx is nondecreasing along
// each row (packed sequences). A row that goes back to an earlier id is not reset exactly.
#include <cstdint>

#include "check_msg.h"
#include "ssd_host.h"

namespace mamba_kernels {
namespace ssd {
namespace {

// The op named at the front of every message: the forward's, or the backward's while its
// checks run (one thread checks one call at a time).
thread_local const char* g_fn = "ssd_chunk_scan_fwd: ";
const char* fn() { return g_fn; }
struct FnScope {
  const char* saved;
  explicit FnScope(const char* name) : saved(g_fn) { g_fn = name; }
  ~FnScope() { g_fn = saved; }
  FnScope(const FnScope&) = delete;
  FnScope& operator=(const FnScope&) = delete;
};

DType float_dtype(const TensorRef& t, const char* name) {
  switch (t.scalar) {
    case Scalar::kFloat32: return DType::kFloat32;
    case Scalar::kFloat16: return DType::kFloat16;
    case Scalar::kBFloat16: return DType::kBFloat16;
    default:
      MK_CHECK_TYPE(false, fn(), name, " must be float32, float16 or bfloat16 on the CUDA kernel, got ",
                    t.dtype_name);
  }
  return DType::kFloat32;
}

void check_device(const TensorRef& t, const TensorRef& x, const char* name) {
  MK_CHECK(t.same_device(x), fn(), name, " must be on x's device ", x.device(), ", got ", t.device());
}

void check_shape(const TensorRef& t, std::initializer_list<int64_t> want, const char* name, const char* rule) {
  MK_CHECK(t.has_shape(want), fn(), name, " must have shape ", want, " (", rule, "), got ", t.shape());
}

// Stride of axis i, or 0 when the axis has one element (its index is always 0).
int64_t stride_of(const TensorRef& t, int64_t i) { return t.size(i) == 1 ? 0 : t.stride(i); }

// A checked operand with logical axes (a0..a3); an axis index of -1: the tensor lacks that axis.
Operand operand(const TensorRef& t, const TensorRef& x, const char* name, int a0, int a1, int a2, int a3) {
  check_device(t, x, name);
  Operand o;
  o.ptr = t.data;
  o.dtype = float_dtype(t, name);
  o.s0 = a0 < 0 ? 0 : stride_of(t, a0);
  o.s1 = a1 < 0 ? 0 : stride_of(t, a1);
  o.s2 = a2 < 0 ? 0 : stride_of(t, a2);
  o.s3 = a3 < 0 ? 0 : stride_of(t, a3);
  if (a3 >= 0 && t.element_size > 0) {
    const int64_t v = 16 / t.element_size;  // elements per 16 bytes
    o.vec16 = (t.stride(a3) == 1 || t.size(a3) == 1) && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 &&
              o.s0 % v == 0 && o.s1 % v == 0 && o.s2 % v == 0;
  }
  return o;
}

void check_same_dtype(const TensorRef& t, const TensorRef& x, const char* name) {
  MK_CHECK_TYPE(t.scalar == x.scalar, fn(), name, " must have x's dtype ", x.dtype_name, " on the CUDA kernel, got ",
                t.dtype_name);
}

// Row-major contiguous (an axis of one element may have any stride).
bool row_major(const TensorRef& t) {
  for (int64_t i = 0; i < t.dim; ++i) {
    if (t.size(i) == 0) return true;  // no elements: torch gives an empty tensor any strides
  }
  int64_t want = 1;
  for (int64_t i = t.dim - 1; i >= 0; --i) {
    if (t.size(i) != 1 && t.stride(i) != want) return false;
    want *= t.size(i);
  }
  return true;
}

}  // namespace

namespace {
SsdFwdParams prepare_inputs(const TensorRef& x, const TensorRef& dt, const TensorRef& A, const TensorRef& B,
                            const TensorRef& C, int64_t chunk_size, const TensorRef& D, const TensorRef& z,
                            const TensorRef& dt_bias, const TensorRef& initial_states, const TensorRef& seq_idx,
                            const TensorRef& cu_seqlens, bool dt_softplus, double dt_limit_lo, double dt_limit_hi) {
  MK_CHECK(x.is_cuda, fn(), "x must be a CUDA tensor, got device ", x.device());
  MK_CHECK(x.dim == 4, fn(), "x must be (batch, seqlen, nheads, headdim), got shape ", x.shape());
  SsdFwdParams p;
  p.dtype = float_dtype(x, "x");
  p.batch = x.size(0);
  p.seqlen = x.size(1);
  p.nheads = x.size(2);
  p.headdim = x.size(3);
  MK_CHECK(chunk_size >= 1 && chunk_size <= kSsdMaxChunk, fn(), "chunk_size must be in 1..", kSsdMaxChunk,
           " on the CUDA kernel, got ", chunk_size);
  p.chunk = chunk_size;
  p.nchunks = (p.seqlen + chunk_size - 1) / chunk_size;
  p.x = operand(x, x, "x", 0, 1, 2, 3);

  check_shape(dt, {p.batch, p.seqlen, p.nheads}, "dt", "(batch, seqlen, nheads), matching x");
  p.dt = operand(dt, x, "dt", 0, 1, 2, -1);
  check_shape(A, {p.nheads}, "A", "(nheads,), matching x");
  p.A = operand(A, x, "A", 0, -1, -1, -1);

  MK_CHECK(B.dim == 4, fn(), "B must be (batch, seqlen, ngroups, dstate), got shape ", B.shape());
  const int64_t ngroups = B.size(2);
  MK_CHECK(ngroups >= 1 && p.nheads % ngroups == 0,
           fn(), "nheads must be divisible by ngroups (B.shape[2]): nheads=", p.nheads, ", ngroups=", ngroups);
  p.heads_per_group = p.nheads / ngroups;
  p.ngroups = ngroups;
  p.dstate = B.size(3);
  check_shape(B, {p.batch, p.seqlen, ngroups, p.dstate}, "B", "(batch, seqlen, ngroups, dstate), matching x");
  check_shape(C, {p.batch, p.seqlen, ngroups, p.dstate}, "C", "same as B");
  check_same_dtype(B, x, "B");
  check_same_dtype(C, x, "C");
  p.B = operand(B, x, "B", 0, 1, 2, 3);
  p.C = operand(C, x, "C", 0, 1, 2, 3);

  if (D.present) {
    MK_CHECK(D.has_shape({p.nheads}) || D.has_shape({p.nheads, p.headdim}),
             fn(), "D must have shape [", p.nheads, "] or [", p.nheads, ", ", p.headdim,
             "] ((nheads,) or (nheads, headdim)), got ", D.shape());
    p.D = operand(D, x, "D", 0, D.dim == 2 ? 1 : -1, -1, -1);
  }
  if (z.present) {
    check_shape(z, {p.batch, p.seqlen, p.nheads, p.headdim}, "z", "like x");
    check_same_dtype(z, x, "z");
    p.z = operand(z, x, "z", 0, 1, 2, 3);
  }
  if (dt_bias.present) {
    check_shape(dt_bias, {p.nheads}, "dt_bias", "(nheads,)");
    p.dt_bias = operand(dt_bias, x, "dt_bias", 0, -1, -1, -1);
  }
  if (initial_states.present) {
    check_shape(initial_states, {p.batch, p.nheads, p.headdim, p.dstate}, "initial_states",
                "(batch, nheads, headdim, dstate)");
    p.init = operand(initial_states, x, "initial_states", 0, 1, 2, 3);
  }
  if (seq_idx.present) {
    check_device(seq_idx, x, "seq_idx");
    MK_CHECK_TYPE(seq_idx.scalar == Scalar::kInt32, fn(), "seq_idx must be int32, got ", seq_idx.dtype_name);
    check_shape(seq_idx, {p.batch, p.seqlen}, "seq_idx", "(batch, seqlen)");
    p.seq_idx = static_cast<const int32_t*>(seq_idx.data);
    p.seq_s0 = stride_of(seq_idx, 0);
    p.seq_s1 = stride_of(seq_idx, 1);
  }
  if (cu_seqlens.present) {
    check_device(cu_seqlens, x, "cu_seqlens");
    MK_CHECK_TYPE(cu_seqlens.scalar == Scalar::kInt32 || cu_seqlens.scalar == Scalar::kInt64,
                  fn(), "cu_seqlens must be int32 or int64, got ", cu_seqlens.dtype_name);
    MK_CHECK(cu_seqlens.dim == 1 && cu_seqlens.size(0) >= 2,
             fn(), "cu_seqlens must be (nseqs + 1,) with nseqs >= 1, got shape ", cu_seqlens.shape());
    MK_CHECK(p.batch == 1, fn(), "cu_seqlens needs batch 1 (the sequences packed along seqlen), got batch ",
             p.batch);
    p.cu_seqlens = cu_seqlens.data;
    p.cu_seqlens_64 = cu_seqlens.scalar == Scalar::kInt64;
    p.cu_s0 = cu_seqlens.stride(0);
    p.nseqs = cu_seqlens.size(0) - 1;
    MK_CHECK(p.nseqs <= kSsdMaxGridYZ, fn(), "cu_seqlens may hold at most ", kSsdMaxGridYZ,
             " sequences on the CUDA kernel, got ", p.nseqs);
  }
  p.dt_softplus = dt_softplus;
  p.dt_lo = float(dt_limit_lo);
  p.dt_hi = float(dt_limit_hi);

  // The launches' grid limits (head on x; tiles on y; batch x chunk on z).
  MK_CHECK(p.nheads <= kSsdMaxGridYZ, fn(), "nheads must be <= ", kSsdMaxGridYZ, " on the CUDA kernel, got ",
           p.nheads);
  MK_CHECK(p.batch * p.nchunks <= kSsdMaxGridYZ, fn(), "batch * nchunks (ceil(seqlen / chunk_size)) must be <= ",
           kSsdMaxGridYZ, " on the CUDA kernel, got ", p.batch * p.nchunks, " (batch=", p.batch, ", seqlen=", p.seqlen,
           ", chunk_size=", chunk_size, ")");
  MK_CHECK(p.batch <= kSsdMaxGridYZ, fn(), "batch must be <= ", kSsdMaxGridYZ, " on the CUDA kernel, got ", p.batch);
  MK_CHECK(p.headdim <= 65536 && p.dstate <= 65536,
           fn(), "headdim and dstate must be <= 65536 on the CUDA kernel, got headdim=", p.headdim,
           ", dstate=", p.dstate);
  return p;
}
}  // namespace

SsdFwdParams prepare_ssd_fwd(const TensorRef& x, const TensorRef& dt, const TensorRef& A, const TensorRef& B,
                             const TensorRef& C, int64_t chunk_size, const TensorRef& D, const TensorRef& z,
                             const TensorRef& dt_bias, const TensorRef& initial_states, const TensorRef& seq_idx,
                             const TensorRef& cu_seqlens, bool dt_softplus, double dt_limit_lo, double dt_limit_hi) {
  const FnScope scope("ssd_chunk_scan_fwd: ");
  return prepare_inputs(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus,
                        dt_limit_lo, dt_limit_hi);
}

void launch_ssd_fwd_checked(SsdFwdParams& p, const TensorRef& out, const TensorRef& out_x, const TensorRef& dt_out,
                            const TensorRef& dA_cumsum, const TensorRef& states, const TensorRef& final_states,
                            const TensorRef& varlen_states, const TensorRef& cb, cudaStream_t stream) {
  // The binding allocated these; the checks keep a direct caller of this code honest too.
  const std::initializer_list<int64_t> xs = {p.batch, p.seqlen, p.nheads, p.headdim};
  MK_CHECK(out.has_shape(xs), fn(), "out must have x's shape, got ", out.shape());
  p.out = out.data;
  p.out_s0 = stride_of(out, 0);
  p.out_s1 = stride_of(out, 1);
  p.out_s2 = stride_of(out, 2);
  p.out_s3 = stride_of(out, 3);
  if (p.z.ptr) {
    MK_CHECK(out_x.present && out_x.has_shape(xs), fn(), "out_x must have x's shape");
    p.out_x = out_x.data;
    p.outx_s0 = stride_of(out_x, 0);
    p.outx_s1 = stride_of(out_x, 1);
    p.outx_s2 = stride_of(out_x, 2);
    p.outx_s3 = stride_of(out_x, 3);
  }
  auto f32_dense = [&](const TensorRef& t, std::initializer_list<int64_t> shape, const char* name) {
    MK_CHECK(t.scalar == Scalar::kFloat32 && t.has_shape(shape) && row_major(t), fn(), name,
             " must be a contiguous float32 tensor of shape ", shape);
    return static_cast<float*>(t.data);
  };
  p.dt_out = f32_dense(dt_out, {p.batch, p.nheads, p.nchunks, p.chunk}, "dt_out");
  p.dA_cumsum = f32_dense(dA_cumsum, {p.batch, p.nheads, p.nchunks, p.chunk}, "dA_cumsum");
  p.states = f32_dense(states, {p.batch, p.nchunks, p.nheads, p.headdim, p.dstate}, "states");
  p.final_states = f32_dense(final_states, {p.batch, p.nheads, p.headdim, p.dstate}, "final_states");
  if (p.cu_seqlens) {
    p.varlen_states = f32_dense(varlen_states, {p.nseqs, p.nheads, p.headdim, p.dstate}, "varlen_states");
  }
  p.cb = f32_dense(cb, {p.batch, p.nchunks, p.ngroups, p.chunk, p.chunk}, "the C B^T workspace");
  const cudaError_t err = launch_ssd_fwd(p, stream);
  MK_CHECK(err == cudaSuccess, fn(), "kernel launch failed: ", cudaGetErrorString(err));
}

SsdBwdParams prepare_ssd_bwd(const TensorRef& dout, const TensorRef& x, const TensorRef& dt, const TensorRef& A,
                             const TensorRef& B, const TensorRef& C, const TensorRef& out, int64_t chunk_size,
                             const TensorRef& D, const TensorRef& z, const TensorRef& dt_bias,
                             const TensorRef& initial_states, const TensorRef& dfinal_states, const TensorRef& seq_idx,
                             bool dt_softplus, double dt_limit_lo, double dt_limit_hi) {
  const FnScope scope("ssd_chunk_scan_bwd: ");
  SsdBwdParams p;
  p.f = prepare_inputs(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, TensorRef(), dt_softplus,
                       dt_limit_lo, dt_limit_hi);
  const SsdFwdParams& f = p.f;
  MK_CHECK(f.headdim >= 1 && f.dstate >= 1, fn(), "headdim and dstate must be >= 1 on the CUDA backward, got headdim=",
           f.headdim, ", dstate=", f.dstate);
  check_shape(dout, {f.batch, f.seqlen, f.nheads, f.headdim}, "dout", "like x");
  p.dout = operand(dout, x, "dout", 0, 1, 2, 3);
  if (z.present) {
    MK_CHECK(out.present, fn(), "out (y before the gate) is required with z");
    check_shape(out, {f.batch, f.seqlen, f.nheads, f.headdim}, "out", "like x");
    p.out = operand(out, x, "out", 0, 1, 2, 3);
  }
  if (dfinal_states.present) {
    check_shape(dfinal_states, {f.batch, f.nheads, f.headdim, f.dstate}, "dfinal_states",
                "(batch, nheads, headdim, dstate)");
    p.dfinal = operand(dfinal_states, x, "dfinal_states", 0, 1, 2, 3);
  }
  p.ddt_dtype = float_dtype(dt, "dt");
  p.dA_dtype = float_dtype(A, "A");
  if (D.present) {
    p.dD_dtype = float_dtype(D, "D");
    p.dD_per_channel = D.dim == 2;
  }
  if (dt_bias.present) p.ddt_bias_dtype = float_dtype(dt_bias, "dt_bias");
  if (initial_states.present) p.dinit_dtype = float_dtype(initial_states, "initial_states");
  return p;
}

void launch_ssd_bwd_checked(SsdBwdParams& p, const BwdOutputs& o, const TensorRef& workspace, cudaStream_t stream) {
  const FnScope scope("ssd_chunk_scan_bwd: ");
  SsdFwdParams& f = p.f;
  auto dense = [&](const TensorRef& t, std::initializer_list<int64_t> shape, Scalar scalar, const char* name) {
    MK_CHECK(t.present && t.scalar == scalar && t.has_shape(shape) && row_major(t), fn(), name,
             " must be a contiguous tensor of shape ", shape, " and the input's dtype");
    return t.data;
  };
  const std::initializer_list<int64_t> xs = {f.batch, f.seqlen, f.nheads, f.headdim};
  const std::initializer_list<int64_t> bs = {f.batch, f.seqlen, f.ngroups, f.dstate};
  p.dx = dense(o.dx, xs, o.x_scalar, "dx");
  p.dB = dense(o.dB, bs, o.x_scalar, "dB");
  p.dC = dense(o.dC, bs, o.x_scalar, "dC");
  p.ddt = dense(o.ddt, {f.batch, f.seqlen, f.nheads}, o.ddt.scalar, "ddt");
  p.dA = dense(o.dA, {f.nheads}, o.dA.scalar, "dA");
  if (f.z.ptr) p.dz = dense(o.dz, xs, o.x_scalar, "dz");
  if (f.D.ptr) {
    p.dD = p.dD_per_channel ? dense(o.dD, {f.nheads, f.headdim}, o.dD.scalar, "dD")
                            : dense(o.dD, {f.nheads}, o.dD.scalar, "dD");
  }
  if (f.dt_bias.ptr) p.ddt_bias = dense(o.ddt_bias, {f.nheads}, o.ddt_bias.scalar, "ddt_bias");
  if (f.init.ptr) p.dinit = dense(o.dinit, {f.batch, f.nheads, f.headdim, f.dstate}, o.dinit.scalar, "dinitial_states");
  // one fp32 workspace, carved into 256-byte aligned pieces
  int64_t counts[kSsdBwdPieces];
  const int64_t n = ssd_bwd_workspace_floats(p, counts);
  MK_CHECK(workspace.present && workspace.scalar == Scalar::kFloat32 && workspace.dim == 1 &&
               workspace.size(0) >= n && row_major(workspace) && reinterpret_cast<uintptr_t>(workspace.data) % 256 == 0,
           fn(), "the workspace must be a contiguous float32 tensor of at least ", n, " elements");
  float* base = static_cast<float*>(workspace.data);
  float* piece[kSsdBwdPieces];
  int64_t at = 0;
  for (int i = 0; i < kSsdBwdPieces; ++i) {
    piece[i] = base + at;
    at += (counts[i] + 63) / 64 * 64;
  }
  f.dt_out = piece[0];
  f.dA_cumsum = piece[1];
  f.states = piece[2];
  f.cb = piece[3];
  f.final_states = nullptr;
  p.dy = piece[4];
  p.dstates = piece[5];
  p.dcb = piece[6];
  p.step_part = piece[7];
  p.decay_part = piece[8];
  p.head_part = piece[9];
  p.dD_part = piece[10];
  p.dbc_part = piece[11];
  const cudaError_t err = launch_ssd_bwd(p, stream);
  MK_CHECK(err == cudaSuccess, fn(), "kernel launch failed: ", cudaGetErrorString(err));
}

int64_t ssd_bwd_workspace_floats(SsdBwdParams& p, int64_t (&counts)[kSsdBwdPieces]) {
  const SsdFwdParams& f = p.f;
  const SsdBwdWorkspace w = ssd_bwd_workspace(p);
  const int64_t steps = f.batch * f.nheads * f.nchunks * f.chunk;
  counts[0] = steps;
  counts[1] = steps;
  counts[2] = f.batch * f.nchunks * f.nheads * f.headdim * f.dstate;
  counts[3] = f.batch * f.nchunks * f.ngroups * f.chunk * f.chunk;
  counts[4] = w.dy;
  counts[5] = w.dstates;
  counts[6] = w.dcb;
  counts[7] = w.step_part;
  counts[8] = w.decay_part;
  counts[9] = w.head_part;
  counts[10] = w.dD_part;
  counts[11] = w.dbc_part;
  int64_t n = 0;
  for (int64_t c : counts) n += (c + 63) / 64 * 64;
  return n;
}

}  // namespace ssd
}  // namespace mamba_kernels
