// Backward of the forward in fwd.cu. With pre[s] = bias + sum_k w[k] x[s-(W-1)+k] (taps masked
// to the token's seq_idx segment) and dpre[s] = dout[s] * act'(pre[s]) (0 on padding tokens):
//   dx[t]      = sum_k w[k] dpre[t + (W-1) - k]  (+ dfinal_states for the last W-1 positions)
//   dweight[k] = sum_s dpre[s] x[s-(W-1)+k],  dbias = sum_s dpre[s]
//   dinitial_states: the same sum as dx, for the W-1 positions before 0.
// dweight/dbias are summed in fp32: atomics, or per-partial rows reduced in a fixed order.
#include <algorithm>
#include <climits>

#include "conv_common.cuh"

namespace mamba_kernels {
namespace causal_conv1d {
namespace {

using Policy = BwdPolicy;

// Channel-first (stride(2) == 1): the tile scheme of fwd_channel_first with kTilesCF tiles per
// warp. Pass 1 computes dpre and the dweight / dbias partials, pass 2 dx, whose right halo
// (dpre of the next W-1 positions) comes from the right neighbour, the next tile, or past the
// segment from a few positions recomputed ahead. One warp's work on one (batch, channel,
// segment) item, in phases: load, prepare, dpre_pass, ahead_dpre, dx_pass, dinitial, flush.
template <typename T, int W, bool kSeq>
struct CfBwdAgent {
  static constexpr int kN = kVec16<T>;
  static constexpr int kTilesCF = Policy::kTilesCF;
  static constexpr int kTile = 32 * kN;
  static constexpr int kSeg = kTilesCF * kTile;
  static_assert(kN >= W - 1, "a lane's vector must cover its neighbour's halo");

  const ConvParams& p;
  const int lane;
  int64_t seg, c, b, t0;
  const T* xr;
  const T* gr;
  T* dxr;
  Pack<T, kN> xv[kTilesCF], gv[kTilesCF];
  float w[W], bias, halo[W - 1];
  // inputs of dpre at the W-1 positions right of the segment (lane i < W-1: position t0 + kSeg + i)
  bool ahead_live;
  float ax[W], ag;
  int as[W];
  float dp[kTilesCF][kN];  // dpre at the warp's own positions
  float dw[W], db;         // the dweight / dbias partials
  float ahead;             // dpre right of the segment

  __device__ __forceinline__ CfBwdAgent(const ConvParams& params, int lane_) : p(params), lane(lane_) {}

  // The item's rows and its tiles of x and dout.
  __device__ __forceinline__ void load(int64_t item, int64_t nseg, int64_t items) {
    split_item(item, nseg, p.dim, items, seg, c, b);
    t0 = seg * kSeg;
    xr = static_cast<const T*>(p.x) + b * p.x_s.b + c * p.x_s.c;
    gr = static_cast<const T*>(p.dout) + b * p.dout_s.b + c * p.dout_s.c;
    dxr = static_cast<T*>(p.dx) + b * p.dx_s.b + c * p.dx_s.c;
#pragma unroll
    for (int j = 0; j < kTilesCF; ++j) {
      const int64_t t = t0 + j * kTile + lane * kN;
      if (p.vec_in && t + kN <= p.seqlen) {
        load_pack(xv[j], xr + t);
        load_pack(gv[j], gr + t);
      } else {
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          const bool in = t + i < p.seqlen;
          xv[j].e[i] = in ? xr[(t + i) * p.x_s.l] : from_float<T>(0.0f);
          gv[j].e[i] = in ? gr[(t + i) * p.dout_s.l] : from_float<T>(0.0f);
        }
      }
    }
  }

  // Weights, bias, the left halo, and the inputs of the ahead positions, loaded now so their
  // latency overlaps the tiles' loads.
  __device__ __forceinline__ void prepare() {
#pragma unroll
    for (int k = 0; k < W; ++k) w[k] = weight_at(p.weight, c * W + k);
    bias = bias_at(p.bias, c);
#pragma unroll
    for (int i = 0; i < W - 1; ++i) halo[i] = x_ext(p, xr, b, c, t0 - (W - 1) + i);
    const int64_t apos = t0 + kSeg + lane;
    ahead_live = lane < W - 1 && apos < p.seqlen;
    ag = 0.0f;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      ax[k] = ahead_live ? to_float(xr[(apos - (W - 1) + k) * p.x_s.l]) : 0.0f;  // apos - (W-1) >= 0
      as[k] = ahead_live && kSeq ? seq_at(p, b, apos - (W - 1) + k) : 0;
    }
    if (ahead_live) ag = to_float(gr[apos * p.dout_s.l]);
  }

