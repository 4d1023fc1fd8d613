// The Mamba-2 SSD chunked-scan forward (math in ssd.h): four launches on one stream (five with
// cu_seqlens).
//
// 1. chunk_cb_kernel: per (t-tile x s-tile at or below the diagonal, group, batch x chunk):
//    G = C B^T of the chunk (on tensor cores for 16-bit inputs) into an fp32 workspace, once per
//    group instead of once per head.
// 2. chunk_state_kernel: per (head, state tile, batch x chunk). discretise: dt (bias, softplus,
//    clamp) and its running sum dA_cumsum over the chunk, a block scan in shared memory (every
//    block of the chunk repeats it; the first writes dt_out and dA_cumsum). Then the chunk's own
//    state, a (headdim x dstate) tile product over the chunk's steps: x scaled by
//    exp(cs_last - cs_t) dt_t (transposed) times B, on tensor cores for 16-bit inputs. Written
//    into `states`, which step 3 turns into the states entering each chunk.
// 3. state_pass_kernel: kVec state elements of a (batch, head) a thread, the chunks in
//    sequence with kDepth chunks' loads in flight: H_(c+1) = exp(cs_last(c)) H_c + S_c, reset
//    at a seq_idx change; states[c] = H_c, final_states = H after the last chunk. (With
//    cu_seqlens, varlen_state_kernel then gives each packed sequence's final state.)
// 4. chunk_scan_kernel: per (head, output tile of kScanT steps x kScanP channels, batch x chunk).
//    off-chunk: C times the entering state (on tensor cores), each row scaled by exp(cs_t);
//    intra-chunk: per s-block up to the diagonal, G from the workspace, masked and decayed into
//    M[t, s] = G exp(cs_t - cs_s) dt_s (s <= t, same sequence; other entries exactly 0, no exp
//    evaluated), then M times x. The diagonal block on tensor cores when its x is all finite
//    (the masked terms add exact zeros); else its 16 x 16 diagonal blocks by FMA, terms s <= t
//    only, so a NaN or Inf in x_s cannot reach y_t for t < s. The store adds D x, writes out_x
//    and out = y silu(z).
//
// Decays are exp of differences of running sums, and a masked entry is a select, never a
// product, so a NaN or Inf at step t reaches no output before t. Every index is 64-bit; every
// operand is read in place with its strides.
#include <cstdint>
#include <type_traits>

#include "device_utils.cuh"
#include "ssd.h"
#include "ssd_pass.cuh"
#include "ssd_mma.cuh"
#include "ssd_policy.cuh"
#include "ssd_tile.cuh"

namespace mamba_kernels {
namespace ssd {
namespace {

constexpr int kMaxChunk = int(kSsdMaxChunk);

__device__ __forceinline__ float softplus_dt(float d) { return d <= 20.0f ? log1pf(expf(d)) : d; }
// NaN-preserving clamp (fminf / fmaxf would drop a NaN).
__device__ __forceinline__ float clamp_dt(float d, float lo, float hi) { return d < lo ? lo : (d > hi ? hi : d); }
__device__ __forceinline__ float silu_exact(float z) { return z / (1.0f + expf(-z)); }

// The unit row scale of an unscaled tile load.
struct One {
  __device__ __forceinline__ float operator()(int) const { return 1.0f; }
};

template <typename T>
__device__ __forceinline__ const T* tptr(const Operand& o) {
  return static_cast<const T*>(o.ptr);
}

// Per-(batch, chunk) coordinates shared by the chunk kernels: blockIdx.x is the head,
// blockIdx.z is batch * nchunks + chunk.
struct ChunkCoords {
  int64_t b, h, g, c, c0;
  int Lc;  // the chunk's steps inside the sequence (the last chunk may be short)
  __device__ __forceinline__ explicit ChunkCoords(const SsdFwdParams& p)
      : ChunkCoords(p, int64_t(blockIdx.z) / p.nchunks, int64_t(blockIdx.z) % p.nchunks) {}
  __device__ __forceinline__ ChunkCoords(const SsdFwdParams& p, int64_t batch, int64_t chunk) {
    h = blockIdx.x;
    b = batch;
    c = chunk;
    g = h / p.heads_per_group;
    c0 = c * p.chunk;
    const int64_t left = p.seqlen - c0;
    Lc = int(left < p.chunk ? left : p.chunk);
  }
};

// ------------------------------------------------------------------------------ chunk state

// The state tile's accumulators on mma.sync: warp w holds channels 16w.. of the tile, kNT
// 8-column tiles of state (ssd_mma.cuh's C layout).
template <int kNT>
struct MmaAcc {
  float v[kNT][4];
};

// The tiles of the state product: the FMA / wmma form stages x w (scaled on load) and B, and
// its result through an fp32 tile; the mma.sync form (16-bit inputs, sm_80 on) double-buffers raw
// x and B by cp.async, scales x by w in the A fragments and stores from the accumulators.
template <typename T, int BP, int BN, int BK, int LDX, int LDB, int LDS, bool kMma>
struct StateTiles {
  alignas(32) T xs[BK * LDX];  // x w, step-major (the product's A, column-major)
  alignas(32) T bs[BK * LDB];  // B, step-major
  alignas(32) float stage[BP * LDS];
};
template <typename T, int BP, int BN, int BK, int LDX, int LDB, int LDS>
struct StateTiles<T, BP, BN, BK, LDX, LDB, LDS, true> {
  alignas(16) T xs[2][BK * LDX];
  alignas(16) T bs[2][BK * LDB];
};

template <typename T>
struct ChunkStateAgent {
  using Pol = SsdPolicy<Is16Bit<T>::value>;
  static constexpr int NT = Pol::kThreads, BP = Pol::kStateP, BN = Pol::kStateN, BK = Pol::kStateK;
  static constexpr int LDX = BP + Pol::kPadS, LDB = BN + Pol::kPadS, LDS = BN + Pol::kPadF;
  static constexpr bool kTC = MK_SSD_TENSOR_CORES && Is16Bit<T>::value;
  static constexpr bool kMma = MK_SSD_MMA && Is16Bit<T>::value;
  static constexpr int kNT = BN / 8;
  static_assert(2 * NT >= kMaxChunk, "the scan takes two steps a thread");
  static_assert(!kMma || (BP == 16 * (NT / 32) && BK % 16 == 0 && BN % 16 == 0), "a 16-channel strip per warp");
  using Acc = typename std::conditional<kMma, MmaAcc<kNT>, TileAcc<T, BP, BN, NT, kTC>>::type;

  struct Smem {
    alignas(32) float dt[kMaxChunk];
    alignas(32) float cs[kMaxChunk];
    alignas(32) float w[kMaxChunk];  // exp(cs_last - cs_t) dt_t, 0 where masked
    StateTiles<T, BP, BN, BK, LDX, LDB, LDS, kMma> tl;
    float warp_sum[NT / 32];
    int masked;  // some step of the chunk has w = 0 (its B row must not enter the product)
  };

  const SsdFwdParams& p;
  Smem& sm;
  ChunkCoords at;
  int64_t p0, n0;
  // The steps [lo, hi) of the chunk the state sums (the whole chunk, or a sequence's part of it
  // for the varlen states); their last step's running sum is the reference of the decays.
  int lo = 0, hi = 0;

