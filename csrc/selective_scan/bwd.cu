// Selective-scan backward. One thread owns one channel (b, d) and a slice of kNS states and
// walks the sequence backwards, chunk by chunk, from the states the forward saved after every
// chunk. Inside a chunk a forward sweep records the state at the start of each window of kW
// steps (shared memory); each window is then recomputed into registers (states and decays)
// and swept in reverse with the adjoint g_t = conj(C_t) dy_t + conj(a_{t+1}) g_{t+1}.
// Per-step sums over states (du, ddelta) go through shared memory across the threads of a
// channel; dB/dC of variable B/C are summed over the block's channels in a fixed order and
// written as per-block partials, which the caller sums: no atomics, so results are bitwise
// reproducible.
//
// Instantiations: dtype (3) x real/complex (2) = 6 kernels.
#include "scan_common.cuh"

namespace mamba_kernels {
namespace selective_scan {
namespace {

struct BwdPolicy {
  static constexpr int kThreads = 128;
  static constexpr int kStates = 4;  // states per thread
  template <bool kComplex>
  __host__ __device__ static constexpr int window() { return kComplex ? 4 : 8; }  // steps recomputed into registers
};

template <bool kComplex>
__host__ __device__ constexpr int bwd_rs(int tpr) {  // floats per step of a B/C tile (all slices of a channel)
  return tpr * BwdPolicy::kStates * (kComplex ? 2 : 1);
}

template <bool kComplex>
size_t bwd_smem_bytes(int tpr) {
  constexpr int kW = BwdPolicy::window<kComplex>();
  constexpr int kSF = BwdPolicy::kStates * (kComplex ? 2 : 1);
  constexpr int kT = BwdPolicy::kThreads;
  const int rs = bwd_rs<kComplex>(tpr), rows = kT / tpr;
  return sizeof(float) * (2 * kW * rs + (kChunk / kW) * kSF * kT + 2 * rows * kW * rs + 2 * kW * kT);
}

template <typename T, bool kComplex>
__global__ void __launch_bounds__(BwdPolicy::kThreads)
    bwd_kernel(const ScanParams p, const int tpr, const int64_t blocks_per_group) {
  constexpr int kNS = BwdPolicy::kStates;
  constexpr int kF = kComplex ? 2 : 1;
  constexpr int kSF = kNS * kF;
  constexpr int kW = BwdPolicy::window<kComplex>();
  constexpr int kT = BwdPolicy::kThreads;
  constexpr int kWin = kChunk / kW;
  extern __shared__ float smem[];

  const int64_t L = p.seqlen, N = p.dstate, NF = N * kF;
  const int64_t dpg = p.dim / p.ngroups;
  const int rows = kT / tpr;
  const int rs = bwd_rs<kComplex>(tpr);
  const int tid = threadIdx.x;
  const int64_t bg = int64_t(blockIdx.x) / blocks_per_group;
  const int64_t rb = int64_t(blockIdx.x) % blocks_per_group;
  const int64_t b = bg / p.ngroups, g = bg % p.ngroups;
  const int lr = tid / tpr, s = tid % tpr;
  const int64_t rig = rb * rows + lr;
  const bool active = rig < dpg;
  const int64_t d = g * dpg + (active ? rig : 0);  // inactive threads shadow row 0 and store nothing

  float* sB = smem;                   // [kW][rs] window tile of variable B
  float* sC = sB + kW * rs;           // [kW][rs]
  float* sWS = sC + kW * rs;          // [kWin][kSF][kT] states at window starts
  float* sRB = sWS + kWin * kSF * kT;  // [rows][kW][rs] per-channel dB of the window
  float* sRC = sRB + rows * kW * rs;   // [rows][kW][rs] per-channel dC
  float* sSumD = sRC + rows * kW * rs;  // [kW][kT] per-thread part of sum_n Re(conj(A) da)
  float* sSumB = sSumD + kW * kT;       // [kW][kT] per-thread part of sum_n Re(conj(B) g)

  const int64_t n0 = int64_t(s) * kNS;
  float a2[kSF], Af[kSF], Bf[kSF], Cf[kSF], dA[kSF], dBf[kSF], dCf[kSF], gc[kSF];
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
  const float Dd = p.D != nullptr ? p.D[d] : 0.0f;
  const float bias = p.delta_bias != nullptr ? p.delta_bias[d] : 0.0f;
  float dD_acc = 0.0f, dbias_acc = 0.0f;

  const T* u = static_cast<const T*>(p.u) + offset3(p.u_s, b, d, 0);
  const T* delta = static_cast<const T*>(p.delta) + offset3(p.delta_s, b, d, 0);
  const T* dout = static_cast<const T*>(p.dout) + offset3(p.dout_s, b, d, 0);
  const T* z = p.z != nullptr ? static_cast<const T*>(p.z) + offset3(p.z_s, b, d, 0) : nullptr;
  const T* yv = p.y != nullptr ? static_cast<const T*>(p.y) + offset3(p.y_s, b, d, 0) : nullptr;
  const bool vec_u = rows_vectorizable(p.u, p.u_s, sizeof(T));
  const bool vec_delta = rows_vectorizable(p.delta, p.delta_s, sizeof(T));
  const bool vec_dout = rows_vectorizable(p.dout, p.dout_s, sizeof(T));
  const bool vec_z = rows_vectorizable(p.z, p.z_s, sizeof(T));
  const bool vec_y = rows_vectorizable(p.y, p.y_s, sizeof(T));
  const bool vec_du = rows_vectorizable(p.du, p.du_s, sizeof(T));
  const bool vec_ddelta = rows_vectorizable(p.ddelta, p.ddelta_s, sizeof(T));
  const bool vec_dz = rows_vectorizable(p.dz, p.dz_s, sizeof(T));
  const T* Bv = p.B.variable ? static_cast<const T*>(p.B.ptr) + b * p.B.s_b + g * p.B.s_g : nullptr;
  const T* Cv = p.C.variable ? static_cast<const T*>(p.C.ptr) + b * p.C.s_b + g * p.C.s_g : nullptr;
  const int64_t n_chunks = (L + kChunk - 1) / kChunk;
  const bool writer = active && s == 0;

  // Variable B (and C) of steps [t0, t0 + kW) into the window tiles, zero beyond L or dstate.
  auto load_tiles = [&](int64_t t0, int valid, bool with_c) {
    __syncthreads();  // earlier readers of the tiles are done
    for (int i = tid; i < rs * kW; i += kT) {
      const int t = i / rs, k = i % rs;  // k = n * kF + component
      const bool ok = t < valid && k < NF;
      const int64_t n = k / kF, l = (t0 + t) * kF + (k % kF);
      if (Bv != nullptr) sB[i] = ok ? to_float(Bv[n * p.B.s_n + l * p.B.s_l]) : 0.0f;
      if (with_c && Cv != nullptr) sC[i] = ok ? to_float(Cv[n * p.C.s_n + l * p.C.s_l]) : 0.0f;
    }
    __syncthreads();
  };
  auto discretise = [&](float (&dt)[kW], float (&pre)[kW], int64_t t0, int valid) {
    load_row<T, kW>(pre, delta + t0 * p.delta_s.l, p.delta_s.l, valid, vec_delta);
#pragma unroll
    for (int t = 0; t < kW; ++t) {
      pre[t] += bias;
      dt[t] = p.softplus ? softplus(pre[t]) : pre[t];
    }
  };

  for (int64_t c = n_chunks - 1; c >= 0; --c) {
    const int64_t tc0 = c * kChunk;
    const int nwin = int(((L - tc0 < kChunk ? L - tc0 : kChunk) + kW - 1) / kW);
    float h[kSF];
    {
      const float* src = c > 0 ? p.ckpt + ((b * p.dim + d) * n_chunks + c - 1) * NF + n0 * kF : nullptr;
#pragma unroll
      for (int j = 0; j < kSF; ++j) h[j] = (src != nullptr && n0 * kF + j < NF) ? src[j] : 0.0f;
    }
    // Forward sweep: the state entering each window.
    for (int w = 0; w < nwin; ++w) {
#pragma unroll
      for (int j = 0; j < kSF; ++j) sWS[(w * kSF + j) * kT + tid] = h[j];
      if (w == nwin - 1) break;
      const int64_t t0 = tc0 + int64_t(w) * kW;  // a full window: only the last can be partial
      load_tiles(t0, kW, false);
      float dt[kW], pre[kW], uu[kW];
      discretise(dt, pre, t0, kW);
      load_row<T, kW>(uu, u + t0 * p.u_s.l, p.u_s.l, kW, vec_u);
#pragma unroll
      for (int t = 0; t < kW; ++t) {
        const float dtu = dt[t] * uu[t];
#pragma unroll
        for (int j = 0; j < kNS; ++j) {
          if constexpr (!kComplex) {
            const float bb = Bv != nullptr ? sB[t * rs + s * kSF + j] : Bf[j];
            h[j] = fmaf(fast_exp2(dt[t] * a2[j]), h[j], dtu * bb);
          } else {
            const float br = Bv != nullptr ? sB[t * rs + s * kSF + 2 * j] : Bf[2 * j];
            const float bi = Bv != nullptr ? sB[t * rs + s * kSF + 2 * j + 1] : Bf[2 * j + 1];
            float ar, ai;
            decay_complex(dt[t], a2[2 * j], a2[2 * j + 1], ar, ai);
            const float hr = h[2 * j], hi = h[2 * j + 1];
            h[2 * j] = ar * hr - ai * hi + dtu * br;
            h[2 * j + 1] = ar * hi + ai * hr + dtu * bi;
          }
        }
      }
    }
    // Windows in reverse.
    for (int w = nwin - 1; w >= 0; --w) {
      const int64_t t0 = tc0 + int64_t(w) * kW;
      const int valid = int(L - t0 < kW ? L - t0 : kW);
      load_tiles(t0, valid, true);
      float dt[kW], pre[kW], uu[kW], dy[kW];
      discretise(dt, pre, t0, valid);
      load_row<T, kW>(uu, u + t0 * p.u_s.l, p.u_s.l, valid, vec_u);
      load_row<T, kW>(dy, dout + t0 * p.dout_s.l, p.dout_s.l, valid, vec_dout);
      if (z != nullptr) {
        float zz[kW], yy[kW], dzz[kW];
        load_row<T, kW>(zz, z + t0 * p.z_s.l, p.z_s.l, valid, vec_z);
        load_row<T, kW>(yy, yv + t0 * p.y_s.l, p.y_s.l, valid, vec_y);
#pragma unroll
        for (int t = 0; t < kW; ++t) {
          dzz[t] = dy[t] * yy[t] * silu_grad(zz[t]);
          dy[t] *= silu(zz[t]);
        }
        if (writer) store_row<T, kW>(static_cast<T*>(p.dz) + offset3(p.dz_s, b, d, t0), p.dz_s.l, dzz, valid, vec_dz);
      }
      // Recompute the window: states before each step (hp) and decays (aa).
      float hp[kW][kSF], aa[kW][kSF];
#pragma unroll
      for (int j = 0; j < kSF; ++j) h[j] = sWS[(w * kSF + j) * kT + tid];
#pragma unroll
      for (int t = 0; t < kW; ++t) {
        const float dtu = dt[t] * uu[t];
#pragma unroll
        for (int j = 0; j < kNS; ++j) {
          if constexpr (!kComplex) {
            const float bb = Bv != nullptr ? sB[t * rs + s * kSF + j] : Bf[j];
            const float a = t < valid ? fast_exp2(dt[t] * a2[j]) : 0.0f;
            hp[t][j] = h[j];
            aa[t][j] = a;
            h[j] = fmaf(a, h[j], dtu * bb);
          } else {
            const float br = Bv != nullptr ? sB[t * rs + s * kSF + 2 * j] : Bf[2 * j];
            const float bi = Bv != nullptr ? sB[t * rs + s * kSF + 2 * j + 1] : Bf[2 * j + 1];
            float ar = 0.0f, ai = 0.0f;
            if (t < valid) decay_complex(dt[t], a2[2 * j], a2[2 * j + 1], ar, ai);
            const float hr = h[2 * j], hi = h[2 * j + 1];
            hp[t][2 * j] = hr;
            hp[t][2 * j + 1] = hi;
            aa[t][2 * j] = ar;
            aa[t][2 * j + 1] = ai;
            h[2 * j] = ar * hr - ai * hi + dtu * br;
            h[2 * j + 1] = ar * hi + ai * hr + dtu * bi;
          }
        }
      }
      // Reverse sweep.
      float sumA[kW], sumB[kW];
#pragma unroll
      for (int t = kW - 1; t >= 0; --t) {
        sumA[t] = sumB[t] = 0.0f;
        if (t >= valid) {
#pragma unroll
          for (int k = 0; k < kSF; ++k) {
            sRB[(lr * kW + t) * rs + s * kSF + k] = 0.0f;
            sRC[(lr * kW + t) * rs + s * kSF + k] = 0.0f;
          }
          continue;
        }
        const float dtu = dt[t] * uu[t];
        const float* bt = sB + t * rs + s * kSF;
        const float* ct = sC + t * rs + s * kSF;
        float* rbt = sRB + (lr * kW + t) * rs + s * kSF;
        float* rct = sRC + (lr * kW + t) * rs + s * kSF;
        if constexpr (!kComplex) {
#pragma unroll
          for (int j = 0; j < kNS; ++j) {
            const float bb = Bv != nullptr ? bt[j] : Bf[j];
            const float cc = Cv != nullptr ? ct[j] : Cf[j];
            const float gg = fmaf(cc, dy[t], gc[j]);
            const float ah = aa[t][j] * hp[t][j];
            const float da = ah * gg;
            dA[j] = fmaf(dt[t], da, dA[j]);
            sumA[t] = fmaf(Af[j], da, sumA[t]);
            sumB[t] = fmaf(bb, gg, sumB[t]);
            const float db = gg * dtu, dc = (ah + dtu * bb) * dy[t];
            if (Bv != nullptr) rbt[j] = active ? db : 0.0f; else dBf[j] += db;
            if (Cv != nullptr) rct[j] = active ? dc : 0.0f; else dCf[j] += dc;
            gc[j] = aa[t][j] * gg;
          }
        } else {
          const float dyw = 2.0f * dy[t];
#pragma unroll
          for (int j = 0; j < kNS; ++j) {
            const int r = 2 * j, i = 2 * j + 1;
            const float br = Bv != nullptr ? bt[r] : Bf[r], bi = Bv != nullptr ? bt[i] : Bf[i];
            const float cr = Cv != nullptr ? ct[r] : Cf[r], ci = Cv != nullptr ? ct[i] : Cf[i];
            const float gr = cr * dyw + gc[r], gi = -ci * dyw + gc[i];  // conj(C) dyw + carry
            const float ar = aa[t][r], ai = aa[t][i], pr = hp[t][r], pi = hp[t][i];
            const float wr = ar * pr - ai * pi, wi = ar * pi + ai * pr;  // a h_{t-1}
            const float dar = wr * gr + wi * gi, dai = wr * gi - wi * gr;  // conj(a h_{t-1}) g
            dA[r] = fmaf(dt[t], dar, dA[r]);
            dA[i] = fmaf(dt[t], dai, dA[i]);
            sumA[t] += Af[r] * dar + Af[i] * dai;  // Re(conj(A) da)
            sumB[t] += br * gr + bi * gi;          // Re(conj(B) g)
            const float dbr = gr * dtu, dbi = gi * dtu;
            const float dcr = (wr + dtu * br) * dyw, dci = -(wi + dtu * bi) * dyw;  // conj(h_t) dyw
            if (Bv != nullptr) {
              rbt[r] = active ? dbr : 0.0f;
              rbt[i] = active ? dbi : 0.0f;
            } else {
              dBf[r] += dbr;
              dBf[i] += dbi;
            }
            if (Cv != nullptr) {
              rct[r] = active ? dcr : 0.0f;
              rct[i] = active ? dci : 0.0f;
            } else {
              dCf[r] += dcr;
              dCf[i] += dci;
            }
            gc[r] = ar * gr + ai * gi;  // conj(a) g
            gc[i] = ar * gi - ai * gr;
          }
        }
      }
#pragma unroll
      for (int t = 0; t < kW; ++t) {
        sSumD[t * kT + tid] = sumA[t];
        sSumB[t * kT + tid] = sumB[t];
      }
      __syncthreads();
      // dB/dC of the window summed over the block's channels, in channel order.
      if (Bv != nullptr || Cv != nullptr) {
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
      if (writer) {
        float du[kW], ddt[kW];
#pragma unroll
        for (int t = 0; t < kW; ++t) {
          float sa = 0.0f, sb = 0.0f;
          for (int k = 0; k < tpr; ++k) {
            sa += sSumD[t * kT + tid + k];
            sb += sSumB[t * kT + tid + k];
          }
          du[t] = fmaf(dt[t], sb, Dd * dy[t]);
          float gdt = fmaf(uu[t], sb, sa);
          if (p.softplus) gdt *= softplus_grad(pre[t]);
          ddt[t] = gdt;
          if (t < valid) {
            dbias_acc += gdt;
            dD_acc = fmaf(dy[t], uu[t], dD_acc);
          }
        }
        store_row<T, kW>(static_cast<T*>(p.du) + offset3(p.du_s, b, d, t0), p.du_s.l, du, valid, vec_du);
        store_row<T, kW>(static_cast<T*>(p.ddelta) + offset3(p.ddelta_s, b, d, t0), p.ddelta_s.l, ddt, valid,
                         vec_ddelta);
      }
    }
  }
  if (active) {
    const int64_t off = (b * p.dim + d) * NF + n0 * kF;
#pragma unroll
    for (int j = 0; j < kSF; ++j) {
      if (n0 * kF + j >= NF) break;
      p.dA_part[off + j] = dA[j];
      if (!p.B.variable) p.dB_part[off + j] = dBf[j];
      if (!p.C.variable) p.dC_part[off + j] = dCf[j];
    }
    if (s == 0) {
      if (p.dD_part != nullptr) p.dD_part[b * p.dim + d] = dD_acc;
      if (p.dbias_part != nullptr) p.dbias_part[b * p.dim + d] = dbias_acc;
    }
  }
}

}  // namespace

int bwd_threads_per_row(int64_t dstate, bool) {
  return pow2_at_least((dstate + BwdPolicy::kStates - 1) / BwdPolicy::kStates);
}

int64_t bwd_row_blocks(const ScanParams& p) {
  const int rows = BwdPolicy::kThreads / bwd_threads_per_row(p.dstate, p.is_complex);
  const int64_t dpg = p.dim / p.ngroups;
  return (dpg + rows - 1) / rows;
}

cudaError_t launch_bwd(const ScanParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.dim == 0 || p.seqlen == 0) return cudaSuccess;
  return with_dtype_complex(p.dtype, p.is_complex, [&](auto tag, auto cplx) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr bool kComplex = decltype(cplx)::value;
    const int tpr = bwd_threads_per_row(p.dstate, kComplex);
    if (tpr > BwdPolicy::kThreads) return cudaErrorInvalidValue;
    const int64_t bpg = bwd_row_blocks(p);
    const int64_t blocks = bpg * p.batch * p.ngroups;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    const size_t smem = bwd_smem_bytes<kComplex>(tpr);
    auto kernel = bwd_kernel<T, kComplex>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) return err;
    kernel<<<unsigned(blocks), BwdPolicy::kThreads, smem, stream>>>(p, tpr, bpg);
    return cudaGetLastError();
  });
}

}  // namespace selective_scan
}  // namespace mamba_kernels
