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

#define SSD_FN "ssd_chunk_scan_fwd: "

DType float_dtype(const TensorRef& t, const char* name) {
  switch (t.scalar) {
    case Scalar::kFloat32: return DType::kFloat32;
    case Scalar::kFloat16: return DType::kFloat16;
    case Scalar::kBFloat16: return DType::kBFloat16;
    default:
      MK_CHECK_TYPE(false, SSD_FN, name, " must be float32, float16 or bfloat16 on the CUDA kernel, got ",
                    t.dtype_name);
  }
  return DType::kFloat32;
}

void check_device(const TensorRef& t, const TensorRef& x, const char* name) {
  MK_CHECK(t.same_device(x), SSD_FN, name, " must be on x's device ", x.device(), ", got ", t.device());
}

void check_shape(const TensorRef& t, std::initializer_list<int64_t> want, const char* name, const char* rule) {
  MK_CHECK(t.has_shape(want), SSD_FN, name, " must have shape ", want, " (", rule, "), got ", t.shape());
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
  MK_CHECK_TYPE(t.scalar == x.scalar, SSD_FN, name, " must have x's dtype ", x.dtype_name, " on the CUDA kernel, got ",
                t.dtype_name);
}

// Row-major contiguous (an axis of one element may have any stride).
bool row_major(const TensorRef& t) {
  int64_t want = 1;
  for (int64_t i = t.dim - 1; i >= 0; --i) {
    if (t.size(i) != 1 && t.stride(i) != want) return false;
    want *= t.size(i);
  }
  return true;
}

}  // namespace

SsdFwdParams prepare_ssd_fwd(const TensorRef& x, const TensorRef& dt, const TensorRef& A, const TensorRef& B,
                             const TensorRef& C, int64_t chunk_size, const TensorRef& D, const TensorRef& z,
                             const TensorRef& dt_bias, const TensorRef& initial_states, const TensorRef& seq_idx,
                             const TensorRef& cu_seqlens, bool dt_softplus, double dt_limit_lo, double dt_limit_hi) {
  MK_CHECK(x.is_cuda, SSD_FN "x must be a CUDA tensor, got device ", x.device());
  MK_CHECK(x.dim == 4, SSD_FN "x must be (batch, seqlen, nheads, headdim), got shape ", x.shape());
  SsdFwdParams p;
  p.dtype = float_dtype(x, "x");
  p.batch = x.size(0);
  p.seqlen = x.size(1);
  p.nheads = x.size(2);
  p.headdim = x.size(3);
  MK_CHECK(chunk_size >= 1 && chunk_size <= kSsdMaxChunk, SSD_FN "chunk_size must be in 1..", kSsdMaxChunk,
           " on the CUDA kernel, got ", chunk_size);
  p.chunk = chunk_size;
  p.nchunks = (p.seqlen + chunk_size - 1) / chunk_size;
  p.x = operand(x, x, "x", 0, 1, 2, 3);

  check_shape(dt, {p.batch, p.seqlen, p.nheads}, "dt", "(batch, seqlen, nheads), matching x");
  p.dt = operand(dt, x, "dt", 0, 1, 2, -1);
  check_shape(A, {p.nheads}, "A", "(nheads,), matching x");
  p.A = operand(A, x, "A", 0, -1, -1, -1);

  MK_CHECK(B.dim == 4, SSD_FN "B must be (batch, seqlen, ngroups, dstate), got shape ", B.shape());
  const int64_t ngroups = B.size(2);
  MK_CHECK(ngroups >= 1 && p.nheads % ngroups == 0,
           SSD_FN "nheads must be divisible by ngroups (B.shape[2]): nheads=", p.nheads, ", ngroups=", ngroups);
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
             SSD_FN "D must have shape [", p.nheads, "] or [", p.nheads, ", ", p.headdim,
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
    MK_CHECK_TYPE(seq_idx.scalar == Scalar::kInt32, SSD_FN "seq_idx must be int32, got ", seq_idx.dtype_name);
    check_shape(seq_idx, {p.batch, p.seqlen}, "seq_idx", "(batch, seqlen)");
    p.seq_idx = static_cast<const int32_t*>(seq_idx.data);
    p.seq_s0 = stride_of(seq_idx, 0);
    p.seq_s1 = stride_of(seq_idx, 1);
  }
  if (cu_seqlens.present) {
    check_device(cu_seqlens, x, "cu_seqlens");
    MK_CHECK_TYPE(cu_seqlens.scalar == Scalar::kInt32 || cu_seqlens.scalar == Scalar::kInt64,
                  SSD_FN "cu_seqlens must be int32 or int64, got ", cu_seqlens.dtype_name);
    MK_CHECK(cu_seqlens.dim == 1 && cu_seqlens.size(0) >= 2,
             SSD_FN "cu_seqlens must be (nseqs + 1,) with nseqs >= 1, got shape ", cu_seqlens.shape());
    MK_CHECK(p.batch == 1, SSD_FN "cu_seqlens needs batch 1 (the sequences packed along seqlen), got batch ",
             p.batch);
    p.cu_seqlens = cu_seqlens.data;
    p.cu_seqlens_64 = cu_seqlens.scalar == Scalar::kInt64;
    p.cu_s0 = cu_seqlens.stride(0);
    p.nseqs = cu_seqlens.size(0) - 1;
    MK_CHECK(p.nseqs <= kSsdMaxGridYZ, SSD_FN "cu_seqlens may hold at most ", kSsdMaxGridYZ,
             " sequences on the CUDA kernel, got ", p.nseqs);
  }
  p.dt_softplus = dt_softplus;
  p.dt_lo = float(dt_limit_lo);
  p.dt_hi = float(dt_limit_hi);

  // The launches' grid limits (head on x; tiles on y; batch x chunk on z).
  MK_CHECK(p.nheads <= kSsdMaxGridYZ, SSD_FN "nheads must be <= ", kSsdMaxGridYZ, " on the CUDA kernel, got ",
           p.nheads);
  MK_CHECK(p.batch * p.nchunks <= kSsdMaxGridYZ, SSD_FN "batch * nchunks (ceil(seqlen / chunk_size)) must be <= ",
           kSsdMaxGridYZ, " on the CUDA kernel, got ", p.batch * p.nchunks, " (batch=", p.batch, ", seqlen=", p.seqlen,
           ", chunk_size=", chunk_size, ")");
  MK_CHECK(p.batch <= kSsdMaxGridYZ, SSD_FN "batch must be <= ", kSsdMaxGridYZ, " on the CUDA kernel, got ", p.batch);
  MK_CHECK(p.headdim <= 65536 && p.dstate <= 65536,
           SSD_FN "headdim and dstate must be <= 65536 on the CUDA kernel, got headdim=", p.headdim,
           ", dstate=", p.dstate);
  return p;
}