  __device__ __forceinline__ ChunkStateAgent(const SsdFwdParams& params, Smem& smem, const ChunkCoords& coords)
      : p(params), sm(smem), at(coords) {
    const int64_t ntiles = (p.dstate + BN - 1) / BN;
    p0 = int64_t(blockIdx.y) / ntiles * BP;
    n0 = int64_t(blockIdx.y) % ntiles * BN;
    hi = at.Lc;
  }

  // dt_t and the inclusive running sum of dt_t A over the chunk (0 and flat past its end).
  __device__ __forceinline__ void discretise() {
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const float A = load_as_float(p.A.ptr, p.A.dtype, at.h * p.A.s0);
    const float bias = p.dt_bias.ptr ? load_as_float(p.dt_bias.ptr, p.dt_bias.dtype, at.h * p.dt_bias.s0) : 0.0f;
    float a[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int t = 2 * tid + i;
      float d = 0.0f;
      if (t < at.Lc) {
        d = load_as_float(p.dt.ptr, p.dt.dtype, at.b * p.dt.s0 + (at.c0 + t) * p.dt.s1 + at.h * p.dt.s2) + bias;
        if (p.dt_softplus) d = softplus_dt(d);
        d = clamp_dt(d, p.dt_lo, p.dt_hi);
      }
      if (t < kMaxChunk) sm.dt[t] = d;
      a[i] = t < at.Lc ? d * A : 0.0f;
    }
    a[1] += a[0];
    float run = a[1];  // inclusive warp scan of the threads' pair sums
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const float up = __shfl_up_sync(0xffffffffu, run, off);
      if (lane >= off) run += up;
    }
    if (lane == 31) sm.warp_sum[warp] = run;
    __syncthreads();
    float before = run - a[1];
    for (int w = 0; w < warp; ++w) before += sm.warp_sum[w];
    if (2 * tid < kMaxChunk) sm.cs[2 * tid] = before + a[0];
    if (2 * tid + 1 < kMaxChunk) sm.cs[2 * tid + 1] = before + a[1];
    __syncthreads();
  }

  // The first tile's block writes dt_out and dA_cumsum.
  __device__ __forceinline__ void store_discretised() {
    if (blockIdx.y != 0) return;
    const int64_t base = ((at.b * p.nheads + at.h) * p.nchunks + at.c) * p.chunk;
    for (int t = threadIdx.x; t < int(p.chunk); t += NT) {
      p.dt_out[base + t] = sm.dt[t];
      p.dA_cumsum[base + t] = sm.cs[t];
    }
  }

  // The varlen states' form of discretise: the chunk's dt and running sums as kernel 1 stored them.
  __device__ __forceinline__ void load_discretised() {
    const int64_t base = ((at.b * p.nheads + at.h) * p.nchunks + at.c) * p.chunk;
    for (int t = threadIdx.x; t < at.Lc; t += NT) {
      sm.dt[t] = p.dt_out[base + t];
      sm.cs[t] = p.dA_cumsum[base + t];
    }
    __syncthreads();
  }

  // The step weights exp(cs_last - cs_t) dt_t over [lo, hi); 0 elsewhere and, with seq_idx
  // (the chunk states), for steps of another sequence than the last one's.
  __device__ __forceinline__ void weights(bool by_seq) {
    const float cs_last = sm.cs[hi - 1];
    int32_t seq_last = 0;
    by_seq = by_seq && p.seq_idx != nullptr;
    if (by_seq) seq_last = p.seq_idx[at.b * p.seq_s0 + (at.c0 + hi - 1) * p.seq_s1];
    for (int t = threadIdx.x; t < kMaxChunk; t += NT) {  // to the last step-block's end: 0 past the chunk
      bool keep = lo <= t && t < hi;
      if (keep && by_seq) keep = p.seq_idx[at.b * p.seq_s0 + (at.c0 + t) * p.seq_s1] == seq_last;
      sm.w[t] = keep ? expf(cs_last - sm.cs[t]) * sm.dt[t] : 0.0f;
    }
    if constexpr (kMma) {
      int zero = 0;
      for (int t = threadIdx.x; t < at.Lc; t += NT) zero |= sm.w[t] == 0.0f ? 1 : 0;
      zero = __syncthreads_or(zero);
      if (threadIdx.x == 0) sm.masked = zero;
    }
    __syncthreads();
  }

  // Steps k0..k0+BK: x w and B into shared memory (0 past the chunk, the tile, or where w is 0:
  // a masked step's NaN stays out of the product).
  __device__ __forceinline__ void load(int k0) {
    const T* x = tptr<T>(p.x);
    const T* B = tptr<T>(p.B);
    const int rows = hi - k0;
    const float* w = sm.w + k0;
    auto weight = [w](int t) { return w[t]; };
    auto live = [w](int t) { return w[t] != 0.0f ? 1.0f : 0.0f; };  // B masked, not scaled
    auto x_row = [&](int t) {
      return x + at.b * p.x.s0 + (at.c0 + k0 + t) * p.x.s1 + at.h * p.x.s2 + p0 * p.x.s3;
    };
    auto b_row = [&](int t) {
      return B + at.b * p.B.s0 + (at.c0 + k0 + t) * p.B.s1 + at.g * p.B.s2 + n0 * p.B.s3;
    };
    if constexpr (!kMma) {
      load_tile<BK, BP, NT, true, T, T>(sm.tl.xs, LDX, x_row, weight, rows, int(p.headdim - p0), p.x.s3, p.x.vec16);
      load_tile<BK, BN, NT, true, T, T>(sm.tl.bs, LDB, b_row, live, rows, int(p.dstate - n0), p.B.s3, p.B.vec16);
    }
  }

  __device__ __forceinline__ void state(Acc& acc) {
    if constexpr (kMma) {
      state_mma(acc);
    } else {
      acc.zero();
      for (int k0 = lo / BK * BK; k0 < hi; k0 += BK) {
        load(k0);
        __syncthreads();
        acc.template mma<false, true>(sm.tl.xs, LDX, sm.tl.bs, LDB, BK, false);
        __syncthreads();
      }
    }
  }

#if MK_SSD_MMA
  // Steps k0.. of raw x and B into buffer buf, asynchronously (0 past the chunk or the tile).
  __device__ __forceinline__ void stage_mma(int k0, int buf) {
    auto x_row = [&](int t) {
      return tptr<T>(p.x) + at.b * p.x.s0 + (at.c0 + k0 + t) * p.x.s1 + at.h * p.x.s2 + p0 * p.x.s3;
    };
    auto b_row = [&](int t) {
      return tptr<T>(p.B) + at.b * p.B.s0 + (at.c0 + k0 + t) * p.B.s1 + at.g * p.B.s2 + n0 * p.B.s3;
    };
    const int rows = at.Lc - k0;
    mma::stage_async<BK, BP, NT>(sm.tl.xs[buf], LDX, x_row, rows, int(p.headdim - p0), p.x.s3, p.x.vec16);
    mma::stage_async<BK, BN, NT>(sm.tl.bs[buf], LDB, b_row, rows, int(p.dstate - n0), p.B.s3, p.B.vec16);
    mma::cp_async_commit();
  }

