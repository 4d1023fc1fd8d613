// The Mamba-2 SSD chunked-scan backward (math in ssd.h; the gradients in docs/KERNELS.md, "Mamba-2
// SSD backward"). Nothing of the forward is saved but its inputs and output: the forward's first
// three launches run again (chunk_cb, chunk_state, state_pass: C B^T, dt_out, dA_cumsum and the
// entering states H_c), then eight launches on one stream:
//
// 1. gate_bwd_kernel: dy = dout silu(z) into an fp32 workspace, and dz = dout y silu'(z).
// 2. chunk_dstate_kernel: per (head, state tile, batch x chunk), the chunk's own share of the
//    gradient of its entering state, sum_t [seq_t = seq before c] exp(cs_t) dy_t C_t^T, a
//    (headdim x dstate) tile product over the chunk's steps (tensor cores for 16-bit inputs).
// 3. state_pass_bwd_kernel: kVec state elements a thread, the chunks in reverse (kDepth chunks'
//    loads in flight):
//    dS_c = G_(c+1), G_c = own_c + keep_c exp(cs_last(c)) G_(c+1), G_nchunks = dfinal_states,
//    dinitial_states = G_0; per block and chunk the fixed-order sum of H_c G_(c+1) (the decay's
//    gradient).
// 4. chunk_dcb_kernel: per ((t-tile, s-tile) at or below the diagonal, group, batch x chunk), the
//    heads of the group in order: dM = dy x^T (tensor cores), then d(C_t . B_s) =
//    dM exp(cs_t - cs_s) dt_s (masked by select), summed over the group's heads in head order
//    into a workspace; each head's row sums of dM (C B^T) exp() dt and column sums of dM (C B^T)
//    exp() go to per-step partial slots (the gradients of dA_cumsum and dt).
// 5. chunk_dx_kernel: per (head, s-tile x channel tile, batch x chunk): dx = w_s (B_s dS_c^T)
//    + sum_{t >= s} M[t, s] dy_t + D dy_s, the intra-chunk sum anti-causal on tensor cores (the
//    diagonal t-block too when its dy is all finite; else its 16 x 16 diagonal blocks by FMA,
//    terms t >= s only); per
//    step and channel tile, x_s . (dS_c B_s) and dy_s . (exp(cs_s) C_s H_c) into partial slots;
//    per channel the sum of dy x over the tile (D's gradient).
// 6. chunk_dbc_kernel: per (step tile x state tile, group, batch x chunk), the group's heads in
//    order: dC = sum_h m exp(cs_t) dy_h H_h + dCB B (causal), dB = sum_h w_s x_h dS_h
//    + dCB^T C (anti-causal).
// 7. chunk_ddt_kernel: per (head, batch x chunk), one thread a step: the slots summed in fixed
//    order into the gradient of dA_cumsum and of dt, the reverse running sum within the chunk
//    (the gradient of dt A), the chain through clamp, softplus and bias into ddt; per chunk the
//    block's fixed-tree sums for dA and dt_bias.
// 8. param_sum_kernel: dA, dt_bias's and D's gradients, one block an output element adding the
//    per-chunk partials in a fixed order.
//
// Deterministic: no atomics; every sum across blocks (heads of a group, channel tiles, chunks,
// batch) is a fixed-order loop or a fixed tree. NaN-causal: a masked term is a select, never a
// product with 0, and the only products whose mask runs through a NaN-carrying operand (dy in the
// intra-chunk dx) skip the masked terms, so a NaN in dout at step t reaches no gradient of an
// input at a step after t.
#include <cstdint>
#include <type_traits>

#include "device_info.h"
#include "device_utils.cuh"
#include "ssd.h"
#include "ssd_mma.cuh"
#include "ssd_pass.cuh"
#include "ssd_policy.cuh"
#include "ssd_tile.cuh"

namespace mamba_kernels {
namespace ssd {
namespace {

constexpr int kMaxChunk = int(kSsdMaxChunk);

template <typename T>
__device__ __forceinline__ const T* tptr(const Operand& o) {
  return static_cast<const T*>(o.ptr);
}

struct One {
  __device__ __forceinline__ float operator()(int) const { return 1.0f; }
};

__device__ __forceinline__ void store_as(void* out, int64_t at, DType dtype, float v) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(out)[at] = v; break;
    case DType::kFloat16: static_cast<__half*>(out)[at] = from_float<__half>(v); break;
    case DType::kBFloat16: static_cast<__nv_bfloat16*>(out)[at] = from_float<__nv_bfloat16>(v); break;
  }
}

// A chunk's position: blockIdx.z is batch * nchunks + chunk.
struct ChunkAt {
  int64_t b, c, c0;
  int Lc;  // the chunk's steps inside the sequence
  __device__ __forceinline__ explicit ChunkAt(const SsdFwdParams& p) {
    b = int64_t(blockIdx.z) / p.nchunks;
    c = int64_t(blockIdx.z) % p.nchunks;
    c0 = c * p.chunk;
    const int64_t left = p.seqlen - c0;
    Lc = int(left < p.chunk ? left : p.chunk);
  }
};

// One head's steps of a chunk in shared memory: dt_out and dA_cumsum over the whole chunk (0 and
// flat past its end, as the forward wrote them), sequence ids (0 without seq_idx), and the id of
// the step before the chunk (0 for the first chunk: the initial state is sequence 0's).
struct Steps {
  float cs[kMaxChunk];
  float dt[kMaxChunk];
  int32_t seq[kMaxChunk];
  float w[kMaxChunk];  // a per-step weight the caller fills
  int32_t seq_prev;
};

template <int NT>
__device__ __forceinline__ void load_steps(const SsdFwdParams& p, const ChunkAt& at, int64_t h, Steps& st) {
  const int64_t base = ((at.b * p.nheads + h) * p.nchunks + at.c) * p.chunk;
  for (int t = threadIdx.x; t < kMaxChunk; t += NT) {  // 0 past the chunk: every entry is finite
    st.cs[t] = t < p.chunk ? p.dA_cumsum[base + t] : 0.0f;
    st.dt[t] = t < p.chunk ? p.dt_out[base + t] : 0.0f;
    st.seq[t] = p.seq_idx && t < at.Lc ? p.seq_idx[at.b * p.seq_s0 + (at.c0 + t) * p.seq_s1] : 0;
  }
  if (threadIdx.x == 0) st.seq_prev = p.seq_idx && at.c > 0 ? p.seq_idx[at.b * p.seq_s0 + (at.c0 - 1) * p.seq_s1] : 0;
  __syncthreads();
}

// w_t = [seq_t = seq before the chunk] exp(cs_t): the weight of the entering state in y_t.
template <int NT>
__device__ __forceinline__ void weights_off(const ChunkAt& at, Steps& st) {
  for (int t = threadIdx.x; t < kMaxChunk; t += NT) {
    st.w[t] = t < at.Lc && st.seq[t] == st.seq_prev ? expf(st.cs[t]) : 0.0f;
  }
  __syncthreads();
}

// w_s = [seq_s = seq of the chunk's last step] exp(cs_last - cs_s) dt_s: step s's weight in the
// chunk's state.
template <int NT>
__device__ __forceinline__ void weights_state(const ChunkAt& at, Steps& st) {
  const float cs_last = st.cs[at.Lc - 1];
  const int32_t seq_last = st.seq[at.Lc - 1];
  for (int t = threadIdx.x; t < kMaxChunk; t += NT) {
    st.w[t] = t < at.Lc && st.seq[t] == seq_last ? expf(cs_last - st.cs[t]) * st.dt[t] : 0.0f;
  }
  __syncthreads();
}

// dy, in x's dtype T: packed (batch, seqlen, head, p), rows 256-byte aligned at their start.
template <typename T>
__device__ __forceinline__ const T* dy_at(const SsdBwdParams& p, int64_t b, int64_t l, int64_t h, int64_t ch) {
  const SsdFwdParams& f = p.f;
  return static_cast<const T*>(p.dy) + ((b * f.seqlen + l) * f.nheads + h) * f.headdim + ch;
}

// dy's rows take 16-byte vector reads (from a 16-byte aligned column).
template <typename T>
__device__ __forceinline__ bool dy_vec(const SsdFwdParams& f) {
  return f.headdim * int64_t(sizeof(T)) % 16 == 0;
}

// ----------------------------------------------------------------------------------- gate

// An operand laid out as dy, (batch, seqlen, head, p) packed: its element i is at offset i.
__device__ __forceinline__ bool packed_like_dy(const Operand& o, const SsdFwdParams& f) {
  return o.s3 == 1 && o.s2 == f.headdim && o.s1 == f.nheads * f.headdim && o.s0 == f.seqlen * f.nheads * f.headdim;
}

// dy at element i, whose dout / z / out sit at offsets od, oz, oy; dz too where z is given.
template <typename T>
__device__ __forceinline__ void gate_one(const SsdBwdParams& p, int64_t i, int64_t od, int64_t oz, int64_t oy) {
  float d = load_as_float(p.dout.ptr, p.dout.dtype, od);
  if (p.f.z.ptr) {
    const float zv = to_float(tptr<T>(p.f.z)[oz]);
    const float y = load_as_float(p.out.ptr, p.out.dtype, oy);
    const float sg = 1.0f / (1.0f + expf(-zv));
    static_cast<T*>(p.dz)[i] = from_float<T>(d * y * sg * (1.0f + zv * (1.0f - sg)));
    d *= zv * sg;
  }
  static_cast<T*>(p.dy)[i] = from_float<T>(d);
}

template <typename T>
__global__ void __launch_bounds__(SsdBwdStepPolicy::kThreads) gate_bwd_kernel(const SsdBwdParams p) {
  const SsdFwdParams& f = p.f;
  const int64_t n = f.batch * f.seqlen * f.nheads * f.headdim;
  const int64_t stride = int64_t(gridDim.x) * SsdBwdStepPolicy::kThreads;
  const int64_t first = int64_t(blockIdx.x) * SsdBwdStepPolicy::kThreads + threadIdx.x;
  // Packed operands (the models' case) need no index split: three 64-bit divisions an element
  // made this an index-bound kernel at a third of the memory bandwidth (22nd bench pass, 0.52 ms
  // for the 2.7B layer).
  if (packed_like_dy(p.dout, f) && (!f.z.ptr || (packed_like_dy(f.z, f) && packed_like_dy(p.out, f)))) {
    for (int64_t i = first; i < n; i += stride) gate_one<T>(p, i, i, i, i);
    return;
  }
  for (int64_t i = first; i < n; i += stride) {
    int64_t r = i;
    const int64_t ch = r % f.headdim;
    r /= f.headdim;
    const int64_t h = r % f.nheads;
    r /= f.nheads;
    const int64_t l = r % f.seqlen, b = r / f.seqlen;
    gate_one<T>(p, i, b * p.dout.s0 + l * p.dout.s1 + h * p.dout.s2 + ch * p.dout.s3,
                b * f.z.s0 + l * f.z.s1 + h * f.z.s2 + ch * f.z.s3, b * p.out.s0 + l * p.out.s1 + h * p.out.s2 + ch * p.out.s3);
  }
}

// ------------------------------------------------------------------ chunk state gradients

// own_c = sum_t w_t dy_t^T C_t (w: weights_off), a (headdim x dstate) tile over the chunk's steps.
template <typename T>
struct DstateAgent {
  using Pol = SsdBwdPolicy<Is16Bit<T>::value>;
  static constexpr int NT = Pol::kThreads, BP = Pol::kP, BN = Pol::kN, BK = Pol::kK;
  static constexpr int LDY = BP + Pol::kPadS, LDC = BN + Pol::kPadS, LDS = BN + Pol::kPadF;
  static constexpr bool kTC = MK_SSD_TENSOR_CORES && Is16Bit<T>::value;
  using Acc = TileAcc<T, BP, BN, NT, kTC>;

