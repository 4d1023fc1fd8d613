// Selective-scan forward. One thread owns one channel (b, d) and a slice of its states, and
// walks the sequence in order: every state of the slice lives in registers, so a step costs
// one exponential and two FMAs per state with no synchronisation between steps. The threads
// of a block share (b, group), so a tile of variable B/C is loaded once into shared memory and
// read there as a broadcast; the next tile's B/C, u and delta are fetched into registers while
// the current one is computed. A NaN at step t can only reach steps >= t.
//
// Few channels and a long sequence (too few threads to fill the GPU): the sequence is cut
// into segments run in parallel. A first pass computes each segment's end state from zero and
// its sum of dt; the full pass then starts segment p from the exact state
//   h_p = sum_{q<p} exp(A (S_{q+1} + ... + S_{p-1})) s_q,
// folded in order, and writes the outputs.
//
// Instantiations: dtype (3) x real/complex (2) = 6 kernels.
#include "scan_lanes.cuh"

namespace mamba_kernels {
namespace selective_scan {
namespace {


struct FwdLaunch {
  int tpr;              // threads per channel
  int64_t bpg;          // blocks per (batch, group)
  int64_t nseg;         // segments of the sequence
  int64_t seg_len;      // steps per segment (multiple of kChunk)
  float* seg_state;     // (batch, dim, nseg, NF): end state of each segment from zero
  float* seg_dtsum;     // (batch, dim, nseg)
  bool states_only;     // first pass: segment end states, no outputs
};

// One thread's walk over its segment, in phases: setup (the block's fixed B/C, A, D, the
// segment's start state) and, per tile, stage_bc, discretise, prefetch, scan, reduce_y,
// store_out and checkpoint; store_segment ends the first pass of a cut sequence.
template <typename T, bool kComplex>
struct FwdAgent {
  static constexpr int kSF = FwdPolicy::kSliceFloats;
  static constexpr int kNS = kComplex ? kSF / 2 : kSF;
  static constexpr int kF = kComplex ? 2 : 1;
  static constexpr int kTL = FwdPolicy::kTile;
  static constexpr int kH = kTL / 2;
  static constexpr int kPF = FwdPolicy::kPrefetch;
  static constexpr int kT = FwdPolicy::kThreads;

  // One tile's registers, scoped to the tile so that none lives across tiles (zr is loaded only
  // by the threads that read it).
  struct Tile {
    int64_t t0;
    int valid;
    float* tB;
    float* tC;
    float uu[kTL], dt[kTL], y[kTL];
    RawRow<T, kTL> zr;
  };

  const ScanParams& p;
  const FwdLaunch& f;
  int64_t L, N, NF, dpg;
  int tpr, rows;
  int64_t seg, rb, b, g;
  int tid, lr, s;
  bool active;
  int64_t d;
  int rs;  // shared row stride of a variable tile (>= NF)
  int fs;  // padding keeps 16-byte reads of neighbouring channels conflict-free
  float* sB;   // [2][kTL][rs] variable B tiles (double buffered)
  float* sC;   // [2][kTL][rs]
  float* sBf;  // [rows][fs] fixed B of the block's channels
  float* sCf;
  float* sY;  // [kT / 32][kTL] per-warp output sums when a channel spans warps
  int64_t n0;
  float a2[kSF], h[kSF];
  float Dd, bias;
  int64_t t_begin, t_stop;
  const T* u;
  const T* delta;
  const T* z;
  bool vec_u, vec_delta, vec_z, vec_out, vec_out_z;
  const T* Bv;
  const T* Cv;
  int b_step, c_step;
  int tile_elems;    // every float of a tile row is written, the padding beyond dstate with 0
  bool prefetch_bc;  // else: B/C tiles loaded in place (large dstate)
  float pB[kPF], pC[kPF];
  RawRow<T, kTL> pu, pdt;
  float dt_sum;