  // acc = sum over the steps of (x w)^T B: the A fragments from x (step-major, so transposed by
  // ldmatrix) scaled by w in registers, the B fragments from B; buffers one step-block ahead.
  __device__ __forceinline__ void state_mma(Acc& acc) {
    const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc.v[j][0] = acc.v[j][1] = acc.v[j][2] = acc.v[j][3] = 0.0f;
    const int first = lo / BK * BK;
    if (first < hi) stage_mma(first, 0);
    for (int k0 = first, i = 0; k0 < hi; k0 += BK, ++i) {
      const int buf = i % 2;
      mma::cp_async_wait<0>();
      __syncthreads();  // buf landed; every warp is done with buf ^ 1
      if (k0 + BK < hi) stage_mma(k0 + BK, buf ^ 1);
      T* bs = sm.tl.bs[buf];
      if (sm.masked) {  // a B row whose step is masked is 0 (a NaN there must not meet w = 0)
        for (int e = threadIdx.x; e < BK * BN; e += NT) {
          const int t = e / BN;
          if (k0 + t < at.Lc && sm.w[k0 + t] == 0.0f) bs[t * LDB + e % BN] = from_float<T>(0.0f);
        }
        __syncthreads();
      }
      const T* xs = sm.tl.xs[buf];
#pragma unroll
      for (int kk = 0; kk < BK; kk += 16) {
        uint32_t a[4];
        mma::ldsm_x4_t(a, xs + (kk + lane % 8 + lane / 16 * 8) * LDX + 16 * warp + lane / 8 % 2 * 8);
        const float* w = sm.w + k0 + kk + lane % 4 * 2;
        a[0] = mma::scale2<T>(a[0], w[0], w[1]);
        a[1] = mma::scale2<T>(a[1], w[0], w[1]);
        a[2] = mma::scale2<T>(a[2], w[8], w[9]);
        a[3] = mma::scale2<T>(a[3], w[8], w[9]);
#pragma unroll
        for (int jp = 0; jp < kNT / 2; ++jp) {
          uint32_t b[4];
          mma::ldsm_x4_t(b, bs + (kk + lane % 16) * LDB + 16 * jp + lane / 16 * 8);
          mma::mma16816<T>(acc.v[2 * jp], a, b[0], b[1]);
          mma::mma16816<T>(acc.v[2 * jp + 1], a, b[2], b[3]);
        }
      }
    }
  }
#else
  __device__ __forceinline__ void state_mma(Acc&) {}
#endif

  // The tile, plus decay * H[p, n] of a state (fp32, rows of dstate) when H is given, into dst
  // (fp32, rows of dstate).
  __device__ __forceinline__ void store(const Acc& acc, float* dst, const float* H, float decay) {
    if constexpr (kMma) {
      store_mma(acc, dst, H, decay);
    } else {
      acc.store(sm.tl.stage, LDS);
      __syncthreads();
      for (int i = threadIdx.x; i < BP * BN; i += NT) {
        const int pp = i / BN, n = i % BN;
        if (p0 + pp < p.headdim && n0 + n < p.dstate) {
          const int64_t e = (p0 + pp) * p.dstate + n0 + n;
          float v = sm.tl.stage[pp * LDS + n];
          if (H) v += decay * H[e];
          dst[e] = v;
        }
      }
    }
  }

  // store's mma.sync form, from the accumulators: channel 16w + lane / 4 (and 8 below), state
  // columns 8j + 2 (lane % 4) and the next.
  __device__ __forceinline__ void store_mma(const Acc& acc, float* dst, const float* H, float decay) {
    if constexpr (kMma) {
      const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int64_t pp = p0 + 16 * warp + lane / 4 + 8 * i;
        if (pp >= p.headdim) continue;
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int64_t n = n0 + 8 * j + lane % 4 * 2 + e;
            if (n >= p.dstate) continue;
            float v = acc.v[j][2 * i + e];
            if (H) v += decay * H[pp * p.dstate + n];
            dst[pp * p.dstate + n] = v;
          }
        }
      }
    }
  }
};

template <typename T>
__global__ void __launch_bounds__(SsdPolicy<Is16Bit<T>::value>::kThreads)
    chunk_state_kernel(const SsdFwdParams p) {
  using Agent = ChunkStateAgent<T>;
  __shared__ typename Agent::Smem sm;
  Agent agent(p, sm, ChunkCoords(p));
  agent.discretise();
  agent.store_discretised();
  agent.weights(true);
  typename Agent::Acc acc;
  agent.state(acc);
  const int64_t PN = p.headdim * p.dstate;
  agent.store(acc, p.states + ((agent.at.b * p.nchunks + agent.at.c) * p.nheads + agent.at.h) * PN, nullptr, 0.0f);
}

// The final state of each sequence of a packed batch (cu_seqlens, batch 1): per (head, state
// tile, sequence), the sequence's steps in its last chunk summed like a chunk state, plus the
// state entering that chunk, decayed, when the sequence began before the chunk (or is the first
// sequence starting at step 0, which owns the initial state). Runs after state_pass_kernel. An empty sequence's
// state is 0; offsets are clamped into [0, seqlen].
template <typename T>
__global__ void __launch_bounds__(SsdPolicy<Is16Bit<T>::value>::kThreads)
    varlen_state_kernel(const SsdFwdParams p) {
  using Agent = ChunkStateAgent<T>;
  __shared__ typename Agent::Smem sm;
  const int64_t i = blockIdx.z;
  auto offset = [&](int64_t k) {
    int64_t v = p.cu_seqlens_64 ? static_cast<const int64_t*>(p.cu_seqlens)[k * p.cu_s0]
                                : int64_t(static_cast<const int32_t*>(p.cu_seqlens)[k * p.cu_s0]);
    return v < 0 ? int64_t(0) : (v > p.seqlen ? p.seqlen : v);
  };
  const int64_t start = offset(i);
  int64_t end = offset(i + 1);
  end = end < start ? start : end;
  const int64_t PN = p.headdim * p.dstate;
  float* dst = p.varlen_states + (i * p.nheads + int64_t(blockIdx.x)) * PN;
  if (end == start) {
    const int64_t ntiles = (p.dstate + Agent::BN - 1) / Agent::BN;
    const int64_t p0 = int64_t(blockIdx.y) / ntiles * Agent::BP, n0 = int64_t(blockIdx.y) % ntiles * Agent::BN;
    for (int k = threadIdx.x; k < Agent::BP * Agent::BN; k += Agent::NT) {
      const int64_t pp = p0 + k / Agent::BN, n = n0 + k % Agent::BN;
      if (pp < p.headdim && n < p.dstate) dst[pp * p.dstate + n] = 0.0f;
    }
    return;
  }
  const int64_t c = (end - 1) / p.chunk;
  Agent agent(p, sm, ChunkCoords(p, 0, c));
  agent.lo = int(start > agent.at.c0 ? start - agent.at.c0 : 0);
  agent.hi = int(end - agent.at.c0);
  agent.load_discretised();
  agent.weights(false);
  typename Agent::Acc acc;
  agent.state(acc);
  const bool carry = start < agent.at.c0 || (i == 0 && start == 0);  // the initial state is sequence 0's
  const float* H = carry ? p.states + (c * p.nheads + agent.at.h) * PN : nullptr;
  agent.store(acc, dst, H, expf(sm.cs[agent.hi - 1]));
}