  // Pass 1: dpre at the warp's own positions, and the dweight / dbias partial sums.
  __device__ __forceinline__ void dpre_pass() {
    db = 0.0f;
#pragma unroll
    for (int k = 0; k < W; ++k) dw[k] = 0.0f;
#pragma unroll
    for (int j = 0; j < kTilesCF; ++j) {
      const int64_t t = t0 + j * kTile + lane * kN;
      float xe[W - 1 + kN];
#pragma unroll
      for (int i = 0; i < kN; ++i) xe[W - 1 + i] = to_float(xv[j].e[i]);
      halo_from_left_tiles(xe, halo, xv[j > 0 ? j - 1 : 0], j == 0, lane);
      int se[W - 1 + kN];
#pragma unroll
      for (int q = 0; q < W - 1 + kN; ++q) {
        const int64_t pos = t - (W - 1) + q;
        se[q] = kSeq && pos < p.seqlen ? seq_at(p, b, pos) : 0;
      }
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        const int s = se[W - 1 + i];
        float xm[W];
#pragma unroll
        for (int k = 0; k < W; ++k) xm[k] = !kSeq || se[i + k] == s ? xe[i + k] : 0.0f;
        float d = 0.0f;
        if (t + i < p.seqlen && (!kSeq || s >= 0)) {
          d = to_float(gv[j].e[i]);
          if (p.silu) {
            float acc = bias;
#pragma unroll
            for (int k = 0; k < W; ++k) acc += w[k] * xm[k];
            d *= silu_grad(acc);
          }
        }
        dp[j][i] = d;
#pragma unroll
        for (int k = 0; k < W; ++k) dw[k] += d * xm[k];
        db += d;
      }
    }
  }

  // dpre right of the segment, from the inputs prepare() loaded.
  __device__ __forceinline__ void ahead_dpre() {
    ahead = 0.0f;
    if (ahead_live && (!kSeq || as[W - 1] >= 0)) {
      ahead = ag;
      if (p.silu) {
        float acc = bias;
#pragma unroll
        for (int k = 0; k < W; ++k) acc += !kSeq || as[k] == as[W - 1] ? w[k] * ax[k] : 0.0f;
        ahead *= silu_grad(acc);
      }
    }
  }

  // Pass 2: dx (plus dfinal_states at the last W-1 positions).
  __device__ __forceinline__ void dx_pass() {
#pragma unroll
    for (int j = 0; j < kTilesCF; ++j) {
      const int64_t t = t0 + j * kTile + lane * kN;
      float de[kN + W - 1];  // dpre at t .. t + kN + W - 2
#pragma unroll
      for (int i = 0; i < kN; ++i) de[i] = dp[j][i];
      // Lane 31 takes the next tile's lane 0, or after the last tile the ahead values.
      halo_from_right_tiles<W - 1>(de, dp[j], dp[j + 1 < kTilesCF ? j + 1 : j], ahead, j == kTilesCF - 1, lane);
      int se[kN + W - 1];  // seq_idx at t .. t + kN + W - 2
#pragma unroll
      for (int q = 0; q < kN + W - 1; ++q) {
        const int64_t pos = t + q;
        se[q] = kSeq && pos < p.seqlen ? seq_at(p, b, pos) : 0;
      }
      float o[kN];
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < W; ++k) acc += !kSeq || se[i + W - 1 - k] == se[i] ? w[k] * de[i + W - 1 - k] : 0.0f;
        if (p.dfinal_states != nullptr) {
          const int64_t q = t + i - (p.seqlen - (W - 1));
          if (q >= 0 && t + i < p.seqlen) {
            acc += to_float(static_cast<const T*>(p.dfinal_states)[b * p.dfinal_s.b + c * p.dfinal_s.c +
                                                                 q * p.dfinal_s.l]);
          }
        }
        o[i] = acc;
      }
      if (p.vec_out && t + kN <= p.seqlen) {
        store_pack<T, kN>(dxr + t, o);
      } else {
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          if (t + i < p.seqlen) dxr[(t + i) * p.dx_s.l] = from_float<T>(o[i]);
        }
      }
    }
  }

  // dinitial_states: the W-1 positions before 0 only feed dpre[0 .. W-2], all held by lane 0.
  __device__ __forceinline__ void dinitial() {
    if (p.dinitial_states == nullptr || seg != 0 || lane != 0) return;
    const int tag = kSeq ? seq_at(p, b, 0) : 0;
#pragma unroll
    for (int jj = 0; jj < W - 1; ++jj) {
      float acc = 0.0f;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const int s = jj - k;  // position fed by initial-state column jj through tap k
        if (s >= 0 && s < p.seqlen && (!kSeq || seq_at(p, b, s) == tag)) acc += w[k] * dp[0][s >= 0 ? s : 0];
      }
      if (p.dfinal_states != nullptr && jj >= p.seqlen) {
        acc += to_float(static_cast<const T*>(p.dfinal_states)[b * p.dfinal_s.b + c * p.dfinal_s.c +
                                                             (jj - p.seqlen) * p.dfinal_s.l]);
      }
      static_cast<T*>(p.dinitial_states)[b * p.dinit_s.b + c * p.dinit_s.c + jj * p.dinit_s.l] =
          from_float<T>(acc);
    }
  }
};

template <typename T, int W, bool kSeq>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kMinBlocksCF) bwd_channel_first(const ConvParams p) {
  using Agent = CfBwdAgent<T, W, kSeq>;
  constexpr int kWarps = Policy::kWarps;
  const int lane = threadIdx.x & 31;
  const int64_t nseg = (p.seqlen + Agent::kSeg - 1) / Agent::kSeg;
  const int64_t items = p.batch * p.dim * nseg;
  for (int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); item < items;
       item += int64_t(gridDim.x) * kWarps) {
    Agent a(p, lane);
    a.load(item, nseg, items);
    a.prepare();
    a.dpre_pass();
    a.ahead_dpre();
    a.dx_pass();
    a.dinitial();
    warp_flush_dweight(p, a.dw, a.db, lane, a.c, a.b, nseg, a.seg);
  }
}

