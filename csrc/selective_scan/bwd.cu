// Selective-scan backward. One thread owns one channel (b, d) and a slice of kNS states and
// walks the sequence backwards, chunk by chunk, from the states the forward saved after every
// chunk. Inside a chunk a forward sweep records the state at the start of each window of kW
// steps (shared memory); each window is then recomputed into registers (states and decays)
// and swept in reverse with the adjoint g_t = conj(C_t) dy_t + conj(a_{t+1}) g_{t+1}.
//
// Work per (channel, step) that does not depend on the state (dt, the z gate, dz, du, ddelta)
// is done once per channel, its steps spread over the channel's threads, and shared through
// shared memory. dB/dC of variable B/C are summed over the block's channels in a fixed order
// and written as per-block partials, which the caller sums: no atomics, so results are
// bitwise reproducible.
//
// Instantiations: dtype (3) x real/complex (2) = 6 kernels.
#include "scan_lanes.cuh"

namespace mamba_kernels {
namespace selective_scan {
namespace {


template <bool kComplex>
__host__ __device__ constexpr int bwd_rs(int tpr) {  // floats per step of a B/C tile (all slices)
  return tpr * BwdPolicy::kStates * (kComplex ? 2 : 1);
}

// Steps of B/C held in shared memory at once: a whole chunk when it fits, else one window.
template <bool kComplex>
int bwd_tile_steps(int tpr) {
  return kChunk * bwd_rs<kComplex>(tpr) <= BwdPolicy::kTileFloats ? kChunk : BwdPolicy::window<kComplex>();
}

// Shared memory, in floats, in the kernel's order.
struct BwdSmem {
  int tiles, starts, steps, dy, red, sums;
  __host__ __device__ int total() const { return tiles + starts + steps + dy + red + sums; }
};

template <bool kComplex>
__host__ __device__ BwdSmem bwd_smem(int tpr, int ts) {
  constexpr int kW = BwdPolicy::window<kComplex>();
  constexpr int kSF = BwdPolicy::kStates * (kComplex ? 2 : 1);
  constexpr int kT = BwdPolicy::kThreads;
  const int rs = bwd_rs<kComplex>(tpr), rows = kT / tpr;
  BwdSmem m;
  m.tiles = 2 * ts * rs;                                 // B, C
  m.starts = (kChunk / kW) * kSF * kT;                   // states at window starts
  m.steps = 2 * rows * (kChunk + BwdPolicy::kRowPad);    // dt, u of the chunk
  m.dy = rows * (kW + BwdPolicy::kRowPad);               // gated dout of the window
  m.red = 2 * rows * kW * rs;                            // per-channel dB, dC of the window
  m.sums = 2 * kW * kT + 2 * kT;                         // per-thread sums per step; dD, dbias
  return m;
}

// One thread's walk of the backward, in phases: setup (its A and fixed B/C), per chunk stage
// (dt and u), enter (the saved state) and sweep (the states at window starts), then per window
// in reverse: gate, recompute, reverse (adjoint and gradients, step by step), sum_dbc (over the
// block's channels) and du_ddelta; finish writes the per-channel sums. All inlined: the
// phases share registers as one body did.
template <typename T, bool kComplex>
struct BwdAgent {
  static constexpr int kNS = BwdPolicy::kStates;
  static constexpr int kF = kComplex ? 2 : 1;
  static constexpr int kSF = kNS * kF;
  static constexpr int kW = BwdPolicy::window<kComplex>();
  static constexpr int kT = BwdPolicy::kThreads;
  static constexpr int kRS = kChunk + BwdPolicy::kRowPad;  // row stride of the per-step arrays
  static constexpr int kDS = kW + BwdPolicy::kRowPad;