// ---------------------------------------------------------------------------- state passing

// kV consecutive state elements of a (batch, head) a thread, the chunks in sequence, kDepth at
// a time: the batch's chunk states and decays are all loaded before the first is used.
template <int kV>
struct StatePassAgent {
  static constexpr int NT = SsdPassPolicy::kThreads, kDepth = SsdPassPolicy::kDepth;
  const SsdFwdParams& p;
  int64_t b, h, e, PN;

  __device__ __forceinline__ explicit StatePassAgent(const SsdFwdParams& params) : p(params) {
    PN = p.headdim * p.dstate;
    e = (int64_t(blockIdx.x) * NT + threadIdx.x) * kV;
    h = blockIdx.y;
    b = blockIdx.z;
  }

  __device__ __forceinline__ void load_initial(Lanes<kV>& H) const {
    H.fill(0.0f);
    if (!p.init.ptr) return;
#pragma unroll
    for (int i = 0; i < kV; ++i) {
      const int64_t pp = (e + i) / p.dstate, n = (e + i) % p.dstate;
      H.v[i] = load_as_float(p.init.ptr, p.init.dtype, b * p.init.s0 + h * p.init.s1 + pp * p.init.s2 + n * p.init.s3);
    }
  }

  // The sequence id of chunk c's last step (0 without seq_idx).
  __device__ __forceinline__ int32_t seq_last(int64_t c) const {
    if (!p.seq_idx) return 0;
    int64_t last = (c + 1) * p.chunk;
    last = (last < p.seqlen ? last : p.seqlen) - 1;
    return p.seq_idx[b * p.seq_s0 + last * p.seq_s1];
  }

  // states[c] holds S_c on entry and H_c on exit.
  __device__ __forceinline__ void run() {
    if (e >= PN) return;
    Lanes<kV> H;
    load_initial(H);
    int32_t seq_prev = 0;
    const int64_t cs_base = (b * p.nheads + h) * p.nchunks * p.chunk + p.chunk - 1;
    const int64_t stride = p.nheads * PN;  // from one chunk's state to the next
    float* base = p.states + (b * p.nchunks * p.nheads + h) * PN + e;
    for (int64_t c0 = 0; c0 < p.nchunks; c0 += kDepth) {
      Lanes<kV> S[kDepth];
      float decay[kDepth];
      int32_t seq[kDepth];
#pragma unroll
      for (int k = 0; k < kDepth; ++k) {
        if (c0 + k < p.nchunks) {
          S[k].load(base + (c0 + k) * stride);
          decay[k] = p.dA_cumsum[cs_base + (c0 + k) * p.chunk];
          seq[k] = seq_last(c0 + k);
        }
      }
#pragma unroll
      for (int k = 0; k < kDepth; ++k) {
        if (c0 + k >= p.nchunks) break;
        H.store(base + (c0 + k) * stride);
        const bool keep = seq[k] == seq_prev;  // no decay across a change of sequence
        seq_prev = seq[k];
        const float d = expf(decay[k]);
#pragma unroll
        for (int i = 0; i < kV; ++i) H.v[i] = keep ? d * H.v[i] + S[k].v[i] : S[k].v[i];
      }
    }
    if (p.final_states) H.store(p.final_states + (b * p.nheads + h) * PN + e);
  }
};

template <int kV>
__global__ void __launch_bounds__(SsdPassPolicy::kThreads) state_pass_kernel(const SsdFwdParams p) {
  StatePassAgent<kV>(p).run();
}

// ------------------------------------------------------------------------------ C B^T tiles

// C_t . B_s of one chunk and group, for one (t-tile, s-tile) pair at or below the diagonal:
// what every head of the group reads in chunk_scan_kernel instead of computing it again.
template <typename T>
struct ChunkCbAgent {
  using Pol = SsdPolicy<Is16Bit<T>::value>;
  static constexpr int NT = Pol::kThreads, BT = Pol::kScanT, BS = BT, BK = Pol::kScanK;
  static constexpr int LDK = BK + Pol::kPadS, LDS = BS + Pol::kPadF;
  static constexpr bool kTC = MK_SSD_TENSOR_CORES && Is16Bit<T>::value;
  using Acc = TileAcc<T, BT, BS, NT, kTC>;

  struct Smem {
    alignas(32) T c[BT * LDK];
    alignas(32) T b[BS * LDK];
    alignas(32) float stage[BT * LDS];
  };

  const SsdFwdParams& p;
  Smem& sm;
  int64_t b, g, c, c0;
  int Lc, t0, s0;

  __device__ __forceinline__ ChunkCbAgent(const SsdFwdParams& params, Smem& smem) : p(params), sm(smem) {
    const int ttiles = int((p.chunk + BT - 1) / BT);
    t0 = int(blockIdx.x) / ttiles * BT;
    s0 = int(blockIdx.x) % ttiles * BS;
    g = blockIdx.y;
    b = int64_t(blockIdx.z) / p.nchunks;
    c = int64_t(blockIdx.z) % p.nchunks;
    c0 = c * p.chunk;
    const int64_t left = p.seqlen - c0;
    Lc = int(left < p.chunk ? left : p.chunk);
  }

  __device__ __forceinline__ bool active() const { return s0 <= t0 && t0 < Lc; }

  __device__ __forceinline__ void product(Acc& acc) {
    const T* C = tptr<T>(p.C);
    const T* B = tptr<T>(p.B);
    acc.zero();
    for (int k0 = 0; k0 < p.dstate; k0 += BK) {
      auto c_row = [&](int t) { return C + b * p.C.s0 + (c0 + t0 + t) * p.C.s1 + g * p.C.s2 + k0 * p.C.s3; };
      auto b_row = [&](int s) { return B + b * p.B.s0 + (c0 + s0 + s) * p.B.s1 + g * p.B.s2 + k0 * p.B.s3; };
      load_tile<BT, BK, NT, false, T, T>(sm.c, LDK, c_row, One{}, Lc - t0, int(p.dstate - k0), p.C.s3, p.C.vec16);
      load_tile<BS, BK, NT, false, T, T>(sm.b, LDK, b_row, One{}, Lc - s0, int(p.dstate - k0), p.B.s3, p.B.vec16);
      __syncthreads();
      acc.template mma<true, false>(sm.c, LDK, sm.b, LDK, BK, false);
      __syncthreads();
    }
  }

  // The entries inside the chunk (t, s < Lc); the rest of the workspace is never read.
  __device__ __forceinline__ void store(const Acc& acc) {
    acc.store(sm.stage, LDS);
    __syncthreads();
    const int64_t L = p.chunk;
    float* dst = p.cb + ((b * p.nchunks + c) * p.ngroups + g) * L * L;
    for (int i = threadIdx.x; i < BT * BS; i += NT) {
      const int t = i / BS, s = i % BS;
      if (t0 + t < Lc && s0 + s < Lc) dst[(t0 + t) * L + s0 + s] = sm.stage[t * LDS + s];
    }
  }
};

