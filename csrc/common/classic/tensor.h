// The classic binding's side of the shared host code: TensorRef from an at::Tensor, the current
// stream, allocation with given strides. Included only by csrc/<kernel>/classic/*.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "tensor_ref.h"

namespace mamba_kernels {
namespace classic {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

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
  r.device = d.str();
  r.dim = t.dim();
  r.sizes = t.sizes().data();
  r.strides = t.strides().data();
  return r;
}

inline TensorRef tref(const OptTensor& t) { return t.has_value() ? tref(*t) : TensorRef(); }

inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// A new tensor on `like`'s device with the given layout and dtype.
inline Tensor alloc(const Tensor& like, const Alloc3& a, c10::ScalarType dtype) {
  return at::empty_strided({a.sizes[0], a.sizes[1], a.sizes[2]}, {a.strides[0], a.strides[1], a.strides[2]},
                           like.options().dtype(dtype));
}

}  // namespace classic
}  // namespace mamba_kernels
