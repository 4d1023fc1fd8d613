// Error messages for the torch bindings: MK_CHECK(cond, parts...) raises torch's error with the
// parts concatenated. Shared by every binding.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

namespace mamba_kernels {

// Error messages are built with std::string and std::to_string only: TORCH_CHECK's own
// formatting of numbers goes through iostreams inlined from the compile-time libstdc++, which
// crashed (SIGSEGV in num_put) on the GPU image whose runtime libstdc++ differs.
inline std::string part(const char* s) { return s; }
inline std::string part(const std::string& s) { return s; }
inline std::string part(int64_t v) { return std::to_string(v); }
inline std::string part(int v) { return std::to_string(v); }
inline std::string part(at::IntArrayRef a) {
  std::string r = "[";
  for (size_t i = 0; i < a.size(); ++i) r += (i ? ", " : "") + std::to_string(a[i]);
  return r + "]";
}
inline std::string part(c10::ScalarType t) { return c10::toString(t); }
inline std::string part(const c10::Device& d) { return d.str(); }
template <typename... A>
std::string msg(const A&... a) {
  std::string r;
  ((r += part(a)), ...);
  return r;
}
#define MK_CHECK(cond, ...) TORCH_CHECK(cond, ::mamba_kernels::msg(__VA_ARGS__))
#define MK_CHECK_TYPE(cond, ...) TORCH_CHECK_TYPE(cond, ::mamba_kernels::msg(__VA_ARGS__))

}  // namespace mamba_kernels