  __device__ __forceinline__ FwdAgent(const ScanParams& params, const FwdLaunch& launch, float* smem)
      : p(params), f(launch) {
    L = p.seqlen, N = p.dstate, NF = N * kF;
    dpg = p.dim / p.ngroups;
    tpr = f.tpr, rows = kT / tpr;
    seg = blockIdx.y;
    const int64_t bg = int64_t(blockIdx.x) / f.bpg;
    rb = int64_t(blockIdx.x) % f.bpg;
    b = bg / p.ngroups, g = bg % p.ngroups;
    tid = threadIdx.x, lr = tid / tpr, s = tid % tpr;
    const int64_t rig = rb * rows + lr;
    active = rig < dpg;
    d = g * dpg + (active ? rig : 0);  // inactive threads shadow row 0 and store nothing
    rs = tpr * kSF;
    fs = rs + 4;
    sB = smem;
    sC = sB + 2 * kTL * rs;
    sBf = sC + 2 * kTL * rs;
    sCf = sBf + rows * fs;
    sY = sCf + rows * fs;
  }

  __device__ __forceinline__ void load_fixed_bc() {
    for (int i = tid; i < rows * rs; i += kT) {
      const int r = i / rs, j = i % rs;
      const int64_t rr = rb * rows + r;
      const bool ok = rr < dpg && j < NF;
      const int64_t off = (g * dpg + rr) * NF + j;
      if (!p.B.variable) sBf[r * fs + j] = ok ? static_cast<const float*>(p.B.ptr)[off] : 0.0f;
      if (!p.C.variable) sCf[r * fs + j] = ok ? static_cast<const float*>(p.C.ptr)[off] : 0.0f;
    }
  }

  __device__ __forceinline__ void load_channel() {
    n0 = int64_t(s) * kNS;
#pragma unroll
    for (int j = 0; j < kSF; ++j) {
      const bool ok = n0 * kF + j < NF;
      const float a = ok ? p.A[d * NF + n0 * kF + j] : 0.0f;
      a2[j] = (kComplex && (j & 1)) ? a : a * kLog2e;  // complex: imaginary part stays in radians
      h[j] = 0.0f;
    }
    Dd = p.D != nullptr ? p.D[d] : 0.0f;
    bias = p.delta_bias != nullptr ? p.delta_bias[d] : 0.0f;
    t_begin = seg * f.seg_len;
    t_stop = t_begin + f.seg_len < L ? t_begin + f.seg_len : L;
  }

  // The exact start state of segment seg, folded from the earlier segments' end states.
  __device__ __forceinline__ void start_state() {
    const float* st = f.seg_state + (b * p.dim + d) * f.nseg * NF + n0 * kF;
    const float* sum = f.seg_dtsum + (b * p.dim + d) * f.nseg;
    for (int64_t q = 0; q < seg; ++q) {
#pragma unroll
      for (int j = 0; j < kNS; ++j) {
        const bool ok = (n0 + j) * kF < NF;
        if constexpr (!kComplex) {
          const float a = fast_exp2(sum[q] * a2[j]);
          h[j] = a * h[j] + (ok ? st[q * NF + j] : 0.0f);
        } else {
          float ar, ai;
          decay_complex(sum[q], a2[2 * j], a2[2 * j + 1], ar, ai);
          const float hr = h[2 * j], hi = h[2 * j + 1];
          h[2 * j] = ar * hr - ai * hi + (ok ? st[q * NF + 2 * j] : 0.0f);
          h[2 * j + 1] = ar * hi + ai * hr + (ok ? st[q * NF + 2 * j + 1] : 0.0f);
        }
      }
    }
  }

  __device__ __forceinline__ void setup_rows() {
    u = static_cast<const T*>(p.u) + offset3(p.u_s, b, d, 0);
    delta = static_cast<const T*>(p.delta) + offset3(p.delta_s, b, d, 0);
    z = p.z != nullptr ? static_cast<const T*>(p.z) + offset3(p.z_s, b, d, 0) : nullptr;
    vec_u = rows_vectorizable(p.u, p.u_s, sizeof(T));
    vec_delta = rows_vectorizable(p.delta, p.delta_s, sizeof(T));
    vec_z = rows_vectorizable(p.z, p.z_s, sizeof(T));
    vec_out = rows_vectorizable(p.out, p.out_s, sizeof(T));
    vec_out_z = rows_vectorizable(p.out_z, p.out_z_s, sizeof(T));
    Bv = p.B.variable ? static_cast<const T*>(p.B.ptr) + b * p.B.s_b + g * p.B.s_g : nullptr;
    Cv = p.C.variable ? static_cast<const T*>(p.C.ptr) + b * p.C.s_b + g * p.C.s_g : nullptr;
    b_step = p.B.variable ? rs : 0;
    c_step = p.C.variable ? rs : 0;
    tile_elems = rs * kTL;
    prefetch_bc = tile_elems <= kPF * kT;
  }