  struct Smem {
    Steps st;
    alignas(32) T ys[BK * LDY];  // dy w, step-major (the product's A, column-major)
    alignas(32) T cs[BK * LDC];  // C, step-major
    alignas(32) float stage[BP * LDS];
  };

  const SsdBwdParams& p;
  Smem& sm;
  ChunkAt at;
  int64_t h, g, p0, n0;

  __device__ __forceinline__ DstateAgent(const SsdBwdParams& params, Smem& smem)
      : p(params), sm(smem), at(params.f) {
    h = blockIdx.x;
    g = h / p.f.heads_per_group;
    const int64_t ntiles = (p.f.dstate + BN - 1) / BN;
    p0 = int64_t(blockIdx.y) / ntiles * BP;
    n0 = int64_t(blockIdx.y) % ntiles * BN;
  }

  __device__ __forceinline__ void product(Acc& acc) {
    const SsdFwdParams& f = p.f;
    load_steps<NT>(f, at, h, sm.st);
    weights_off<NT>(at, sm.st);
    acc.zero();
    const T* C = tptr<T>(f.C);
    for (int k0 = 0; k0 < at.Lc; k0 += BK) {
      const float* w = sm.st.w + k0;
      auto weight = [w](int t) { return w[t]; };
      auto live = [w](int t) { return w[t] != 0.0f ? 1.0f : 0.0f; };
      auto y_row = [&](int t) { return dy_at<T>(p, at.b, at.c0 + k0 + t, h, p0); };
      auto c_row = [&](int t) { return C + at.b * f.C.s0 + (at.c0 + k0 + t) * f.C.s1 + g * f.C.s2 + n0 * f.C.s3; };
      load_tile<BK, BP, NT, true, T, T>(sm.ys, LDY, y_row, weight, at.Lc - k0, int(f.headdim - p0), 1, dy_vec<T>(f));
      load_tile<BK, BN, NT, true, T, T>(sm.cs, LDC, c_row, live, at.Lc - k0, int(f.dstate - n0), f.C.s3, f.C.vec16);
      __syncthreads();
      acc.template mma<false, true>(sm.ys, LDY, sm.cs, LDC, BK, false);
      __syncthreads();
    }
  }

  __device__ __forceinline__ void store(const Acc& acc) {
    const SsdFwdParams& f = p.f;
    acc.store(sm.stage, LDS);
    __syncthreads();
    const int64_t PN = f.headdim * f.dstate;
    float* dst = p.dstates + ((at.b * f.nchunks + at.c) * f.nheads + h) * PN;
    for (int i = threadIdx.x; i < BP * BN; i += NT) {
      const int pp = i / BN, n = i % BN;
      if (p0 + pp < f.headdim && n0 + n < f.dstate) dst[(p0 + pp) * f.dstate + n0 + n] = sm.stage[pp * LDS + n];
    }
  }
};

template <typename T>
__global__ void __launch_bounds__(SsdBwdPolicy<Is16Bit<T>::value>::kThreads)
    chunk_dstate_kernel(const SsdBwdParams p) {
  using Agent = DstateAgent<T>;
  __shared__ typename Agent::Smem sm;
  Agent agent(p, sm);
  typename Agent::Acc acc;
  agent.product(acc);
  agent.store(acc);
}

// -------------------------------------------------------------------- reverse state passing

// kV consecutive state elements a thread, the chunks in reverse, kDepth at a time (their loads
// first, as in the forward's walk).
template <int kV>
struct StatePassBwdAgent {
  static constexpr int NT = SsdPassPolicy::kThreads, kDepth = SsdPassPolicy::kDepth;
  const SsdBwdParams& p;
  float* red;
  int64_t b, h, e, PN;
  bool live;

  __device__ __forceinline__ StatePassBwdAgent(const SsdBwdParams& params, float* red_smem)
      : p(params), red(red_smem) {
    PN = p.f.headdim * p.f.dstate;
    e = (int64_t(blockIdx.x) * NT + threadIdx.x) * kV;
    h = blockIdx.y;
    b = blockIdx.z;
    live = e < PN;
  }

  // Sequence id of the last step of chunk c (0 for c < 0 or without seq_idx).
  __device__ __forceinline__ int32_t seq_last(int64_t c) const {
    const SsdFwdParams& f = p.f;
    if (!f.seq_idx || c < 0) return 0;
    int64_t last = (c + 1) * f.chunk;
    last = (last < f.seqlen ? last : f.seqlen) - 1;
    return f.seq_idx[b * f.seq_s0 + last * f.seq_s1];
  }

  __device__ __forceinline__ void run() {
    const SsdFwdParams& f = p.f;
    Lanes<kV> G;  // the gradient of the state leaving chunk c (entering c + 1)
    G.fill(0.0f);
    if (live && p.dfinal.ptr) {
#pragma unroll
      for (int i = 0; i < kV; ++i) {
        const int64_t pp = (e + i) / f.dstate, n = (e + i) % f.dstate;
        G.v[i] = load_as_float(p.dfinal.ptr, p.dfinal.dtype,
                               b * p.dfinal.s0 + h * p.dfinal.s1 + pp * p.dfinal.s2 + n * p.dfinal.s3);
      }
    }
    const int64_t cs_base = (b * f.nheads + h) * f.nchunks * f.chunk + f.chunk - 1;
    const int64_t stride = f.nheads * PN;
    const int64_t at0 = (b * f.nchunks * f.nheads + h) * PN + e;  // chunk c's slot: at0 + c * stride
    float* part_out = p.decay_part + (b * f.nheads + h) * f.nchunks * p.pass_blocks + blockIdx.x;
    for (int64_t c0 = f.nchunks - 1; c0 >= 0; c0 -= kDepth) {
      Lanes<kV> own[kDepth], H[kDepth];
      float decay[kDepth];
      bool keep[kDepth];
#pragma unroll
      for (int k = 0; k < kDepth; ++k) {
        const int64_t c = c0 - k;
        if (c >= 0) {
          if (live) {
            own[k].load(p.dstates + at0 + c * stride);
            H[k].load(f.states + at0 + c * stride);
          }
          decay[k] = f.dA_cumsum[cs_base + c * f.chunk];
          keep[k] = seq_last(c) == seq_last(c - 1);
        }
      }
#pragma unroll
      for (int k = 0; k < kDepth; ++k) {
        const int64_t c = c0 - k;
        if (c < 0) break;  // uniform over the block
        float part = 0.0f;
        if (live) {
          G.store(p.dstates + at0 + c * stride);  // dS_c
#pragma unroll
          for (int i = 0; i < kV; ++i) part += H[k].v[i] * G.v[i];
        }
        const float sum = block_sum<NT>(part, red);
        if (threadIdx.x == 0) part_out[c * p.pass_blocks] = sum;
        const float d = expf(decay[k]);
        if (live) {
#pragma unroll
          for (int i = 0; i < kV; ++i) G.v[i] = keep[k] ? own[k].v[i] + d * G.v[i] : own[k].v[i];
        }
      }
    }
    if (live && p.dinit) {
#pragma unroll
      for (int i = 0; i < kV; ++i) store_as(p.dinit, (b * f.nheads + h) * PN + e + i, p.dinit_dtype, G.v[i]);
    }
  }
};

template <int kV>
__global__ void __launch_bounds__(SsdPassPolicy::kThreads) state_pass_bwd_kernel(const SsdBwdParams p) {
  __shared__ float red[SsdPassPolicy::kThreads / 32];
  StatePassBwdAgent<kV>(p, red).run();
}

// ------------------------------------------------------------------------- d(C B^T) tiles

// The body of a kernel whose agent works a whole tile or nothing: its shared memory, the agent,
// the exit of a block without a tile (uniform across the block), the run.
template <typename Agent>
__device__ __forceinline__ void run_tile(const SsdBwdParams& p) {
  __shared__ typename Agent::Smem sm;
  Agent agent(p, sm);
  if (!agent.active()) return;
  agent.run();
}

// chunk_dcb's block: a (t-tile, s-tile) pair of the chunk, a group and a split of its heads
// (both forms of the kernel).
struct DcbTile {
  ChunkAt at;
  int64_t g, split, h_lo, h_hi;  // the split's heads [h_lo, h_hi)
  int ntl, ti, si, t0, s0;

  __device__ __forceinline__ DcbTile(const SsdBwdParams& p, int tile) : at(p.f) {
    ntl = int((p.f.chunk + tile - 1) / tile);
    ti = int(blockIdx.x) / ntl;
    si = int(blockIdx.x) % ntl;
    t0 = ti * tile;
    s0 = si * tile;
    g = int64_t(blockIdx.y) / p.dcb_splits;
    split = int64_t(blockIdx.y) % p.dcb_splits;
    const int64_t hpg = p.f.heads_per_group, per = (hpg + p.dcb_splits - 1) / p.dcb_splits;
    h_lo = g * hpg + split * per;
    h_hi = g * hpg + ((split + 1) * per < hpg ? (split + 1) * per : hpg);
  }