  const ScanParams& p;
  const int tpr, ts;
  const int64_t blocks_per_group;
  int64_t L, N, NF, b, g, rb, d, n0;
  int rows, rs, tid, lr, s;
  bool active;
  float* sB;     // [ts][rs] tile of variable B (steps [tile0, tile0 + ts))
  float* sC;     // [ts][rs]
  float* sWS;    // [kChunk / kW][kSF][kT] states at window starts
  float* sRB;    // [rows][kW][rs] per-channel dB of the window
  float* sRC;    // [rows][kW][rs] per-channel dC
  float* sSumD;  // [kW][kT] per-thread part of sum_n Re(conj(A) da)
  float* sSumB;  // [kW][kT] per-thread part of sum_n Re(conj(B) g)
  float* sAcc;   // [2][kT] per-thread dD, dbias
  float* dtr;    // this channel's row of dt of the chunk's steps
  float* ur;     // u
  float* dyr;    // dout * silu(z) of the window
  const T *u, *delta, *dout, *z, *yv, *Bv, *Cv;
  T *du_row, *ddelta_row, *dz_row, *out_z_row;
  const float* tileB;  // sB for variable B, else null (slice takes Bf)
  const float* tileC;
  int64_t tile0 = -1;
  float a2[kSF], Af[kSF], Bf[kSF], Cf[kSF], dA[kSF], dBf[kSF], dCf[kSF], gc[kSF];
  float Dd, bias, dD_acc = 0.0f, dbias_acc = 0.0f;

  __device__ __forceinline__ BwdAgent(const ScanParams& params, int tpr_, int64_t bpg, int ts_, float* smem)
      : p(params), tpr(tpr_), ts(ts_), blocks_per_group(bpg) {
    L = p.seqlen, N = p.dstate, NF = N * kF;
    const int64_t dpg = p.dim / p.ngroups;
    rows = kT / tpr;
    rs = bwd_rs<kComplex>(tpr);
    tid = threadIdx.x;
    const int64_t bg = int64_t(blockIdx.x) / blocks_per_group;
    rb = int64_t(blockIdx.x) % blocks_per_group;
    b = bg / p.ngroups, g = bg % p.ngroups;
    lr = tid / tpr, s = tid % tpr;
    const int64_t rig = rb * rows + lr;
    active = rig < dpg;
    d = g * dpg + (active ? rig : 0);  // inactive threads shadow row 0 and store nothing
    const BwdSmem m = bwd_smem<kComplex>(tpr, ts);
    sB = smem;
    sC = sB + ts * rs;
    sWS = smem + m.tiles;
    float* sDT = sWS + m.starts;  // [rows][kRS] dt, then [rows][kRS] u
    float* sDY = sDT + m.steps;   // [rows][kDS]
    sRB = sDY + m.dy;
    sRC = sRB + rows * kW * rs;
    sSumD = sRB + m.red;
    sSumB = sSumD + kW * kT;
    sAcc = sSumB + kW * kT;
    dtr = sDT + lr * kRS;
    ur = sDT + rows * kRS + lr * kRS;
    dyr = sDY + lr * kDS;
    n0 = int64_t(s) * kNS;
  }

