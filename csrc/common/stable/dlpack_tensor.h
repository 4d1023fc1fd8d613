// The tensor API of the op bodies (scan_ops.h: Tensor, OptTensor, ScalarType, DeviceGuard, tref,
// current_stream, empty, empty_like, contiguous_as) over DLPack's C exchange API, for the stable
// build's C entry (selective_scan/stable/compat_entry.cpp). torch publishes that API as a
// capsule on torch.Tensor (`__dlpack_c_exchange_api__`): C functions that read a Python tensor
// as a DLTensor, allocate through torch's allocator, give a new tensor to Python and name the
// current stream, all without the Python interpreter or torch's C++ ABI. So a stable-ABI binary
// can read its caller's tensors as the classic build's entry does.
//
// What needs one of torch's own kernels here (a dtype conversion, a copy to a contiguous
// layout) throws HandBack before anything is launched: the entry then gives the call to the
// Python function, which runs the op through torch.ops. Included only by the stable entry.
#pragma once

#include <Python.h>

// DLPack's C header (its structs and the exchange API, DLPack 1.3) as torch installs it. It is
// plain C with no ATen inside, and DLPack versions its own ABI (compat_arm checks the major
// version at run time), so it ties the binary to no torch release; torch refuses every header
// under ATen/ in a stable build, this one included, hence the two macros lifted around it.
#pragma push_macro("TORCH_TARGET_VERSION")
#pragma push_macro("TORCH_STABLE_ONLY")
#undef TORCH_TARGET_VERSION
#undef TORCH_STABLE_ONLY
#include <ATen/dlpack.h>
#pragma pop_macro("TORCH_STABLE_ONLY")
#pragma pop_macro("TORCH_TARGET_VERSION")
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include "tensor_ref.h"

namespace mamba_kernels {
namespace dlpack {

// The op body asked for what only torch can do, or an allocation failed: the Python function
// answers the call instead (and raises torch's own error where there is one).
struct HandBack : std::exception {
  const char* what() const noexcept override { return "mamba_kernels: the C entry hands this call back"; }
};

// The exchange API the entry was armed with (compat_entry.cpp owns it).
const DLPackExchangeAPI* exchange();
void set_exchange(const DLPackExchangeAPI* api);

enum class ScalarType { Float, Half, BFloat16, ComplexFloat, Int, Long, Other };

inline ScalarType scalar_type_of(DLDataType t) {
  if (t.lanes != 1) return ScalarType::Other;
  if (t.code == kDLFloat) return t.bits == 32 ? ScalarType::Float : t.bits == 16 ? ScalarType::Half : ScalarType::Other;
  if (t.code == kDLBfloat && t.bits == 16) return ScalarType::BFloat16;
  if (t.code == kDLComplex && t.bits == 64) return ScalarType::ComplexFloat;
  if (t.code == kDLInt) return t.bits == 32 ? ScalarType::Int : t.bits == 64 ? ScalarType::Long : ScalarType::Other;
  return ScalarType::Other;
}

inline DLDataType dl_type_of(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return DLDataType{kDLFloat, 32, 1};
    case ScalarType::Half: return DLDataType{kDLFloat, 16, 1};
    case ScalarType::BFloat16: return DLDataType{kDLBfloat, 16, 1};
    case ScalarType::ComplexFloat: return DLDataType{kDLComplex, 64, 1};
    case ScalarType::Int: return DLDataType{kDLInt, 32, 1};
    case ScalarType::Long: return DLDataType{kDLInt, 64, 1};
    default: throw HandBack();
  }
}

// torch's names of the dtypes (TensorRef::dtype_name, which error messages print).
inline const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "Float";
    case ScalarType::Half: return "Half";
    case ScalarType::BFloat16: return "BFloat16";
    case ScalarType::ComplexFloat: return "ComplexFloat";
    case ScalarType::Int: return "Int";
    case ScalarType::Long: return "Long";
    default: return "other";
  }
}

constexpr int kMaxDims = 8;

// A tensor as the op bodies see it: data, dtype, device and its own copy of the sizes and
// strides (so views are metadata only), plus what keeps an allocation of ours alive (nothing
// for the caller's tensors, which their Python objects keep alive for the whole call).
class Tensor {
 public:
  struct Dims {
    const int64_t* p;
    int64_t n;
    const int64_t* data() const { return p; }
    size_t size() const { return size_t(n); }
    int64_t operator[](size_t i) const { return p[i]; }
  };