  __device__ __forceinline__ bool active() const { return si <= ti && t0 < at.Lc; }
};

template <typename T>
struct DcbAgent : DcbTile {
  using Pol = SsdBwdPolicy<Is16Bit<T>::value>;
  static constexpr int NT = Pol::kThreads, BT = Pol::kTile, BS = BT, BK = Pol::kK;
  static constexpr int LDK = BK + Pol::kPadS, LDS = BS + Pol::kPadF;
  static constexpr bool kTC = MK_SSD_TENSOR_CORES && Is16Bit<T>::value;
  using Acc = TileAcc<T, BT, BS, NT, kTC>;
  static_assert(BT <= NT, "a thread a row and a column");

  struct Operands {
    alignas(32) T a[BT * LDK];  // dy rows
    alignas(32) T b[BS * LDK];  // x rows
  };
  struct Smem {
    Steps st;
    union {  // the operands, then (the product done) dM in fp32
      Operands op;
      alignas(32) float stage[BT * LDS];
    } u;
    alignas(32) float dcb[BT * BS];  // d(C B^T), summed over the group's heads in order
  };

  const SsdBwdParams& p;
  Smem& sm;

  __device__ __forceinline__ DcbAgent(const SsdBwdParams& params, Smem& smem)
      : DcbTile(params, BT), p(params), sm(smem) {}

  __device__ __forceinline__ void head(Acc& acc, int64_t h) {
    const SsdFwdParams& f = p.f;
    load_steps<NT>(f, at, h, sm.st);
    acc.zero();
    const T* x = tptr<T>(f.x);
    for (int k0 = 0; k0 < f.headdim; k0 += BK) {
      auto y_row = [&](int t) { return dy_at<T>(p, at.b, at.c0 + t0 + t, h, k0); };
      auto x_row = [&](int s) { return x + at.b * f.x.s0 + (at.c0 + s0 + s) * f.x.s1 + h * f.x.s2 + k0 * f.x.s3; };
      load_tile<BT, BK, NT, false, T, T>(sm.u.op.a, LDK, y_row, One{}, at.Lc - t0, int(f.headdim - k0), 1, dy_vec<T>(f));
      load_tile<BS, BK, NT, false, T, T>(sm.u.op.b, LDK, x_row, One{}, at.Lc - s0, int(f.headdim - k0), f.x.s3,
                                         f.x.vec16);
      __syncthreads();
      acc.template mma<true, false>(sm.u.op.a, LDK, sm.u.op.b, LDK, BK, false);
      __syncthreads();
    }
    float* stage = sm.u.stage;
    acc.store(stage, LDS);
    __syncthreads();
    const int64_t L = f.chunk;
    const float* cb = f.cb + ((at.b * f.nchunks + at.c) * f.ngroups + g) * L * L;
    for (int i = threadIdx.x; i < BT * BS; i += NT) {
      const int t = i / BS, s = i % BS;
      const int r = t0 + t, q = s0 + s;
      const bool keep = q <= r && r < at.Lc && sm.st.seq[q] == sm.st.seq[r];
      const float dM = stage[t * LDS + s];
      const float e = keep ? expf(sm.st.cs[r] - sm.st.cs[q]) : 0.0f;
      const float F = keep ? dM * cb[r * L + q] * e : 0.0f;
      sm.dcb[i] += keep ? dM * e * sm.st.dt[q] : 0.0f;
      stage[t * LDS + s] = F;
    }
    __syncthreads();
    // per-step partials: row sums of F dt_s (to t), column sums of F (to s)
    const int tid = threadIdx.x;
    float* part = p.step_part + ((at.b * f.nheads + h) * f.nchunks + at.c) * p.nslots * L;
    if (tid < BT && t0 + tid < at.Lc) {
      float acc_r = 0.0f;
      for (int s = 0; s < BS; ++s) acc_r += stage[tid * LDS + s] * sm.st.dt[s0 + s];
      part[int64_t(si) * L + t0 + tid] = acc_r;
    }
    if (tid < BS && s0 + tid < at.Lc) {
      float acc_c = 0.0f;
      for (int t = 0; t < BT; ++t) acc_c += stage[t * LDS + tid];
      part[int64_t(ntl + ti) * L + s0 + tid] = acc_c;
    }
    __syncthreads();
  }

  __device__ __forceinline__ void run() {
    for (int i = threadIdx.x; i < BT * BS; i += NT) sm.dcb[i] = 0.0f;
    Acc acc;
    for (int64_t h = h_lo; h < h_hi; ++h) head(acc, h);  // this split's heads of the group, in order
    const int64_t L = p.f.chunk;
    const int64_t slab = p.f.batch * p.f.nchunks * p.f.ngroups * L * L;
    float* dst = p.dcb + split * slab + ((at.b * p.f.nchunks + at.c) * p.f.ngroups + g) * L * L;
    for (int i = threadIdx.x; i < BT * BS; i += NT) {
      const int t = i / BS, s = i % BS;
      if (t0 + t < at.Lc && s0 + s < at.Lc) dst[(t0 + t) * L + s0 + s] = sm.dcb[i];
    }
  }
};

#if MK_SSD_MMA
// chunk_dcb for 16-bit inputs on sm_80 and later, on mma.sync (ssd_mma.cuh): per head dM = dy x^T
// in the accumulators (rows t: the warp's 16-step strip; columns s: the tile's steps), then the
// mask, the decay, the group's d(C B^T) (summed over the split's heads in registers) and both
// per-step partial sums on the accumulators in place: row sums by the quad's shuffles, column
// sums by shuffles over the warp's 8 row groups, then the warps in order through shared memory.
// The tile of C B^T is read once per block. Masked entries are selects, as DcbAgent's.
template <typename T>
struct DcbMmaAgent : DcbTile {
  using Pol = SsdBwdPolicy<true>;
  static constexpr int NT = Pol::kThreads, BT = Pol::kTile, BS = BT, BK = Pol::kK;
  static constexpr int LDK = BK + Pol::kPadS;  // dy and x rows (channels)
  static constexpr int kNT = BS / 8, kWarps = NT / 32;
  static_assert(BT == 16 * kWarps && BS % 16 == 0 && BK % 16 == 0, "a 16-step strip per warp");

  struct Smem {
    Steps st;
    alignas(16) T dy[BT * LDK];     // dy rows t, BK channels, as T
    alignas(16) T x[BS * LDK];      // x rows s
    alignas(16) float cb[BT * BS];  // C_t . B_s of the tile
    float col[kWarps][BS];          // each warp's column sums of F
  };

  const SsdBwdParams& p;
  Smem& sm;
  int lane, warp;
  int row[2];          // the thread's accumulator steps t: t0 + 16 warp + lane / 4, and 8 below
  float acc[kNT][4];   // dM of the current head
  float dcb[kNT][4];   // d(C B^T), the split's heads summed in order

  __device__ __forceinline__ DcbMmaAgent(const SsdBwdParams& params, Smem& smem)
      : DcbTile(params, BT), p(params), sm(smem) {
    lane = int(threadIdx.x) % 32;
    warp = int(threadIdx.x) / 32;
    row[0] = t0 + 16 * warp + lane / 4;
    row[1] = row[0] + 8;
  }

  // The accumulator column (j, e)'s step s.
  __device__ __forceinline__ int col_step(int j, int e) const { return s0 + 8 * j + lane % 4 * 2 + e; }

  __device__ __forceinline__ void load_cb() {
    const int64_t L = p.f.chunk;
    const float* cb = p.f.cb + ((at.b * p.f.nchunks + at.c) * p.f.ngroups + g) * L * L;
    for (int i = threadIdx.x; i < BT * BS; i += NT) {
      const int t = i / BS, s = i % BS;
      sm.cb[i] = t0 + t < at.Lc && s0 + s < at.Lc ? cb[(t0 + t) * L + s0 + s] : 0.0f;
    }
  }

  // acc = dy x^T for head h over its channels, BK at a time.
  __device__ __forceinline__ void product(int64_t h) {
    const SsdFwdParams& f = p.f;
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const T* x = tptr<T>(f.x);
    for (int k0 = 0; k0 < f.headdim; k0 += BK) {
      auto x_row = [&](int s) { return x + at.b * f.x.s0 + (at.c0 + s0 + s) * f.x.s1 + h * f.x.s2 + k0 * f.x.s3; };
      mma::stage_async<BS, BK, NT>(sm.x, LDK, x_row, at.Lc - s0, int(f.headdim - k0), f.x.s3, f.x.vec16);
      mma::stage_async<BT, BK, NT>(sm.dy, LDK, [&](int t) { return dy_at<T>(p, at.b, at.c0 + t0 + t, h, k0); },
                                   at.Lc - t0, int(f.headdim - k0), 1, dy_vec<T>(f));
      mma::cp_async_commit();
      mma::cp_async_wait<0>();
      __syncthreads();
      mma::rows_times_rows<T, kNT, BK>(acc, sm.dy + 16 * warp * LDK, LDK, sm.x, LDK);
      __syncthreads();
    }
  }

