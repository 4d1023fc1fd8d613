// Thread block clusters (sm_90 on): the blocks of a cluster are resident together on one GPC and
// can store into one another's shared memory. What is here serves one pattern, a sum over the
// cluster's blocks without memory fences on its path:
// - a block stores values into another's shared memory with st_async, each store counted (in
//   bytes) on the receiver's mbarrier, so the receiver knows when all have landed by waiting on
//   that barrier (mbar_expect / mbar_wait), not through a fence of the senders' other writes;
// - the cluster barrier, relaxed (cluster_arrive_relaxed / cluster_wait), says when a receiver
//   has read a buffer that senders may then fill again. (barrier.cluster.arrive.release would
//   fence every prior global store of the thread, MEMBAR.ALL.GPU, on each use.)
//
// kClusterSum says whether this compilation has them (sm_90 on, nvcc 12.1 on for st.async); on
// the host, the nvcc version alone (the launcher also checks the kernel's PTX version). Where a
// compilation lacks them the functions trap: a launcher must not form clusters there.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDACC_VER_MAJOR__) && (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 1))
#define MK_CLUSTER_NVCC 1
#else
#define MK_CLUSTER_NVCC 0
#endif
#if MK_CLUSTER_NVCC && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MK_CLUSTER_DEVICE 1
#else
#define MK_CLUSTER_DEVICE 0
#endif

namespace mamba_kernels {

constexpr bool kClusterSum = MK_CLUSTER_NVCC;

// This block's index in its cluster (0 without clusters).
__device__ __forceinline__ unsigned cluster_rank() {
#if MK_CLUSTER_DEVICE
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
#else
  return 0;
#endif
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The shared-memory address `local` (of this block) in the cluster's block `rank`.
__device__ __forceinline__ uint32_t cluster_map(uint32_t local, unsigned rank) {
#if MK_CLUSTER_DEVICE
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
#else
  (void)local, (void)rank;
  __trap();
  return 0;
#endif
}

// The whole cluster barrier with release / acquire (once, after mbar_init: the barriers are
// initialised before any peer stores to them).
__device__ __forceinline__ void cluster_sync_all() {
#if MK_CLUSTER_DEVICE
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __trap();
#endif
}

// The split cluster barrier without a fence at arrive. Each thread alternates arrive and wait;
// the whole warp takes part (.aligned).
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if MK_CLUSTER_DEVICE
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void cluster_wait() {
#if MK_CLUSTER_DEVICE
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#else
  __trap();
#endif
}

// One thread initialises a barrier in shared memory for one arrival a phase, then fences the
// initialisation for the cluster (cluster_sync_all publishes it).
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
#if MK_CLUSTER_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
#else
  (void)bar;
  __trap();
#endif
}

__device__ __forceinline__ void mbar_init_fence() {
#if MK_CLUSTER_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
  __trap();
#endif
}

// The phase's one arrival, expecting `bytes` of st_async stores in it (before or after they land).
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
#if MK_CLUSTER_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
#else
  (void)bar, (void)bytes;
  __trap();
#endif
}

// Wait until the barrier's phase of this parity has completed (its arrival and all its bytes).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if MK_CLUSTER_DEVICE
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
#else
  (void)bar, (void)parity;
  __trap();
#endif
}

// Store v at `remote` (cluster_map'ed, 16-byte aligned) and count its 16 bytes on the barrier at
// `remote_bar`.
__device__ __forceinline__ void st_async4(uint32_t remote, float4 v, uint32_t remote_bar) {
#if MK_CLUSTER_DEVICE
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   remote),
               "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
               "r"(__float_as_uint(v.w)), "r"(remote_bar)
               : "memory");
#else
  (void)remote, (void)v, (void)remote_bar;
  __trap();
#endif
}

}  // namespace mamba_kernels