  // Element i of a tile: (state n, step t, component), stored at [t][n * kF + component].
  __device__ __forceinline__ void tile_src(int i, int64_t t0, int& dst, int64_t& n, int64_t& l, bool& ok) const {
    n = i / (kTL * kF);
    const int j = i % (kTL * kF);
    const int t = j / kF;
    l = t0 * kF + j;
    dst = t * rs + int(n) * kF + (j % kF);
    ok = t0 + t < t_stop && n < N;
  }

  __device__ __forceinline__ void fetch_bc(int64_t t0) {
#pragma unroll
    for (int k = 0; k < kPF; ++k) {
      const int i = tid + k * kT;
      int dst;
      int64_t n, l;
      bool ok;
      tile_src(i, t0, dst, n, l, ok);
      ok = ok && i < tile_elems;
      pB[k] = (ok && Bv != nullptr) ? to_float(Bv[n * p.B.s_n + l * p.B.s_l]) : 0.0f;
      pC[k] = (ok && Cv != nullptr) ? to_float(Cv[n * p.C.s_n + l * p.C.s_l]) : 0.0f;
    }
  }

  __device__ __forceinline__ void fetch_rows(int64_t t0) {
    const int valid = int(t_stop - t0 < kTL ? t_stop - t0 : kTL);
    load_raw_row(pu, u + t0 * p.u_s.l, p.u_s.l, valid, vec_u);
    load_raw_row(pdt, delta + t0 * p.delta_s.l, p.delta_s.l, valid, vec_delta);
  }

  // The tile's B/C into shared buffer buf: the values prefetched, or loaded now.
  __device__ __forceinline__ void stage_bc(Tile& tl, int64_t t0, int buf) {
    tl.t0 = t0;
    tl.valid = int(t_stop - t0 < kTL ? t_stop - t0 : kTL);
    tl.tB = sB + buf * kTL * rs;
    tl.tC = sC + buf * kTL * rs;
    if (prefetch_bc) {
#pragma unroll
      for (int k = 0; k < kPF; ++k) {
        const int i = tid + k * kT;
        if (i < tile_elems) {
          int dst;
          int64_t n, l;
          bool ok;
          tile_src(i, t0, dst, n, l, ok);
          if (Bv != nullptr) tl.tB[dst] = pB[k];
          if (Cv != nullptr) tl.tC[dst] = pC[k];
        }
      }
    } else {
      for (int i = tid; i < tile_elems; i += kT) {
        int dst;
        int64_t n, l;
        bool ok;
        tile_src(i, t0, dst, n, l, ok);
        if (Bv != nullptr) tl.tB[dst] = ok ? to_float(Bv[n * p.B.s_n + l * p.B.s_l]) : 0.0f;
        if (Cv != nullptr) tl.tC[dst] = ok ? to_float(Cv[n * p.C.s_n + l * p.C.s_l]) : 0.0f;
      }
    }
  }

  // dt of the tile. With two or more threads per channel, the two threads of a pair each
  // discretise half the steps and swap halves, so no step's softplus is computed twice.
  __device__ __forceinline__ void discretise(Tile& tl) const {
    const bool upper = (s & 1) != 0;
#pragma unroll
    for (int t = 0; t < kTL; ++t) {
      tl.uu[t] = pu.get(t);
      tl.y[t] = 0.0f;
    }
    if (tpr == 1) {
#pragma unroll
      for (int t = 0; t < kTL; ++t) {
        const float v = pdt.get(t) + bias;
        tl.dt[t] = p.softplus ? softplus(v) : v;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kH; ++i) {
        const float v = (upper ? pdt.get(kH + i) : pdt.get(i)) + bias;
        const float mine = p.softplus ? softplus(v) : v;
        const float other = __shfl_xor_sync(kFullMask, mine, 1);
        tl.dt[i] = upper ? other : mine;
        tl.dt[kH + i] = upper ? mine : other;
      }
    }
  }