template <typename T>
__global__ void __launch_bounds__(SsdPolicy<Is16Bit<T>::value>::kThreads) chunk_cb_kernel(const SsdFwdParams p) {
  using Agent = ChunkCbAgent<T>;
  __shared__ typename Agent::Smem sm;
  Agent agent(p, sm);
  if (!agent.active()) return;  // above the diagonal or past the last chunk's end (uniform)
  typename Agent::Acc acc;
  agent.product(acc);
  agent.store(acc);
}

// ------------------------------------------------------------------------------- chunk scan

// The chunk's dt, running sums and sequence ids (written by chunk_state_kernel) into shared
// memory (the caller publishes them with a barrier); returns the sequence id before the chunk.
template <int NT>
__device__ __forceinline__ int32_t load_chunk_steps(const SsdFwdParams& p, const ChunkCoords& at, float* cs, float* dt,
                                                    int32_t* seq) {
  const int64_t base = ((at.b * p.nheads + at.h) * p.nchunks + at.c) * p.chunk;
  for (int t = threadIdx.x; t < at.Lc; t += NT) {
    cs[t] = p.dA_cumsum[base + t];
    dt[t] = p.dt_out[base + t];
    if (p.seq_idx) seq[t] = p.seq_idx[at.b * p.seq_s0 + (at.c0 + t) * p.seq_s1];
  }
  return p.seq_idx && at.c > 0 ? p.seq_idx[at.b * p.seq_s0 + (at.c0 - 1) * p.seq_s1] : 0;
}

// The output tile of a chunk-scan block: its first step t0 (the last tiles of a chunk first: they
// sum the most s-blocks, a shorter tail of the grid) and first channel p0.
template <int BT, int BP>
__device__ __forceinline__ void scan_tile(const SsdFwdParams& p, int& t0, int64_t& p0) {
  const int64_t ptiles = (p.headdim + BP - 1) / BP;
  const int64_t ttiles = (p.chunk + BT - 1) / BT;
  t0 = int(ttiles - 1 - int64_t(blockIdx.y) / ptiles) * BT;
  p0 = int64_t(blockIdx.y) % ptiles * BP;
}

template <typename T>
struct ChunkScanAgent {
  using Pol = SsdPolicy<Is16Bit<T>::value>;
  static constexpr int NT = Pol::kThreads, BT = Pol::kScanT, BP = Pol::kScanP, BK = Pol::kScanK;
  static constexpr int BS = BT;  // s-blocks match t-tiles, so the diagonal block is one s-block
  static constexpr int LDK = BK + Pol::kPadS;  // C (step-major) and H (channel-major) rows
  static constexpr int LDM = BS + Pol::kPadS;  // M rows
  static constexpr int LDX = BP + Pol::kPadS;  // x rows
  static constexpr int LDS = BP + Pol::kPadF;  // the fp32 staging tile (y, then G's tiles)
  static constexpr bool kTC = MK_SSD_TENSOR_CORES && Is16Bit<T>::value;
  static_assert(BS <= BP, "G is staged in y's tile");
  using AccY = TileAcc<T, BT, BP, NT, kTC>;

  static constexpr int cmax(int a, int b) { return a > b ? a : b; }
  static constexpr int kBufA = cmax(BT * LDK, BT * LDM);  // C, then M
  static constexpr int kBufB = cmax(BP * LDK, BS * LDX);  // H, then x

  struct Smem {
    alignas(32) float cs[kMaxChunk];
    alignas(32) float dt[kMaxChunk];
    alignas(32) int32_t seq[kMaxChunk];
    alignas(32) T a[kBufA];
    alignas(32) T b[kBufB];
    alignas(32) float stage[BT * LDS];
  };

  const SsdFwdParams& p;
  Smem& sm;
  ChunkCoords at;
  int t0;  // the tile's first step in the chunk
  int64_t p0;
  int32_t seq_prev = 0;
  // The diagonal s-block went through the strictly causal product (x not all finite there), so
  // its 16 x 16 diagonal blocks are added by finish() (uniform over the block).
  bool split_diagonal = false;

  __device__ __forceinline__ ChunkScanAgent(const SsdFwdParams& params, Smem& smem)
      : p(params), sm(smem), at(params) {
    scan_tile<BT, BP>(p, t0, p0);
  }

  __device__ __forceinline__ bool active() const { return t0 < at.Lc; }

  __device__ __forceinline__ const T* x_at(int s, int64_t pp) const {
    return tptr<T>(p.x) + at.b * p.x.s0 + (at.c0 + s) * p.x.s1 + at.h * p.x.s2 + pp * p.x.s3;
  }

  __device__ __forceinline__ void load_chunk() {
    seq_prev = load_chunk_steps<NT>(p, at, sm.cs, sm.dt, sm.seq);
    __syncthreads();
  }

  // C rows t0.. of state columns k0.. into buffer a (0 outside).
  __device__ __forceinline__ void load_C(int k0) {
    const T* C = tptr<T>(p.C);
    auto c_row = [&](int t) {
      return C + at.b * p.C.s0 + (at.c0 + t0 + t) * p.C.s1 + at.g * p.C.s2 + k0 * p.C.s3;
    };
    load_tile<BT, BK, NT, false, T, T>(sm.a, LDK, c_row, One{}, at.Lc - t0, int(p.dstate - k0), p.C.s3, p.C.vec16);
  }

  // off-chunk: y = exp(cs_t) C_t H_c for the tile's rows (0 across a sequence change).
  __device__ __forceinline__ void off_chunk(AccY& y) {
    y.zero();
    if (at.c == 0 && !p.init.ptr) return;  // H_0 = 0
    const int64_t PN = p.headdim * p.dstate;
    const float* H = p.states + ((at.b * p.nchunks + at.c) * p.nheads + at.h) * PN;
    const bool h_vec = p.dstate % 4 == 0;  // rows of 16-byte pieces (states is ours, contiguous)
    for (int k0 = 0; k0 < p.dstate; k0 += BK) {
      load_C(k0);
      auto h_row = [&](int pp) { return H + (p0 + pp) * p.dstate + k0; };
      load_tile<BP, BK, NT, false, T, float>(sm.b, LDK, h_row, One{}, int(p.headdim - p0), int(p.dstate - k0), 1,
                                             h_vec);
      __syncthreads();
      y.template mma<true, false>(sm.a, LDK, sm.b, LDK, BK, false);
      __syncthreads();
    }
    y.store(sm.stage, LDS);
    __syncthreads();
    for (int i = threadIdx.x; i < BT * BP; i += NT) {
      const int t = i / BP, pp = i % BP;
      const int s = t0 + t;
      const bool keep = s < at.Lc && (!p.seq_idx || sm.seq[s] == seq_prev);
      float& v = sm.stage[t * LDS + pp];
      v = keep ? v * expf(sm.cs[s]) : 0.0f;
    }
    __syncthreads();
    y.load(sm.stage, LDS);
    __syncthreads();
  }

