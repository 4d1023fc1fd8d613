// A binding-neutral description of one tensor argument: what the shared checks and parameter
// fills (csrc/<kernel>/*_host.cpp) read. Each binding fills it from its own tensor type
// (csrc/common/classic/tensor.h, csrc/common/stable/tensor.h), so the rules and their messages
// are written once. No torch here.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "check_msg.h"

namespace mamba_kernels {

// The element types the kernels tell apart; every other dtype is kOther (named by dtype_name).
enum class Scalar : int { kFloat32, kFloat16, kBFloat16, kInt32, kInt64, kComplex64, kOther };

struct TensorRef {
  bool present = false;  // false: an optional argument passed as None
  void* data = nullptr;
  Scalar scalar = Scalar::kOther;
  const char* dtype_name = "";  // torch's name of the dtype: "Float", "Half", "Double", ...
  bool is_complex = false;      // any complex dtype (kComplex64 or another)
  int64_t element_size = 0;
  bool is_cuda = false;
  int device_type = -1;  // the binding's device type code, compared for equality only
  int device_index = -1;
  // The binding's namer of (device_type, device_index) as torch prints it ("cuda:0", "cpu"):
  // only an error message needs the name, so no call pays for building it.
  std::string (*name_device)(int device_type, int device_index) = nullptr;
  int64_t dim = 0;
  // Borrowed from the tensor, which the binding keeps alive for the whole call.
  const int64_t* sizes = nullptr;
  const int64_t* strides = nullptr;

  int64_t size(int64_t i) const { return sizes[i]; }
  int64_t stride(int64_t i) const { return strides[i]; }
  IntList shape() const { return IntList{sizes, dim}; }
  IntList stride_list() const { return IntList{strides, dim}; }
  std::string device() const {
    return name_device != nullptr ? name_device(device_type, device_index) : std::string("an unknown device");
  }
  bool same_device(const TensorRef& o) const {
    return device_type == o.device_type && device_index == o.device_index;
  }
  bool has_shape(std::initializer_list<int64_t> want) const { return has_shape(want.begin(), int64_t(want.size())); }
  bool has_shape(const int64_t* want, int64_t n) const {
    if (n != dim) return false;
    for (int64_t i = 0; i < n; ++i) {
      if (sizes[i] != want[i]) return false;
    }
    return true;
  }
  bool same_shape(const TensorRef& o) const { return has_shape(o.sizes, o.dim); }
};

// torch's contiguous (row-major) strides for sizes; an axis of size 0 or 1 steps like size 1.
inline void row_major_strides(const int64_t* sizes, int64_t ndim, int64_t* strides) {
  int64_t stride = 1;
  for (int64_t i = ndim - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= sizes[i] > 1 ? sizes[i] : 1;
  }
}

// torch's rule for a tensor whose elements occupy a dense block without overlap (any order of
// the axes): sorted by stride, skipping axes of size < 2, each stride is the product of the
// sizes before it.
inline bool non_overlapping_and_dense(const TensorRef& t) {
  if (t.dim == 1) return t.sizes[0] < 2 || t.strides[0] == 1;
  int64_t order[16];  // the kernels' tensors have at most 5 axes
  if (t.dim > 16) return false;
  int64_t n = 0;
  for (int64_t i = 0; i < t.dim; ++i) {
    if (t.sizes[i] < 2) continue;
    int64_t j = n++;
    for (; j > 0 && t.strides[order[j - 1]] > t.strides[i]; --j) order[j] = order[j - 1];
    order[j] = i;  // insertion sort by stride (stable, like torch's)
  }
  int64_t want = 1;
  for (int64_t k = 0; k < n; ++k) {
    if (t.strides[order[k]] != want) return false;
    want *= t.sizes[order[k]];
  }
  return true;
}

// True when two elements certainly share memory: an axis of size > 1 with stride 0 (torch's
// "internal overlap: yes"; other overlaps are too costly to detect and are not reported).
inline bool has_internal_overlap(const TensorRef& t) {
  for (int64_t i = 0; i < t.dim; ++i) {
    if (t.strides[i] == 0 && t.sizes[i] > 1) return true;
  }
  return false;
}

// Sizes and strides of a tensor the binding allocates (at most 3-D here).
struct Alloc3 {
  int64_t sizes[3];
  int64_t strides[3];
};

}  // namespace mamba_kernels