  // The caller's tensor, borrowed (DLTensor strides may be null: row-major).
  static Tensor borrow(const DLTensor& t) {
    if (t.ndim < 0 || t.ndim > kMaxDims) throw HandBack();
    Tensor r;
    r.data_ = static_cast<char*>(t.data) + t.byte_offset;
    r.dtype_ = t.dtype;
    r.device_ = t.device;
    r.ndim_ = t.ndim;
    for (int i = 0; i < t.ndim; ++i) r.shape_[i] = t.shape[i];
    if (t.strides != nullptr) {
      for (int i = 0; i < t.ndim; ++i) r.strides_[i] = t.strides[i];
    } else {
      r.set_row_major();
    }
    return r;
  }

  void* data_ptr() const { return data_; }
  Dims sizes() const { return {shape_, ndim_}; }
  Dims strides() const { return {strides_, ndim_}; }
  int64_t dim() const { return ndim_; }
  int64_t size(int64_t i) const { return shape_[i]; }
  ScalarType scalar_type() const { return scalar_type_of(dtype_); }
  DLDataType dl_dtype() const { return dtype_; }
  const DLDevice& device() const { return device_; }
  bool is_cuda() const { return device_.device_type == kDLCUDA; }

  bool is_contiguous() const {
    int64_t want = 1;
    for (int i = ndim_ - 1; i >= 0; --i) {
      if (shape_[i] != 1 && strides_[i] != want) return false;
      want *= shape_[i];
    }
    return true;
  }

  // t.unsqueeze(d) / t.squeeze(d) (the axis of size 1): views
  Tensor unsqueeze(int d) const {
    if (ndim_ >= kMaxDims || d < 0 || d > ndim_) throw HandBack();
    Tensor r = *this;
    for (int i = ndim_; i > d; --i) r.shape_[i] = shape_[i - 1], r.strides_[i] = strides_[i - 1];
    r.shape_[d] = 1;
    r.strides_[d] = d < ndim_ ? shape_[d] * strides_[d] : 1;
    ++r.ndim_;
    return r;
  }
  Tensor squeeze(int d) const {
    if (d < 0 || d >= ndim_ || shape_[d] != 1) throw HandBack();
    Tensor r = *this;
    for (int i = d; i + 1 < ndim_; ++i) r.shape_[i] = shape_[i + 1], r.strides_[i] = strides_[i + 1];
    --r.ndim_;
    return r;
  }

  // A new Python tensor of this one (same storage, sizes and strides), or null with a Python
  // error set. The DLPack tensor handed over keeps the allocation alive until torch frees it.
  PyObject* to_python() const {
    struct Export {
      DLManagedTensorVersioned mt;
      std::shared_ptr<void> owner;
      int64_t shape[kMaxDims], strides[kMaxDims];
    };
    Export* e = new Export();
    e->owner = owner_;
    std::memcpy(e->shape, shape_, sizeof(shape_));
    std::memcpy(e->strides, strides_, sizeof(strides_));
    e->mt.version.major = DLPACK_MAJOR_VERSION;
    e->mt.version.minor = DLPACK_MINOR_VERSION;
    e->mt.manager_ctx = e;
    e->mt.deleter = [](DLManagedTensorVersioned* m) { delete static_cast<Export*>(m->manager_ctx); };
    e->mt.flags = 0;
    e->mt.dl_tensor = DLTensor{data_, device_, ndim_, dtype_, e->shape, e->strides, 0};
    void* py = nullptr;
    if (exchange()->managed_tensor_to_py_object_no_sync(&e->mt, &py) != 0) return nullptr;
    return static_cast<PyObject*>(py);
  }

 private:
  friend Tensor empty_strided(const Tensor&, int64_t, const int64_t*, const int64_t*, ScalarType);

  void set_row_major() { row_major_strides(shape_, ndim_, strides_); }

  void* data_ = nullptr;
  DLDataType dtype_{kDLFloat, 32, 1};
  DLDevice device_{kDLCPU, 0};
  int32_t ndim_ = 0;
  int64_t shape_[kMaxDims] = {};
  int64_t strides_[kMaxDims] = {};
  std::shared_ptr<void> owner_;
};

using OptTensor = std::optional<Tensor>;

// ---- allocation: torch's allocator through the exchange API, on `like`'s device

inline void set_error(void*, const char*, const char*) {}  // the Python function will name it

