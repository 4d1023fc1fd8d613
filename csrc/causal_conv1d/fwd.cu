// Forward: out = act(bias + sum_k weight[:, k] * x[..., t - (W-1) + k]), both layouts.
#include <algorithm>
#include <climits>

#include "conv_common.cuh"

namespace mamba_kernels {
namespace causal_conv1d {
namespace {

using Policy = FwdPolicy;

// Channel-first (stride(2) == 1). A warp owns kTilesCF tiles of 32 lanes x kN positions of one
// (batch, channel) row; all its loads are issued before any use. The W-1 positions left of a
// lane's vector come from its left neighbour by shuffle; lane 0 takes them from the previous
// tile, or at the segment start from memory (or the initial states).
template <typename T, int W, bool kSeq>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kMinBlocksCF) fwd_channel_first(const ConvParams p) {
  constexpr int kN = kVec16<T>;
  constexpr int kTilesCF = Policy::kTilesCF;
  constexpr int kWarps = Policy::kWarps;
  constexpr int kTile = 32 * kN;
  constexpr int kSeg = kTilesCF * kTile;
  static_assert(kN >= W - 1, "a lane's vector must cover its neighbour's halo");
  const int lane = threadIdx.x & 31;
  const int64_t nseg = (p.seqlen + kSeg - 1) / kSeg;
  const int64_t items = p.batch * p.dim * nseg;
  for (int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); item < items;
       item += int64_t(gridDim.x) * kWarps) {
    int64_t seg, c, b;
    split_item(item, nseg, p.dim, items, seg, c, b);
    const int64_t t0 = seg * kSeg;
    const T* xr = static_cast<const T*>(p.x) + b * p.x_s.b + c * p.x_s.c;
    T* outr = static_cast<T*>(p.out) + b * p.out_s.b + c * p.out_s.c;

    Pack<T, kN> xv[kTilesCF];
#pragma unroll
    for (int j = 0; j < kTilesCF; ++j) {
      const int64_t t = t0 + j * kTile + lane * kN;
      if (p.vec_in && t + kN <= p.seqlen) {
        load_pack(xv[j], xr + t);
      } else {
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          xv[j].e[i] = t + i < p.seqlen ? xr[(t + i) * p.x_s.l] : from_float<T>(0.0f);
        }
      }
    }
    float w[W];
#pragma unroll
    for (int k = 0; k < W; ++k) w[k] = weight_at(p.weight, c * W + k);
    const float bias = bias_at(p.bias, c);
    float halo[W - 1];
#pragma unroll
    for (int i = 0; i < W - 1; ++i) halo[i] = x_ext(p, xr, b, c, t0 - (W - 1) + i);

#pragma unroll
    for (int j = 0; j < kTilesCF; ++j) {
      const int64_t t = t0 + j * kTile + lane * kN;
      float xe[W - 1 + kN];  // positions t - (W-1) .. t + kN - 1
#pragma unroll
      for (int i = 0; i < kN; ++i) xe[W - 1 + i] = to_float(xv[j].e[i]);
      halo_from_left_tiles(xe, halo, xv[j > 0 ? j - 1 : 0], j == 0, lane);
      float o[kN];
      if (!kSeq) {
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          float acc = bias;
#pragma unroll
          for (int k = 0; k < W; ++k) acc += w[k] * xe[i + k];
          o[i] = p.silu ? silu(acc) : acc;
        }
      } else {
        int se[W - 1 + kN];
#pragma unroll
        for (int q = 0; q < W - 1 + kN; ++q) {
          const int64_t pos = t - (W - 1) + q;
          se[q] = pos < p.seqlen ? seq_at(p, b, pos) : -1;
        }
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          const int s = se[W - 1 + i];
          float acc = bias;
#pragma unroll
          for (int k = 0; k < W; ++k) acc += se[i + k] == s ? w[k] * xe[i + k] : 0.0f;
          o[i] = s < 0 ? 0.0f : (p.silu ? silu(acc) : acc);  // padding token: exactly 0
        }
      }
      if (p.vec_out && t + kN <= p.seqlen) {
        store_pack<T, kN>(outr + t, o);
      } else {
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          if (t + i < p.seqlen) outr[(t + i) * p.out_s.l] = from_float<T>(o[i]);
        }
      }
    }
    if (p.final_states != nullptr && seg == nseg - 1 && lane < W - 1) {
      T* f = static_cast<T*>(p.final_states) + b * p.final_s.b + c * p.final_s.c + lane * p.final_s.l;
      *f = from_float<T>(x_ext(p, xr, b, c, p.seqlen - (W - 1) + lane));
    }
  }
}