  // This thread's A (and log2e A) and fixed B/C; the rows it reads and writes.
  __device__ __forceinline__ void setup() {
#pragma unroll
    for (int j = 0; j < kSF; ++j) {
      const bool ok = n0 * kF + j < NF;
      const int64_t off = d * NF + n0 * kF + j;
      Af[j] = ok ? p.A[off] : 0.0f;
      a2[j] = (kComplex && (j & 1)) ? Af[j] : Af[j] * kLog2e;
      Bf[j] = (ok && !p.B.variable) ? static_cast<const float*>(p.B.ptr)[off] : 0.0f;
      Cf[j] = (ok && !p.C.variable) ? static_cast<const float*>(p.C.ptr)[off] : 0.0f;
      dA[j] = dBf[j] = dCf[j] = gc[j] = 0.0f;
    }
    Dd = p.D != nullptr ? p.D[d] : 0.0f;
    bias = p.delta_bias != nullptr ? p.delta_bias[d] : 0.0f;
    u = static_cast<const T*>(p.u) + offset3(p.u_s, b, d, 0);
    delta = static_cast<const T*>(p.delta) + offset3(p.delta_s, b, d, 0);
    dout = static_cast<const T*>(p.dout) + offset3(p.dout_s, b, d, 0);
    z = p.z != nullptr ? static_cast<const T*>(p.z) + offset3(p.z_s, b, d, 0) : nullptr;
    yv = p.y != nullptr ? static_cast<const T*>(p.y) + offset3(p.y_s, b, d, 0) : nullptr;
    du_row = static_cast<T*>(p.du) + offset3(p.du_s, b, d, 0);
    ddelta_row = static_cast<T*>(p.ddelta) + offset3(p.ddelta_s, b, d, 0);
    dz_row = p.dz != nullptr ? static_cast<T*>(p.dz) + offset3(p.dz_s, b, d, 0) : nullptr;
    out_z_row = p.out_z != nullptr ? static_cast<T*>(p.out_z) + offset3(p.out_z_s, b, d, 0) : nullptr;
    Bv = p.B.variable ? static_cast<const T*>(p.B.ptr) + b * p.B.s_b + g * p.B.s_g : nullptr;
    Cv = p.C.variable ? static_cast<const T*>(p.C.ptr) + b * p.C.s_b + g * p.C.s_g : nullptr;
    tileB = Bv != nullptr ? sB : nullptr;
    tileC = Cv != nullptr ? sC : nullptr;
  }

  // Variable B and C of steps [want, want + ts) into the tiles, zero beyond L or dstate; a no-op
  // when the tile already holds them (block-uniform, like every caller).
  __device__ __forceinline__ void ensure_tile(int64_t t0) {
    if (Bv == nullptr && Cv == nullptr) return;
    const int64_t want = t0 - (t0 % kChunk) + ((t0 % kChunk) / ts) * ts;
    if (want == tile0) return;
    tile0 = want;
    __syncthreads();  // earlier readers of the tiles are done
    for (int i = tid; i < rs * ts; i += kT) {
      const int t = i / rs, k = i % rs;  // k = n * kF + component
      const bool ok = want + t < L && k < NF;
      const int64_t n = k / kF, l = (want + t) * kF + (k % kF);
      if (Bv != nullptr) sB[i] = ok ? to_float(Bv[n * p.B.s_n + l * p.B.s_l]) : 0.0f;
      if (Cv != nullptr) sC[i] = ok ? to_float(Cv[n * p.C.s_n + l * p.C.s_l]) : 0.0f;
    }
    __syncthreads();
  }

  // This thread's slice of B or C at step t of the tile: 16-byte shared reads (tiles and slices
  // start at multiples of 4 floats), or the fixed values.
  __device__ __forceinline__ void slice(const float* tile, const float (&fixed)[kSF], int tb, int t,
                                        float (&out)[kSF]) const {
    if (tile == nullptr) {
#pragma unroll
      for (int j = 0; j < kSF; ++j) out[j] = fixed[j];
      return;
    }
#pragma unroll
    for (int j = 0; j < kSF; j += 4) {
      const float4 v = *reinterpret_cast<const float4*>(tile + tb + t * rs + s * kSF + j);
      out[j] = v.x, out[j + 1] = v.y, out[j + 2] = v.z, out[j + 3] = v.w;
    }
  }

  __device__ __forceinline__ static void store4(float* dst, const float (&v)[kSF]) {
#pragma unroll
    for (int j = 0; j < kSF; j += 4) {
      *reinterpret_cast<float4*>(dst + j) = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
    }
  }