  // F = dM (C B^T) exp(cs_t - cs_s) where kept (s <= t in the chunk, one sequence), else 0;
  // dcb += dM exp() dt_s likewise; the head's per-step partials: row sums of F dt_s (slot si,
  // steps t) and column sums of F (slot ntl + ti, steps s).
  __device__ __forceinline__ void epilogue(int64_t h) {
    const SsdFwdParams& f = p.f;
    const int64_t L = f.chunk;
    float* part = p.step_part + ((at.b * f.nheads + h) * f.nchunks + at.c) * p.nslots * L;
    bool live[2];
    float cs_t[2], rowsum[2] = {0.0f, 0.0f};
    int32_t seq_t[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      live[i] = row[i] < at.Lc;
      cs_t[i] = live[i] ? sm.st.cs[row[i]] : 0.0f;
      seq_t[i] = live[i] ? sm.st.seq[row[i]] : 0;
    }
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int s = col_step(j, e);
        const float cs_s = sm.st.cs[s], dt_s = sm.st.dt[s];
        const int32_t seq_s = sm.st.seq[s];
        float colsum = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int t = row[i];
          const bool keep = live[i] && s <= t && seq_s == seq_t[i];
          const float dM = acc[j][2 * i + e];
          const float ex = keep ? expf(cs_t[i] - cs_s) : 0.0f;
          const float F = keep ? dM * sm.cb[(t - t0) * BS + (s - s0)] * ex : 0.0f;
          dcb[j][2 * i + e] += keep ? dM * ex * dt_s : 0.0f;
          rowsum[i] += F * dt_s;
          colsum += F;
        }
        colsum += __shfl_xor_sync(0xffffffffu, colsum, 4);  // the warp's 8 row groups
        colsum += __shfl_xor_sync(0xffffffffu, colsum, 8);
        colsum += __shfl_xor_sync(0xffffffffu, colsum, 16);
        if (lane < 4) sm.col[warp][s - s0] = colsum;
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float v = rowsum[i];
      v += __shfl_xor_sync(0xffffffffu, v, 1);  // the quad's columns
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (lane % 4 == 0 && live[i]) part[int64_t(si) * L + row[i]] = v;
    }
    __syncthreads();
    const int tid = int(threadIdx.x);
    if (tid < BS && s0 + tid < at.Lc) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) v += sm.col[w][tid];  // the warps in order
      part[int64_t(ntl + ti) * L + s0 + tid] = v;
    }
  }

  __device__ __forceinline__ void run() {
#pragma unroll
    for (int j = 0; j < kNT; ++j) dcb[j][0] = dcb[j][1] = dcb[j][2] = dcb[j][3] = 0.0f;
    load_cb();  // (published by load_steps' barrier)
    for (int64_t h = h_lo; h < h_hi; ++h) {  // this split's heads of the group, in order
      load_steps<NT>(p.f, at, h, sm.st);      // (its barrier also ends the last head's column reads)
      product(h);
      epilogue(h);
    }
    const int64_t L = p.f.chunk;
    const int64_t slab = p.f.batch * p.f.nchunks * p.f.ngroups * L * L;
    float* dst = p.dcb + split * slab + ((at.b * p.f.nchunks + at.c) * p.f.ngroups + g) * L * L;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int t = row[i];
      if (t >= at.Lc) continue;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int s = col_step(j, e);
          if (s < at.Lc) dst[int64_t(t) * L + s] = dcb[j][2 * i + e];
        }
      }
    }
  }
};
#endif

template <typename T>
__global__ void __launch_bounds__(SsdBwdPolicy<Is16Bit<T>::value>::kThreads) chunk_dcb_kernel(const SsdBwdParams p) {
#if MK_SSD_MMA
  if constexpr (Is16Bit<T>::value) {
    run_tile<DcbMmaAgent<T>>(p);  // (a tile above the diagonal or past the chunk's end: none)
  } else
#endif
  {
    run_tile<DcbAgent<T>>(p);
  }
}

// ---------------------------------------------------------------------------------- dx

// A chunk_dx block's tile: blockIdx.x the head, blockIdx.y (step tile, channel tile), blockIdx.z
// batch x chunk; kTile steps from s0, kP channels from p0.
struct DxTile {
  ChunkAt at;
  int64_t h, g, p0, PN, slot_base;
  int si, pi, s0, ntl, ptiles;

  __device__ __forceinline__ DxTile(const SsdBwdParams& p, int steps, int chans) : at(p.f) {
    h = blockIdx.x;
    g = h / p.f.heads_per_group;
    ptiles = int(p.ptiles);
    ntl = int(p.stiles);
    si = int(blockIdx.y) / ptiles;
    pi = int(blockIdx.y) % ptiles;
    s0 = si * steps;
    p0 = int64_t(pi) * chans;
    PN = p.f.headdim * p.f.dstate;
    slot_base = ((at.b * p.f.nheads + h) * p.f.nchunks + at.c) * p.nslots * p.f.chunk;
  }

  __device__ __forceinline__ bool active() const { return s0 < at.Lc; }

  __device__ __forceinline__ float* dD_row(const SsdBwdParams& p) const {
    return p.dD_part + ((int64_t(blockIdx.z) * p.stiles + si) * p.f.nheads + h) * p.f.headdim;
  }

  // An inactive tile's share of D's gradient is 0.
  __device__ __forceinline__ void zero_dD(const SsdBwdParams& p, int chans, int threads) const {
    for (int i = threadIdx.x; i < chans; i += threads) {
      if (p0 + i < p.f.headdim) dD_row(p)[p0 + i] = 0.0f;
    }
  }
};

template <typename T>
struct DxAgent : DxTile {
  using Pol = SsdBwdPolicy<Is16Bit<T>::value>;
  static constexpr int NT = Pol::kThreads, BS = Pol::kTile, BT = BS, BP = Pol::kP, BK = Pol::kK;
  static constexpr int LDK = BK + Pol::kPadS;  // B / C rows and dS / H rows (state columns)
  static constexpr int LDM = BT + Pol::kPadS;  // M^T rows
  static constexpr int LDX = BP + Pol::kPadS;  // dy rows
  static constexpr int LDS = BP + Pol::kPadF;
  static constexpr bool kTC = MK_SSD_TENSOR_CORES && Is16Bit<T>::value;
  using Acc = TileAcc<T, BS, BP, NT, kTC>;
  static_assert(BS <= NT && BP <= NT, "a thread a row and a channel");
  static constexpr int cmax(int a, int b) { return a > b ? a : b; }

  struct Smem {
    Steps st;
    alignas(32) T a[cmax(BS * LDK, BS * LDM)];
    alignas(32) T b[cmax(BP * LDK, BT * LDX)];
    alignas(32) float stage[BS * LDS];
  };

  const SsdBwdParams& p;
  Smem& sm;
  // The diagonal t-block went through the strictly anti-causal product (dy not all finite
  // there): finish() adds its 16 x 16 diagonal blocks (uniform over the block).
  bool split_diagonal = false;

  __device__ __forceinline__ DxAgent(const SsdBwdParams& params, Smem& smem)
      : DxTile(params, BS, BP), p(params), sm(smem) {}

  // acc = rows s of a (B or C, state columns) times the rows p of a (P x N) fp32 state's
  // transpose.
  __device__ __forceinline__ void state_product(Acc& acc, const Operand& op, const float* S) {
    const SsdFwdParams& f = p.f;
    const T* base = tptr<T>(op);
    for (int k0 = 0; k0 < f.dstate; k0 += BK) {
      auto a_row = [&](int s) { return base + at.b * op.s0 + (at.c0 + s0 + s) * op.s1 + g * op.s2 + k0 * op.s3; };
      auto s_row = [&](int pp) { return S + (p0 + pp) * f.dstate + k0; };
      load_tile<BS, BK, NT, false, T, T>(sm.a, LDK, a_row, One{}, at.Lc - s0, int(f.dstate - k0), op.s3, op.vec16);
      load_tile<BP, BK, NT, false, T, float>(sm.b, LDK, s_row, One{}, int(f.headdim - p0), int(f.dstate - k0), 1,
                                             f.dstate % 4 == 0);
      __syncthreads();
      acc.template mma<true, false>(sm.a, LDK, sm.b, LDK, BK, false);
      __syncthreads();
    }
  }

  __device__ __forceinline__ float x_val(int64_t s, int64_t ch) const {
    const SsdFwdParams& f = p.f;
    return to_float(tptr<T>(f.x)[at.b * f.x.s0 + (at.c0 + s) * f.x.s1 + h * f.x.s2 + ch * f.x.s3]);
  }

  // Partial slot k at the tile's steps: sum over the tile's channels of v(s, pp) stage[s, pp].
  template <typename V>
  __device__ __forceinline__ void row_slot(int64_t k, const V& v, bool scale_off) {
    const int tid = threadIdx.x;
    const int cols = int(p.f.headdim - p0 < BP ? p.f.headdim - p0 : BP);
    if (tid < BS && s0 + tid < at.Lc) {
      const int s = s0 + tid;
      float acc = 0.0f;
      for (int pp = 0; pp < cols; ++pp) acc += v(s, p0 + pp) * sm.stage[tid * LDS + pp];
      if (scale_off) acc = sm.st.seq[s] == sm.st.seq_prev ? expf(sm.st.cs[s]) * acc : 0.0f;
      p.step_part[slot_base + k * p.f.chunk + s] = acc;
    }
    __syncthreads();
  }

  __device__ __forceinline__ void run() {
    const SsdFwdParams& f = p.f;
    load_steps<NT>(f, at, h, sm.st);
    weights_state<NT>(at, sm.st);
    const int64_t slot = ((at.b * f.nchunks + at.c) * f.nheads + h) * PN;
    Acc acc;
    // dy_s . (C_s H_c^T): the gradient of the entering state's decay exp(cs_s) in y_s
    acc.zero();
    if (at.c > 0 || f.init.ptr) state_product(acc, f.C, f.states + slot);
    acc.store(sm.stage, LDS);
    __syncthreads();
    row_slot(2 * ntl + ptiles + pi, [&](int s, int64_t ch) { return to_float(*dy_at<T>(p, at.b, at.c0 + s, h, ch)); }, true);
    // (B_s dS_c^T): x_s . it is the gradient of the step weight w_s; w_s times it is dx's state part
    acc.zero();
    state_product(acc, f.B, p.dstates + slot);
    acc.store(sm.stage, LDS);
    __syncthreads();
    row_slot(2 * ntl + pi, [&](int s, int64_t ch) { return x_val(s, ch); }, false);
    for (int i = threadIdx.x; i < BS * BP; i += NT) {
      const int s = i / BP, pp = i % BP;
      const float w = sm.st.w[s0 + s];
      sm.stage[s * LDS + pp] = w != 0.0f ? sm.stage[s * LDS + pp] * w : 0.0f;
    }
    __syncthreads();
    acc.load(sm.stage, LDS);
    __syncthreads();
    intra(acc);
    finish(acc);
  }