// A new tensor with the given sizes and strides (dense, non-overlapping: one block of the
// product of the sizes), on like's device.
inline Tensor empty_strided(const Tensor& like, int64_t ndim, const int64_t* sizes, const int64_t* strides,
                            ScalarType dtype) {
  if (ndim < 0 || ndim > kMaxDims) throw HandBack();
  int64_t numel = 1;
  for (int64_t i = 0; i < ndim; ++i) numel *= sizes[i];
  int64_t flat[1] = {numel};
  DLTensor proto{nullptr, like.device(), 1, dl_type_of(dtype), flat, nullptr, 0};
  DLManagedTensorVersioned* mt = nullptr;
  if (exchange()->managed_tensor_allocator(&proto, &mt, nullptr, &set_error) != 0 || mt == nullptr) throw HandBack();
  Tensor r;
  r.owner_ = std::shared_ptr<void>(mt, [](void* p) {
    auto* m = static_cast<DLManagedTensorVersioned*>(p);
    if (m->deleter != nullptr) m->deleter(m);
  });
  r.data_ = static_cast<char*>(mt->dl_tensor.data) + mt->dl_tensor.byte_offset;
  r.dtype_ = mt->dl_tensor.dtype;
  r.device_ = mt->dl_tensor.device;
  r.ndim_ = int32_t(ndim);
  for (int64_t i = 0; i < ndim; ++i) r.shape_[i] = sizes[i], r.strides_[i] = strides[i];
  return r;
}

// A new contiguous tensor (torch's row-major strides).
inline Tensor empty(const Tensor& like, const int64_t* sizes, int64_t ndim, ScalarType dtype) {
  if (ndim < 0 || ndim > kMaxDims) throw HandBack();
  int64_t strides[kMaxDims];
  row_major_strides(sizes, ndim, strides);
  return empty_strided(like, ndim, sizes, strides, dtype);
}
inline Tensor empty(const Tensor& like, std::initializer_list<int64_t> sizes, ScalarType dtype) {
  return empty(like, sizes.begin(), int64_t(sizes.size()), dtype);
}

// torch.empty_like(t) for a dense, non-overlapping t (its exact strides, as torch keeps them);
// any other layout is torch's to decide.
inline Tensor empty_like(const Tensor& t, const TensorRef& r) {
  if (!non_overlapping_and_dense(r)) throw HandBack();
  return empty_strided(t, r.dim, r.sizes, r.strides, t.scalar_type());
}

// t itself when it is contiguous and of that dtype; anything else needs a copy of torch's.
inline Tensor contiguous_as(const Tensor& t, ScalarType dtype, bool always_copy = false) {
  if (always_copy || t.scalar_type() != dtype || !t.is_contiguous()) throw HandBack();
  return t;
}
inline OptTensor contiguous_as(const OptTensor& t, ScalarType dtype) {
  return t.has_value() ? OptTensor(contiguous_as(*t, dtype)) : std::nullopt;
}

// ---- device and stream

class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    if (cudaGetDevice(&prev_) != cudaSuccess) throw HandBack();
    if (prev_ != index && cudaSetDevice(index) != cudaSuccess) throw HandBack();
    set_ = prev_ != index;
  }
  ~DeviceGuard() {
    if (set_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool set_ = false;
};

inline cudaStream_t current_stream(int32_t device_index) {
  void* stream = nullptr;
  if (exchange()->current_work_stream(kDLCUDA, device_index, &stream) != 0) throw HandBack();
  return static_cast<cudaStream_t>(stream);
}

// ---- the shared host code's view of a tensor

inline TensorRef tref(const Tensor& t) {
  TensorRef r;
  r.present = true;
  r.data = t.data_ptr();
  const ScalarType st = t.scalar_type();
  const DLDataType dt = t.dl_dtype();
  r.scalar = st == ScalarType::Float ? Scalar::kFloat32
             : st == ScalarType::Half ? Scalar::kFloat16
             : st == ScalarType::BFloat16 ? Scalar::kBFloat16
             : st == ScalarType::Int ? Scalar::kInt32
             : st == ScalarType::Long ? Scalar::kInt64
             : st == ScalarType::ComplexFloat ? Scalar::kComplex64
                                              : Scalar::kOther;
  r.dtype_name = dtype_name(st);
  r.is_complex = dt.code == kDLComplex;
  r.element_size = int64_t(dt.bits / 8) * dt.lanes;
  r.is_cuda = t.is_cuda();
  r.device_type = int(t.device().device_type);  // compared for equality only
  r.device_index = int(t.device().device_id);
  r.name_device = [](int type, int index) {
    return (type == kDLCUDA ? std::string("cuda:") : "device type " + std::to_string(type) + ":") + std::to_string(index);
  };
  r.dim = t.dim();
  r.sizes = t.sizes().data();
  r.strides = t.strides().data();
  return r;
}

inline TensorRef tref(const OptTensor& t) { return t.has_value() ? tref(*t) : TensorRef(); }

}  // namespace dlpack
}  // namespace mamba_kernels