  // dt and u of the chunk, each step computed by one of the channel's threads.
  __device__ __forceinline__ void stage(int64_t tc0, int clen) {
    __syncthreads();  // the previous chunk's readers are done
    for (int t = s; t < clen; t += tpr) {
      const float v = to_float(delta[(tc0 + t) * p.delta_s.l]) + bias;
      dtr[t] = p.softplus ? softplus(v) : v;
      ur[t] = to_float(u[(tc0 + t) * p.u_s.l]);
    }
    ensure_tile(tc0);  // its barriers also publish dt and u
    if (Bv == nullptr && Cv == nullptr) __syncthreads();
  }

  // The state entering chunk c: the forward's saved one (zero for the first chunk).
  __device__ __forceinline__ void enter(int64_t c, int64_t n_chunks, float (&h)[kSF]) const {
    const float* src = c > 0 ? p.ckpt + ((b * p.dim + d) * n_chunks + c - 1) * NF + n0 * kF : nullptr;
#pragma unroll
    for (int j = 0; j < kSF; ++j) h[j] = (src != nullptr && n0 * kF + j < NF) ? src[j] : 0.0f;
  }

  // One step forward: h = a h + dt u B.
  __device__ __forceinline__ void advance(float dt, float dtu, const float (&bq)[kSF], float (&h)[kSF]) const {
#pragma unroll
    for (int j = 0; j < kNS; ++j) {
      if constexpr (!kComplex) {
        h[j] = fmaf(fast_exp2(dt * a2[j]), h[j], dtu * bq[j]);
      } else {
        float ar, ai;
        decay_complex(dt, a2[2 * j], a2[2 * j + 1], ar, ai);
        const float hr = h[2 * j], hi = h[2 * j + 1];
        h[2 * j] = ar * hr - ai * hi + bq[2 * j] * dtu;
        h[2 * j + 1] = ar * hi + ai * hr + bq[2 * j + 1] * dtu;
      }
    }
  }

  // Forward sweep of the chunk: the state entering each window into sWS.
  __device__ __forceinline__ void sweep(int64_t tc0, int nwin, float (&h)[kSF]) {
    for (int w = 0; w < nwin; ++w) {
#pragma unroll
      for (int j = 0; j < kSF; ++j) sWS[(w * kSF + j) * kT + tid] = h[j];
      if (w == nwin - 1) break;
      const int64_t t0 = tc0 + int64_t(w) * kW;  // a full window: only the last can be partial
      ensure_tile(t0);
      const int tb = int(t0 - tile0) * rs;
#pragma unroll
      for (int t = 0; t < kW; ++t) {
        const float dt = dtr[w * kW + t];
        const float dtu = ur[w * kW + t] * dt;
        float bq[kSF];
        slice(tileB, Bf, tb, t, bq);
        advance(dt, dtu, bq, h);
      }
    }
  }

  // The gate, once per (channel, step): dy = dout silu(z), dz = dout y silu'(z), and out_z =
  // y silu(z) when asked for.
  __device__ __forceinline__ void gate(int64_t t0, int valid) {
    for (int t = s; t < valid; t += tpr) {
      float gy = to_float(dout[(t0 + t) * p.dout_s.l]);
      if (z != nullptr) {
        const float zz = to_float(z[(t0 + t) * p.z_s.l]);
        const float yy = to_float(yv[(t0 + t) * p.y_s.l]);
        if (active) dz_row[(t0 + t) * p.dz_s.l] = from_float<T>(gy * yy * silu_grad(zz));
        if (active && out_z_row != nullptr) out_z_row[(t0 + t) * p.out_z_s.l] = from_float<T>(yy * silu(zz));
        gy *= silu(zz);
      }
      dyr[t] = gy;
    }
  }