  // intra-chunk: y += sum over s-blocks up to the diagonal of M x, with G = C B^T read from the
  // workspace chunk_cb_kernel wrote. The diagonal block on tensor cores when its x is all finite;
  // else strictly causal, its M and x left in the buffers for the fix-up.
  __device__ __forceinline__ void intra_chunk(AccY& y) {
    const T zero = from_float<T>(0.0f);
    const int64_t L = p.chunk;
    const float* cb = p.cb + ((at.b * p.nchunks + at.c) * p.ngroups + at.g) * L * L;
    const bool cb_vec = L % 4 == 0;  // rows of 16-byte pieces
    for (int s0 = 0; s0 <= t0; s0 += BS) {
      const bool diag = s0 == t0;
      auto g_row = [&](int t) { return cb + (t0 + t) * L + s0; };
      load_tile<BT, BS, NT, false, float, float>(sm.stage, LDS, g_row, One{}, at.Lc - t0, at.Lc - s0, 1, cb_vec);
      __syncthreads();
      for (int i = threadIdx.x; i < BT * BS; i += NT) {
        const int t = i / BS, s = i % BS;
        const int r = t0 + t, q = s0 + s;
        const bool keep = q <= r && r < at.Lc && (!p.seq_idx || sm.seq[q] == sm.seq[r]);
        sm.a[t * LDM + s] = keep ? from_float<T>(sm.stage[t * LDS + s] * expf(sm.cs[r] - sm.cs[q]) * sm.dt[q]) : zero;
      }
      auto x_row = [&](int s) { return x_at(s0 + s, p0); };
      load_tile<BS, BP, NT, false, T, T>(sm.b, LDX, x_row, One{}, at.Lc - s0, int(p.headdim - p0), p.x.s3, p.x.vec16);
      __syncthreads();
      if (!diag) {
        y.template mma<true, true>(sm.a, LDM, sm.b, LDX, BS, false);
        __syncthreads();
      } else if (AccY::kSplitsDiagonal && tile_finite<BS, BP, NT>(sm.b, LDX)) {
        y.template mma_through<true, true>(sm.a, LDM, sm.b, LDX, BS);  // no fix-up: x finite
      } else {
        y.template mma<true, true>(sm.a, LDM, sm.b, LDX, BS, true);
        split_diagonal = AccY::kSplitsDiagonal;
      }
    }
  }

  // y into the staging tile, with the diagonal 16 x 16 blocks a strictly causal product left out.
  __device__ __forceinline__ void finish(const AccY& y) {
    y.store(sm.stage, LDS);
    __syncthreads();
    if (split_diagonal) {
      for (int i = threadIdx.x; i < BT * BP; i += NT) {
        const int t = i / BP, pp = i % BP;
        float acc = 0.0f;
        for (int s = t / 16 * 16; s <= t; ++s) acc += to_float(sm.a[t * LDM + s]) * to_float(sm.b[s * LDX + pp]);
        sm.stage[t * LDS + pp] += acc;
      }
      __syncthreads();
    }
  }

  // out_x = y + D x; out = out_x silu(z) (out_x written only with z).
  __device__ __forceinline__ void store() {
    T* out = static_cast<T*>(p.out);
    T* out_x = static_cast<T*>(p.out_x);
    for (int i = threadIdx.x; i < BT * BP; i += NT) {
      const int t = i / BP, pp = i % BP;
      const int s = t0 + t;
      const int64_t ch = p0 + pp;
      if (s >= at.Lc || ch >= p.headdim) continue;
      float v = sm.stage[t * LDS + pp];
      if (p.D.ptr) v += load_as_float(p.D.ptr, p.D.dtype, at.h * p.D.s0 + ch * p.D.s1) * to_float(*x_at(s, ch));
      const int64_t l = at.c0 + s;
      if (p.z.ptr) {
        out_x[at.b * p.outx_s0 + l * p.outx_s1 + at.h * p.outx_s2 + ch * p.outx_s3] = from_float<T>(v);
        const T zv = tptr<T>(p.z)[at.b * p.z.s0 + l * p.z.s1 + at.h * p.z.s2 + ch * p.z.s3];
        v *= silu_exact(to_float(zv));
      }
      out[at.b * p.out_s0 + l * p.out_s1 + at.h * p.out_s2 + ch * p.out_s3] = from_float<T>(v);
    }
  }
};

#if MK_SSD_MMA
// chunk_scan for 16-bit inputs on sm_80 and later, on mma.sync with fragments whose layout is
// fixed (ssd_mma.cuh): the decayed M = C B^T exp(cs_t - cs_s) dt_s is built in registers as the
// A operand straight from the workspace (never stored to shared memory), the off-chunk rows are
// scaled by exp(cs_t) in the accumulators, x tiles arrive by cp.async one s-block ahead, and the
// store reads its accumulators in place. Same tiles (SsdPolicy<true>), same math and the same
// NaN rule as ChunkScanAgent: a masked entry of M is an exact 0 by a select, and the diagonal
// 16 x 16 block goes through the tensor cores only when the warp's x rows there are finite;
// otherwise its terms s <= t are added one by one.
template <typename T>
struct ChunkScanMmaAgent {
  using Pol = SsdPolicy<true>;
  static constexpr int NT = Pol::kThreads, BT = Pol::kScanT, BP = Pol::kScanP, BK = Pol::kScanK, BS = BT;
  static constexpr int LDK = BK + Pol::kPadS;  // C and H rows (16-byte multiples: ldmatrix rows)
  static constexpr int LDX = BP + Pol::kPadS;  // x rows
  static constexpr int kNT = BP / 8;           // 8-channel accumulator tiles of a warp's 16 rows
  static constexpr int V = 8;                  // 16-bit elements a 16-byte piece
  static_assert(BT == 16 * (NT / 32) && BP % 16 == 0 && BK % 16 == 0, "a 16-row strip per warp");

  struct Smem {
    alignas(16) float cs[kMaxChunk];
    alignas(16) float dt[kMaxChunk];
    alignas(16) int32_t seq[kMaxChunk];
    alignas(16) T c[BT * LDK];
    alignas(16) T h[BP * LDK];
    alignas(16) T x[2][BS * LDX];
  };

  const SsdFwdParams& p;
  Smem& sm;
  ChunkCoords at;
  int t0, lane, warp;
  int64_t p0;
  int row[2];  // the thread's accumulator rows in the chunk: t0 + 16 warp + lane / 4, and 8 below
  int32_t seq_prev = 0;
  float acc[kNT][4];

  __device__ __forceinline__ ChunkScanMmaAgent(const SsdFwdParams& params, Smem& smem)
      : p(params), sm(smem), at(params) {
    scan_tile<BT, BP>(p, t0, p0);
    lane = int(threadIdx.x) % 32;
    warp = int(threadIdx.x) / 32;
    row[0] = t0 + 16 * warp + lane / 4;
    row[1] = row[0] + 8;
  }

  __device__ __forceinline__ bool active() const { return t0 < at.Lc; }

