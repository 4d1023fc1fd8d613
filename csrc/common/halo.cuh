// Halo exchange along a warp tile. A warp's 32 lanes hold consecutive runs of N values each
// (lane l: positions l*N .. l*N+N-1 of the tile). A stencil over H neighbours needs, per lane,
// the H values just left (or right) of its run: lane l gets them from lane l-1 (l+1) by one
// shuffle each; the lane at the tile's edge gets an edge value, which the caller takes from the
// neighbouring tile, from memory, or from one value per lane. Requires N >= H (a run covers
// its neighbour's halo) and all 32 lanes.
//
// Each variant computes lane 0's (lane 31's) edge value inside the slot loop, next to that
// slot's shuffle, as the kernels did by hand; no lambdas (an edge callback is inlined only
// after the kernel's arrays were placed, which changed register allocation).
#pragma once

#include <cuda_runtime.h>

#include "reduce.cuh"
#include "vec_io.cuh"

namespace mamba_kernels {

// v as held by lane src, in every lane.
__device__ __forceinline__ float lane_broadcast(float v, int src) { return __shfl_sync(kFullMask, v, src); }

// v = [H halo slots | N own values]: fills the halo slots with the left neighbour's last H
// values; lane 0 takes edge.
template <int H, int M>
__device__ __forceinline__ void halo_from_left(float (&v)[M], const float (&edge)[H], int lane) {
  static_assert(M - H >= H, "a lane's run must cover its neighbour's halo");
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const float up = __shfl_up_sync(kFullMask, v[M - H + i], 1);
    v[i] = lane == 0 ? edge[i] : up;
  }
}

// halo_from_left for a warp that streams consecutive tiles of one row: lane 0 takes carry (the
// previous tile's lane 31's last H values), then carry becomes this tile's.
template <int H, int M>
__device__ __forceinline__ void halo_from_left_carry(float (&v)[M], float (&carry)[H], int lane) {
  static_assert(M - H >= H, "a lane's run must cover its neighbour's halo");
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const float up = __shfl_up_sync(kFullMask, v[M - H + i], 1);
    const float last = lane_broadcast(v[M - H + i], kWarpSize - 1);
    v[i] = lane == 0 ? carry[i] : up;
    carry[i] = last;
  }
}

// halo_from_left for a warp holding several tiles of one row at once, as loaded vectors:
// lane 0 takes `first` in the first tile, else lane 31's last H values of the previous tile,
// converted from its vector `prev` (so no fp32 copy of the previous tile stays live).
template <int H, int M, typename T, int N>
__device__ __forceinline__ void halo_from_left_tiles(float (&v)[M], const float (&first)[H], const Pack<T, N>& prev,
                                                     bool first_tile, int lane) {
  static_assert(M == H + N && N >= H, "v holds the halo and the lane's vector");
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const float up = __shfl_up_sync(kFullMask, v[M - H + i], 1);
    const float left = first_tile ? first[i] : lane_broadcast(to_float(prev.e[N - H + i]), kWarpSize - 1);
    v[i] = lane == 0 ? left : up;
  }
}

// v = [N own values | H halo slots]: fills the halo slots with the right neighbour's first H
// values; lane 31 takes edge.
template <int H, int M>
__device__ __forceinline__ void halo_from_right(float (&v)[M], const float (&edge)[H], int lane) {
  static_assert(M - H >= H, "a lane's run must cover its neighbour's halo");
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const float down = __shfl_down_sync(kFullMask, v[i], 1);
    v[M - H + i] = lane == kWarpSize - 1 ? edge[i] : down;
  }
}

// halo_from_right for a warp holding several tiles of one row at once: lane 31 takes the next
// tile's lane 0's first H values (next), or after the last tile the values `tail` of lanes
// 0 .. H-1 (one per lane). own: the lane's values, also held in v's first N slots; the
// shuffles read own, not v (reading the copy changed register allocation).
template <int H, int M, int N>
__device__ __forceinline__ void halo_from_right_tiles(float (&v)[M], const float (&own)[N], const float (&next)[N],
                                                      float tail, bool last_tile, int lane) {
  static_assert(M == N + H && N >= H, "v holds the lane's values and the halo");
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const float down = __shfl_down_sync(kFullMask, own[i], 1);
    const float right = last_tile ? lane_broadcast(tail, i) : lane_broadcast(next[i], 0);
    v[N + i] = lane == kWarpSize - 1 ? right : down;
  }
}

// Lane 0's first H values of v, in every lane: the right edge of the previous tile.
template <int H, int M>
__device__ __forceinline__ void halo_first_lane(const float (&v)[M], float (&out)[H]) {
#pragma unroll
  for (int i = 0; i < H; ++i) out[i] = lane_broadcast(v[i], 0);
}

// out[i] = lane i's v, in every lane: an edge computed one value per lane (lanes 0 .. H-1).
template <int H>
__device__ __forceinline__ void halo_gather(float v, float (&out)[H]) {
#pragma unroll
  for (int i = 0; i < H; ++i) out[i] = lane_broadcast(v, i);
}

}  // namespace mamba_kernels
