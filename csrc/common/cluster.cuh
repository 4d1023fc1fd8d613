// Thread block clusters (sm_90 on): a split barrier over the blocks of a cluster and loads from
// another block's shared memory. The blocks of a cluster are resident together on one GPC, so
// they can wait on one another without the risk of waiting for a block that has not started.
//
// Compiled below sm_90 these keep their meaning for a cluster of one block (the only kind such
// a device launches): the barrier is the block's, and the peer is the block itself. A caller
// must launch clusters of more than one block only where the kernel was compiled for sm_90 on
// (cudaFuncAttributes::ptxVersion >= 90).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mamba_kernels {

// This block's index in its cluster.
__device__ __forceinline__ unsigned cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
#else
  return 0;
#endif
}

// The split cluster barrier: every thread of every block of the cluster arrives, then waits.
// Shared-memory writes before arrive are visible to the cluster's loads after wait (release /
// acquire). Each thread alternates arrive and wait; the whole warp takes part (.aligned).
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __syncthreads();
#endif
}

// The address of `p` (this block's shared memory) in the shared memory of the cluster's block
// `rank`, for ld_cluster.
__device__ __forceinline__ uint32_t cluster_map(const void* p, unsigned rank) {
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
#else
  (void)rank;
  return local;
#endif
}

__device__ __forceinline__ float ld_cluster(uint32_t addr) {
  float v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
#else
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
#endif
  return v;
}

}  // namespace mamba_kernels