  // acc += sum over t >= s of M[t, s] dy_t, t-blocks from the last to the diagonal one (whose M^T
  // and dy stay in the buffers for the diagonal fix-up).
  __device__ __forceinline__ void intra(Acc& acc) {
    const SsdFwdParams& f = p.f;
    const int64_t L = f.chunk;
    const float* cb = f.cb + ((at.b * f.nchunks + at.c) * f.ngroups + g) * L * L;
    const T zero = from_float<T>(0.0f);
    const int last = (at.Lc + BT - 1) / BT - 1;
    for (int tb = last; tb >= si; --tb) {
      const int t0 = tb * BT;
      const bool diag = tb == si;
      // s fastest: the workspace's rows of C_t . B_s are read along s (coalesced)
      for (int i = threadIdx.x; i < BS * BT; i += NT) {
        const int t = i / BS, s = i % BS;
        const int r = t0 + t, q = s0 + s;
        const bool keep = q <= r && r < at.Lc && sm.st.seq[q] == sm.st.seq[r];
        sm.a[s * LDM + t] =
            keep ? from_float<T>(cb[r * L + q] * expf(sm.st.cs[r] - sm.st.cs[q]) * sm.st.dt[q]) : zero;
      }
      auto y_row = [&](int t) { return dy_at<T>(p, at.b, at.c0 + t0 + t, h, p0); };
      load_tile<BT, BP, NT, false, T, T>(sm.b, LDX, y_row, One{}, at.Lc - t0, int(f.headdim - p0), 1, dy_vec<T>(f));
      __syncthreads();
      if (!diag) {
        acc.template mma<true, true>(sm.a, LDM, sm.b, LDX, BT, false);
        __syncthreads();
      } else if (Acc::kSplitsDiagonal && tile_finite<BT, BP, NT>(sm.b, LDX)) {
        acc.template mma_upper_from<true, true>(sm.a, LDM, sm.b, LDX, BT);  // no fix-up: dy finite
      } else {
        acc.template mma_upper<true, true>(sm.a, LDM, sm.b, LDX, BT);
        split_diagonal = Acc::kSplitsDiagonal;
      }
    }
  }

  __device__ __forceinline__ void finish(const Acc& acc) {
    const SsdFwdParams& f = p.f;
    acc.store(sm.stage, LDS);
    __syncthreads();
    if (split_diagonal) {
      for (int i = threadIdx.x; i < BS * BP; i += NT) {
        const int s = i / BP, pp = i % BP;
        float v = 0.0f;
        for (int t = s; t < s / 16 * 16 + 16; ++t) v += to_float(sm.a[s * LDM + t]) * to_float(sm.b[t * LDX + pp]);
        sm.stage[s * LDS + pp] += v;
      }
      __syncthreads();
    }
    T* dx = static_cast<T*>(p.dx);
    for (int i = threadIdx.x; i < BS * BP; i += NT) {
      const int s = i / BP, pp = i % BP;
      const int64_t ch = p0 + pp;
      if (s0 + s >= at.Lc || ch >= f.headdim) continue;
      const int64_t l = at.c0 + s0 + s;
      float v = sm.stage[s * LDS + pp];
      if (f.D.ptr) v += load_as_float(f.D.ptr, f.D.dtype, h * f.D.s0 + ch * f.D.s1) * to_float(*dy_at<T>(p, at.b, l, h, ch));
      dx[((at.b * f.seqlen + l) * f.nheads + h) * f.headdim + ch] = from_float<T>(v);
    }
    // D's gradient: sum over the tile's steps of dy x, a thread a channel, steps in order
    for (int pp = threadIdx.x; pp < BP; pp += NT) {
      const int64_t ch = p0 + pp;
      if (ch >= f.headdim) continue;
      float v = 0.0f;
      for (int s = s0; s < at.Lc && s < s0 + BS; ++s) v += to_float(*dy_at<T>(p, at.b, at.c0 + s, h, ch)) * x_val(s, ch);
      dD_row(p)[ch] = v;
    }
  }
};

#if MK_SSD_MMA
// chunk_dx for 16-bit inputs on sm_80 and later, on mma.sync (ssd_mma.cuh): the same products
// and sums as DxAgent, with the fragments' layout fixed so that the state products' row sums are
// quad shuffles, M^T = (C B^T exp(cs_t - cs_s) dt_s)^T is built in registers as the A operand
// straight from the workspace, the w_s scaling and the store read the accumulators in place,
// and D's gradient is a shuffle tree per warp then the warps in order. NaN rule as DxAgent: the
// warp's diagonal 16 x 16 block is dense only when its dy rows are finite, else its terms
// t >= s one by one.
template <typename T>
struct DxMmaAgent : DxTile {
  using Pol = SsdBwdPolicy<true>;
  static constexpr int NT = Pol::kThreads, BS = Pol::kTile, BT = BS, BP = Pol::kP, BK = Pol::kK;
  static constexpr int LDK = BK + Pol::kPadS;  // B / C rows and the state's rows (state columns)
  static constexpr int LDX = BP + Pol::kPadS;  // dy rows
  static constexpr int kNT = BP / 8, kWarps = NT / 32, V = 8;
  static_assert(BS == 16 * kWarps && BP % 16 == 0 && BK % 16 == 0, "a 16-step strip per warp");

  struct Smem {
    Steps st;
    alignas(16) T a[BS * LDK];   // B or C at the tile's steps, BK state columns
    alignas(16) T s[BP * LDK];   // the state's rows (channels), the same columns, as T
    alignas(16) T dy[BT * LDX];  // a t-block of dy, as T
    float dD[kWarps][BP];        // each warp's sum of dy x over its 16 steps, per channel
  };

  const SsdBwdParams& p;
  Smem& sm;
  int lane, warp;
  int row[2];  // the thread's accumulator steps in the chunk: s0 + 16 warp + lane / 4, and 8 below
  float acc[kNT][4];

  __device__ __forceinline__ DxMmaAgent(const SsdBwdParams& params, Smem& smem)
      : DxTile(params, BS, BP), p(params), sm(smem) {
    lane = int(threadIdx.x) % 32;
    warp = int(threadIdx.x) / 32;
    row[0] = s0 + 16 * warp + lane / 4;
    row[1] = row[0] + 8;
  }

  // The channel of accumulator column (j, e).
  __device__ __forceinline__ int64_t chan(int j, int e) const { return p0 + 8 * j + lane % 4 * 2 + e; }

  __device__ __forceinline__ float x_val(int64_t s, int64_t ch) const {
    const SsdFwdParams& f = p.f;
    return to_float(tptr<T>(f.x)[at.b * f.x.s0 + (at.c0 + s) * f.x.s1 + h * f.x.s2 + ch * f.x.s3]);
  }

  // acc = rows s of op (B or C) times the (P x N) fp32 state S's rows p, transposed.
  __device__ __forceinline__ void state_product(const Operand& op, const float* S) {
    const SsdFwdParams& f = p.f;
#pragma unroll
    for (int j = 0; j < kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const T* base = tptr<T>(op);
    const bool s_vec = f.dstate % 4 == 0;  // 16-byte pieces (the states are ours, contiguous)
    for (int k0 = 0; k0 < f.dstate; k0 += BK) {
      auto a_row = [&](int s) { return base + at.b * op.s0 + (at.c0 + s0 + s) * op.s1 + g * op.s2 + k0 * op.s3; };
      mma::stage_async<BS, BK, NT>(sm.a, LDK, a_row, at.Lc - s0, int(f.dstate - k0), op.s3, op.vec16);
      mma::cp_async_commit();
      mma::stage_f32_as<BP, BK, NT>(sm.s, LDK, [&](int pp) { return S + (p0 + pp) * f.dstate + k0; },
                                    int(f.headdim - p0), int(f.dstate - k0), s_vec);
      mma::cp_async_wait<0>();
      __syncthreads();
      mma::rows_times_rows<T, kNT, BK>(acc, sm.a + 16 * warp * LDK, LDK, sm.s, LDK);
      __syncthreads();
    }
  }

  // Partial slot k at the tile's steps: sum over the tile's channels of v(s, ch) acc[s, ch]
  // (each row's 4 lanes, then a quad shuffle); scale_off: times exp(cs_s), 0 across a sequence change.
  template <typename Val>
  __device__ __forceinline__ void row_slot(int64_t k, const Val& v, bool scale_off) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int s = row[i];
      float sum = 0.0f;
      if (s < at.Lc) {
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int64_t ch = chan(j, e);
            if (ch < p.f.headdim) sum += v(s, ch) * acc[j][2 * i + e];
          }
        }
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (lane % 4 == 0 && s < at.Lc) {
        if (scale_off) sum = sm.st.seq[s] == sm.st.seq_prev ? expf(sm.st.cs[s]) * sum : 0.0f;
        p.step_part[slot_base + k * p.f.chunk + s] = sum;
      }
    }
  }

  // M^T[s, t] = (C_t . B_s) exp(cs_t - cs_s) dt_s for t >= s in the chunk and the same sequence.
  __device__ __forceinline__ bool keep(int s, int t) const {
    return s <= t && t < at.Lc && sm.st.seq[s] == sm.st.seq[t];
  }
  __device__ __forceinline__ float mt_entry(const float* cb, int s, int t) const {
    return keep(s, t) ? cb[int64_t(t) * p.f.chunk + s] * __expf(sm.st.cs[t] - sm.st.cs[s]) * sm.st.dt[s] : 0.0f;
  }

  // Whether dy's rows [r0, r0 + 16) of the t-block are all finite (warp-uniform).
  __device__ __forceinline__ bool dy_rows_finite(int r0) const {
    bool ok = true;
#pragma unroll
    for (int i = lane; i < 16 * (BP / V); i += 32) {
      const uint4 v = *reinterpret_cast<const uint4*>(sm.dy + (r0 + i / (BP / V)) * LDX + i % (BP / V) * V);
      ok = ok && mma::finite2(v.x, T()) && mma::finite2(v.y, T()) && mma::finite2(v.z, T()) && mma::finite2(v.w, T());
    }
    return __all_sync(0xffffffffu, ok);
  }

  // acc += sum over t >= s of M[t, s] dy_t, t-blocks from the last to the diagonal one.
  __device__ __forceinline__ void intra() {
    const SsdFwdParams& f = p.f;
    const int64_t L = f.chunk;
    const float* cb = f.cb + ((at.b * f.nchunks + at.c) * f.ngroups + g) * L * L;
    const int last = (at.Lc + BT - 1) / BT - 1;
    for (int tb = last; tb >= si; --tb) {
      const int t0 = tb * BT;
      mma::stage_async<BT, BP, NT>(sm.dy, LDX, [&](int t) { return dy_at<T>(p, at.b, at.c0 + t0 + t, h, p0); },
                                   at.Lc - t0, int(f.headdim - p0), 1, dy_vec<T>(f));
      mma::cp_async_commit();
      mma::cp_async_wait<0>();
      __syncthreads();
      const bool diag = tb == si;
      for (int kk = diag ? warp : 0; kk < BT / 16; ++kk) {  // the diagonal block: from the warp's strip on
        const int t16 = t0 + 16 * kk;
        if (diag && kk == warp && !dy_rows_finite(16 * kk)) {
          diagonal_exact(cb, t0, t16);
          continue;
        }
        const int t = t16 + lane % 4 * 2;
        uint32_t a[4];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          a[i] = mma::pack2(mt_entry(cb, row[i], t), mt_entry(cb, row[i], t + 1), T());
          a[i + 2] = mma::pack2(mt_entry(cb, row[i], t + 8), mt_entry(cb, row[i], t + 9), T());
        }
#pragma unroll
        for (int jp = 0; jp < kNT / 2; ++jp) {
          uint32_t b[4];
          mma::ldsm_x4_t(b, sm.dy + (16 * kk + lane % 16) * LDX + 16 * jp + lane / 16 * 8);
          mma::mma16816<T>(acc[2 * jp], a, b[0], b[1]);
          mma::mma16816<T>(acc[2 * jp + 1], a, b[2], b[3]);
        }
      }
      __syncthreads();
    }
  }

  // The warp's diagonal 16 x 16 block when its dy is not all finite: exactly the kept terms t >= s.
  __device__ __forceinline__ void diagonal_exact(const float* cb, int t0, int t16) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int s = row[i];
      if (s >= at.Lc) continue;