// silu'(z), the formula of silu_grad (device_utils.cuh) on the flush-to-zero approximate
// ex2 / rcp instructions, without __expf's denormal fix-ups: exp(-z) below 2^-126 only ever
// meets 1 + exp(-z), which rounds to 1 either way.
__device__ __forceinline__ float silu_grad_ftz(float z) {
  float e, s;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(z * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(1.0f + e));
  return s * (1.0f + z * (1.0f - s));
}

// dx of one tile of the lean channel-first kernel from the tile's dpre (dpv, kN positions per
// lane) and the W-1 dpre values right of the tile (right[i]: the value lane 31 takes; the
// other lanes take their right neighbour's first W-1).
template <typename T, int W, int kN>
__device__ __forceinline__ void lean_cf_dx(T* dxr, int t, bool store, int lane, const float (&w)[W],
                                           const float (&dpv)[kN], const float (&right)[W - 1]) {
  float de[kN + W - 1];  // dpre at t .. t + kN + W - 2
#pragma unroll
  for (int i = 0; i < kN; ++i) de[i] = dpv[i];
  halo_from_right(de, right, lane);
  float o[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < W; ++k) acc += w[k] * de[i + W - 1 - k];
    o[i] = acc;
  }
  if (store) store_pack<T, kN>(dxr + t, o);
}

// Lean channel-first backward for the common case (the launcher checks cf_lean_ok): no
// seq_idx, no initial / final states, vector loads and stores only, seqlen a multiple of kN
// (so a lane's vector lies wholly inside or wholly past the sequence) and small enough for
// 32-bit positions; 64-bit offsets only for the row bases. A warp streams a chunk of up to
// chunk_tiles tiles (32 lanes x kN positions) of one row, tile by tile: dpre of tile j, then
// dx of tile j-1 (which needs dpre of tile j's first W-1 positions); the row setup, the warp
// reduction and the atomics are paid once per chunk. Lanes past the end load zeros, so their
// dpre is 0 without per-element bounds checks. Deterministic mode runs chunks of kTilesCF
// tiles: one workspace row per bwd_channel_first segment, in the same layout.
template <typename T, int W, bool kSilu>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kMinBlocksCFLean)
    bwd_channel_first_lean(const ConvParams p, const int chunk_tiles) {
  constexpr int kN = kVec16<T>;
  constexpr int kWarps = Policy::kWarps;
  constexpr int kTile = 32 * kN;
  static_assert(kN >= W - 1, "a lane's vector must cover its neighbour's halo");
  const int lane = threadIdx.x & 31;
  const int L = int(p.seqlen);
  const int chunk = chunk_tiles * kTile;
  const int nchunk = (L + chunk - 1) / chunk;
  const int64_t items = p.batch * p.dim * nchunk;
  for (int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); item < items;
       item += int64_t(gridDim.x) * kWarps) {
    int64_t ch64, c, b;
    split_item(item, nchunk, p.dim, items, ch64, c, b);
    const int ch = int(ch64);
    const int t0 = ch * chunk;
    const int ntiles = min(chunk_tiles, (L - t0 + kTile - 1) / kTile);  // >= 1: t0 < L
    const int tend = t0 + ntiles * kTile;
    const T* xr = static_cast<const T*>(p.x) + (b * p.x_s.b + c * p.x_s.c);
    const T* gr = static_cast<const T*>(p.dout) + (b * p.dout_s.b + c * p.dout_s.c);
    T* dxr = static_cast<T*>(p.dx) + (b * p.dx_s.b + c * p.dx_s.c);

    float carry[W - 1];  // x at the W-1 positions left of the current tile (zero before 0)
#pragma unroll
    for (int i = 0; i < W - 1; ++i) carry[i] = t0 > 0 ? to_float(xr[t0 - (W - 1) + i]) : 0.0f;
    float w[W];
#pragma unroll
    for (int k = 0; k < W; ++k) w[k] = weight_at(p.weight, c * W + k);
    const float bias = bias_at(p.bias, c);

    float dw[W], db = 0.0f, dprev[kN];
#pragma unroll
    for (int k = 0; k < W; ++k) dw[k] = 0.0f;
#pragma unroll
    for (int i = 0; i < kN; ++i) dprev[i] = 0.0f;
#pragma unroll 1
    for (int j = 0; j < ntiles; ++j) {
      const int t = t0 + j * kTile + lane * kN;
      Pack<T, kN> xv, gv;  // zero past the end
      if (t < L) {
        load_pack(xv, xr + t);
        load_pack(gv, gr + t);
      } else {
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          xv.e[i] = from_float<T>(0.0f);
          gv.e[i] = from_float<T>(0.0f);
        }
      }
      float xe[W - 1 + kN];  // x at t - (W-1) .. t + kN - 1
#pragma unroll
      for (int i = 0; i < kN; ++i) xe[W - 1 + i] = to_float(xv.e[i]);
      halo_from_left_carry(xe, carry, lane);
      float dcur[kN];
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        float d = to_float(gv.e[i]);  // 0 past the end (zero-filled vector)
        if (kSilu) {
          float acc = bias;
#pragma unroll
          for (int k = 0; k < W; ++k) acc += w[k] * xe[i + k];
          d *= silu_grad_ftz(acc);
        }
        dcur[i] = d;
#pragma unroll
        for (int k = 0; k < W; ++k) dw[k] += xe[i + k] * d;
        db += d;
        if (i == W - 2) {
          // dx of tile j-1 as soon as this tile's first W-1 dpre exist, so that dprev is
          // dead before the rest of dcur is live. Tile j-1 lies in range; for j == 0 it is
          // the previous chunk's (not ours to write; dprev is zero then).
          float right[W - 1];
          halo_first_lane(dcur, right);
          lean_cf_dx<T, W, kN>(dxr, t - kTile, j > 0, lane, w, dprev, right);
        }
      }