  // This tile's z (its storing threads), then the next tile's B/C, u and delta.
  __device__ __forceinline__ void prefetch(Tile& tl) {
    if (!f.states_only && z != nullptr && s < 2) {
      load_raw_row(tl.zr, z + tl.t0 * p.z_s.l, p.z_s.l, tl.valid, vec_z);
    }
    if (tl.t0 + kTL < t_stop) {
      if (prefetch_bc) fetch_bc(tl.t0 + kTL);
      fetch_rows(tl.t0 + kTL);
    }
  }

  // One step of the recurrence for the thread's states; y[t] gets its part of sum_n C h.
  __device__ __forceinline__ void step(Tile& tl, int t, const float* b_base, const float* c_base) {
    const float dtu = tl.dt[t] * tl.uu[t];
    dt_sum += tl.dt[t];
    // 16-byte aligned: tiles start at multiples of 16 floats, slices at multiples of kSF = 8
    float bt[kSF], ct[kSF];
#pragma unroll
    for (int j = 0; j < kSF; j += 4) {
      const float4 vb = *reinterpret_cast<const float4*>(b_base + t * b_step + j);
      const float4 vc = *reinterpret_cast<const float4*>(c_base + t * c_step + j);
      bt[j] = vb.x, bt[j + 1] = vb.y, bt[j + 2] = vb.z, bt[j + 3] = vb.w;
      ct[j] = vc.x, ct[j + 1] = vc.y, ct[j + 2] = vc.z, ct[j + 3] = vc.w;
    }
    float acc = 0.0f;
    if constexpr (!kComplex) {
      float part[2] = {0.0f, 0.0f};  // two chains: half the dependent FMAs per step
#pragma unroll
      for (int j = 0; j < kNS; ++j) {
        const float a = fast_exp2(tl.dt[t] * a2[j]);
        h[j] = fmaf(a, h[j], dtu * bt[j]);
        part[j & 1] = fmaf(ct[j], h[j], part[j & 1]);
      }
      acc = part[0] + part[1];
    } else {
#pragma unroll
      for (int j = 0; j < kNS; ++j) {
        float ar, ai;
        decay_complex(tl.dt[t], a2[2 * j], a2[2 * j + 1], ar, ai);
        const float hr = h[2 * j], hi = h[2 * j + 1];
        h[2 * j] = ar * hr - ai * hi + dtu * bt[2 * j];
        h[2 * j + 1] = ar * hi + ai * hr + dtu * bt[2 * j + 1];
        acc += ct[2 * j] * h[2 * j] - ct[2 * j + 1] * h[2 * j + 1];  // Re(C h)
      }
      acc *= 2.0f;
    }
    tl.y[t] = acc;
  }

  __device__ __forceinline__ void scan(Tile& tl) {
    const float* b_base = p.B.variable ? tl.tB + s * kSF : sBf + lr * fs + s * kSF;
    const float* c_base = p.C.variable ? tl.tC + s * kSF : sCf + lr * fs + s * kSF;
    if (tl.valid == kTL) {  // no per-step branch: the scheduler may overlap the steps' exponentials
#pragma unroll
      for (int t = 0; t < kTL; ++t) step(tl, t, b_base, c_base);
    } else {
#pragma unroll
      for (int t = 0; t < kTL; ++t) {
        if (t < tl.valid) step(tl, t, b_base, c_base);  // the sequence's last, partial tile
      }
    }
  }

  // y summed over the channel's threads: shuffles within a warp, shared memory across warps.
  __device__ __forceinline__ void reduce_y(Tile& tl) {
    for (int o = 1; o < tpr && o < 32; o <<= 1) {
#pragma unroll
      for (int t = 0; t < kTL; ++t) tl.y[t] += __shfl_xor_sync(kFullMask, tl.y[t], o);
    }
    if (tpr > 32) {  // large complex dstate
      if ((tid & 31) == 0) {
#pragma unroll
        for (int t = 0; t < kTL; ++t) sY[(tid >> 5) * kTL + t] = tl.y[t];
      }
      __syncthreads();
      if (s < 2) {  // the two threads that store the outputs
        for (int w = 1; w < tpr / 32; ++w) {
#pragma unroll
          for (int t = 0; t < kTL; ++t) tl.y[t] += sY[((tid >> 5) + w) * kTL + t];
        }
      }
    }
  }