#pragma unroll 1
      for (int t = s; t < t16 + 16; ++t) {
        if (!keep(s, t)) continue;
        const float m = mt_entry(cb, s, t);
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          const T* yr = sm.dy + (t - t0) * LDX + 8 * j + lane % 4 * 2;
          acc[j][2 * i] += m * to_float(yr[0]);
          acc[j][2 * i + 1] += m * to_float(yr[1]);
        }
      }
    }
  }

  __device__ __forceinline__ void run() {
    const SsdFwdParams& f = p.f;
    load_steps<NT>(f, at, h, sm.st);
    weights_state<NT>(at, sm.st);
    const int64_t slot = ((at.b * f.nchunks + at.c) * f.nheads + h) * PN;
    auto dy_v = [&](int s, int64_t ch) { return to_float(*dy_at<T>(p, at.b, at.c0 + s, h, ch)); };
    auto x_v = [&](int s, int64_t ch) { return x_val(s, ch); };
    // dy_s . (C_s H_c^T): the gradient of the entering state's decay exp(cs_s) in y_s
    if (at.c > 0 || f.init.ptr) {
      state_product(f.C, f.states + slot);
      row_slot(2 * ntl + ptiles + pi, dy_v, true);
    } else {
      for (int i = 0; i < 2; ++i) {
        if (lane % 4 == 0 && row[i] < at.Lc) p.step_part[slot_base + (2 * ntl + ptiles + pi) * f.chunk + row[i]] = 0.0f;
      }
    }
    // (B_s dS_c^T): x_s . it is the gradient of the step weight w_s; w_s times it is dx's state part
    state_product(f.B, p.dstates + slot);
    row_slot(2 * ntl + pi, x_v, false);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float w = sm.st.w[row[i]];
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        acc[j][2 * i] = w != 0.0f ? acc[j][2 * i] * w : 0.0f;
        acc[j][2 * i + 1] = w != 0.0f ? acc[j][2 * i + 1] * w : 0.0f;
      }
    }
    intra();
    finish();
  }

  // dx = acc + D dy; D's gradient: per channel the sum over the tile's steps of dy x, each
  // thread's two steps, then lanes 4 apart (the warp's 16 steps), then the warps in order.
  __device__ __forceinline__ void finish() {
    const SsdFwdParams& f = p.f;
    T* dx = static_cast<T*>(p.dx);
    float dd[kNT][2];
#pragma unroll
    for (int j = 0; j < kNT; ++j) dd[j][0] = dd[j][1] = 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int s = row[i];
      if (s >= at.Lc) continue;
      const int64_t l = at.c0 + s;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t ch = chan(j, e);
          if (ch >= f.headdim) continue;
          const float y = to_float(*dy_at<T>(p, at.b, l, h, ch));
          float v = acc[j][2 * i + e];
          if (f.D.ptr) v += load_as_float(f.D.ptr, f.D.dtype, h * f.D.s0 + ch * f.D.s1) * y;
          dx[((at.b * f.seqlen + l) * f.nheads + h) * f.headdim + ch] = from_float<T>(v);
          dd[j][e] += y * x_val(s, ch);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = dd[j][e];
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        if (lane < 4) sm.dD[warp][8 * j + lane * 2 + e] = v;
      }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < BP; c += NT) {
      if (p0 + c >= f.headdim) continue;
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) v += sm.dD[w][c];
      dD_row(p)[p0 + c] = v;
    }
  }
};
#endif

template <typename T>
__global__ void __launch_bounds__(SsdBwdPolicy<Is16Bit<T>::value>::kThreads) chunk_dx_kernel(const SsdBwdParams p) {
#if MK_SSD_MMA
  if constexpr (Is16Bit<T>::value) {
    using Agent = DxMmaAgent<T>;
    __shared__ typename Agent::Smem sm;
    Agent agent(p, sm);
    if (!agent.active()) {  // a tile past the end of the last chunk (uniform): its D share is 0
      agent.zero_dD(p, Agent::BP, Agent::NT);
      return;
    }
    agent.run();
  } else
#endif
  {
    using Agent = DxAgent<T>;
    __shared__ typename Agent::Smem sm;
    Agent agent(p, sm);
    if (!agent.active()) {  // a tile past the end of the last chunk (uniform)
      agent.zero_dD(p, Agent::BP, Agent::NT);
      return;
    }
    agent.run();
  }
}

// ------------------------------------------------------------------------------- dB, dC

template <typename T>
struct DbcAgent {
  using Pol = SsdBwdPolicy<Is16Bit<T>::value>;
  static constexpr int NT = Pol::kThreads, BT = Pol::kTile, BN = Pol::kN, BK = Pol::kK;
  static constexpr int LDA = BK + Pol::kPadS;  // dy / x rows (channels)
  static constexpr int LDM = BT + Pol::kPadS;  // dCB rows
  static constexpr int LDB = BN + Pol::kPadS;  // H / dS / B / C rows (state columns)
  static constexpr int LDS = BN + Pol::kPadF;
  static constexpr bool kTC = MK_SSD_TENSOR_CORES && Is16Bit<T>::value;
  using Acc = TileAcc<T, BT, BN, NT, kTC>;
  static constexpr int cmax(int a, int b) { return a > b ? a : b; }

  struct Smem {
    Steps st;
    alignas(32) T a[cmax(BT * LDA, BT * LDM)];
    alignas(32) T b[cmax(BK * LDB, BT * LDB)];
    alignas(32) float stage[BT * LDS];
  };

  const SsdBwdParams& p;
  Smem& sm;
  ChunkAt at;
  int64_t g, n0, PN;
  int split, k_lo, k_hi;  // this block's heads of the group: [k_lo, k_hi)
  int ti, t0, ntl;

  __device__ __forceinline__ DbcAgent(const SsdBwdParams& params, Smem& smem) : p(params), sm(smem), at(params.f) {
    const int64_t ntn = (p.f.dstate + BN - 1) / BN;
    ti = int(int64_t(blockIdx.x) / ntn);
    n0 = int64_t(blockIdx.x) % ntn * BN;
    t0 = ti * BT;
    const int splits = int(p.dbc_splits);  // (the grid's y: ngroups x splits < 2^16)
    g = int(blockIdx.y) / splits;
    split = int(blockIdx.y) % splits;
    const int hpg = int(p.f.heads_per_group), per = (hpg + splits - 1) / splits;
    k_lo = split * per < hpg ? split * per : hpg;
    k_hi = (split + 1) * per < hpg ? (split + 1) * per : hpg;
    ntl = int((p.f.chunk + BT - 1) / BT);
    PN = p.f.headdim * p.f.dstate;
  }

  __device__ __forceinline__ bool active() const { return t0 < at.Lc; }

  // acc += sum over channels of (w_r a_r) S, a the tile's rows (dy from the workspace, or x),
  // S a (P x N) fp32 state (rows p).
  template <typename TG, typename Row>
  __device__ __forceinline__ void head_product(Acc& acc, const Row& a_row, int64_t acs, bool a_vec, const float* S) {
    const SsdFwdParams& f = p.f;
    const float* w = sm.st.w + t0;
    auto weight = [w](int t) { return w[t]; };
    for (int k0 = 0; k0 < f.headdim; k0 += BK) {
      auto row = [&](int t) { return a_row(t, k0); };
      auto s_row = [&](int k) { return S + (k0 + k) * f.dstate + n0; };
      load_tile<BT, BK, NT, true, T, TG>(sm.a, LDA, row, weight, at.Lc - t0, int(f.headdim - k0), acs, a_vec);
      load_tile<BK, BN, NT, false, T, float>(sm.b, LDB, s_row, One{}, int(f.headdim - k0), int(f.dstate - n0), 1,
                                             f.dstate % 4 == 0);
      __syncthreads();
      acc.template mma<true, true>(sm.a, LDA, sm.b, LDB, BK, false);
      __syncthreads();
    }
  }

  // The dCB tile (r0.., c0..) into sm.a as T: the splits' slabs added in order (0 outside the chunk).
  __device__ __forceinline__ void load_dcb(const float* dcb, int r0, int c0) {
    const int64_t L = p.f.chunk;
    const int64_t slab = p.f.batch * p.f.nchunks * p.f.ngroups * L * L;
    const int rows = at.Lc - r0, cols = at.Lc - c0;
    const bool vec = L % 4 == 0;
    const int splits = int(p.dcb_splits);
    for (int i = threadIdx.x; i < BT * (BT / 4); i += NT) {
      const int r = i / (BT / 4), c = (i % (BT / 4)) * 4;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float* src = dcb + (r0 + r) * L + c0 + c;
      if (r < rows && vec && c + 4 <= cols) {
#pragma unroll 1
        for (int k = 0; k < splits; ++k) {
          const float4 q = *reinterpret_cast<const float4*>(src + k * slab);
          v.x += q.x, v.y += q.y, v.z += q.z, v.w += q.w;
        }
      } else if (r < rows) {
#pragma unroll 1
        for (int k = 0; k < splits; ++k) {
          const float* q = src + k * slab;
          v.x += c < cols ? q[0] : 0.0f;
          v.y += c + 1 < cols ? q[1] : 0.0f;
          v.z += c + 2 < cols ? q[2] : 0.0f;
          v.w += c + 3 < cols ? q[3] : 0.0f;
        }
      }
      T* d = sm.a + r * LDM + c;
      d[0] = from_float<T>(v.x), d[1] = from_float<T>(v.y), d[2] = from_float<T>(v.z), d[3] = from_float<T>(v.w);
    }
  }