#pragma unroll
      for (int i = 0; i < kN; ++i) dprev[i] = dcur[i];
    }
    // dpre at the W-1 positions right of the chunk (0 past the end): lane i < W-1 takes
    // position tend + i, whose inputs start at tend + i - (W-1) >= 0 (kTile >= W-1).
    const int apos = tend + lane;
    float ahead = 0.0f;
    if (lane < W - 1 && apos < L) {
      float acc = bias;
#pragma unroll
      for (int k = 0; k < W; ++k) acc += w[k] * to_float(xr[apos - (W - 1) + k]);
      ahead = to_float(gr[apos]);
      if (kSilu) ahead *= silu_grad_ftz(acc);
    }
    {
      float right[W - 1];
      halo_gather(ahead, right);
      const int t = tend - kTile + lane * kN;
      lean_cf_dx<T, W, kN>(dxr, t, t < L, lane, w, dprev, right);
    }

    // Deterministic mode: chunk_tiles == kTilesCF, so chunk ch is bwd_channel_first's segment ch.
    warp_flush_dweight(p, dw, db, lane, c, b, nchunk, ch);
  }
}

// Channel-last: a lane owns kVecCL channels and walks its segment with sliding windows of
// the last W inputs, seq ids and dpre values, running W-1 steps past the segment end so that
// every dx of the segment sees all of its dpre terms. The block's 4 warps (4 consecutive
// segments of the same channels) sum their dweight partials through shared memory.
// One lane's walk over its segment of kN channels, in phases: setup (weights, bias, the W-1
// inputs and seq ids left of the segment), load (kU steps' inputs, loads first), step (slide
// the windows, dpre, the segment's dweight / dbias, dx W-1 steps back, dinitial_states).
template <typename T, int W, bool kSeq>
struct ClBwdAgent {
  static constexpr int kN = Policy::kVecCL;
  static constexpr int kU = Policy::kUnrollCL;

  const ConvParams& p;
  const int64_t b, c0, t0, t1, s_end;
  const int nc;
  const bool vin, vout;
  const T* xb;
  const T* gb;
  T* dxb;
  float w[W][kN], bias[kN], xw[W][kN], dpw[W][kN];  // weights; windows of inputs and dpre
  int sw[W];                                         // window of seq ids
  int tag;                                           // seq id of position 0
  Pack<T, kN> xv[kU], gv[kU];
  int sv[kU];  // seq id of each loaded step, -1 past the sequence (or padding)

  __device__ __forceinline__ ClBwdAgent(const ConvParams& params, int64_t b_, int64_t c0_, int64_t t0_,
                                        int64_t seg_len)
      : p(params),
        b(b_),
        c0(c0_),
        t0(t0_),
        t1(t0_ + seg_len < params.seqlen ? t0_ + seg_len : params.seqlen),
        s_end((t0_ + seg_len < params.seqlen ? t0_ + seg_len : params.seqlen) + W - 1),  // dpre up to t1 + W - 2
        nc(params.dim - c0_ < kN ? int(params.dim - c0_) : kN),
        vin(params.vec_in && params.dim - c0_ >= kN),
        vout(params.vec_out && params.dim - c0_ >= kN),
        xb(static_cast<const T*>(params.x) + b_ * params.x_s.b + c0_ * params.x_s.c),
        gb(static_cast<const T*>(params.dout) + b_ * params.dout_s.b + c0_ * params.dout_s.c),
        dxb(static_cast<T*>(params.dx) + b_ * params.dx_s.b + c0_ * params.dx_s.c) {}

  __device__ __forceinline__ void setup() {
    sw[0] = 0;
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const bool ok = i < nc;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        w[k][i] = ok ? weight_at(p.weight, (c0 + i) * W + k) : 0.0f;
        dpw[k][i] = 0.0f;
      }
      bias[i] = ok ? bias_at(p.bias, c0 + i) : 0.0f;
      xw[0][i] = 0.0f;
    }
    load_left_halo<T, W, kN>(xw + 1, p, xb, b, c0, nc, t0, vin);
#pragma unroll
    for (int q = 0; q < W - 1; ++q) sw[q + 1] = kSeq ? seq_at(p, b, t0 - (W - 1) + q) : 0;
    tag = kSeq ? seq_at(p, b, 0) : 0;
  }

  // The inputs of steps sb .. sb + kU - 1 (zeros past the sequence or the walk's end).
  __device__ __forceinline__ void load(int64_t sb) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t s = sb + u;
      sv[u] = -1;
      if (s < p.seqlen && s < s_end) {
        if (vin) {
          load_pack(xv[u], xb + s * p.x_s.l);
          load_pack(gv[u], gb + s * p.dout_s.l);
        } else {
#pragma unroll
          for (int i = 0; i < kN; ++i) {
            xv[u].e[i] = i < nc ? xb[s * p.x_s.l + i * p.x_s.c] : from_float<T>(0.0f);
            gv[u].e[i] = i < nc ? gb[s * p.dout_s.l + i * p.dout_s.c] : from_float<T>(0.0f);
          }
        }
        sv[u] = kSeq ? seq_at(p, b, s) : 0;
      } else {
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          xv[u].e[i] = from_float<T>(0.0f);
          gv[u].e[i] = from_float<T>(0.0f);
        }
      }
    }
  }

  // Step s (the u-th loaded): slide the windows, dpre at s (into dw / db when s is the
  // segment's), dx at s - (W-1), and dinitial_states once the first W-1 dpre exist.
  __device__ __forceinline__ void step(int u, int64_t s, float (&dw)[W][kN], float (&db)[kN]) {
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
      sw[k] = sw[k + 1];
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        xw[k][i] = xw[k + 1][i];
        dpw[k][i] = dpw[k + 1][i];
      }
    }
    sw[W - 1] = sv[u];
    const bool live = sv[u] >= 0;  // in range and not padding
    const bool own = s < t1;        // counted in this segment's dweight
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      xw[W - 1][i] = to_float(xv[u].e[i]);
      float xm[W];