  // Window w recomputed into registers: states before each step (hp) and decays (aa; 0 past
  // valid).
  __device__ __forceinline__ void recompute(int w, int tb, int valid, const float (&dt)[kW], const float (&dtu)[kW],
                                            float (&hp)[kW][kSF], float (&aa)[kW][kSF]) const {
    float h[kSF];
#pragma unroll
    for (int j = 0; j < kSF; ++j) h[j] = sWS[(w * kSF + j) * kT + tid];
#pragma unroll
    for (int t = 0; t < kW; ++t) {
      float bq[kSF];
      slice(tileB, Bf, tb, t, bq);
#pragma unroll
      for (int j = 0; j < kNS; ++j) {
        if constexpr (!kComplex) {
          const float a = t < valid ? fast_exp2(dt[t] * a2[j]) : 0.0f;
          hp[t][j] = h[j];
          aa[t][j] = a;
          h[j] = fmaf(a, h[j], dtu[t] * bq[j]);
        } else {
          float ar = 0.0f, ai = 0.0f;
          if (t < valid) decay_complex(dt[t], a2[2 * j], a2[2 * j + 1], ar, ai);
          const float hr = h[2 * j], hi = h[2 * j + 1];
          hp[t][2 * j] = hr;
          hp[t][2 * j + 1] = hi;
          aa[t][2 * j] = ar;
          aa[t][2 * j + 1] = ai;
          h[2 * j] = ar * hr - ai * hi + dtu[t] * bq[2 * j];
          h[2 * j + 1] = ar * hi + ai * hr + dtu[t] * bq[2 * j + 1];
        }
      }
    }
  }

  // One step's adjoint, real A: g = C dy + carry; dA here, dB/dC and the step's sums out.
  __device__ __forceinline__ void grads(float dt, float dtu, float dy, const float (&hp)[kSF], const float (&aa)[kSF],
                                        const float (&bq)[kSF], const float (&cq)[kSF], float (&dbq)[kSF],
                                        float (&dcq)[kSF], float& sumA, float& sumB) {
#pragma unroll
    for (int j = 0; j < kNS; ++j) {
      const float bb = bq[j], cc = cq[j];
      const float gg = fmaf(cc, dy, gc[j]);
      const float ah = aa[j] * hp[j];
      const float da = ah * gg;
      dA[j] = fmaf(dt, da, dA[j]);
      sumA = fmaf(Af[j], da, sumA);
      sumB = fmaf(bb, gg, sumB);
      const float db = gg * dtu, dc = fmaf(dtu, bb, ah) * dy;
      dbq[j] = active ? db : 0.0f;
      dcq[j] = active ? dc : 0.0f;
      gc[j] = aa[j] * gg;
    }
  }

  // The same for complex A: g = conj(C) dy + conj(a) carry.
  __device__ __forceinline__ void grads_complex(float dt, float dtu, float dy, const float (&hp)[kSF],
                                                const float (&aa)[kSF], const float (&bq)[kSF],
                                                const float (&cq)[kSF], float (&dbq)[kSF], float (&dcq)[kSF],
                                                float& sumA, float& sumB) {
    const float dyw = 2.0f * dy;
#pragma unroll
    for (int j = 0; j < kNS; ++j) {
      const int r = 2 * j, i = 2 * j + 1;
      const float br = bq[r], bi = bq[i];
      const float cr = cq[r], ci = cq[i];
      const float gr = cr * dyw + gc[r], gi = -ci * dyw + gc[i];  // conj(C) dyw + carry
      const float ar = aa[r], ai = aa[i], pr = hp[r], pi = hp[i];
      const float wr = ar * pr - ai * pi, wi = ar * pi + ai * pr;  // a h_{t-1}
      const float dar = wr * gr + wi * gi, dai = wr * gi - wi * gr;  // conj(a h_{t-1}) g
      dA[r] = fmaf(dt, dar, dA[r]);
      dA[i] = fmaf(dt, dai, dA[i]);
      sumA += Af[r] * dar + Af[i] * dai;  // Re(conj(A) da)
      sumB += br * gr + bi * gi;          // Re(conj(B) g)
      const float dbr = gr * dtu, dbi = gi * dtu;
      const float dcr = (wr + dtu * br) * dyw, dci = -(wi + dtu * bi) * dyw;  // conj(h_t) dyw
      dbq[r] = active ? dbr : 0.0f;
      dbq[i] = active ? dbi : 0.0f;
      dcq[r] = active ? dcr : 0.0f;
      dcq[i] = active ? dci : 0.0f;
      gc[r] = ar * gr + ai * gi;  // conj(a) g
      gc[i] = ar * gi - ai * gr;
    }
  }

