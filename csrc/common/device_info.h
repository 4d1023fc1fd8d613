// The running device's multiprocessor count, which grids and kernel choices are sized by. Read
// once per device and kept per device: a process that drives GPUs of different sizes sizes each
// launch for the GPU it runs on. Host code only (no torch), shared by every kernel family.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>

namespace mamba_kernels {

// Where the count cannot be read: an H100 / H200's, the GPUs the policies were tuned on.
constexpr int kFallbackSmCount = 132;
constexpr int kMaxDevices = 64;

// MAMBA_KERNELS_SM_COUNT (the knob registry's SM_COUNT; a positive integer), read once: when
// set, every device counts as that many multiprocessors. GPU tests set it to make the launch
// choices of a GPU of another size on the one they have; results never depend on it.
inline int sm_count_override() {
  static const int value = [] {
#ifdef _MSC_VER
#pragma warning(suppress : 4996)  // getenv: the value is parsed here, never kept
#endif
    const char* s = std::getenv("MAMBA_KERNELS_SM_COUNT");
    if (!s || !*s) return 0;
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    return (*end == '\0' && v > 0 && v <= 1 << 16) ? int(v) : 0;
  }();
  return value;
}

// Multiprocessors of device `dev` (kFallbackSmCount for an index outside [0, kMaxDevices) or a
// failed query, whose error is cleared); the override above when it is set.
inline int sm_count(int dev) {
  static std::atomic<int> counts[kMaxDevices];  // 0: not read yet
  if (const int forced = sm_count_override()) return forced;
  if (dev < 0 || dev >= kMaxDevices) return kFallbackSmCount;
  int n = counts[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) {
      cudaGetLastError();
      n = kFallbackSmCount;
    }
    counts[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

// Multiprocessors of the current device.
inline int sm_count() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return kFallbackSmCount;
  }
  return sm_count(dev);
}

}  // namespace mamba_kernels