  // Outputs: every thread holds the channel's y; a pair of threads stores one half each (one
  // thread stores both halves when it is alone on its channel).
  __device__ __forceinline__ void store_out(const Tile& tl) const {
    for (int half = tpr == 1 ? 0 : s; active && half < 2; half += tpr == 1 ? 1 : 2) {
      const int base = half * kH;
      const int vh = tl.valid - base < kH ? tl.valid - base : kH;
      if (vh <= 0) break;
      float yo[kH];
#pragma unroll
      for (int i = 0; i < kH; ++i) yo[i] = half ? fmaf(Dd, tl.uu[kH + i], tl.y[kH + i]) : fmaf(Dd, tl.uu[i], tl.y[i]);
      if (p.out != nullptr) {
        store_row<T, kH>(static_cast<T*>(p.out) + offset3(p.out_s, b, d, tl.t0 + base), p.out_s.l, yo, vh, vec_out);
      }
      if (z != nullptr) {
#pragma unroll
        for (int i = 0; i < kH; ++i) yo[i] *= silu(half ? tl.zr.get(kH + i) : tl.zr.get(i));
        store_row<T, kH>(static_cast<T*>(p.out_z) + offset3(p.out_z_s, b, d, tl.t0 + base), p.out_z_s.l, yo, vh,
                         vec_out_z);
      }
    }
  }

  __device__ __forceinline__ void checkpoint(const Tile& tl) const {
    const int64_t t_end = tl.t0 + tl.valid;
    if (active && (t_end % kChunk == 0 || t_end == L)) {
      const int64_t c = (t_end - 1) / kChunk;
      const bool final_chunk = t_end == L;
      if (final_chunk || ((c + 1) & ((int64_t(1) << p.ckpt_shift) - 1)) == 0) {
        // slot c / 2^ckpt_shift; the final state fills the one slot a layout may have after it
        const int64_t k = c >> p.ckpt_shift, bd = b * p.dim + d;
        const int e = ckpt_elem_step(p);
        float* dst = ckpt_slot(p, bd, k, NF, kF) + n0 * kF * e;
        float* dst2 = final_chunk && k + 1 < p.ckpt_count ? ckpt_slot(p, bd, k + 1, NF, kF) + n0 * kF * e : nullptr;
#pragma unroll
        for (int j = 0; j < kSF; ++j) {
          if (n0 * kF + j < NF) {
            const int at = (j / kF) * kF * e + j % kF;  // state j / kF, component j % kF
            dst[at] = h[j];
            if (dst2 != nullptr) dst2[at] = h[j];
          }
        }
      }
    }
  }