  // acc += the group's dCB tiles times B (dC, kTrans false: rows t, the s-blocks up to the
  // diagonal) or dCB^T times C (dB, kTrans: rows s, the t-blocks from the diagonal on).
  template <bool kTrans>
  __device__ __forceinline__ void dcb_product(Acc& acc, const Operand& op) {
    const SsdFwdParams& f = p.f;
    const int64_t L = f.chunk;
    const float* dcb = p.dcb + ((at.b * f.nchunks + at.c) * f.ngroups + g) * L * L;
    const T* base = tptr<T>(op);
    const int last = (at.Lc + BT - 1) / BT - 1;
    const int lo = kTrans ? ti : 0, hi = kTrans ? last : ti;
    for (int kb = lo; kb <= hi; ++kb) {
      const int k0 = kb * BT;
      // the dCB tile, rows t: (t0.., k0..) for dC, (k0.., t0..) for dB
      const int r0 = kTrans ? k0 : t0, c0 = kTrans ? t0 : k0;
      load_dcb(dcb, r0, c0);
      auto o_row = [&](int k) { return base + at.b * op.s0 + (at.c0 + k0 + k) * op.s1 + g * op.s2 + n0 * op.s3; };
      load_tile<BT, BN, NT, false, T, T>(sm.b, LDB, o_row, One{}, at.Lc - k0, int(f.dstate - n0), op.s3, op.vec16);
      __syncthreads();
      acc.template mma<!kTrans, true>(sm.a, LDM, sm.b, LDB, BT, false);
      __syncthreads();
    }
  }

  // The tile into out (x's dtype) or, with head splits, into this split's fp32 slab of which
  // (0: dC, 1: dB) for dbc_sum.
  __device__ __forceinline__ void store(const Acc& acc, void* out, int which) {
    const SsdFwdParams& f = p.f;
    acc.store(sm.stage, LDS);
    __syncthreads();
    const int64_t n_out = f.batch * f.seqlen * f.ngroups * f.dstate;
    float* slab = p.dbc_splits > 1 ? p.dbc_part + (split * 2 + which) * n_out : nullptr;
    for (int i = threadIdx.x; i < BT * BN; i += NT) {
      const int t = i / BN, n = i % BN;
      if (t0 + t < at.Lc && n0 + n < f.dstate) {
        const int64_t e = ((at.b * f.seqlen + at.c0 + t0 + t) * f.ngroups + g) * f.dstate + n0 + n;
        if (slab != nullptr) {
          slab[e] = sm.stage[t * LDS + n];
        } else {
          static_cast<T*>(out)[e] = from_float<T>(sm.stage[t * LDS + n]);
        }
      }
    }
    __syncthreads();
  }

  __device__ __forceinline__ void run() {
    const SsdFwdParams& f = p.f;
    const T* x = tptr<T>(f.x);
    const int64_t hpg = f.heads_per_group;
    Acc acc;
    // dC
    acc.zero();
    if (at.c > 0 || f.init.ptr) {
      for (int k = k_lo; k < k_hi; ++k) {
        const int64_t h = g * hpg + k;
        load_steps<NT>(f, at, h, sm.st);
        weights_off<NT>(at, sm.st);
        auto y_row = [&](int t, int k0) { return dy_at<T>(p, at.b, at.c0 + t0 + t, h, k0); };
        head_product<T>(acc, y_row, 1, dy_vec<T>(f), f.states + ((at.b * f.nchunks + at.c) * f.nheads + h) * PN);
      }
    }
    if (split == 0) dcb_product<false>(acc, f.B);  // (the group's dCB, once)
    store(acc, p.dC, 0);
    // dB
    acc.zero();
    for (int k = k_lo; k < k_hi; ++k) {
      const int64_t h = g * hpg + k;
      load_steps<NT>(f, at, h, sm.st);
      weights_state<NT>(at, sm.st);
      auto x_row = [&](int t, int k0) {
        return x + at.b * f.x.s0 + (at.c0 + t0 + t) * f.x.s1 + h * f.x.s2 + k0 * f.x.s3;
      };
      head_product<T>(acc, x_row, f.x.s3, f.x.vec16, p.dstates + ((at.b * f.nchunks + at.c) * f.nheads + h) * PN);
    }
    if (split == 0) dcb_product<true>(acc, f.C);
    store(acc, p.dB, 1);
  }
};

template <typename T>
__global__ void __launch_bounds__(SsdBwdPolicy<Is16Bit<T>::value>::kThreads) chunk_dbc_kernel(const SsdBwdParams p) {
  run_tile<DbcAgent<T>>(p);  // (a tile past the end of the last chunk: none)
}

// dC and dB: chunk_dbc's head-split slabs added in split order (deterministic), in x's dtype.
template <typename T>
__global__ void __launch_bounds__(SsdBwdStepPolicy::kThreads) dbc_sum_kernel(const SsdBwdParams p) {
  const SsdFwdParams& f = p.f;
  const int64_t n_out = f.batch * f.seqlen * f.ngroups * f.dstate;
  const int64_t stride = int64_t(gridDim.x) * SsdBwdStepPolicy::kThreads;
  for (int64_t i = int64_t(blockIdx.x) * SsdBwdStepPolicy::kThreads + threadIdx.x; i < 2 * n_out; i += stride) {
    const int which = i < n_out ? 0 : 1;
    const int64_t e = i - which * n_out;
    float acc = 0.0f;
    for (int64_t k = 0; k < p.dbc_splits; ++k) acc += p.dbc_part[(k * 2 + which) * n_out + e];
    static_cast<T*>(which == 0 ? p.dC : p.dB)[e] = from_float<T>(acc);
  }
}

// ---------------------------------------------------------------------- per-step reduction

__device__ __forceinline__ float softplus_dt(float d) { return d <= 20.0f ? log1pf(expf(d)) : d; }

template <typename T>
struct DdtAgent {
  static constexpr int NT = SsdBwdStepPolicy::kThreads;
  static constexpr int BT = SsdBwdPolicy<Is16Bit<T>::value>::kTile;
  static_assert(NT >= kMaxChunk, "a thread a step");

  struct Smem {
    Steps st;
    float v[2][kMaxChunk];
    float red[NT];
  };

  const SsdBwdParams& p;
  Smem& sm;
  ChunkAt at;
  int64_t h;

  __device__ __forceinline__ DdtAgent(const SsdBwdParams& params, Smem& smem) : p(params), sm(smem), at(params.f) {
    h = blockIdx.x;
  }

  __device__ __forceinline__ void run() {
    const SsdFwdParams& f = p.f;
    load_steps<NT>(f, at, h, sm.st);
    const int t = threadIdx.x;
    const int64_t L = f.chunk;
    const int ntl = int(p.stiles), ptiles = int(p.ptiles);
    const int last_tile = (at.Lc + BT - 1) / BT - 1;
    const float cs_last = sm.st.cs[at.Lc - 1];
    const int32_t seq_last = sm.st.seq[at.Lc - 1];
    const float* part = p.step_part + ((at.b * f.nheads + h) * f.nchunks + at.c) * p.nslots * L;
    float dcs = 0.0f, ddt = 0.0f, last = 0.0f;
    if (t < at.Lc) {
      const int ti = t / BT;
      float row = 0.0f, col = 0.0f, dw = 0.0f, off = 0.0f;
      for (int k = 0; k <= ti; ++k) row += part[k * L + t];
      for (int k = ti; k <= last_tile; ++k) col += part[(ntl + k) * L + t];
      for (int k = 0; k < ptiles; ++k) dw += part[(2 * ntl + k) * L + t];
      for (int k = 0; k < ptiles; ++k) off += part[(2 * ntl + ptiles + k) * L + t];
      const bool in_state = sm.st.seq[t] == seq_last;
      const float e = in_state ? expf(cs_last - sm.st.cs[t]) : 0.0f;
      const float wdw = in_state ? dw * e * sm.st.dt[t] : 0.0f;
      dcs = row - sm.st.dt[t] * col + off - wdw;
      ddt = col + (in_state ? dw * e : 0.0f);
      last = wdw;
    }
    const float last_sum = block_sum<NT>(last, sm.red);
    float decay_sum = 0.0f;
    if (t == 0) {
      const float* dp = p.decay_part + ((at.b * f.nheads + h) * f.nchunks + at.c) * p.pass_blocks;
      for (int64_t k = 0; k < p.pass_blocks; ++k) decay_sum += dp[k];
    }
    // the state leaving the chunk decays by exp(cs_last): its gradient, and the step weights'
    // share of cs_last, go to the chunk's last step
    if (t == at.Lc - 1) dcs += last_sum;
    sm.v[0][t] = dcs;
    __syncthreads();
    if (t == 0) {
      const bool keep = seq_last == sm.st.seq_prev;
      if (keep) sm.v[0][at.Lc - 1] += expf(cs_last) * decay_sum;
    }
    __syncthreads();
    // da_t = sum of dcs_u over u >= t (a reverse inclusive scan, fixed steps)
    int cur = 0;
    for (int off = 1; off < NT; off *= 2) {
      float v = sm.v[cur][t];
      if (t + off < NT) v += sm.v[cur][t + off];
      sm.v[1 - cur][t] = v;
      cur = 1 - cur;
      __syncthreads();
    }
    const float da = t < at.Lc ? sm.v[cur][t] : 0.0f;
    const float A = load_as_float(f.A.ptr, f.A.dtype, h * f.A.s0);
    float g = 0.0f, da_dt = 0.0f;
    if (t < at.Lc) {
      const float total = ddt + da * A;
      const int64_t l = at.c0 + t;
      float v = load_as_float(f.dt.ptr, f.dt.dtype, at.b * f.dt.s0 + l * f.dt.s1 + h * f.dt.s2);
      if (f.dt_bias.ptr) v += load_as_float(f.dt_bias.ptr, f.dt_bias.dtype, h * f.dt_bias.s0);
      const float d = f.dt_softplus ? softplus_dt(v) : v;
      const bool inside = d >= f.dt_lo && d <= f.dt_hi;
      const float dsp = f.dt_softplus && v <= 20.0f ? 1.0f / (1.0f + expf(-v)) : 1.0f;
      g = inside ? total * dsp : 0.0f;
      store_as(p.ddt, (at.b * f.seqlen + l) * f.nheads + h, p.ddt_dtype, g);
      da_dt = da * sm.st.dt[t];
    }
    const float sA = block_sum<NT>(da_dt, sm.red);
    const float sB = block_sum<NT>(g, sm.red);
    if (t == 0) {
      p.head_part[(int64_t(blockIdx.z) * 2 + 0) * f.nheads + h] = sA;
      p.head_part[(int64_t(blockIdx.z) * 2 + 1) * f.nheads + h] = sB;
    }
  }
};