  __device__ __forceinline__ const T* x_at(int s, int64_t pp) const {
    return tptr<T>(p.x) + at.b * p.x.s0 + (at.c0 + s) * p.x.s1 + at.h * p.x.s2 + pp * p.x.s3;
  }

  __device__ __forceinline__ void load_x(int s0, int buf) {
    auto x_row = [&](int s) { return x_at(s0 + s, p0); };
    mma::stage_async<BS, BP, NT>(sm.x[buf], LDX, x_row, at.Lc - s0, int(p.headdim - p0), p.x.s3, p.x.vec16);
    mma::cp_async_commit();
  }

  __device__ __forceinline__ void load_chunk() { seq_prev = load_chunk_steps<NT>(p, at, sm.cs, sm.dt, sm.seq); }

  // off-chunk: acc = exp(cs_t) C_t H_c (0 across a sequence change), the state in BK-column slices.
  __device__ __forceinline__ void off_chunk() {
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    if (at.c == 0 && !p.init.ptr) return;  // H_0 = 0
    const int64_t PN = p.headdim * p.dstate;
    const float* H = p.states + ((at.b * p.nchunks + at.c) * p.nheads + at.h) * PN;
    const bool h_vec = p.dstate % 4 == 0;  // 16-byte pieces (states is ours, contiguous)
    for (int k0 = 0; k0 < p.dstate; k0 += BK) {
      auto c_row = [&](int t) {
        return tptr<T>(p.C) + at.b * p.C.s0 + (at.c0 + t0 + t) * p.C.s1 + at.g * p.C.s2 + k0 * p.C.s3;
      };
      mma::stage_async<BT, BK, NT>(sm.c, LDK, c_row, at.Lc - t0, int(p.dstate - k0), p.C.s3, p.C.vec16);
      mma::cp_async_commit();
      mma::stage_f32_as<BP, BK, NT>(sm.h, LDK, [&](int pp) { return H + (p0 + pp) * p.dstate + k0; },
                                    int(p.headdim - p0), int(p.dstate - k0), h_vec);
      mma::cp_async_wait<0>();
      __syncthreads();
      mma::rows_times_rows<T, kNT, BK>(acc, sm.c + 16 * warp * LDK, LDK, sm.h, LDK);
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int t = row[i];
      const bool keep = t < at.Lc && (!p.seq_idx || sm.seq[t] == seq_prev);
      const float e = keep ? expf(sm.cs[t]) : 0.0f;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        acc[j][2 * i] = keep ? acc[j][2 * i] * e : 0.0f;
        acc[j][2 * i + 1] = keep ? acc[j][2 * i + 1] * e : 0.0f;
      }
    }
  }

  // G[t, s..s+1] of the workspace row t for s <= t (0 where s > t).
  __device__ __forceinline__ float2 g_pair(const float* g_row, int s, int t, bool even_L) const {
    float2 v = make_float2(0.0f, 0.0f);
    if (s > t) return v;
    if (even_L) return *reinterpret_cast<const float2*>(g_row + s);  // s even, s + 1 <= t < L
    v.x = g_row[s];
    if (s + 1 <= t) v.y = g_row[s + 1];
    return v;
  }

  // M[t, s] = G exp(cs_t - cs_s) dt_s for s <= t in the chunk and the same sequence, else 0.
  __device__ __forceinline__ float m_entry(float g, int t, float cs_t, int s) const {
    const bool keep = s <= t && t < at.Lc && (!p.seq_idx || sm.seq[s] == sm.seq[t]);
    return keep ? g * __expf(cs_t - sm.cs[s]) * sm.dt[s] : 0.0f;
  }

  // The A fragment of M for the warp's rows and the 16 steps from s16.
  __device__ __forceinline__ void m_fragment(uint32_t (&a)[4], const float* cb, int s16) const {
    const int s = s16 + lane % 4 * 2;
    const bool even_L = p.chunk % 2 == 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int t = row[i];
      const bool live = t < at.Lc;
      const float* g_row = cb + int64_t(t) * p.chunk;
      const float cs_t = live ? sm.cs[t] : 0.0f;
      const float2 lo = live ? g_pair(g_row, s, t, even_L) : make_float2(0.0f, 0.0f);
      const float2 hi = live ? g_pair(g_row, s + 8, t, even_L) : make_float2(0.0f, 0.0f);
      a[i] = mma::pack2(m_entry(lo.x, t, cs_t, s), m_entry(lo.y, t, cs_t, s + 1), T());
      a[i + 2] = mma::pack2(m_entry(hi.x, t, cs_t, s + 8), m_entry(hi.y, t, cs_t, s + 9), T());
    }
  }

  // Whether the x rows [r0, r0 + 16) of the buffer are all finite (warp-uniform).
  __device__ __forceinline__ bool x_rows_finite(const T* xs, int r0) const {
    bool ok = true;
#pragma unroll
    for (int i = lane; i < 16 * (BP / V); i += 32) {
      const uint4 v = *reinterpret_cast<const uint4*>(xs + (r0 + i / (BP / V)) * LDX + i % (BP / V) * V);
      ok = ok && mma::finite2(v.x, T()) && mma::finite2(v.y, T()) && mma::finite2(v.z, T()) && mma::finite2(v.w, T());
    }
    return __all_sync(0xffffffffu, ok);
  }

  // The warp's diagonal 16 x 16 block when its x is not all finite: exactly the terms s <= t.
  __device__ __forceinline__ void diagonal_exact(const float* cb, const T* xs, int s0, int s16) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int t = row[i];
      if (t >= at.Lc) continue;
      const float cs_t = sm.cs[t];
