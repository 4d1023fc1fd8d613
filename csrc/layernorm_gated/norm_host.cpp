// Shared host code of the gated norm ops (see norm_host.h): O(1) checks of every precondition
// the kernels rely on, so a direct op call cannot access memory out of bounds, and the
// parameter fills. Nothing is copied: every operand is read or written in place.
#include "norm_host.h"

#include <cmath>
#include <cstdint>

#include "check_msg.h"

namespace mamba_kernels {
namespace layernorm_gated {
namespace {

struct Ctx {
  const char* fn;       // "layernorm_gated_fwd: "
  const TensorRef& x;   // the reference for device, shape and dtype
};

DType act_dtype(const Ctx& c, const TensorRef& t, const char* name) {
  switch (t.scalar) {
    case Scalar::kFloat32: return DType::kFloat32;
    case Scalar::kFloat16: return DType::kFloat16;
    case Scalar::kBFloat16: return DType::kBFloat16;
    default:
      MK_CHECK_TYPE(false, c.fn, name, " must be float32, float16 or bfloat16 on the CUDA kernel, got ",
                    t.dtype_name);
  }
  return DType::kFloat32;
}

void check_device(const Ctx& c, const TensorRef& t, const char* name) {
  MK_CHECK(t.same_device(c.x), c.fn, name, " must be on x's device ", c.x.device(), ", got ", t.device());
}

// A (rows, n) operand like x: its shape, x's dtype, unit channel stride; `written`: rows must
// not share memory (they are written by different teams).
RowOperand row_operand(const Ctx& c, const TensorRef& t, const char* name, bool written) {
  check_device(c, t, name);
  MK_CHECK(t.same_shape(c.x), c.fn, name, " must have x's shape ", c.x.shape(), ", got ", t.shape());
  MK_CHECK_TYPE(t.scalar == c.x.scalar, c.fn, name, " must have x's dtype ", c.x.dtype_name, ", got ",
                t.dtype_name);
  const int64_t rows = t.size(0), n = t.size(1);
  MK_CHECK(n <= 1 || t.stride(1) == 1, c.fn, name, " must have unit stride along the channels, got strides ",
           t.stride_list());
  if (written) {
    MK_CHECK(rows <= 1 || n == 0 || t.stride(0) >= n, c.fn, name,
             " is written, so its rows must not share memory (row stride >= channels), got strides ",
             t.stride_list());
  }
  RowOperand o;
  o.ptr = t.data;
  o.row = rows <= 1 ? 0 : t.stride(0);
  return o;
}

// weight, bias, dweight, dbias: (n,) contiguous, a float dtype of their own.
DType param(const Ctx& c, const TensorRef& t, const char* name, int64_t n) {
  check_device(c, t, name);
  const int64_t want[1] = {n};
  MK_CHECK(t.has_shape(want, 1), c.fn, name, " must have shape ", IntList{want, 1}, " (x.shape[-1] channels), got ",
           t.shape());
  MK_CHECK(n <= 1 || t.stride(0) == 1, c.fn, name, " must be contiguous, got strides ", t.stride_list());
  return act_dtype(c, t, name);
}

// mean, rstd: float32 (ngroups * rows,) contiguous.
float* stat(const Ctx& c, const TensorRef& t, const char* name, int64_t count) {
  check_device(c, t, name);
  MK_CHECK_TYPE(t.scalar == Scalar::kFloat32, c.fn, name, " must be float32, got ", t.dtype_name);
  const int64_t want[1] = {count};
  MK_CHECK(t.has_shape(want, 1), c.fn, name, " must have shape ", IntList{want, 1}, " (ngroups * rows), got ",
           t.shape());
  MK_CHECK(count <= 1 || t.stride(0) == 1, c.fn, name, " must be contiguous, got strides ", t.stride_list());
  return static_cast<float*>(t.data);
}

// x, eps and group_size; returns (rows, n, ngroups) through the params.
template <typename P>
void common(const Ctx& c, P& p, double eps, int64_t group_size) {
  const TensorRef& x = c.x;
  MK_CHECK(x.is_cuda, c.fn, "x must be a CUDA tensor, got device ", x.device());
  MK_CHECK(x.dim == 2, c.fn, "x must be 2-D (rows, channels), got shape ", x.shape());
  p.dtype = act_dtype(c, x, "x");
  p.rows = x.size(0);
  p.n = x.size(1);
  MK_CHECK(group_size >= 1 && p.n % group_size == 0, c.fn, "group_size must be >= 1 and divide x.shape[-1] = ", p.n,
           ", got ", group_size);
  MK_CHECK(group_size * int64_t(dtype_size(p.dtype)) <= kMaxGroupBytes, c.fn, "group_size must be <= ",
           kMaxGroupBytes / dtype_size(p.dtype), " elements (", kMaxGroupBytes, " bytes) on the CUDA kernel, got ",
           group_size);
  MK_CHECK(std::isfinite(eps) && eps >= 0, c.fn, "eps must be finite and >= 0, got ", std::to_string(eps));
  p.group_size = group_size;
  p.ngroups = p.n / group_size;
  p.eps = float(eps);
}

// mean (LayerNorm only: None for the RMSNorm) and rstd, one float per (group, row), and the
// norm's kind; after common().
template <typename P>
void norm_kind(const Ctx& c, P& p, const TensorRef& mean, const TensorRef& rstd, bool is_rms_norm,
               bool norm_before_gate) {
  const int64_t count = p.ngroups * p.rows;
  if (is_rms_norm) {
    MK_CHECK(!mean.present, c.fn, "mean must be None for the RMSNorm (is_rms_norm), got a tensor of shape ",
             mean.shape());
  } else {
    MK_CHECK(mean.present, c.fn, "mean must be a tensor for the LayerNorm (is_rms_norm false), got None");
    p.mean = stat(c, mean, "mean", count);
  }
  p.rstd = stat(c, rstd, "rstd", count);
  p.norm_before_gate = norm_before_gate;
  p.rms = is_rms_norm;
}

}  // namespace

NormFwdParams prepare_fwd(const TensorRef& x, const TensorRef& weight, const TensorRef& bias, const TensorRef& z,
                          const TensorRef& out, const TensorRef& mean, const TensorRef& rstd, double eps,
                          int64_t group_size, bool norm_before_gate, bool is_rms_norm) {
  const Ctx c{"layernorm_gated_fwd: ", x};
  NormFwdParams p;
  common(c, p, eps, group_size);
  p.x = row_operand(c, x, "x", false);
  if (z.present) p.z = row_operand(c, z, "z", false);
  p.out = row_operand(c, out, "out", true);
  p.w_dtype = param(c, weight, "weight", p.n);
  p.w = weight.data;
  if (bias.present) {
    p.b_dtype = param(c, bias, "bias", p.n);
    p.b = bias.data;
  }
  norm_kind(c, p, mean, rstd, is_rms_norm, norm_before_gate);
  return p;
}

void launch_fwd_checked(const NormFwdParams& p, cudaStream_t stream) {
  const cudaError_t err = launch_norm_fwd(p, stream);
  MK_CHECK(err == cudaSuccess, "layernorm_gated_fwd: kernel launch failed: ", cudaGetErrorString(err));
}

NormBwdParams prepare_bwd(const TensorRef& dy, const TensorRef& x, const TensorRef& weight, const TensorRef& bias,
                          const TensorRef& z, const TensorRef& mean, const TensorRef& rstd, const TensorRef& dx,
                          const TensorRef& dz, const TensorRef& out, const TensorRef& dweight,
                          const TensorRef& dbias, double eps, int64_t group_size, bool norm_before_gate,
                          bool is_rms_norm) {
  const Ctx c{"layernorm_gated_bwd: ", x};
  NormBwdParams p;
  common(c, p, eps, group_size);
  p.x = row_operand(c, x, "x", false);
  p.dy = row_operand(c, dy, "dy", false);
  p.dx = row_operand(c, dx, "dx", true);
  if (z.present) {
    p.z = row_operand(c, z, "z", false);
    MK_CHECK(dz.present, c.fn, "dz must be a tensor when z is given, got None");
    p.dz = row_operand(c, dz, "dz", true);
  } else {
    MK_CHECK(!dz.present, c.fn, "dz must be None without z, got a tensor of shape ", dz.shape());
  }
  if (out.present) p.out = row_operand(c, out, "out", true);
  p.w_dtype = param(c, weight, "weight", p.n);
  p.w = weight.data;
  const DType dw_dtype = param(c, dweight, "dweight", p.n);
  MK_CHECK_TYPE(dw_dtype == p.w_dtype, c.fn, "dweight must have weight's dtype ", weight.dtype_name, ", got ",
                dweight.dtype_name);
  p.dw = dweight.data;
  if (bias.present) {
    p.b_dtype = param(c, bias, "bias", p.n);
    p.b = bias.data;
    MK_CHECK(dbias.present, c.fn, "dbias must be a tensor when bias is given, got None");
    const DType db_dtype = param(c, dbias, "dbias", p.n);
    MK_CHECK_TYPE(db_dtype == p.b_dtype, c.fn, "dbias must have bias's dtype ", bias.dtype_name, ", got ",
                  dbias.dtype_name);
    p.db = dbias.data;
  } else {
    MK_CHECK(!dbias.present, c.fn, "dbias must be None without bias, got a tensor of shape ", dbias.shape());
  }
  norm_kind(c, p, mean, rstd, is_rms_norm, norm_before_gate);
  return p;
}

int64_t bwd_workspace_floats(const NormBwdParams& p, int device_index) { return norm_bwd_workspace(p, device_index); }

void launch_bwd_checked(const NormBwdParams& p, float* workspace, int device_index, cudaStream_t stream) {
  const cudaError_t err = launch_norm_bwd(p, workspace, device_index, stream);
  MK_CHECK(err == cudaSuccess, "layernorm_gated_bwd: kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace layernorm_gated
}  // namespace mamba_kernels