template <typename T>
__global__ void __launch_bounds__(SsdBwdStepPolicy::kThreads) chunk_ddt_kernel(const SsdBwdParams p) {
  using Agent = DdtAgent<T>;
  __shared__ typename Agent::Smem sm;
  Agent(p, sm).run();
}

// dA, dt_bias and D gradients: one block an output element. Each thread adds a strided share of
// the per-(batch, chunk[, step tile]) partials in order, then a fixed tree across the block (the
// same sum every run).
__global__ void __launch_bounds__(SsdParamSumPolicy::kThreads) param_sum_kernel(const SsdBwdParams p) {
  constexpr int NT = SsdParamSumPolicy::kThreads;
  __shared__ float red[NT / 32];
  const SsdFwdParams& f = p.f;
  const int64_t H = f.nheads, P = f.headdim;
  const int64_t i = blockIdx.x;
  const int64_t bc = f.batch * f.nchunks;
  float acc = 0.0f;
  if (i < 2 * H) {
    const int64_t which = i / H, h = i % H;
    void* out = which == 0 ? p.dA : p.ddt_bias;
    if (!out) return;  // the whole block
    for (int64_t r = threadIdx.x; r < bc; r += NT) acc += p.head_part[(r * 2 + which) * H + h];
    const float total = block_sum<NT>(acc, red);
    if (threadIdx.x == 0) store_as(out, h, which == 0 ? p.dA_dtype : p.ddt_bias_dtype, total);
  } else {
    const int64_t j = i - 2 * H;
    const int64_t rows = bc * p.stiles;
    if (p.dD_per_channel) {
      for (int64_t r = threadIdx.x; r < rows; r += NT) acc += p.dD_part[r * H * P + j];
    } else {
      for (int64_t k = threadIdx.x; k < rows * P; k += NT) acc += p.dD_part[(k / P * H + j) * P + k % P];
    }
    const float total = block_sum<NT>(acc, red);
    if (threadIdx.x == 0) store_as(p.dD, j, p.dD_dtype, total);
  }
}

// --------------------------------------------------------------------------------- launcher

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A group's heads split over enough blocks for about per_sm blocks an SM (times the device's SM
// count) where `blocks` (one per tile, group and chunk) would leave it short; at most a split a
// head, and within the grid's y limit.
int64_t head_splits(int64_t blocks, int64_t per_sm, const SsdFwdParams& f) {
  int64_t splits = blocks > 0 ? cdiv(per_sm * sm_count(), blocks) : 1;
  splits = splits < f.heads_per_group ? splits : f.heads_per_group;
  const int64_t max_splits = kSsdMaxGridYZ / (f.ngroups > 0 ? f.ngroups : 1);
  return splits < 1 ? 1 : (splits > max_splits ? max_splits : splits);
}

// State elements a thread of the reverse walk: kVec when a state's size is a multiple of it (the
// workspace's pieces are 256-byte aligned), else 1.
int pass_width(const SsdFwdParams& f) {
  return (f.headdim * f.dstate) % SsdPassPolicy::kVec == 0 ? SsdPassPolicy::kVec : 1;
}

template <typename T>
cudaError_t launch_typed(const SsdBwdParams& p, cudaStream_t stream) {
  using Pol = SsdBwdPolicy<Is16Bit<T>::value>;
  const SsdFwdParams& f = p.f;
  const int64_t bc = f.batch * f.nchunks;
  const int64_t state_tiles = cdiv(f.headdim, Pol::kP) * cdiv(f.dstate, Pol::kN);
  const int64_t ntl = cdiv(f.chunk, Pol::kTile);
  const int64_t dx_tiles = ntl * cdiv(f.headdim, Pol::kP);
  const int64_t dbc_tiles = ntl * cdiv(f.dstate, Pol::kN);
  if (bc > kSsdMaxGridYZ || state_tiles > kSsdMaxGridYZ || dx_tiles > kSsdMaxGridYZ || f.ngroups > kSsdMaxGridYZ ||
      f.batch > kSsdMaxGridYZ || f.nheads > kSsdMaxGridYZ || p.pass_blocks > INT32_MAX || dbc_tiles > INT32_MAX ||
      p.stiles != ntl || p.ptiles != cdiv(f.headdim, Pol::kP) || p.dcb_splits < 1 || p.dbc_splits < 1 ||
      f.ngroups * p.dcb_splits > kSsdMaxGridYZ || f.ngroups * p.dbc_splits > kSsdMaxGridYZ) {
    return cudaErrorInvalidValue;
  }
  cudaError_t err = launch_ssd_fwd_states(f, stream);
  if (err != cudaSuccess) return err;
  const int64_t n = f.batch * f.seqlen * f.nheads * f.headdim;
  if (n > 0) {
    const int64_t blocks = cdiv(n, SsdBwdStepPolicy::kThreads);
    gate_bwd_kernel<T><<<unsigned(blocks < 65536 ? blocks : 65536), SsdBwdStepPolicy::kThreads, 0, stream>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  if (bc > 0) {
    chunk_dstate_kernel<T>
        <<<dim3(unsigned(f.nheads), unsigned(state_tiles), unsigned(bc)), Pol::kThreads, 0, stream>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  if (f.batch > 0) {
    const dim3 grid(unsigned(p.pass_blocks), unsigned(f.nheads), unsigned(f.batch));
    if (pass_width(f) == SsdPassPolicy::kVec) {
      state_pass_bwd_kernel<SsdPassPolicy::kVec><<<grid, SsdPassPolicy::kThreads, 0, stream>>>(p);
    } else {
      state_pass_bwd_kernel<1><<<grid, SsdPassPolicy::kThreads, 0, stream>>>(p);
    }
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  if (bc > 0) {
    chunk_dcb_kernel<T>
        <<<dim3(unsigned(ntl * ntl), unsigned(f.ngroups * p.dcb_splits), unsigned(bc)), Pol::kThreads, 0, stream>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    chunk_dx_kernel<T><<<dim3(unsigned(f.nheads), unsigned(dx_tiles), unsigned(bc)), Pol::kThreads, 0, stream>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    chunk_dbc_kernel<T>
        <<<dim3(unsigned(dbc_tiles), unsigned(f.ngroups * p.dbc_splits), unsigned(bc)), Pol::kThreads, 0, stream>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    if (p.dbc_splits > 1) {
      const int64_t blocks = cdiv(2 * f.batch * f.seqlen * f.ngroups * f.dstate, SsdBwdStepPolicy::kThreads);
      dbc_sum_kernel<T><<<unsigned(blocks < 65536 ? blocks : 65536), SsdBwdStepPolicy::kThreads, 0, stream>>>(p);
      if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }
    chunk_ddt_kernel<T>
        <<<dim3(unsigned(f.nheads), 1u, unsigned(bc)), SsdBwdStepPolicy::kThreads, 0, stream>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  const int64_t nD = f.D.ptr ? (p.dD_per_channel ? f.nheads * f.headdim : f.nheads) : 0;
  const int64_t sums = 2 * f.nheads + nD;
  if (sums > INT32_MAX) return cudaErrorInvalidValue;
  param_sum_kernel<<<unsigned(sums), SsdParamSumPolicy::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

SsdBwdWorkspace ssd_bwd_workspace(SsdBwdParams& p) {
  const SsdFwdParams& f = p.f;
  const bool half = f.dtype != DType::kFloat32;
  const int64_t tile = half ? SsdBwdPolicy<true>::kTile : SsdBwdPolicy<false>::kTile;
  const int64_t ptile = half ? SsdBwdPolicy<true>::kP : SsdBwdPolicy<false>::kP;
  p.stiles = cdiv(f.chunk, tile);
  p.ptiles = cdiv(f.headdim, ptile);
  p.nslots = 2 * p.stiles + 2 * p.ptiles;
  p.pass_blocks = cdiv(f.headdim * f.dstate, SsdPassPolicy::kThreads * pass_width(f));
  const int64_t BH = f.batch * f.nheads, bc = f.batch * f.nchunks;
  SsdBwdWorkspace w;
  w.dy = (f.batch * f.seqlen * f.nheads * f.headdim * (half ? 2 : 4) + 3) / 4;  // in x's dtype
  w.dstates = bc * f.nheads * f.headdim * f.dstate;
  const int64_t pairs = p.stiles * (p.stiles + 1) / 2;  // the tile pairs at or below the diagonal
  p.dcb_splits = head_splits(pairs * f.ngroups * bc, SsdDcbPolicy::kBlocksPerSm, f);
  w.dcb = p.dcb_splits * bc * f.ngroups * f.chunk * f.chunk;
  p.dbc_splits = head_splits(cdiv(f.chunk, tile) * cdiv(f.dstate, half ? SsdBwdPolicy<true>::kN : SsdBwdPolicy<false>::kN) *
                                 f.ngroups * bc,
                             SsdDbcPolicy::kBlocksPerSm, f);
  w.dbc_part = p.dbc_splits > 1 ? p.dbc_splits * 2 * f.batch * f.seqlen * f.ngroups * f.dstate : 0;
  w.step_part = BH * f.nchunks * p.nslots * f.chunk;
  w.decay_part = BH * f.nchunks * p.pass_blocks;
  w.head_part = bc * 2 * f.nheads;
  w.dD_part = bc * p.stiles * f.nheads * f.headdim;
  return w;
}

cudaError_t launch_ssd_bwd(const SsdBwdParams& p, cudaStream_t stream) {
  const SsdFwdParams& f = p.f;
  if (f.chunk < 1 || f.chunk > kSsdMaxChunk) return cudaErrorInvalidValue;
  // batch 0 still sums the (zero) parameter gradients; the host code rejects headdim or dstate 0
  if (f.nheads == 0) return cudaSuccess;
  if (f.headdim == 0 || f.dstate == 0) return cudaErrorInvalidValue;
  switch (f.dtype) {
    case DType::kFloat32: return launch_typed<float>(p, stream);
    case DType::kFloat16: return launch_typed<__half>(p, stream);
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ssd
}  // namespace mamba_kernels