// Channel-last (stride(1) == 1). A lane owns kN adjacent channels and walks a segment of time
// steps with the last W-1 inputs in registers; a warp's lanes cover 32 * kN channels, so every
// row access is coalesced. The 4 warps of a block take 4 consecutive segments.
template <typename T, int W, bool kSeq>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kMinBlocksCL)
    fwd_channel_last(const ConvParams p, const int64_t seg_len) {
  constexpr int kN = kVec16<T>;
  constexpr int kU = Policy::kUnrollCL<T>;
  constexpr int kWarps = Policy::kWarps;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const ClGrid<kN, kWarps> grid(p.batch, p.dim, p.seqlen, seg_len);
  for (int64_t blk = blockIdx.x; blk < grid.blocks; blk += gridDim.x) {
    const auto cell = grid.cell(blk, warp, lane);
    const int64_t b = cell.b, seg = cell.seg, c0 = cell.c0, nseg = grid.nseg;
    if (seg >= nseg || c0 >= p.dim) continue;  // lanes are independent here: no shuffles
    const int64_t t0 = seg * seg_len;
    const int64_t t1 = t0 + seg_len < p.seqlen ? t0 + seg_len : p.seqlen;
    const int nc = p.dim - c0 < kN ? int(p.dim - c0) : kN;
    const bool vin = p.vec_in && nc == kN;
    const bool vout = p.vec_out && nc == kN;
    const T* xb = static_cast<const T*>(p.x) + b * p.x_s.b + c0 * p.x_s.c;
    T* ob = static_cast<T*>(p.out) + b * p.out_s.b + c0 * p.out_s.c;

    float w[W][kN], bias[kN], h[W - 1][kN];
    load_left_halo<T, W, kN>(h, p, xb, b, c0, nc, t0, vin);
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const bool ok = i < nc;
#pragma unroll
      for (int k = 0; k < W; ++k) w[k][i] = ok ? weight_at(p.weight, (c0 + i) * W + k) : 0.0f;
      bias[i] = ok ? bias_at(p.bias, c0 + i) : 0.0f;
    }
    int hs[W - 1];
#pragma unroll
    for (int q = 0; q < W - 1; ++q) hs[q] = kSeq ? seq_at(p, b, t0 - (W - 1) + q) : 0;

    for (int64_t t = t0; t < t1; t += kU) {
      Pack<T, kN> xv[kU];
      int sv[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t tt = t + u;
        sv[u] = 0;
        if (tt < t1) {
          if (vin) {
            load_pack(xv[u], xb + tt * p.x_s.l);
          } else {
#pragma unroll
            for (int i = 0; i < kN; ++i) {
              xv[u].e[i] = i < nc ? xb[tt * p.x_s.l + i * p.x_s.c] : from_float<T>(0.0f);
            }
          }
          if (kSeq) sv[u] = seq_at(p, b, tt);
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t tt = t + u;
        if (tt >= t1) break;
        float xc[kN], o[kN];
#pragma unroll
        for (int i = 0; i < kN; ++i) xc[i] = to_float(xv[u].e[i]);
        const int s = sv[u];
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          float acc = bias[i];
#pragma unroll
          for (int k = 0; k < W - 1; ++k) acc += !kSeq || hs[k] == s ? w[k][i] * h[k][i] : 0.0f;
          acc += w[W - 1][i] * xc[i];
          o[i] = kSeq && s < 0 ? 0.0f : (p.silu ? silu(acc) : acc);
        }
        T* op = ob + tt * p.out_s.l;
        if (vout) {
          store_pack<T, kN>(op, o);
        } else {
#pragma unroll
          for (int i = 0; i < kN; ++i) {
            if (i < nc) op[i * p.out_s.c] = from_float<T>(o[i]);
          }
        }
#pragma unroll
        for (int q = 0; q < W - 2; ++q) {
          hs[q] = hs[q + 1];
#pragma unroll
          for (int i = 0; i < kN; ++i) h[q][i] = h[q + 1][i];
        }
        hs[W - 2] = s;
#pragma unroll
        for (int i = 0; i < kN; ++i) h[W - 2][i] = xc[i];
      }
    }
    if (p.final_states != nullptr && t1 == p.seqlen) {
#pragma unroll
      for (int q = 0; q < W - 1; ++q) {
        for (int i = 0; i < nc; ++i) {
          T* f = static_cast<T*>(p.final_states) + b * p.final_s.b + (c0 + i) * p.final_s.c + q * p.final_s.l;
          *f = from_float<T>(x_ext(p, xb + i * p.x_s.c, b, c0 + i, p.seqlen - (W - 1) + q));
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Lean kernels for the common case (no seq_idx, no initial / final states, vector-aligned x and
// out): no per-element masks, no state branches, no grid-stride loops, few registers. The
// general kernels above handle everything else; fwd_launch picks (see lean_* below).

// Channel-first lean path: the warp scheme of fwd_channel_first, one item per warp (the grid
// covers every item), whole vectors only (seqlen % kN == 0, so a vector is either entirely in
// the row or entirely past its end), 32-bit item split (items < 2^31).
template <typename T, int W>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kMinBlocksCFLean)
    fwd_channel_first_lean(const ConvParams p) {
  constexpr int kN = kVec16<T>;
  constexpr int kTilesCF = Policy::kTilesCF;
  constexpr int kWarps = Policy::kWarps;
  constexpr int kTile = 32 * kN;
  constexpr int kSeg = kTilesCF * kTile;
  static_assert(kN >= W - 1, "a lane's vector must cover its neighbour's halo");
  const int lane = threadIdx.x & 31;
  const uint32_t item = blockIdx.x * uint32_t(kWarps) + (threadIdx.x >> 5);
  const uint32_t nseg = uint32_t((p.seqlen + kSeg - 1) / kSeg);
  const uint32_t row = item / nseg;
  if (row >= uint32_t(p.batch * p.dim)) return;  // whole warp: the last block's spare warps
  const uint32_t seg = item - row * nseg;
  const uint32_t b = row / uint32_t(p.dim);
  const uint32_t c = row - b * uint32_t(p.dim);
  const int64_t t0 = int64_t(seg) * kSeg;
  const T* xr = static_cast<const T*>(p.x) + b * p.x_s.b + c * p.x_s.c + t0;
  T* outr = static_cast<T*>(p.out) + b * p.out_s.b + c * p.out_s.c + t0;
  const int64_t rem = p.seqlen - t0;  // positions left in the row from t0 (> 0)

  Pack<T, kN> xv[kTilesCF];
#pragma unroll
  for (int j = 0; j < kTilesCF; ++j) {
    const int o = j * kTile + lane * kN;
    if (o < rem) {
      load_pack(xv[j], xr + o);
    } else {
#pragma unroll
      for (int i = 0; i < kN; ++i) xv[j].e[i] = from_float<T>(0.0f);
    }
  }
  float w[W];
#pragma unroll
  for (int k = 0; k < W; ++k) w[k] = weight_at(p.weight, int64_t(c) * W + k);
  const float bias = bias_at(p.bias, c);
  float halo[W - 1];  // positions t0 - (W-1) .. t0 - 1: zeros at the row start
#pragma unroll
  for (int i = 0; i < W - 1; ++i) halo[i] = t0 > 0 ? to_float(xr[i - (W - 1)]) : 0.0f;

#pragma unroll
  for (int j = 0; j < kTilesCF; ++j) {
    const int o = j * kTile + lane * kN;
    float xe[W - 1 + kN];  // positions o - (W-1) .. o + kN - 1
#pragma unroll
    for (int i = 0; i < kN; ++i) xe[W - 1 + i] = to_float(xv[j].e[i]);
    halo_from_left_tiles(xe, halo, xv[j > 0 ? j - 1 : 0], j == 0, lane);
    float out[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      float acc = bias;
#pragma unroll
      for (int k = 0; k < W; ++k) acc += w[k] * xe[i + k];
      out[i] = acc;
    }
    if (p.silu) {  // one uniform branch per vector, not per element
#pragma unroll
      for (int i = 0; i < kN; ++i) out[i] = silu(out[i]);
    }
    if (o < rem) store16<T, kN>(outr + o, out);
  }
}

// Channel-last lean path: 2-D tiles of kTileL time steps x kTileC channels through shared
// memory. A tile row is 128 contiguous bytes (64 16-bit or 32 fp32 channels, so shared memory
// and registers, hence occupancy, are the same for every dtype). Loads and stores are 16-byte
// vectors along the channels, all issued before any use; the convolution runs along time
// inside shared memory, one channel per thread (kTileL / (kThreads / kTileC) steps each),
// so registers stay few and every load of a block is in flight at once.

// One channel of a channel-last tile: kSteps outputs from kSteps + W - 1 inputs. x points at
// the first input (W-1 steps before the first output), y at the first output; both are
// columns of shared-memory tiles with rows `ld` elements apart.
template <typename T, int W, int kSteps, bool kSilu>
__device__ __forceinline__ void cl_tile_column(const float (&w)[W], float bias, const T* x, T* y, int ld) {
  float h[W - 1];  // the W-1 inputs before step j, oldest first
#pragma unroll
  for (int q = 0; q < W - 1; ++q) h[q] = to_float(x[q * ld]);
#pragma unroll 8
  for (int j = 0; j < kSteps; ++j) {
    const float xc = to_float(x[(j + W - 1) * ld]);
    float acc = bias;
#pragma unroll
    for (int k = 0; k < W - 1; ++k) acc += w[k] * h[k];
    acc += w[W - 1] * xc;
    y[j * ld] = from_float<T>(kSilu ? silu(acc) : acc);
#pragma unroll
    for (int q = 0; q < W - 2; ++q) h[q] = h[q + 1];
    h[W - 2] = xc;
  }
}

template <typename T, int W>
__global__ void __launch_bounds__(Policy::kThreads) fwd_channel_last_tile(const ConvParams p) {
  constexpr int kN = kVec16<T>;
  constexpr int kThreads = Policy::kThreads;
  constexpr int kTileL = Policy::kTileL;
  constexpr int kC = Policy::kTileC<T>;
  constexpr int kV = kC / kN;           // vectors per tile row
  constexpr int kRows = kTileL + W - 1;  // W-1 halo rows, then the tile's time steps
  constexpr int kInVecs = kRows * kV;
  constexpr int kInPer = (kInVecs + kThreads - 1) / kThreads;
  constexpr int kOutPer = kTileL * kV / kThreads;
  constexpr int kSplit = kThreads / kC;  // threads per channel
  constexpr int kSteps = kTileL / kSplit;    // time steps per thread
  static_assert(kTileL * kV % kThreads == 0 && kThreads % kC == 0 && kTileL % kSplit == 0 &&
                    kThreads % kV == 0,
                "tile shape");
  using Raw = typename RawWord<16>::type;
  // Row r: time t0 - (W-1) + r. Rows past kRows only pad the array to whole load rounds, so
  // no load or store below is conditional (a conditional one gets sunk into its branch, which
  // serialises the loads).
  __shared__ __align__(16) T sx[kInPer * kThreads / kV][kC];
  __shared__ __align__(16) T so[kTileL][kC];

  const int64_t c0 = int64_t(blockIdx.x) * kC;
  const int64_t t0 = int64_t(blockIdx.y) * kTileL;
  const int64_t b = blockIdx.z;
  // Tile bases in 64 bits; offsets inside the tile in 32 (x_s.l, out_s.l <= INT_MAX / 128).
  const T* xt = static_cast<const T*>(p.x) + b * p.x_s.b + c0 + t0 * p.x_s.l;  // x_s.c == 1
  T* ot = static_cast<T*>(p.out) + b * p.out_s.b + c0 + t0 * p.out_s.l;       // out_s.c == 1
  const int xl = int(p.x_s.l), ol = int(p.out_s.l);
  const int nc = p.dim - c0 < kC ? int(p.dim - c0) : kC;  // a multiple of kN
  const int nt = p.seqlen - t0 < kTileL ? int(p.seqlen - t0) : kTileL;  // steps in the tile
  const int rmin = t0 >= W - 1 ? 0 : int(W - 1 - t0);  // input rows before the row start are 0

  // This thread's channel: its weights, loaded along with the tile.
  const int cc = int(threadIdx.x) % kC;
  const int j0 = int(threadIdx.x) / kC * kSteps;
  const bool has_c = cc < nc;
  float w[W], bias = 0.0f;
#pragma unroll
  for (int k = 0; k < W; ++k) w[k] = has_c ? weight_at(p.weight, (c0 + cc) * W + k) : 0.0f;
  if (has_c) bias = bias_at(p.bias, c0 + cc);

  // Every load is issued unconditionally (a vector outside x reads the tile's first vector,
  // which always exists, and is then replaced by zeros), so all of them are in flight before
  // the first shared-memory store waits on one.
  Raw in[kInPer];
  bool ok[kInPer];
#pragma unroll
  for (int k = 0; k < kInPer; ++k) {
    const int idx = int(threadIdx.x) + k * kThreads;
    const int r = idx / kV, v = idx % kV;
    ok[k] = r >= rmin && r < nt + W - 1 && v * kN < nc;  // r < nt + W - 1 also bounds r < kRows
    in[k] = *reinterpret_cast<const Raw*>(xt + (ok[k] ? (r - (W - 1)) * xl + v * kN : 0));
  }
#pragma unroll
  for (int k = 0; k < kInPer; ++k) {
    const int idx = int(threadIdx.x) + k * kThreads;
    *reinterpret_cast<Raw*>(&sx[idx / kV][(idx % kV) * kN]) = ok[k] ? in[k] : make_uint4(0, 0, 0, 0);
  }
  __syncthreads();

  if (has_c) {
    if (p.silu) {  // uniform: the activation is chosen once, not per element
      cl_tile_column<T, W, kSteps, true>(w, bias, &sx[j0][cc], &so[j0][cc], kC);
    } else {
      cl_tile_column<T, W, kSteps, false>(w, bias, &sx[j0][cc], &so[j0][cc], kC);
    }
  }
  __syncthreads();

#pragma unroll
  for (int k = 0; k < kOutPer; ++k) {
    const int idx = int(threadIdx.x) + k * kThreads;
    const int r = idx / kV, v = idx % kV;
    if (r < nt && v * kN < nc) {
      *reinterpret_cast<Raw*>(ot + r * ol + v * kN) = *reinterpret_cast<const Raw*>(&so[r][v * kN]);
    }
  }
}

// The common case both lean kernels need: no seq_idx, no states, vector-aligned x and out.
bool lean_common(const ConvParams& p) {
  return p.seq_idx == nullptr && p.initial_states == nullptr && p.final_states == nullptr && p.vec_in &&
         p.vec_out;
}

bool lean_channel_first(const ConvParams& p, int vec, int64_t seg) {
  const int64_t items = p.batch * p.dim * ((p.seqlen + seg - 1) / seg);
  // < 2^31 items: item = blockIdx.x * kWarps + warp cannot wrap in 32 bits.
  return !p.channel_last && lean_common(p) && p.seqlen % vec == 0 && items < (int64_t(1) << 31);
}

template <typename T>
bool lean_channel_last(const ConvParams& p, int vec) {
  constexpr int kL = Policy::kTileL, kC = Policy::kTileC<T>;
  return p.channel_last && lean_common(p) && p.dim % vec == 0 && p.x_s.l <= INT_MAX / 128 &&
         p.out_s.l <= INT_MAX / 128 && (p.seqlen + kL - 1) / kL <= 65535 && p.batch <= 65535 &&
         (p.dim + kC - 1) / kC <= INT_MAX;
}

unsigned grid_size(int64_t blocks) {
  return unsigned(std::min<int64_t>(std::max<int64_t>(blocks, 1), INT_MAX));
}

template <typename T, int W>
cudaError_t fwd_launch(const ConvParams& p, cudaStream_t stream) {
  constexpr int kN = kVec16<T>;
  constexpr int kThreads = Policy::kThreads;
  constexpr int kWarps = Policy::kWarps;
  constexpr int64_t kSegCF = int64_t(Policy::kTilesCF) * 32 * kN;
  if (lean_channel_last<T>(p, kN)) {
    constexpr int kL = Policy::kTileL, kC = Policy::kTileC<T>;
    const dim3 grid(unsigned((p.dim + kC - 1) / kC), unsigned((p.seqlen + kL - 1) / kL), unsigned(p.batch));
    fwd_channel_last_tile<T, W><<<grid, kThreads, 0, stream>>>(p);
  } else if (p.channel_last) {
    const int64_t seg_len = cl_seg_len(p, kN);
    const int64_t blocks = ClGrid<kN, kWarps>(p.batch, p.dim, p.seqlen, seg_len).blocks;
    if (p.seq_idx != nullptr) {
      fwd_channel_last<T, W, true><<<grid_size(blocks), kThreads, 0, stream>>>(p, seg_len);
    } else {
      fwd_channel_last<T, W, false><<<grid_size(blocks), kThreads, 0, stream>>>(p, seg_len);
    }
  } else {
    const int64_t items = p.batch * p.dim * ((p.seqlen + kSegCF - 1) / kSegCF);
    const unsigned grid = grid_size((items + kWarps - 1) / kWarps);
    if (lean_channel_first(p, kN, kSegCF)) {
      fwd_channel_first_lean<T, W><<<grid, kThreads, 0, stream>>>(p);  // grid covers every item
    } else if (p.seq_idx != nullptr) {
      fwd_channel_first<T, W, true><<<grid, kThreads, 0, stream>>>(p);
    } else {
      fwd_channel_first<T, W, false><<<grid, kThreads, 0, stream>>>(p);
    }
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_fwd(const ConvParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.dim == 0 || p.seqlen == 0) return cudaSuccess;
  return with_dtype_width(p.dtype, p.width, [&](auto t, auto w) {
    return fwd_launch<typename decltype(t)::type, decltype(w)::value>(p, stream);
  });
}

int64_t cl_seg_len(const ConvParams& p, int vec) {
  const int64_t ncg = (p.dim + 32 * int64_t(vec) - 1) / (32 * int64_t(vec));
  // About two waves of 16 resident warps per SM: longer segments amortise the per-warp setup
  // and the W-1 halo reloads; shorter ones would only add waves of tiny work.
  const int64_t target_warps = int64_t(sm_count()) * FwdPolicy::kSegWarpsPerSm;
  int64_t seg = FwdPolicy::kSegMaxCL;
  while (seg > FwdPolicy::kSegMinCL && p.batch * ((p.seqlen + seg - 1) / seg) * ncg < target_warps) seg /= 2;
  return seg;
}

int vec_elems(DType dtype, bool channel_last, bool backward) {
  if (channel_last && backward) return BwdPolicy::kVecCL;
  return 16 / dtype_size(dtype);
}

}  // namespace causal_conv1d
}  // namespace mamba_kernels