void launch_ssd_fwd_checked(SsdFwdParams& p, const TensorRef& out, const TensorRef& out_x, const TensorRef& dt_out,
                            const TensorRef& dA_cumsum, const TensorRef& states, const TensorRef& final_states,
                            const TensorRef& varlen_states, const TensorRef& cb, cudaStream_t stream) {
  // The binding allocated these; the checks keep a direct caller of this code honest too.
  const std::initializer_list<int64_t> xs = {p.batch, p.seqlen, p.nheads, p.headdim};
  MK_CHECK(out.has_shape(xs), SSD_FN "out must have x's shape, got ", out.shape());
  p.out = out.data;
  p.out_s0 = stride_of(out, 0);
  p.out_s1 = stride_of(out, 1);
  p.out_s2 = stride_of(out, 2);
  p.out_s3 = stride_of(out, 3);
  if (p.z.ptr) {
    MK_CHECK(out_x.present && out_x.has_shape(xs), SSD_FN "out_x must have x's shape");
    p.out_x = out_x.data;
    p.outx_s0 = stride_of(out_x, 0);
    p.outx_s1 = stride_of(out_x, 1);
    p.outx_s2 = stride_of(out_x, 2);
    p.outx_s3 = stride_of(out_x, 3);
  }
  auto f32_dense = [&](const TensorRef& t, std::initializer_list<int64_t> shape, const char* name) {
    MK_CHECK(t.scalar == Scalar::kFloat32 && t.has_shape(shape) && row_major(t), SSD_FN, name,
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
  MK_CHECK(err == cudaSuccess, SSD_FN "kernel launch failed: ", cudaGetErrorString(err));
}

#undef SSD_FN

}  // namespace ssd
}  // namespace mamba_kernels
