// Error messages of the bindings, shared by both (classic and stable): MK_CHECK(cond, parts...)
// raises with the parts concatenated through mamba_kernels::fail, the one error hook each
// binding defines (csrc/common/<binding>/errors.cpp). No torch here.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace mamba_kernels {

// kValue: a bad value or shape (Python RuntimeError); kType: a wrong dtype (Python TypeError
// where the binding can raise one: the classic binding; the stable ABI raises RuntimeError).
enum class ErrorKind : int { kValue = 0, kType = 1 };

// Defined once per extension by its binding; throws the binding's error type.
[[noreturn]] void fail(ErrorKind kind, const std::string& message);

// A list of sizes or strides as torch prints them: "[2, 3, 4]".
struct IntList {
  const int64_t* data;
  int64_t size;
};

// Messages are built with std::string and std::to_string only: formatting numbers through
// iostreams inlined from the compile-time libstdc++ crashed (SIGSEGV in num_put) on a GPU
// image whose runtime libstdc++ differs.
inline std::string part(const char* s) { return s; }
inline std::string part(const std::string& s) { return s; }
inline std::string part(int64_t v) { return std::to_string(v); }
inline std::string part(int v) { return std::to_string(v); }
inline std::string part(IntList a) {
  std::string r = "[";
  for (int64_t i = 0; i < a.size; ++i) r += (i ? ", " : "") + std::to_string(a.data[i]);
  return r + "]";
}
inline std::string part(std::initializer_list<int64_t> a) {
  return part(IntList{a.begin(), static_cast<int64_t>(a.size())});
}
template <typename... A>
std::string msg(const A&... a) {
  std::string r;
  ((r += part(a)), ...);
  return r;
}

}  // namespace mamba_kernels

#define MK_CHECK(cond, ...)                                                                       \
  do {                                                                                            \
    if (!(cond)) ::mamba_kernels::fail(::mamba_kernels::ErrorKind::kValue, ::mamba_kernels::msg(__VA_ARGS__)); \
  } while (0)
#define MK_CHECK_TYPE(cond, ...)                                                                  \
  do {                                                                                            \
    if (!(cond)) ::mamba_kernels::fail(::mamba_kernels::ErrorKind::kType, ::mamba_kernels::msg(__VA_ARGS__)); \
  } while (0)