#pragma unroll
      for (int k = 0; k < W; ++k) xm[k] = !kSeq || sw[k] == sw[W - 1] ? xw[k][i] : 0.0f;
      float d = 0.0f;
      if (live) {
        d = to_float(gv[u].e[i]);
        if (p.silu) {
          float acc = bias[i];
#pragma unroll
          for (int k = 0; k < W; ++k) acc += w[k][i] * xm[k];
          d *= silu_grad(acc);
        }
      }
      dpw[W - 1][i] = d;
      if (own) {
#pragma unroll
        for (int k = 0; k < W; ++k) dw[k][i] += d * xm[k];
        db[i] += d;
      }
    }
    const int64_t t = s - (W - 1);
    if (t >= t0) store_dx(t);
    if (p.dinitial_states != nullptr && t0 == 0 && s == W - 2) dinitial();
  }

  __device__ __forceinline__ void store_dx(int64_t t) {
    float o[kN];
    const int64_t q = t - (p.seqlen - (W - 1));  // dfinal_states column of position t
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      float acc = 0.0f;
#pragma unroll
      for (int k = 0; k < W; ++k) acc += !kSeq || sw[W - 1 - k] == sw[0] ? w[k][i] * dpw[W - 1 - k][i] : 0.0f;
      if (p.dfinal_states != nullptr && q >= 0 && i < nc) {
        acc += to_float(static_cast<const T*>(p.dfinal_states)[b * p.dfinal_s.b + (c0 + i) * p.dfinal_s.c +
                                                             q * p.dfinal_s.l]);
      }
      o[i] = acc;
    }
    T* dp_out = dxb + t * p.dx_s.l;
    if (vout) {
      store_pack<T, kN>(dp_out, o);
    } else {
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        if (i < nc) dp_out[i * p.dx_s.c] = from_float<T>(o[i]);
      }
    }
  }

  // dpw[1 + m] holds dpre[m] for m = 0 .. W-2 here.
  __device__ __forceinline__ void dinitial() {
#pragma unroll
    for (int jj = 0; jj < W - 1; ++jj) {
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        if (i >= nc) continue;
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < W; ++k) {
          const int m = jj - k;
          if (m >= 0 && (!kSeq || sw[1 + (m >= 0 ? m : 0)] == tag)) acc += w[k][i] * dpw[1 + (m >= 0 ? m : 0)][i];
        }
        if (p.dfinal_states != nullptr && jj >= p.seqlen) {
          acc += to_float(static_cast<const T*>(p.dfinal_states)[b * p.dfinal_s.b + (c0 + i) * p.dfinal_s.c +
                                                               (jj - p.seqlen) * p.dfinal_s.l]);
        }
        static_cast<T*>(p.dinitial_states)[b * p.dinit_s.b + (c0 + i) * p.dinit_s.c + jj * p.dinit_s.l] =
            from_float<T>(acc);
      }
    }
  }
};

template <typename T, int W, bool kSeq>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kMinBlocksCL)
    bwd_channel_last(const ConvParams p, const int64_t seg_len) {
  using Agent = ClBwdAgent<T, W, kSeq>;
  constexpr int kN = Agent::kN;
  constexpr int kThreads = Policy::kThreads;
  constexpr int kWarps = Policy::kWarps;
  __shared__ float red[kWarps][W + 1][32 * kN];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const ClGrid<kN, kWarps> grid(p.batch, p.dim, p.seqlen, seg_len);
  for (int64_t blk = blockIdx.x; blk < grid.blocks; blk += gridDim.x) {
    const auto cell = grid.cell(blk, warp, lane);
    const int64_t cg = cell.cg, tb = cell.tb, b = cell.b, seg = cell.seg, c0 = cell.c0;
    const int64_t nseg = grid.nseg, ntb = grid.ntb;
    float dw[W][kN], db[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      db[i] = 0.0f;
#pragma unroll
      for (int k = 0; k < W; ++k) dw[k][i] = 0.0f;
    }
    if (seg < nseg && c0 < p.dim) {
      Agent a(p, b, c0, seg * seg_len, seg_len);
      a.setup();
      for (int64_t sb = a.t0; sb < a.s_end; sb += Agent::kU) {
        a.load(sb);
#pragma unroll
        for (int u = 0; u < Agent::kU; ++u) {
          if (sb + u >= a.s_end) break;
          a.step(u, sb + u, dw, db);
        }
      }
    }
    block_flush_dweight<W, kN, kWarps, kThreads>(p, red, dw, db, warp, lane, cg * 32 * kN, p.dim, b, ntb, tb);
  }
}