  // Reverse step t of the window: its gradients, then variable dB/dC of this channel for the
  // block sum (fixed: summed here) and the step's sums over this thread's states.
  __device__ __forceinline__ void rev_step(int t, int tb, const float (&dt)[kW], const float (&dtu)[kW],
                                           const float (&dy)[kW], const float (&hp)[kW][kSF],
                                           const float (&aa)[kW][kSF]) {
    float sumA = 0.0f, sumB = 0.0f;
    float* rbt = sRB + (lr * kW + t) * rs + s * kSF;
    float* rct = sRC + (lr * kW + t) * rs + s * kSF;
    float bq[kSF], cq[kSF], dbq[kSF], dcq[kSF];
    slice(tileB, Bf, tb, t, bq);
    slice(tileC, Cf, tb, t, cq);
    if constexpr (!kComplex) {
      grads(dt[t], dtu[t], dy[t], hp[t], aa[t], bq, cq, dbq, dcq, sumA, sumB);
    } else {
      grads_complex(dt[t], dtu[t], dy[t], hp[t], aa[t], bq, cq, dbq, dcq, sumA, sumB);
    }
    if (Bv != nullptr) {
      store4(rbt, dbq);
    } else {
#pragma unroll
      for (int j = 0; j < kSF; ++j) dBf[j] += dbq[j];
    }
    if (Cv != nullptr) {
      store4(rct, dcq);
    } else {
#pragma unroll
      for (int j = 0; j < kSF; ++j) dCf[j] += dcq[j];
    }
    sSumD[t * kT + tid] = sumA;
    sSumB[t * kT + tid] = sumB;
  }

  // Reverse sweep of the window; steps past valid leave zeros.
  __device__ __forceinline__ void reverse(int tb, int valid, const float (&dt)[kW], const float (&dtu)[kW],
                                          const float (&dy)[kW], const float (&hp)[kW][kSF],
                                          const float (&aa)[kW][kSF]) {
    if (valid == kW) {  // no per-step branch in full windows
#pragma unroll
      for (int t = kW - 1; t >= 0; --t) rev_step(t, tb, dt, dtu, dy, hp, aa);
      return;
    }
#pragma unroll
    for (int t = kW - 1; t >= 0; --t) {
      if (t < valid) {
        rev_step(t, tb, dt, dtu, dy, hp, aa);
      } else {
#pragma unroll
        for (int k = 0; k < kSF; ++k) {
          sRB[(lr * kW + t) * rs + s * kSF + k] = 0.0f;
          sRC[(lr * kW + t) * rs + s * kSF + k] = 0.0f;
        }
        sSumD[t * kT + tid] = sSumB[t * kT + tid] = 0.0f;
      }
    }
  }

  // dB/dC of the window summed over the block's channels, in channel order.
  __device__ __forceinline__ void sum_dbc(int64_t t0, int valid) {
    if (Bv == nullptr && Cv == nullptr) return;
    const int64_t LF = L * kF;
    for (int i = tid; i < int(NF) * kW; i += kT) {
      const int k = i / kW, t = i % kW;  // k = n * kF + component
      if (t >= valid) continue;
      const int64_t n = k / kF, l = (t0 + t) * kF + (k % kF);
      const int64_t dst = (((b * p.ngroups + g) * blocks_per_group + rb) * N + n) * LF + l;
      if (Bv != nullptr) {
        float acc = 0.0f;
        for (int r = 0; r < rows; ++r) acc += sRB[(r * kW + t) * rs + k];
        p.dB_part[dst] = acc;
      }
      if (Cv != nullptr) {
        float acc = 0.0f;
        for (int r = 0; r < rows; ++r) acc += sRC[(r * kW + t) * rs + k];
        p.dC_part[dst] = acc;
      }
    }
  }

