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

#include <array>
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
  r.device = device_name(d.type(), r.device_index);
  r.dim = t.dim();
  r.sizes = t.sizes().data();
  r.strides = t.strides().data();
  return r;
}

inline TensorRef tref(const OptTensor& t) { return t.has_value() ? tref(*t) : TensorRef(); }

// The current CUDA stream of the device, from the shim (a stream id is not a cudaStream_t).
inline cudaStream_t current_stream(int32_t device_index) {
  void* stream = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device_index, &stream));
  return static_cast<cudaStream_t>(stream);
}

// A new 3-D tensor on `like`'s device with the given layout and dtype.
inline Tensor alloc(const Tensor& like, const Alloc3& a, ScalarType dtype) {
  int32_t device_type = 0;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(like.get(), &device_type));
  const int32_t code = torch::stable::detail::to<int32_t>(torch::stable::detail::from(dtype));
  AtenTensorHandle handle = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(
      aoti_torch_empty_strided(3, a.sizes, a.strides, code, device_type, like.get_device_index(), &handle));
  return Tensor(handle);
}

// An ATen operator taking and returning one tensor, called through the dispatcher (for the
// view operators the stable ops.h of the target does not wrap).
inline Tensor call_unary(const char* op, const Tensor& t) {
  std::array<StableIValue, 1> stack{torch::stable::detail::from(t)};
  STABLE_TORCH_ERROR_CODE_CHECK(torch_call_dispatcher(op, "", stack.data(), TORCH_ABI_VERSION));
  return torch::stable::detail::to<Tensor>(stack[0]);
}

// torch.are_deterministic_algorithms_enabled(): the stable ABI has no call for it, so it is
// asked from Python (errors.cpp); false when no Python interpreter runs.
bool deterministic_algorithms();

}  // namespace stable
}  // namespace mamba_kernels
