// The classic binding's side of the shared host code: TensorRef from an at::Tensor, the current
// stream, allocation and the few tensor operations the ops need, over ATen. The same names and
// signatures as stable/tensor.h, so the ops' bodies (csrc/<kernel>/*_ops.h) are written once for
// both bindings. Included only by csrc/<kernel>/classic/*.cpp.
#pragma once

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <initializer_list>
#include <optional>

#include "tensor_ref.h"

namespace mamba_kernels {
namespace classic {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using c10::ScalarType;
using DeviceGuard = c10::cuda::CUDAGuard;

inline Scalar scalar_of(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return Scalar::kFloat32;
    case at::kHalf: return Scalar::kFloat16;
    case at::kBFloat16: return Scalar::kBFloat16;
    case at::kInt: return Scalar::kInt32;
    case at::kLong: return Scalar::kInt64;
    case at::kComplexFloat: return Scalar::kComplex64;
    default: return Scalar::kOther;
  }
}

inline TensorRef tref(const Tensor& t) {
  TensorRef r;
  r.present = true;
  r.data = t.data_ptr();
  const c10::ScalarType st = t.scalar_type();
  r.scalar = scalar_of(st);
  r.dtype_name = c10::toString(st);
  r.is_complex = c10::isComplexType(st);
  r.element_size = int64_t(t.element_size());
  const c10::Device d = t.device();
  r.is_cuda = d.is_cuda();
  r.device_type = int(d.type());
  r.device_index = int(d.index());
  r.name_device = [](int type, int index) {
    return c10::Device(c10::DeviceType(type), c10::DeviceIndex(index)).str();
  };
  r.dim = t.dim();
  r.sizes = t.sizes().data();
  r.strides = t.strides().data();
  return r;
}

inline TensorRef tref(const OptTensor& t) { return t.has_value() ? tref(*t) : TensorRef(); }

inline cudaStream_t current_stream(int32_t device_index) {
  return c10::cuda::getCurrentCUDAStream(c10::DeviceIndex(device_index)).stream();
}

// A new contiguous tensor on `like`'s device.
inline Tensor empty(const Tensor& like, const int64_t* sizes, int64_t ndim, ScalarType dtype) {
  return at::empty(at::IntArrayRef(sizes, size_t(ndim)), like.options().dtype(dtype));
}
inline Tensor empty(const Tensor& like, std::initializer_list<int64_t> sizes, ScalarType dtype) {
  return empty(like, sizes.begin(), int64_t(sizes.size()), dtype);
}

// A new 3-D tensor with the layout the shared host code computed.
inline Tensor alloc(const Tensor& like, const Alloc3& a, ScalarType dtype) {
  return at::empty_strided({a.sizes[0], a.sizes[1], a.sizes[2]}, {a.strides[0], a.strides[1], a.strides[2]},
                           like.options().dtype(dtype));
}

inline Tensor empty_like(const Tensor& t, const TensorRef&) { return at::empty_like(t); }
inline void copy_(const Tensor& dst, const Tensor& src) { dst.copy_(src); }
inline void zero_(const Tensor& t) { t.zero_(); }

// t.to(dtype).contiguous(); always_copy: a copy even when t already is that (resolves a
// conjugate view, as stable/tensor.h must).
inline Tensor contiguous_as(const Tensor& t, ScalarType dtype, bool always_copy = false) {
  if (!always_copy && t.scalar_type() == dtype && t.is_contiguous()) return t;
  const Tensor out = at::empty(t.sizes(), t.options().dtype(dtype));
  out.copy_(t);
  return out;
}
inline OptTensor contiguous_as(const OptTensor& t, ScalarType dtype) {
  return t.has_value() ? OptTensor(contiguous_as(*t, dtype)) : std::nullopt;
}

inline bool deterministic_algorithms() { return at::globalContext().deterministicAlgorithms(); }

}  // namespace classic
}  // namespace mamba_kernels
