// Selective-scan forward. One thread owns one channel (b, d) and a slice of its states, and
// walks the sequence in order: every state of the slice lives in registers, so a step costs
// one exponential and two FMAs per state with no synchronisation between steps. The threads
// of a block share (b, group), so a tile of variable B/C is loaded once into shared memory and
// read there as a broadcast. A NaN at step t can only reach steps >= t, as in the recurrence.
//
// Instantiations: dtype (3) x real/complex (2) = 6 kernels.
#include "scan_common.cuh"

namespace mamba_kernels {
namespace selective_scan {
namespace {

struct FwdPolicy {
  static constexpr int kThreads = 128;
  static constexpr int kTile = 16;  // steps per tile (one B/C tile in shared memory)
  template <bool kComplex>
  __host__ __device__ static constexpr int states() { return kComplex ? 8 : 16; }  // states per thread
};

template <typename T, bool kComplex>
__global__ void __launch_bounds__(FwdPolicy::kThreads)
    fwd_kernel(const ScanParams p, const int tpr, const int64_t blocks_per_group) {
  constexpr int kNS = FwdPolicy::states<kComplex>();
  constexpr int kF = kComplex ? 2 : 1;  // floats per state
  constexpr int kTL = FwdPolicy::kTile;
  constexpr int kSF = kNS * kF;  // floats per thread's slice
  extern __shared__ float smem[];

  const int64_t L = p.seqlen, N = p.dstate, NF = N * kF;
  const int64_t dpg = p.dim / p.ngroups;
  const int rows = FwdPolicy::kThreads / tpr;
  const int64_t bg = int64_t(blockIdx.x) / blocks_per_group;
  const int64_t b = bg / p.ngroups, g = bg % p.ngroups;
  const int lr = threadIdx.x / tpr, s = threadIdx.x % tpr;
  const int64_t rig = (int64_t(blockIdx.x) % blocks_per_group) * rows + lr;
  const bool active = rig < dpg;
  const int64_t d = g * dpg + (active ? rig : 0);  // inactive threads shadow row 0 and store nothing
  const int rs = tpr * kSF;                        // shared row stride of a variable tile (>= NF)

  float* sB = smem;                // [kTL][rs] variable B tile
  float* sC = sB + kTL * rs;       // [kTL][rs]
  float* sBf = sC + kTL * rs;      // [rows][rs + 4] fixed B of the block's channels
  float* sCf = sBf + rows * (rs + 4);
  const int fs = rs + 4;  // the padding keeps 16-byte reads of neighbouring channels conflict-free

  // Fixed B/C: the block's channels, once.
  for (int i = threadIdx.x; i < rows * rs; i += blockDim.x) {
    const int r = i / rs, j = i % rs;
    const int64_t rr = (int64_t(blockIdx.x) % blocks_per_group) * rows + r;
    const bool ok = rr < dpg && j < NF;
    const int64_t off = (g * dpg + rr) * NF + j;
    if (!p.B.variable) sBf[r * fs + j] = ok ? static_cast<const float*>(p.B.ptr)[off] : 0.0f;
    if (!p.C.variable) sCf[r * fs + j] = ok ? static_cast<const float*>(p.C.ptr)[off] : 0.0f;
  }

  // This thread's states: A pre-scaled for exp2 (real part), zero beyond dstate.
  const int64_t n0 = int64_t(s) * kNS;
  float a2[kSF], h[kSF];
#pragma unroll
  for (int j = 0; j < kSF; ++j) {
    const bool ok = n0 * kF + j < NF;
    const float a = ok ? p.A[d * NF + n0 * kF + j] : 0.0f;
    a2[j] = (kComplex && (j & 1)) ? a : a * kLog2e;  // complex: imaginary part stays in radians
    h[j] = 0.0f;
  }
  const float Dd = p.D != nullptr ? p.D[d] : 0.0f;
  const float bias = p.delta_bias != nullptr ? p.delta_bias[d] : 0.0f;

  const T* u = static_cast<const T*>(p.u) + offset3(p.u_s, b, d, 0);
  const T* delta = static_cast<const T*>(p.delta) + offset3(p.delta_s, b, d, 0);
  const T* z = p.z != nullptr ? static_cast<const T*>(p.z) + offset3(p.z_s, b, d, 0) : nullptr;
  const bool vec_u = rows_vectorizable(p.u, p.u_s, sizeof(T));
  const bool vec_delta = rows_vectorizable(p.delta, p.delta_s, sizeof(T));
  const bool vec_z = rows_vectorizable(p.z, p.z_s, sizeof(T));
  const bool vec_out = rows_vectorizable(p.out, p.out_s, sizeof(T));
  const bool vec_out_z = rows_vectorizable(p.out_z, p.out_z_s, sizeof(T));
  const T* Bv = p.B.variable ? static_cast<const T*>(p.B.ptr) + b * p.B.s_b + g * p.B.s_g : nullptr;
  const T* Cv = p.C.variable ? static_cast<const T*>(p.C.ptr) + b * p.C.s_b + g * p.C.s_g : nullptr;
  // Where this thread reads B and C of step t: base + t * step + j.
  const float* b_base = p.B.variable ? sB + s * kSF : sBf + lr * fs + s * kSF;
  const float* c_base = p.C.variable ? sC + s * kSF : sCf + lr * fs + s * kSF;
  const int b_step = p.B.variable ? rs : 0;
  const int c_step = p.C.variable ? rs : 0;
  const int64_t n_chunks = (L + kChunk - 1) / kChunk;

  for (int64_t t0 = 0; t0 < L; t0 += kTL) {
    const int valid = int(L - t0 < kTL ? L - t0 : kTL);
    __syncthreads();  // the previous tile's readers are done
    const int tile_elems = int(NF) * kTL;
    for (int i = threadIdx.x; i < tile_elems; i += blockDim.x) {
      const int64_t n = i / (kTL * kF);
      const int j = i % (kTL * kF);
      const int t = j / kF;
      const int64_t l = t0 * kF + j;
      const int dst = t * rs + int(n) * kF + (j % kF);
      if (Bv != nullptr) sB[dst] = t < valid ? to_float(Bv[n * p.B.s_n + l * p.B.s_l]) : 0.0f;
      if (Cv != nullptr) sC[dst] = t < valid ? to_float(Cv[n * p.C.s_n + l * p.C.s_l]) : 0.0f;
    }
    __syncthreads();

    float uu[kTL], dt[kTL], y[kTL];
    load_row<T, kTL>(uu, u + t0 * p.u_s.l, p.u_s.l, valid, vec_u);
    load_row<T, kTL>(dt, delta + t0 * p.delta_s.l, p.delta_s.l, valid, vec_delta);
#pragma unroll
    for (int t = 0; t < kTL; ++t) {
      float v = dt[t] + bias;
      dt[t] = p.softplus ? softplus(v) : v;
      y[t] = 0.0f;
    }
#pragma unroll
    for (int t = 0; t < kTL; ++t) {
      if (t >= valid) break;  // uniform across the block
      const float dtu = dt[t] * uu[t];
      const float* bt = b_base + t * b_step;
      const float* ct = c_base + t * c_step;
      float acc = 0.0f;
      if constexpr (!kComplex) {
#pragma unroll
        for (int j = 0; j < kNS; ++j) {
          const float a = fast_exp2(dt[t] * a2[j]);
          h[j] = fmaf(a, h[j], dtu * bt[j]);
          acc = fmaf(ct[j], h[j], acc);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kNS; ++j) {
          float ar, ai;
          decay_complex(dt[t], a2[2 * j], a2[2 * j + 1], ar, ai);
          const float hr = h[2 * j], hi = h[2 * j + 1];
          h[2 * j] = ar * hr - ai * hi + dtu * bt[2 * j];
          h[2 * j + 1] = ar * hi + ai * hr + dtu * bt[2 * j + 1];
          acc += ct[2 * j] * h[2 * j] - ct[2 * j + 1] * h[2 * j + 1];  // Re(C h)
        }
        acc *= 2.0f;
      }
      y[t] = acc;
    }
    for (int o = 1; o < tpr; o <<= 1) {
#pragma unroll
      for (int t = 0; t < kTL; ++t) y[t] += __shfl_xor_sync(kFullMask, y[t], o);
    }
    if (active && s == 0) {
#pragma unroll
      for (int t = 0; t < kTL; ++t) y[t] = fmaf(Dd, uu[t], y[t]);
      if (p.out != nullptr) {
        store_row<T, kTL>(static_cast<T*>(p.out) + offset3(p.out_s, b, d, t0), p.out_s.l, y, valid, vec_out);
      }
      if (z != nullptr) {
        float zz[kTL];
        load_row<T, kTL>(zz, z + t0 * p.z_s.l, p.z_s.l, valid, vec_z);
#pragma unroll
        for (int t = 0; t < kTL; ++t) zz[t] = y[t] * silu(zz[t]);
        store_row<T, kTL>(static_cast<T*>(p.out_z) + offset3(p.out_z_s, b, d, t0), p.out_z_s.l, zz, valid,
                          vec_out_z);
      }
    }
    const int64_t t_end = t0 + valid;
    if (active && (t_end % kChunk == 0 || t_end == L)) {
      float* dst = p.ckpt + ((b * p.dim + d) * n_chunks + (t_end - 1) / kChunk) * NF + n0 * kF;
#pragma unroll
      for (int j = 0; j < kSF; ++j) {
        if (n0 * kF + j < NF) dst[j] = h[j];
      }
    }
  }
}

}  // namespace

int fwd_threads_per_row(int64_t dstate, bool is_complex) {
  const int64_t per = is_complex ? FwdPolicy::states<true>() : FwdPolicy::states<false>();
  return pow2_at_least((dstate + per - 1) / per);
}

cudaError_t launch_fwd(const ScanParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.dim == 0 || p.seqlen == 0) return cudaSuccess;
  return with_dtype_complex(p.dtype, p.is_complex, [&](auto tag, auto cplx) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr bool kComplex = decltype(cplx)::value;
    const int tpr = fwd_threads_per_row(p.dstate, kComplex);
    if (tpr > 32) return cudaErrorInvalidValue;
    const int rows = FwdPolicy::kThreads / tpr;
    const int64_t dpg = p.dim / p.ngroups;
    const int64_t bpg = (dpg + rows - 1) / rows;
    const int64_t blocks = bpg * p.batch * p.ngroups;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    const int rs = tpr * FwdPolicy::states<kComplex>() * (kComplex ? 2 : 1);
    const size_t smem = sizeof(float) * (2 * FwdPolicy::kTile * rs + 2 * rows * (rs + 4));
    fwd_kernel<T, kComplex><<<unsigned(blocks), FwdPolicy::kThreads, smem, stream>>>(p, tpr, bpg);
    return cudaGetLastError();
  });
}

}  // namespace selective_scan
}  // namespace mamba_kernels