#pragma unroll 1
      for (int s = s16; s <= t; ++s) {
        if (p.seq_idx && sm.seq[s] != sm.seq[t]) continue;  // a masked term is skipped, never 0 * x
        const float m = m_entry(cb[int64_t(t) * p.chunk + s], t, cs_t, s);
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          const T* xr = xs + (s - s0) * LDX + 8 * j + lane % 4 * 2;
          acc[j][2 * i] += m * to_float(xr[0]);
          acc[j][2 * i + 1] += m * to_float(xr[1]);
        }
      }
    }
  }

  // intra-chunk: acc += sum over s-blocks up to the diagonal of M x; returns the buffer that
  // holds the last (diagonal) s-block's x, the tile's own rows.
  __device__ __forceinline__ int intra_chunk() {
    const float* cb = p.cb + ((at.b * p.nchunks + at.c) * p.ngroups + at.g) * p.chunk * p.chunk;
    const int nblk = t0 / BS + 1;
    for (int i = 0; i < nblk; ++i) {
      const int s0 = i * BS, buf = i % 2;
      mma::cp_async_wait<0>();
      __syncthreads();  // x[buf] landed; every warp is done with x[buf ^ 1]
      if (i + 1 < nblk) load_x(s0 + BS, buf ^ 1);
      const T* xs = sm.x[buf];
      const bool diag = s0 == t0;
      const int ksteps = diag ? warp + 1 : BS / 16;  // the diagonal block: up to the warp's strip
      for (int kk = 0; kk < ksteps; ++kk) {
        if (diag && kk == warp && !x_rows_finite(xs, 16 * kk)) {
          diagonal_exact(cb, xs, s0, s0 + 16 * kk);
          continue;
        }
        uint32_t a[4];
        m_fragment(a, cb, s0 + 16 * kk);
#pragma unroll
        for (int jp = 0; jp < kNT / 2; ++jp) {
          uint32_t b[4];
          mma::ldsm_x4_t(b, xs + (16 * kk + lane % 16) * LDX + 16 * jp + lane / 16 * 8);
          mma::mma16816<T>(acc[2 * jp], a, b[0], b[1]);
          mma::mma16816<T>(acc[2 * jp + 1], a, b[2], b[3]);
        }
      }
    }
    return (nblk - 1) % 2;
  }

  // out_x = y + D x; out = out_x silu(z) (out_x written only with z). x from the diagonal tile.
  __device__ __forceinline__ void store(int buf) {
    T* out = static_cast<T*>(p.out);
    T* out_x = static_cast<T*>(p.out_x);
    const T* xs = sm.x[buf];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int t = row[i];
      if (t >= at.Lc) continue;
      const int64_t l = at.c0 + t;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int cc = 8 * j + lane % 4 * 2 + e;
          const int64_t ch = p0 + cc;
          if (ch >= p.headdim) continue;
          float v = acc[j][2 * i + e];
          if (p.D.ptr) v += load_as_float(p.D.ptr, p.D.dtype, at.h * p.D.s0 + ch * p.D.s1) * to_float(xs[(t - t0) * LDX + cc]);
          if (p.z.ptr) {
            out_x[at.b * p.outx_s0 + l * p.outx_s1 + at.h * p.outx_s2 + ch * p.outx_s3] = from_float<T>(v);
            v *= silu_exact(to_float(tptr<T>(p.z)[at.b * p.z.s0 + l * p.z.s1 + at.h * p.z.s2 + ch * p.z.s3]));
          }
          out[at.b * p.out_s0 + l * p.out_s1 + at.h * p.out_s2 + ch * p.out_s3] = from_float<T>(v);
        }
      }
    }
  }
};
#endif

template <typename T>
__global__ void __launch_bounds__(SsdPolicy<Is16Bit<T>::value>::kThreads)
    chunk_scan_kernel(const SsdFwdParams p) {
#if MK_SSD_MMA
  if constexpr (Is16Bit<T>::value) {
    using Agent = ChunkScanMmaAgent<T>;
    __shared__ typename Agent::Smem sm;
    Agent agent(p, sm);
    if (!agent.active()) return;  // a tile past the end of the last chunk (uniform per block)
    agent.load_x(0, 0);           // the first s-block's x, in flight during the off-chunk product
    agent.load_chunk();
    agent.off_chunk();            // its barriers also publish load_chunk's values
    agent.store(agent.intra_chunk());
  } else
#endif
  {
    using Agent = ChunkScanAgent<T>;
    __shared__ typename Agent::Smem sm;
    Agent agent(p, sm);
    if (!agent.active()) return;  // a tile past the end of the last chunk (uniform per block)
    agent.load_chunk();
    typename Agent::AccY y;
    agent.off_chunk(y);
    agent.intra_chunk(y);
    agent.finish(y);
    agent.store();
  }
}

// --------------------------------------------------------------------------------- launcher

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// states_only: the backward's recomputation, chunk_cb, chunk_state and state_pass (no outputs).
template <typename T>
cudaError_t launch_typed(const SsdFwdParams& p, cudaStream_t stream, bool states_only) {
  using Pol = SsdPolicy<Is16Bit<T>::value>;
  const int64_t P = p.headdim, N = p.dstate;
  const int64_t state_tiles = cdiv(P, Pol::kStateP) * cdiv(N, Pol::kStateN);
  const int64_t scan_tiles = cdiv(p.chunk, Pol::kScanT) * cdiv(P, Pol::kScanP);
  // kVec state elements a thread when the state's size and the buffers allow 16-byte accesses
  auto aligned16 = [](const float* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const bool pass_vec = (P * N) % SsdPassPolicy::kVec == 0 && aligned16(p.states) && aligned16(p.final_states);
  const int64_t pass_blocks = cdiv(P * N, SsdPassPolicy::kThreads * (pass_vec ? SsdPassPolicy::kVec : 1));
  const int64_t cb_tiles = cdiv(p.chunk, Pol::kScanT) * cdiv(p.chunk, Pol::kScanT);
  const int64_t bc = p.batch * p.nchunks;
  if (state_tiles > kSsdMaxGridYZ || scan_tiles > kSsdMaxGridYZ || bc > kSsdMaxGridYZ ||
      p.nheads > kSsdMaxGridYZ || p.batch > kSsdMaxGridYZ || pass_blocks > INT32_MAX || p.nseqs > kSsdMaxGridYZ ||
      (p.cu_seqlens && p.batch != 1) || p.ngroups > kSsdMaxGridYZ || (bc > 0 && p.cb == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (bc > 0) {
    const dim3 grid(unsigned(cb_tiles), unsigned(p.ngroups), unsigned(bc));
    chunk_cb_kernel<T><<<grid, Pol::kThreads, 0, stream>>>(p);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (bc > 0) {
    const dim3 grid(unsigned(p.nheads), unsigned(state_tiles), unsigned(bc));
    chunk_state_kernel<T><<<grid, Pol::kThreads, 0, stream>>>(p);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (pass_blocks > 0) {
    const dim3 grid(unsigned(pass_blocks), unsigned(p.nheads), unsigned(p.batch));
    if (pass_vec) {
      state_pass_kernel<SsdPassPolicy::kVec><<<grid, SsdPassPolicy::kThreads, 0, stream>>>(p);
    } else {
      state_pass_kernel<1><<<grid, SsdPassPolicy::kThreads, 0, stream>>>(p);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (states_only) return cudaSuccess;
  if (p.cu_seqlens && p.nseqs > 0) {
    const dim3 grid(unsigned(p.nheads), unsigned(state_tiles), unsigned(p.nseqs));
    varlen_state_kernel<T><<<grid, Pol::kThreads, 0, stream>>>(p);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (bc > 0) {
    const dim3 grid(unsigned(p.nheads), unsigned(scan_tiles), unsigned(bc));
    chunk_scan_kernel<T><<<grid, Pol::kThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace

namespace {
cudaError_t launch_any(const SsdFwdParams& p, cudaStream_t stream, bool states_only) {
  if (p.chunk < 1 || p.chunk > kSsdMaxChunk) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.nheads == 0 || p.headdim == 0 || p.dstate == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kFloat32: return launch_typed<float>(p, stream, states_only);
    case DType::kFloat16: return launch_typed<__half>(p, stream, states_only);
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(p, stream, states_only);
  }
  return cudaErrorInvalidValue;
}
}  // namespace

cudaError_t launch_ssd_fwd(const SsdFwdParams& p, cudaStream_t stream) { return launch_any(p, stream, false); }

cudaError_t launch_ssd_fwd_states(const SsdFwdParams& p, cudaStream_t stream) { return launch_any(p, stream, true); }

}  // namespace ssd
}  // namespace mamba_kernels