// Lean channel-last backward for the common case (the launcher checks cl_lean_ok): no
// seq_idx, no states, vector loads and stores only, dim a multiple of kVecCLLean, 32-bit
// positions and time strides. A lane owns kVecCLLean adjacent channels (few enough that the
// weights, dweight sums and the windows of the last W-1 inputs and dpre values stay in
// registers) and walks its warp's time segment: in blocks of kUnrollCLLean steps with loads issued
// first and no bounds checks while the block lies inside the segment, then one step at a
// time up to W-1 steps past the segment end (dpre there completes the segment's last dx, but
// is not the segment's to add to dweight). Blocks, segments, the fixed-order block sum and
// the deterministic workspace rows are those of bwd_channel_last (the same seg_len).
// One lane's walk in the lean kernel, in phases: setup (weights, bias, the W-1 inputs left of
// the segment), block (kU steps inside the segment, loads first, no bounds checks) and tail
// (one step at a time to W-1 steps past the segment end).
template <typename T, int W, bool kSilu>
struct ClLeanBwdAgent {
  static constexpr int kN = Policy::kVecCLLean;
  static constexpr int kU = Policy::kUnrollCLLean;

  const ConvParams& p;
  const int L, t0, t1;
  const int sx, sg, sd;
  const T* xp;  // x, dout and dx at step s (dx is written at s - (W-1), and only from t0 on)
  const T* gp;
  T* dp;
  int s;
  float w[W][kN], bias[kN];
  // x and dpre at the W-1 positions before step s (x is zero before position 0; dpre before
  // t0 only feeds dx left of the segment, which is not emitted)
  float xh[W - 1][kN], dh[W - 1][kN];

  __device__ __forceinline__ ClLeanBwdAgent(const ConvParams& params, int64_t b, int c0, int t0_, int seg_len)
      : p(params),
        L(int(params.seqlen)),
        t0(t0_),
        t1(min(t0_ + seg_len, int(params.seqlen))),
        sx(int(params.x_s.l)),
        sg(int(params.dout_s.l)),
        sd(int(params.dx_s.l)),
        xp(static_cast<const T*>(params.x) + (b * params.x_s.b + c0) + int64_t(t0_) * params.x_s.l),
        gp(static_cast<const T*>(params.dout) + (b * params.dout_s.b + c0) + int64_t(t0_) * params.dout_s.l),
        dp(static_cast<T*>(params.dx) + (b * params.dx_s.b + c0) + int64_t(t0_) * params.dx_s.l),
        s(t0_) {}

  __device__ __forceinline__ void setup(int c0) {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
#pragma unroll
      for (int k = 0; k < W; ++k) w[k][i] = weight_at(p.weight, int64_t(c0 + i) * W + k);
      bias[i] = bias_at(p.bias, c0 + i);
    }
#pragma unroll
    for (int q = 0; q < W - 1; ++q) {
      const int pos = t0 - (W - 1) + q;
      Pack<T, kN> v;
      if (pos >= 0) {
        load_pack(v, xp + int64_t(pos - t0) * p.x_s.l);
      } else {
#pragma unroll
        for (int i = 0; i < kN; ++i) v.e[i] = from_float<T>(0.0f);
      }
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        xh[q][i] = to_float(v.e[i]);
        dh[q][i] = 0.0f;
      }
    }
  }

  // Steps s .. s+kU-1, all in the segment (< t1 <= L).
  __device__ __forceinline__ void block(float (&dw)[W][kN], float (&db)[kN]) {
    Pack<T, kN> xv[kU], gv[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      load_pack(xv[u], xp + u * sx);
      load_pack(gv[u], gp + u * sg);
    }
    float xe[W - 1 + kU][kN], de[W - 1 + kU][kN];  // at positions s-(W-1) .. s+kU-1
#pragma unroll
    for (int i = 0; i < kN; ++i) {
#pragma unroll
      for (int q = 0; q < W - 1; ++q) {
        xe[q][i] = xh[q][i];
        de[q][i] = dh[q][i];
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) xe[W - 1 + u][i] = to_float(xv[u].e[i]);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        float d = to_float(gv[u].e[i]);
        if (kSilu) {
          float acc = bias[i];
#pragma unroll
          for (int k = 0; k < W; ++k) acc += w[k][i] * xe[u + k][i];
          d *= silu_grad_ftz(acc);
        }
        de[W - 1 + u][i] = d;
#pragma unroll
        for (int k = 0; k < W; ++k) dw[k][i] += xe[u + k][i] * d;
        db[i] += d;
      }
      // dx at t = s + u - (W-1) = sum_k w[k] dpre[s + u - k]; only t >= t0 is ours.
      float o[kN];
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < W; ++k) acc += w[k][i] * de[W - 1 + u - k][i];
        o[i] = acc;
      }
      if (u >= W - 1 || s + u - (W - 1) >= t0) store_pack<T, kN>(dp + (u - (W - 1)) * sd, o);
    }