  // du and ddelta, once per (channel, step), from the step's sums over the channel's threads.
  __device__ __forceinline__ void du_ddelta(int w, int64_t t0, int valid) {
    for (int t = s; t < valid; t += tpr) {
      float sa = 0.0f, sb = 0.0f;
      for (int k = 0; k < tpr; ++k) {
        sa += sSumD[t * kT + lr * tpr + k];
        sb += sSumB[t * kT + lr * tpr + k];
      }
      const float dtt = dtr[w * kW + t], ut = ur[w * kW + t], dyt = dyr[t];
      float gdt = fmaf(ut, sb, sa);
      if (p.softplus) gdt *= -expm1f(-dtt);  // sigmoid(x) = 1 - exp(-softplus(x))
      dbias_acc += gdt;
      dD_acc = fmaf(dyt, ut, dD_acc);
      if (active) {
        du_row[(t0 + t) * p.du_s.l] = from_float<T>(fmaf(dtt, sb, Dd * dyt));
        ddelta_row[(t0 + t) * p.ddelta_s.l] = from_float<T>(gdt);
      }
    }
  }

  // Window w of the chunk from tc0, all phases.
  __device__ __forceinline__ void window(int64_t tc0, int w) {
    const int64_t t0 = tc0 + int64_t(w) * kW;
    const int valid = int(L - t0 < kW ? L - t0 : kW);
    ensure_tile(t0);
    const int tb = int(t0 - tile0) * rs;
    gate(t0, valid);
    __syncthreads();
    float dt[kW], dtu[kW], dy[kW];
#pragma unroll
    for (int t = 0; t < kW; ++t) {
      dt[t] = dtr[w * kW + t];
      dtu[t] = dt[t] * ur[w * kW + t];
      dy[t] = dyr[t];
    }
    float hp[kW][kSF], aa[kW][kSF];
    recompute(w, tb, valid, dt, dtu, hp, aa);
    reverse(tb, valid, dt, dtu, dy, hp, aa);
    __syncthreads();
    sum_dbc(t0, valid);
    du_ddelta(w, t0, valid);
    __syncthreads();  // the sums above are read before the next window overwrites them
  }

