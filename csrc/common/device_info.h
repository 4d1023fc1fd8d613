// The running device's multiprocessor count, which grids and kernel choices are sized by. Read
// once per device and kept per device: a process that drives GPUs of different sizes sizes each
// launch for the GPU it runs on. Host code only (no torch), shared by every kernel family.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

namespace mamba_kernels {

// Where the count cannot be read: an H100 / H200's, the GPUs the policies were tuned on.
constexpr int kFallbackSmCount = 132;
constexpr int kMaxDevices = 64;

// Multiprocessors of device `dev` (kFallbackSmCount for an index outside [0, kMaxDevices) or a
// failed query, whose error is cleared).
inline int sm_count(int dev) {
  static std::atomic<int> counts[kMaxDevices];  // 0: not read yet
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