#pragma unroll
    for (int i = 0; i < kN; ++i) {
#pragma unroll
      for (int q = 0; q < W - 1; ++q) {
        xh[q][i] = xe[kU + q][i];
        dh[q][i] = de[kU + q][i];
      }
    }
    xp += kU * sx;
    gp += kU * sg;
    dp += kU * sd;
    s += kU;
  }

  // Step s, past the last whole block: up to W-1 steps after the segment (dpre there completes
  // the segment's last dx, but is not the segment's to add to dweight).
  __device__ __forceinline__ void tail_step(float (&dw)[W][kN], float (&db)[kN]) {
    const bool live = s < L;  // past the end: x = dout = 0, so dpre = 0
    Pack<T, kN> xv, gv;
    if (live) {
      load_pack(xv, xp);
      load_pack(gv, gp);
    } else {
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        xv.e[i] = from_float<T>(0.0f);
        gv.e[i] = from_float<T>(0.0f);
      }
    }
    const bool own = s < t1;
    const int t = s - (W - 1);
    float o[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      float xw[W];  // x at s-(W-1) .. s
#pragma unroll
      for (int q = 0; q < W - 1; ++q) xw[q] = xh[q][i];
      xw[W - 1] = to_float(xv.e[i]);
      float d = to_float(gv.e[i]);
      if (kSilu) {
        float acc = bias[i];
#pragma unroll
        for (int k = 0; k < W; ++k) acc += w[k][i] * xw[k];
        d *= silu_grad_ftz(acc);
      }
      if (own) {
#pragma unroll
        for (int k = 0; k < W; ++k) dw[k][i] += xw[k] * d;
        db[i] += d;
      }
      float acc = w[0][i] * d;  // dx at t: tap k takes dpre[s - k] = dh[W-1-k] for k >= 1
#pragma unroll
      for (int k = 1; k < W; ++k) acc += w[k][i] * dh[W - 1 - k][i];
      o[i] = acc;
#pragma unroll
      for (int q = 0; q < W - 2; ++q) {
        xh[q][i] = xh[q + 1][i];
        dh[q][i] = dh[q + 1][i];
      }
      xh[W - 2][i] = xw[W - 1];
      dh[W - 2][i] = d;
    }
    if (t >= t0) store_pack<T, kN>(dp - (W - 1) * sd, o);
    xp += sx;
    gp += sg;
    dp += sd;
    ++s;
  }
};

template <typename T, int W, bool kSilu>
__global__ void __launch_bounds__(Policy::kThreads, Policy::kMinBlocksCLLean)
    bwd_channel_last_lean(const ConvParams p, const int seg_len) {
  using Agent = ClLeanBwdAgent<T, W, kSilu>;
  constexpr int kN = Agent::kN;
  constexpr int kThreads = Policy::kThreads;
  constexpr int kWarps = Policy::kWarps;
  __shared__ float red[kWarps][W + 1][32 * kN];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int L = int(p.seqlen);
  const int dim = int(p.dim);
  const int ncg = (dim + 32 * kN - 1) / (32 * kN);
  const int nseg = (L + seg_len - 1) / seg_len;
  const int ntb = (nseg + kWarps - 1) / kWarps;
  const int64_t nblocks = p.batch * ntb * ncg;
  for (int64_t blk = blockIdx.x; blk < nblocks; blk += gridDim.x) {
    const int cg = int(blk % ncg);
    const int tb = int((blk / ncg) % ntb);
    const int64_t b = blk / ncg / ntb;
    const int seg = tb * kWarps + warp;
    const int c0 = cg * 32 * kN + lane * kN;
    float dw[W][kN], db[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      db[i] = 0.0f;
#pragma unroll
      for (int k = 0; k < W; ++k) dw[k][i] = 0.0f;
    }
    if (seg < nseg && c0 < dim) {  // dim % kN == 0: the lane's channels all exist
      Agent a(p, b, c0, seg * seg_len, seg_len);
      a.setup(c0);
#pragma unroll 1
      while (a.s + Agent::kU <= a.t1) a.block(dw, db);
#pragma unroll 1
      while (a.s < a.t1 + W - 1) a.tail_step(dw, db);
    }
    block_flush_dweight<W, kN, kWarps, kThreads>(p, red, dw, db, warp, lane, cg * 32 * kN, dim, b, ntb, tb);
  }
}

// Deterministic mode: dweight / dbias = the sum of the partial rows, always in row order.
__global__ void reduce_partials(const float* ws, int64_t n_partials, int64_t dim, int width,
                                float* dweight, float* dbias) {
  const int64_t n = dim * (width + 1);
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    int64_t r = 0;
    constexpr int kLoads = Policy::kReduceLoads;
    for (; r + kLoads <= n_partials; r += kLoads) {  // kLoads independent loads in flight, summed in order
      float v[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) v[u] = ws[(r + u) * n + e];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) acc += v[u];
    }
    for (; r < n_partials; ++r) acc += ws[r * n + e];
    const int64_t c = e / (width + 1);
    const int k = int(e % (width + 1));
    if (k < width) {
      dweight[c * width + k] = acc;
    } else if (dbias != nullptr) {
      dbias[c] = acc;
    }
  }
}

unsigned grid_size(int64_t blocks) {
  return unsigned(std::min<int64_t>(std::max<int64_t>(blocks, 1), INT_MAX));
}

int64_t cf_segments(const ConvParams& p) {
  const int64_t seg = int64_t(Policy::kTilesCF) * 32 * (16 / dtype_size(p.dtype));
  return (p.seqlen + seg - 1) / seg;
}

// The lean channel-first kernel's preconditions (see bwd_channel_first_lean).
bool cf_lean_ok(const ConvParams& p, int vec) {
  return !p.channel_last && p.seq_idx == nullptr && p.initial_states == nullptr && p.dfinal_states == nullptr &&
         p.dinitial_states == nullptr && p.vec_in && p.vec_out && p.seqlen % vec == 0 && p.seqlen <= INT_MAX / 2;
}