  // Per (batch, channel): dA and fixed dB/dC per state; dD and dbias over the channel's threads.
  __device__ __forceinline__ void finish() {
    sAcc[tid] = dD_acc;
    sAcc[kT + tid] = dbias_acc;
    __syncthreads();
    if (!active) return;
    const int64_t off = (b * p.dim + d) * NF + n0 * kF;
#pragma unroll
    for (int j = 0; j < kSF; ++j) {
      if (n0 * kF + j >= NF) break;
      p.dA_part[off + j] = dA[j];
      if (!p.B.variable) p.dB_part[off + j] = dBf[j];
      if (!p.C.variable) p.dC_part[off + j] = dCf[j];
    }
    if (s == 0) {
      float sd = 0.0f, sbias = 0.0f;
      for (int k = 0; k < tpr; ++k) {
        sd += sAcc[lr * tpr + k];
        sbias += sAcc[kT + lr * tpr + k];
      }
      if (p.dD_part != nullptr) p.dD_part[b * p.dim + d] = sd;
      if (p.dbias_part != nullptr) p.dbias_part[b * p.dim + d] = sbias;
    }
  }
};

template <typename T, bool kComplex>
__global__ void __launch_bounds__(BwdPolicy::kThreads)
    bwd_kernel(const ScanParams p, const int tpr, const int64_t blocks_per_group, const int ts) {
  using Agent = BwdAgent<T, kComplex>;
  extern __shared__ float smem[];
  Agent a(p, tpr, blocks_per_group, ts, smem);
  a.setup();
  const int64_t n_chunks = (a.L + kChunk - 1) / kChunk;
  for (int64_t c = n_chunks - 1; c >= 0; --c) {
    const int64_t tc0 = c * kChunk;
    const int clen = int(a.L - tc0 < kChunk ? a.L - tc0 : kChunk);
    const int nwin = (clen + Agent::kW - 1) / Agent::kW;
    a.stage(tc0, clen);
    float h[Agent::kSF];
    a.enter(c, n_chunks, h);
    a.sweep(tc0, nwin, h);
    for (int w = nwin - 1; w >= 0; --w) a.window(tc0, w);
  }
  a.finish();
}

}  // namespace

int bwd_threads_per_row(int64_t dstate, bool) {
  return pow2_at_least((dstate + BwdPolicy::kStates - 1) / BwdPolicy::kStates);
}

int64_t bwd_row_blocks(const ScanParams& p) {
  if (lanes_fit(p.dstate, p.is_complex)) return bwd_lanes_row_blocks(p);
  const int rows = BwdPolicy::kThreads / bwd_threads_per_row(p.dstate, p.is_complex);
  const int64_t dpg = p.dim / p.ngroups;
  return (dpg + rows - 1) / rows;
}

int bwd_max_state_shift(const ScanParams& p) {
  return lanes_fit(p.dstate, p.is_complex) ? BwdLanesPolicy::kMaxStateShift : 0;
}

int64_t bwd_window_chunks(const ScanParams& p) {
  if (p.ckpt_shift == 0 || !lanes_fit(p.dstate, p.is_complex)) return 0;
  const int64_t per = int64_t(1) << p.ckpt_shift;
  if ((p.seqlen + kChunk - 1) / kChunk <= per) return 0;
  // Windows hold a variable B/C's partial rows to a window's steps, for the carried sums and a
  // launch and a sum launch a window: only where that takes less memory than one pass.
  const int64_t per_step = p.batch * p.ngroups * bwd_row_blocks(p) * p.dstate * (p.B.variable + p.C.variable);
  return per_step * per * kChunk + bwd_carry_floats(p) < per_step * p.seqlen ? per : 0;
}

int64_t bwd_carry_floats(const ScanParams& p) { return p.batch * p.dim * LanePolicy::kLanes * kBwdCarry; }

cudaError_t launch_bwd(const ScanParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.dim == 0 || p.seqlen == 0) return cudaSuccess;
  if (p.ckpt_shift > bwd_max_state_shift(p) || (p.ckpt_pairs && !lanes_fit(p.dstate, p.is_complex))) {
    return cudaErrorInvalidValue;  // set_bwd_inputs checks what callers pass: this is the kernels' contract
  }
  if (lanes_fit(p.dstate, p.is_complex)) return launch_bwd_lanes(p, stream);
  return with_dtype_complex(p.dtype, p.is_complex, [&](auto tag, auto cplx) -> cudaError_t {
    using T = typename decltype(tag)::type;
    static constexpr bool kComplex = decltype(cplx)::value;
    const int tpr = bwd_threads_per_row(p.dstate, kComplex);
    if (tpr > BwdPolicy::kThreads) return cudaErrorInvalidValue;
    const int64_t bpg = bwd_row_blocks(p);
    const int64_t blocks = bpg * p.batch * p.ngroups;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    const int ts = bwd_tile_steps<kComplex>(tpr);
    const size_t smem = sizeof(float) * size_t(bwd_smem<kComplex>(tpr, ts).total());
    auto kernel = bwd_kernel<T, kComplex>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) return err;
    kernel<<<unsigned(blocks), BwdPolicy::kThreads, smem, stream>>>(p, tpr, bpg, ts);
    return cudaGetLastError();
  });
}

}  // namespace selective_scan
}  // namespace mamba_kernels
