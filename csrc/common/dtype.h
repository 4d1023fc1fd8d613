// Activation dtypes the kernels are compiled for, shared by host bindings and .cu launchers.
#pragma once

#include <cstdint>

namespace mamba_kernels {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline int dtype_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// Strides of a (batch, channel, position) tensor, in elements.
struct Strides3 {
  int64_t b = 0, c = 0, l = 0;
};

}  // namespace mamba_kernels