// Tiles per warp of the lean channel-first kernel: kTilesCF in deterministic mode (its
// chunks are then the workspace's segments), else up to kMaxTilesCFLean (fewer per-warp
// overheads: halo, weights, warp reduction, atomics) while that still leaves about four waves
// of warps.
int cf_lean_chunk_tiles(const ConvParams& p, int tile) {
  if (p.deterministic) return Policy::kTilesCF;
  const int64_t row_tiles = (p.seqlen + tile - 1) / tile;
  const int64_t target_warps = int64_t(sm_count()) * Policy::kCFLeanWarpsPerSm;
  int tiles = Policy::kMaxTilesCFLean;
  while (tiles > Policy::kTilesCF && p.batch * p.dim * ((row_tiles + tiles - 1) / tiles) < target_warps) tiles /= 2;
  return tiles;
}

// The lean channel-last kernel's preconditions (see bwd_channel_last_lean); strides bounded so
// that kUnrollCLLean steps of any of them fit 32-bit offsets.
bool cl_lean_ok(const ConvParams& p) {
  constexpr int64_t kMaxStride = INT_MAX / (4 * Policy::kUnrollCLLean);
  const auto stride_ok = [](int64_t s) { return s >= 0 && s <= kMaxStride; };
  return p.channel_last && p.seq_idx == nullptr && p.initial_states == nullptr && p.dfinal_states == nullptr &&
         p.dinitial_states == nullptr && p.vec_in && p.vec_out && p.dim % Policy::kVecCLLean == 0 &&
         p.seqlen <= INT_MAX / 2 && p.dim <= INT_MAX / 2 && stride_ok(p.x_s.l) && stride_ok(p.dout_s.l) &&
         stride_ok(p.dx_s.l);
}

template <typename T, int W>
cudaError_t bwd_launch(const ConvParams& p, cudaStream_t stream) {
  constexpr int kThreads = Policy::kThreads;
  constexpr int kWarps = Policy::kWarps;
  if (cl_lean_ok(p)) {
    constexpr int kN = Policy::kVecCLLean;
    const int64_t seg_len = cl_seg_len(p, Policy::kVecCL);  // bwd_channel_last's: the same partial rows
    const int64_t blocks = ClGrid<kN, kWarps>(p.batch, p.dim, p.seqlen, seg_len).blocks;
    if (p.silu) {
      bwd_channel_last_lean<T, W, true><<<grid_size(blocks), kThreads, 0, stream>>>(p, int(seg_len));
    } else {
      bwd_channel_last_lean<T, W, false><<<grid_size(blocks), kThreads, 0, stream>>>(p, int(seg_len));
    }
  } else if (cf_lean_ok(p, kVec16<T>)) {
    constexpr int kTile = 32 * kVec16<T>;
    const int tiles = cf_lean_chunk_tiles(p, kTile);
    const int64_t chunk = int64_t(tiles) * kTile;
    const int64_t items = p.batch * p.dim * ((p.seqlen + chunk - 1) / chunk);
    const unsigned grid = grid_size((items + kWarps - 1) / kWarps);
    if (p.silu) {
      bwd_channel_first_lean<T, W, true><<<grid, kThreads, 0, stream>>>(p, tiles);
    } else {
      bwd_channel_first_lean<T, W, false><<<grid, kThreads, 0, stream>>>(p, tiles);
    }
  } else if (p.channel_last) {
    constexpr int kN = Policy::kVecCL;
    const int64_t seg_len = cl_seg_len(p, kN);
    const int64_t blocks = ClGrid<kN, kWarps>(p.batch, p.dim, p.seqlen, seg_len).blocks;
    if (p.seq_idx != nullptr) {
      bwd_channel_last<T, W, true><<<grid_size(blocks), kThreads, 0, stream>>>(p, seg_len);
    } else {
      bwd_channel_last<T, W, false><<<grid_size(blocks), kThreads, 0, stream>>>(p, seg_len);
    }
  } else {
    const int64_t items = p.batch * p.dim * cf_segments(p);
    const unsigned grid = grid_size((items + kWarps - 1) / kWarps);
    if (p.seq_idx != nullptr) {
      bwd_channel_first<T, W, true><<<grid, kThreads, 0, stream>>>(p);
    } else {
      bwd_channel_first<T, W, false><<<grid, kThreads, 0, stream>>>(p);
    }
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || !p.deterministic) return err;
  const int64_t n = p.dim * (W + 1);
  constexpr int kRed = Policy::kReduceThreads;
  reduce_partials<<<grid_size((n + kRed - 1) / kRed), kRed, 0, stream>>>(p.workspace, bwd_num_partials(p), p.dim, W,
                                                                        p.dweight, p.dbias);
  return cudaGetLastError();
}

}  // namespace

int64_t bwd_num_partials(const ConvParams& p) {
  if (!p.channel_last) return p.batch * cf_segments(p);
  // a partial row per (batch, run of segments), whichever channel-last kernel runs
  const int64_t seg_len = cl_seg_len(p, Policy::kVecCL);
  return p.batch * ClGrid<Policy::kVecCL, Policy::kWarps>(p.batch, p.dim, p.seqlen, seg_len).ntb;
}

cudaError_t launch_bwd(const ConvParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.dim == 0 || p.seqlen == 0) return cudaSuccess;
  return with_dtype_width(p.dtype, p.width, [&](auto t, auto w) {
    return bwd_launch<typename decltype(t)::type, decltype(w)::value>(p, stream);
  });
}

}  // namespace causal_conv1d
}  // namespace mamba_kernels
