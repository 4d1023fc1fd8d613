// A stand-alone probe of the cluster-sum protocol of the scan backward (csrc/common/cluster.cuh,
// used as csrc/selective_scan/bwd_lanes.cu uses it): each block of a cluster sends its stage to
// the owners by st.async, counted on the owner's mbarrier, double-buffered, a relaxed cluster
// barrier guarding reuse; the sums are checked on the host. It tells a fault of synccheck from
// one of ours (docs/KERNELS.md, "The synccheck abort"). On a GPU machine, from the repository root:
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -Icsrc/common \
//        scripts/cluster_synccheck_probe.cu -o /tmp/cluster_probe
//   /tmp/cluster_probe 12 16                                   # 12 clusters of 16: "ok"
//   compute-sanitizer --tool synccheck /tmp/cluster_probe 12 16
//
// Arguments: clusters [blocks a cluster, default 16]. Exit 0 and "ok", else the first mismatch or
// the CUDA error.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "cluster.cuh"

namespace mamba_kernels {
constexpr int kT = 128, kS = 2048, kIters = 6;
__device__ __forceinline__ float val(int rank, int it, int e) { return float(rank + 1) * 0.5f + float(it) + float(e & 255) * 0.25f; }

__global__ void __launch_bounds__(kT) probe_cluster_sum(float* out, int cs) {
  extern __shared__ float4 smem4[];
  char* base = reinterpret_cast<char*>(smem4);
  uint64_t* bars = reinterpret_cast<uint64_t*>(base);
  float* recv = reinterpret_cast<float*>(base + 16);
  const int tid = threadIdx.x;
  const unsigned rank = cluster_rank();
  const int share = kS / cs;
  const int64_t cl = blockIdx.x / cs;
  if (tid == 0) { mbar_init(&bars[0]); mbar_init(&bars[1]); mbar_init_fence(); }
  cluster_sync_all();
  bool owe = false, pending = false;
  int pend = 0;
  auto flush = [&] {
    const int buf = pend & 1;
    if (tid == 0) mbar_expect(&bars[buf], uint32_t(kS * sizeof(float)));
    mbar_wait(&bars[buf], uint32_t((pend >> 1) & 1));
    for (int e = tid; e < share; e += kT) {
      const float* in = recv + buf * kS + e;
      float acc = in[0];
      for (int r = 1; r < cs; ++r) acc += in[r * share];
      out[(cl * kIters + pend) * kS + int(rank) * share + e] = acc;
    }
    cluster_arrive_relaxed();
    owe = true;
    pending = false;
  };
  for (int it = 0; it < kIters; ++it) {
    if (owe) cluster_wait();
    owe = false;
    if (pending) flush();
    const int buf = it & 1;
    const uint32_t bar_local = smem_addr(&bars[buf]);
    for (int k = 0; k < kS / 4 / kT; ++k) {
      const int e = (tid + k * kT) * 4;
      const unsigned owner = unsigned(e / share);
      const float4 v = make_float4(val(rank, it, e), val(rank, it, e + 1), val(rank, it, e + 2), val(rank, it, e + 3));
      const uint32_t at = smem_addr(recv + buf * kS + int(rank) * share + e % share);
      st_async4(cluster_map(at, owner), v, cluster_map(bar_local, owner));
    }
    pending = true;
    pend = it;
  }
  if (owe) cluster_wait();
  owe = false;
  if (pending) flush();
  if (owe) cluster_wait();
}
}  // namespace mamba_kernels

int main(int argc, char** argv) {
  using namespace mamba_kernels;
  const int clusters = argc > 1 ? atoi(argv[1]) : 1, cs = argc > 2 ? atoi(argv[2]) : 16;
  const size_t n = size_t(clusters) * kIters * kS;
  float* d = nullptr;
  cudaMalloc(&d, n * sizeof(float));
  cudaMemset(d, 0xff, n * sizeof(float));
  const int smem = 16 + 2 * kS * int(sizeof(float));
  cudaFuncSetAttribute(probe_cluster_sum, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(probe_cluster_sum, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchAttribute at;
  at.id = cudaLaunchAttributeClusterDimension;
  at.val.clusterDim.x = unsigned(cs), at.val.clusterDim.y = 1, at.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(clusters * cs)), cfg.blockDim = dim3(kT), cfg.dynamicSmemBytes = size_t(smem);
  cfg.attrs = &at, cfg.numAttrs = 1;
  int active = -1;
  cudaOccupancyMaxActiveClusters(&active, probe_cluster_sum, &cfg);
  cudaError_t err = cudaLaunchKernelEx(&cfg, probe_cluster_sum, d, cs);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) { printf("clusters %d x %d (max active %d): %s\n", clusters, cs, active, cudaGetErrorString(err)); return 1; }
  std::vector<float> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  const int share = kS / cs;
  for (int c = 0; c < clusters; ++c)
    for (int it = 0; it < kIters; ++it)
      for (int e = 0; e < kS; ++e) {
        const int owner = e / share, j = e % share;
        // the owner's element j gathers element (owner * share + j) of every rank, in rank order
        float acc = 0.f;
        for (int r = 0; r < cs; ++r) {
          const int se = owner * share + j;
          const float v = float(r + 1) * 0.5f + float(it) + float(se & 255) * 0.25f;
          acc = r == 0 ? v : acc + v;
        }
        const float got = h[(size_t(c) * kIters + it) * kS + e];
        if (got != acc) { printf("clusters %d x %d: mismatch at cluster %d iter %d e %d: %g vs %g\n", clusters, cs, c, it, e, got, acc); return 1; }
      }
  printf("clusters %d x %d (max active %d): ok\n", clusters, cs, active);
  return 0;
}
