// The stable-ABI binding's side of the shared host code: TensorRef from a torch::stable::Tensor,
// the current stream, allocation and the few tensor operations the bindings need, all through
// PyTorch's stable C shim, so the binary runs on every torch from its TORCH_TARGET_VERSION on.
// Compiled with TORCH_TARGET_VERSION set: no c10/ATen header may be included (they #error).
// Included only by csrc/<kernel>/stable/*.cpp.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/DeviceType.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cuda_runtime.h>

#include <initializer_list>
#include <cstdint>
#include <optional>
#include <string>

#include "tensor_ref.h"

namespace mamba_kernels {
namespace stable {

using Tensor = torch::stable::Tensor;
using OptTensor = std::optional<Tensor>;
using torch::headeronly::ScalarType;
using DeviceGuard = torch::stable::accelerator::DeviceGuard;

inline Scalar scalar_of(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return Scalar::kFloat32;
    case ScalarType::Half: return Scalar::kFloat16;
    case ScalarType::BFloat16: return Scalar::kBFloat16;
    case ScalarType::Int: return Scalar::kInt32;
    case ScalarType::Long: return Scalar::kInt64;
    case ScalarType::ComplexFloat: return Scalar::kComplex64;
    default: return Scalar::kOther;
  }
}

// torch's lower-case device names for the types a tensor reaching these ops can have; the
// stable ABI has no call for the name itself.
inline std::string device_name(torch::headeronly::DeviceType type, int index) {
  using torch::headeronly::DeviceType;
  std::string name;
  switch (type) {
    case DeviceType::CPU: name = "cpu"; break;
    case DeviceType::CUDA: name = "cuda"; break;
    case DeviceType::Meta: name = "meta"; break;
    case DeviceType::XPU: name = "xpu"; break;
    case DeviceType::MPS: name = "mps"; break;
    case DeviceType::HIP: name = "hip"; break;
    case DeviceType::PrivateUse1: name = "privateuseone"; break;
    default: name = "device type " + std::to_string(int(type)); break;
  }
  return index >= 0 ? name + ":" + std::to_string(index) : name;
}

inline TensorRef tref(const Tensor& t) {
  TensorRef r;
  r.present = true;
  r.data = t.data_ptr();
  const ScalarType st = t.scalar_type();
  r.scalar = scalar_of(st);
  r.dtype_name = torch::headeronly::toString(st);
  r.is_complex = st == ScalarType::ComplexHalf || st == ScalarType::ComplexFloat || st == ScalarType::ComplexDouble;
  r.element_size = int64_t(t.element_size());
  const torch::stable::Device d = t.device();
  r.is_cuda = d.is_cuda();
  r.device_type = int(d.type());
  r.device_index = int(d.index());
  r.name_device = [](int type, int index) { return device_name(torch::headeronly::DeviceType(type), index); };
  r.dim = t.dim();
  r.sizes = t.sizes().data();
  r.strides = t.strides().data();
  return r;
}

inline TensorRef tref(const OptTensor& t) { return t.has_value() ? tref(*t) : TensorRef(); }

// The current CUDA stream of the device, from the shim (a stream id is not a cudaStream_t).
inline cudaStream_t current_stream(int32_t device_index) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device_index, &stream));
  return static_cast<cudaStream_t>(stream);
}

// ---- Allocation and copies. Each is one direct shim call into ATen: the ops of stable/ops.h
// that go through torch_call_dispatcher look the operator up by name and box its arguments,
// several microseconds a call, which small shapes feel.

// A new tensor on `like`'s device with the given sizes, strides and dtype.
inline Tensor empty_strided(const Tensor& like, int64_t ndim, const int64_t* sizes, const int64_t* strides,
                            ScalarType dtype) {
  int32_t device_type = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(like.get(), &device_type));
  const int32_t code = torch::stable::detail::to<int32_t>(torch::stable::detail::from(dtype));
  AtenTensorHandle handle = nullptr;
  TORCH_ERROR_CODE_CHECK(
      aoti_torch_empty_strided(ndim, sizes, strides, code, device_type, like.get_device_index(), &handle));
  return Tensor(handle);
}

// A new contiguous tensor (torch's row-major strides) of at most kMaxDims axes.
constexpr int64_t kMaxDims = 8;
inline Tensor empty(const Tensor& like, const int64_t* sizes, int64_t ndim, ScalarType dtype) {
  MK_CHECK(ndim >= 0 && ndim <= kMaxDims, "mamba_kernels: cannot allocate a tensor of ", ndim, " dimensions");
  int64_t strides[kMaxDims];
  row_major_strides(sizes, ndim, strides);
  return empty_strided(like, ndim, sizes, strides, dtype);
}
inline Tensor empty(const Tensor& like, std::initializer_list<int64_t> sizes, ScalarType dtype) {
  return empty(like, sizes.begin(), int64_t(sizes.size()), dtype);
}

// A new 3-D tensor with the layout the shared host code computed.
inline Tensor alloc(const Tensor& like, const Alloc3& a, ScalarType dtype) {
  return empty_strided(like, 3, a.sizes, a.strides, dtype);
}

// torch.empty_like(t): a dense, non-overlapping t's exact strides, as torch keeps them; any
// other layout (a strided view: rare here) through the dispatcher, for torch's own rule.
inline Tensor empty_like(const Tensor& t, const TensorRef& r) {
  if (non_overlapping_and_dense(r)) return empty_strided(t, r.dim, r.sizes, r.strides, t.scalar_type());
  return torch::stable::empty_like(t);
}

// dst.copy_(src): broadcasts, converts the dtype and resolves conjugate / negative views.
inline void copy_(const Tensor& dst, const Tensor& src) {
  TORCH_ERROR_CODE_CHECK(aoti_torch_copy_(dst.get(), src.get(), 0));
}
inline void zero_(const Tensor& t) { TORCH_ERROR_CODE_CHECK(aoti_torch_zero_(t.get())); }

// t.to(dtype).contiguous(): t itself when it is contiguous and of that dtype (as torch returns
// it), else a contiguous copy. always_copy: copy anyway (a complex tensor may be a conjugate
// view, which the shim cannot tell; the copy resolves it).
inline Tensor contiguous_as(const Tensor& t, ScalarType dtype, bool always_copy = false) {
  if (!always_copy && t.scalar_type() == dtype) {
    bool contiguous = false;
    TORCH_ERROR_CODE_CHECK(aoti_torch_is_contiguous(t.get(), &contiguous));
    if (contiguous) return t;
  }
  const auto sizes = t.sizes();
  const Tensor out = empty(t, sizes.data(), int64_t(sizes.size()), dtype);
  copy_(out, t);
  return out;
}
inline OptTensor contiguous_as(const OptTensor& t, ScalarType dtype) {
  return t.has_value() ? OptTensor(contiguous_as(*t, dtype)) : std::nullopt;
}

// torch.are_deterministic_algorithms_enabled(): the stable ABI has no call for it, so it is
// asked from Python (errors.cpp); false when no Python interpreter runs.
bool deterministic_algorithms();

}  // namespace stable
}  // namespace mamba_kernels