  // First pass: the segment's end state from zero and its sum of dt.
  __device__ __forceinline__ void store_segment() const {
    float* st = f.seg_state + ((b * p.dim + d) * f.nseg + seg) * NF + n0 * kF;
#pragma unroll
    for (int j = 0; j < kSF; ++j) {
      if (n0 * kF + j < NF) st[j] = h[j];
    }
    if (s == 0) f.seg_dtsum[(b * p.dim + d) * f.nseg + seg] = dt_sum;
  }
};

// __grid_constant__: the agent holds references to the parameters, which so stay in the
// parameter space (no local copy) and are read where used.
template <typename T, bool kComplex>
__global__ void __launch_bounds__(FwdPolicy::kThreads, FwdPolicy::kMinBlocks)
    fwd_kernel(const __grid_constant__ ScanParams p, const __grid_constant__ FwdLaunch f) {
  using Agent = FwdAgent<T, kComplex>;
  extern __shared__ float smem[];
  Agent a(p, f, smem);
  a.load_fixed_bc();
  a.load_channel();
  if (!f.states_only && a.seg > 0) a.start_state();
  a.setup_rows();
  if (a.prefetch_bc) a.fetch_bc(a.t_begin);
  a.fetch_rows(a.t_begin);
  a.dt_sum = 0.0f;
  int buf = 0;
  for (int64_t t0 = a.t_begin; t0 < a.t_stop; t0 += Agent::kTL, buf ^= 1) {
    typename Agent::Tile tl;
    a.stage_bc(tl, t0, buf);
    a.discretise(tl);
    __syncthreads();  // tile t0 is in shared memory; the other buffer's readers are done
    a.prefetch(tl);
    a.scan(tl);
    if (f.states_only) continue;
    a.reduce_y(tl);
    a.store_out(tl);
    a.checkpoint(tl);
  }
  if (f.states_only && a.active) a.store_segment();
}

}  // namespace

int fwd_threads_per_row(int64_t dstate, bool is_complex) {
  const int64_t per = FwdPolicy::kSliceFloats / (is_complex ? 2 : 1);
  return pow2_at_least((dstate + per - 1) / per);
}

int64_t fwd_segments(const ScanParams& p) {
  if (lanes_fit(p.dstate, p.is_complex)) return 1;  // the lane kernel fills the GPU in one pass
  const int64_t warps = p.batch * p.dim * fwd_threads_per_row(p.dstate, p.is_complex) / 32 + 1;
  const int64_t sms = sm_count();
  if (warps >= sms * FwdPolicy::kMinWarpsPerSm) return 1;
  const int64_t want = (sms * FwdPolicy::kTargetWarpsPerSm + warps - 1) / warps;
  const int64_t most = p.seqlen / FwdPolicy::kMinSegment;
  return want < most ? want : (most > 1 ? most : 1);
}

cudaError_t launch_fwd(const ScanParams& p, float* seg_workspace, cudaStream_t stream) {
  if (p.batch == 0 || p.dim == 0 || p.seqlen == 0) return cudaSuccess;
  const int64_t chunks = (p.seqlen + kChunk - 1) / kChunk;
  const int64_t slots = ((chunks - 1) >> p.ckpt_shift) + 1;  // the kernels write these, and at most one more
  if (p.ckpt_shift < 0 || p.ckpt_shift > 24 || p.ckpt_count < slots || p.ckpt_count > slots + 1) {
    return cudaErrorInvalidValue;  // set_fwd_states checks what callers pass: this is the kernels' contract
  }
  if (lanes_fit(p.dstate, p.is_complex)) return launch_fwd_lanes(p, stream);
  return with_dtype_complex(p.dtype, p.is_complex, [&](auto tag, auto cplx) -> cudaError_t {
    using T = typename decltype(tag)::type;
    static constexpr bool kComplex = decltype(cplx)::value;
    FwdLaunch f{};
    f.tpr = fwd_threads_per_row(p.dstate, kComplex);
    if (f.tpr > FwdPolicy::kThreads) return cudaErrorInvalidValue;
    const int rows = FwdPolicy::kThreads / f.tpr;
    const int64_t dpg = p.dim / p.ngroups;
    f.bpg = (dpg + rows - 1) / rows;
    const int64_t blocks = f.bpg * p.batch * p.ngroups;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    f.nseg = seg_workspace != nullptr ? fwd_segments(p) : 1;
    const int64_t per = (p.seqlen + f.nseg - 1) / f.nseg;
    f.seg_len = (per + kChunk - 1) / kChunk * kChunk;
    f.nseg = (p.seqlen + f.seg_len - 1) / f.seg_len;
    const int rs = f.tpr * FwdPolicy::kSliceFloats;
    const size_t smem =
        sizeof(float) * (4 * FwdPolicy::kTile * rs + 2 * rows * (rs + 4) + FwdPolicy::kThreads / 32 * FwdPolicy::kTile);
    auto kernel = fwd_kernel<T, kComplex>;
    if (smem > 48 * 1024) {  // large dstate: opt in to more than the default dynamic shared memory
      const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      if (err != cudaSuccess) return err;
    }
    if (f.nseg > 1) {
      const int64_t nf = p.dstate * (kComplex ? 2 : 1);
      f.seg_state = seg_workspace;
      f.seg_dtsum = seg_workspace + p.batch * p.dim * f.nseg * nf;
      f.states_only = true;
      kernel<<<dim3(unsigned(blocks), unsigned(f.nseg - 1)), FwdPolicy::kThreads, smem, stream>>>(p, f);
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
      f.states_only = false;
    }
    kernel<<<dim3(unsigned(blocks), unsigned(f.nseg)), FwdPolicy::kThreads, smem, stream>>>(p, f);
    return cudaGetLastError();
  });
}

}  // namespace selective_scan
}  // namespace mamba_kernels
