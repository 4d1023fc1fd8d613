// Selective-scan forward for real A and dstate <= 16, in the lane layout (scan_lanes.cuh): a
// channel's states are spread over kP = 16 / kS lanes, kS states each, and every lane walks the
// whole sequence with its states in registers. kS = 4 for problems with channels enough to
// fill the GPU (4 lanes per channel, 32 channels per block), 2 or 1 for fewer channels (long
// sequences at small batch), so the resident warps stay high either way.
//
// Per tile (32 steps at one state per lane, else 16; FwdLanesPolicy::kTile): the block stages
// B and C of the tile (shared by all its channels: one (batch, group)) in shared memory, double
// buffered, one barrier per tile. Each lane
// discretises its own steps of its channel (softplus, dt * u) into the channel's shared rows,
// read back by every lane of the channel as 16-byte broadcasts. The next tile's B/C, u, delta
// and z are loaded into registers while this one is computed. A step is one ex2 and two FMAs
// per state; y of each tile is a reduce-scatter over the channel's lanes, after which each
// lane owns kTile / kP consecutive steps and writes their outputs (vector stores where the
// tensor allows). No step's work is repeated, and a NaN at step t reaches only steps >= t.
//
// Instantiations: 3 (dtype) x 3 (kS = 1, 2, 4) x 2 (B and C both variable, the models' case,
// read without per-step checks; or either fixed).
#include "scan_lanes.cuh"

namespace mamba_kernels {
namespace selective_scan {
namespace {

using LP = LanePolicy;


struct LanesFwdArgs {
  int64_t bpg;  // blocks per (batch, group)
  bool vec_b, vec_c, vec_u, vec_delta, vec_z, vec_out, vec_out_z;
  bool full_ok;  // every row of unit stride, with vector access wherever one is used: the full-tile copy
};

// A thread's part of fwd_lanes_kernel in phases: fetch_bc / stash_bc (the block's B and C tiles),
// fetch_rows (the lane's u, delta, z ahead of their tile) and tile (discretise, recurrence,
// reduce-scatter, store, checkpoint). Its members are references to the kernel's own locals, as
// the lambdas they once were captured them, so the kernel compiles to the same SASS as when
// it was one body: an agent form that held the state as its own members ran the 16-bit
// forward at 4 states a lane 1-9 % slower (ptxas scheduled the reduce-scatter into the scan).
template <typename T, int kS, bool kVarBC>
struct LanesThread {
  using F = FwdLanesPolicy<kS>;
  static constexpr int kTL = F::kTile, kP = F::kP, kQ = F::kQ, kLG = F::kLoadGroups;
  static constexpr bool kZAhead = kS == 1;  // (why: fetch_rows)

  const ScanParams& p;
  const LanesFwdArgs& f;
  float (&sB)[2][F::kTileFloats];
  float (&sC)[2][F::kTileFloats];
  float (&sDT)[F::kCh][F::kNRow];
  float (&sDTU)[F::kCh][F::kNRow];
  const int64_t &L, &N, &b, &d;
  const int &ch, &s, &n0;
  const bool& active;
  float (&a2)[kS];
  float (&h)[kS];
  float (&Bfix)[kS];
  float (&Cfix)[kS];
  const float &Dd, &bias;
  const T* const& z;
  // B/C staging (kernel: who loads what)
  const bool &loader, &loads_c;
  const int &ln, &lt;
  Steps<T, 4> (&pf)[kLG];  // the next tile's values, raw until stashed
  const bool& bc_ok;
  const T*& bc_at;  // advanced per tile
  const int64_t &bc_end, &bc_sl;  // left = bc_end - t0
  const bool& bc_vec;
  // the lane's rows: ru, rd, rz fetched ahead; cu, cz this tile's
  Steps<T, kQ> &ru, &rd, &rz, &cu, &cz;
  const T *&u_at, *&delta_at, *&z_at;
  T *&out_at, *&out_z_at;
  const int64_t& lane_end;  // this lane's steps left in a tile at t0: lane_end - t0

  __device__ __forceinline__ void fetch_bc(int64_t t0) {
#pragma unroll
    for (int i = 0; i < kLG; ++i) load_steps_at(pf[i], bc_at + 4 * i * bc_sl, bc_sl, bc_end - t0 - 4 * i, bc_vec);
    if (bc_ok) bc_at += kTL * bc_sl;
  }

  __device__ __forceinline__ void stash_bc(int buf) {
    if (!loader) return;
    float* tile = loads_c ? sC[buf] : sB[buf];
#pragma unroll
    for (int i = 0; i < kLG; ++i) {
      const Steps<T, 4>& v = pf[i];
      if constexpr (kS == 1) {
        *reinterpret_cast<float4*>(tile + ln * F::kNRow + lt + 4 * i) = make_float4(v.at(0), v.at(1), v.at(2), v.at(3));
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) tile[(lt + 4 * i + j) * F::kTRow + ln] = v.at(j);
      }
    }
  }

  // This lane's steps of its channel in tile t0: [t0 + kQ s, + kQ), the steps whose y the
  // reduce-scatter hands it.
  // u and delta are fetched during the tile before, z too at one state per lane (a short
  // tile); with more states per lane z is fetched at the tile's start, behind a recurrence
  // long enough to hide it, which keeps two fewer registers live. This tile's u and z stay in
  // storage type.
  __device__ __forceinline__ void fetch_rows(int64_t t0, int z_ahead) {  // z_ahead: tiles between t0 and z_at
    load_steps_at(ru, u_at, p.u_s.l, lane_end - t0, f.vec_u);
    load_steps_at(rd, delta_at, p.delta_s.l, lane_end - t0, f.vec_delta);
    if (kZAhead && z != nullptr) {
      load_steps_at(rz, z_at + z_ahead * kTL * p.z_s.l, p.z_s.l, lane_end - t0, f.vec_z);
    }
    u_at += kTL * p.u_s.l;
    delta_at += kTL * p.delta_s.l;
  }


  // One tile. kFull: this tile and the next lie inside the sequence and every tensor takes
  // vector access (unit stride, aligned rows: the models' case), so the copy compiled for it
  // has no bounds checks, element fallbacks or strided pointer steps.
  template <bool kFull>
  __device__ __forceinline__ void tile(int64_t t0, int64_t k) {
    const int buf = int(k & 1);
    const bool more = kFull || t0 + kTL < L;
    // This tile's own steps, discretised into the channel's rows; then the next tile's loads.
    cu = ru;
    if (kZAhead) {
      cz = rz;
    } else if (z != nullptr) {
      load_steps_at(cz, z_at, kFull ? 1 : p.z_s.l, kFull ? kQ : lane_end - t0, kFull || f.vec_z);
    }
    float dtq[kQ], dtu[kQ];
    const int64_t left = lane_end - t0;  // this lane's steps inside the sequence
    const int mine = kFull ? kQ : (left < 0 ? 0 : (left < kQ ? int(left) : kQ));
#pragma unroll
    for (int j = 0; j < kQ; ++j) {
      const bool ok = j < mine;
      const float v = rd.at(j) + bias;
      dtq[j] = ok ? (p.softplus ? softplus(v) : v) : 0.0f;
      dtu[j] = cu.at(j) * dtq[j];
    }
    store_pack<float, kQ>(&sDT[ch][s * kQ], dtq);
    store_pack<float, kQ>(&sDTU[ch][s * kQ], dtu);
    if (kFull) {
      if (bc_ok) {
#pragma unroll
        for (int i = 0; i < kLG; ++i) load_steps_at(pf[i], bc_at + 4 * i, 1, 4, true);
        bc_at += kTL;
      }
      load_steps_at(ru, u_at, 1, kQ, true);
      load_steps_at(rd, delta_at, 1, kQ, true);
      if (kZAhead && z != nullptr) load_steps_at(rz, z_at + kTL, 1, kQ, true);
      u_at += kTL;
      delta_at += kTL;
    } else if (more) {
      fetch_bc(t0 + kTL);
      fetch_rows(t0 + kTL, 1);
    }
    __syncwarp();
    const int valid = kFull ? kTL : int(L - t0 < kTL ? L - t0 : kTL);
    const float* tB = sB[buf];
    const float* tC = sC[buf];
    float yp[kTL];
    // Four steps of the recurrence from 16-byte reads of dt and dt*u; yp[tt + j] gets this
    // lane's part of y at step tt + j. Steps past the end of the sequence need no guard: their
    // dt, dt*u and B/C are zero, so the decay is exactly 1 (A is finite, clamp_finite) and the
    // states pass through unchanged.
    auto quad = [&](int tt) {
      const float4 dt4 = *reinterpret_cast<const float4*>(&sDT[ch][tt]);
      const float4 du4 = *reinterpret_cast<const float4*>(&sDTU[ch][tt]);
      const float dts[4] = {dt4.x, dt4.y, dt4.z, dt4.w};
      const float dus[4] = {du4.x, du4.y, du4.z, du4.w};
      // one state per lane: its four steps in one 16-byte read from the [state][step] tile
      float b4[4] = {}, c4[4] = {};
      (void)b4, (void)c4;  // read only at kS = 1
      if constexpr (kS == 1) {
        if (kVarBC || p.B.variable) {
          const float4 v = *reinterpret_cast<const float4*>(tB + s * F::kNRow + tt);
          b4[0] = v.x, b4[1] = v.y, b4[2] = v.z, b4[3] = v.w;
        }
        if (kVarBC || p.C.variable) {
          const float4 v = *reinterpret_cast<const float4*>(tC + s * F::kNRow + tt);
          c4[0] = v.x, c4[1] = v.y, c4[2] = v.z, c4[3] = v.w;
        }
      }
      // this lane's kS states of B (or C) at step tt + j
      auto read_step = [&](const float* tile, bool var, const float (&fixed)[kS], int j, float (&o)[kS]) {
        if (!kVarBC && !var) {
#pragma unroll
          for (int m = 0; m < kS; ++m) o[m] = fixed[m];
        } else if constexpr (kS == 1) {
          o[0] = (tile == tB ? b4 : c4)[j];
        } else if constexpr (kS == 2) {
          const float2 v = *reinterpret_cast<const float2*>(tile + (tt + j) * F::kTRow + n0);
          o[0] = v.x, o[1] = v.y;
        } else {
          const float4 v = *reinterpret_cast<const float4*>(tile + (tt + j) * F::kTRow + n0);
          o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
        }
      };
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float bq[kS], cq[kS];
        read_step(tB, p.B.variable, Bfix, j, bq);
        read_step(tC, p.C.variable, Cfix, j, cq);
        float acc0 = 0.0f, acc1 = 0.0f;  // two chains: half the dependent FMAs per step
#pragma unroll
        for (int m = 0; m < kS; ++m) {
          const float a = fast_exp2(dts[j] * a2[m]);
          h[m] = fmaf(a, h[m], dus[j] * bq[m]);
          if (m & 1) {
            acc1 = fmaf(cq[m], h[m], acc1);
          } else {
            acc0 = fmaf(cq[m], h[m], acc0);
          }
        }
        yp[tt + j] = kS == 1 ? acc0 : acc0 + acc1;  // (acc0 + 0 is not acc0 for acc0 = -0)
      }
    };
#pragma unroll
    for (int q = 0; q < kTL / 4; ++q) quad(q * 4);
    reduce_scatter_over<kP>(yp, s);  // yp[j]: y of step t0 + kQ s + j
    if (active) {
      float yo[kQ];
#pragma unroll
      for (int j = 0; j < kQ; ++j) yo[j] = fmaf(Dd, cu.at(j), yp[j]);
      if (p.out != nullptr) {
        store_steps_at(out_at, kFull ? 1 : p.out_s.l, kFull ? kQ : left, yo, kFull || f.vec_out);
      }
      if (z != nullptr) {
#pragma unroll
        for (int j = 0; j < kQ; ++j) yo[j] *= silu(cz.at(j));
        store_steps_at(out_z_at, kFull ? 1 : p.out_z_s.l, kFull ? kQ : left, yo, kFull || f.vec_out_z);
      }
    }
    const int64_t t_end = t0 + valid;
    const bool chunk_end = kFull ? (k + 1) % (kChunk / kTL) == 0 : (t_end % kChunk == 0 || t_end == L);
    if (active && chunk_end) {
      const int64_t c = (t_end - 1) / kChunk;
      const bool final_chunk = t_end == L;
      if (final_chunk || ((c + 1) & ((int64_t(1) << p.ckpt_shift) - 1)) == 0) {
        // slot c / 2^ckpt_shift; the final state fills the one slot a layout may have after it
        const int64_t k = c >> p.ckpt_shift, bd = b * p.dim + d;
        const int e = ckpt_elem_step(p);
        float* dst = ckpt_slot(p, bd, k, N, 1) + n0 * e;
        float* dst2 = final_chunk && k + 1 < p.ckpt_count ? ckpt_slot(p, bd, k + 1, N, 1) + n0 * e : nullptr;
#pragma unroll
        for (int m = 0; m < kS; ++m) {
          if (n0 + m < N) {
            dst[m * e] = h[m];
            if (dst2 != nullptr) dst2[m * e] = h[m];
          }
        }
      }
    }
    if (z_at != nullptr) z_at += kTL * (kFull ? 1 : p.z_s.l);
    if (out_at != nullptr) out_at += kTL * (kFull ? 1 : p.out_s.l);
    if (out_z_at != nullptr) out_z_at += kTL * (kFull ? 1 : p.out_z_s.l);
    if (more) stash_bc(buf ^ 1);  // the other buffer's readers finished before the last barrier
  }
};

template <typename T, int kS, bool kVarBC>
__global__ void __launch_bounds__(FwdLanesPolicy<kS>::kThreads, FwdLanesPolicy<kS>::kMinBlocks)
    fwd_lanes_kernel(const ScanParams p, const LanesFwdArgs f) {
  using F = FwdLanesPolicy<kS>;
  constexpr int kTL = F::kTile, kP = F::kP, kQ = F::kQ;
  __shared__ __align__(16) float sB[2][F::kTileFloats];
  __shared__ __align__(16) float sC[2][F::kTileFloats];
  __shared__ __align__(16) float sDT[F::kCh][F::kNRow];  // rows of kTile + 4: the warp's channels'
  __shared__ __align__(16) float sDTU[F::kCh][F::kNRow];  // reads fall in distinct banks

  const int64_t L = p.seqlen, N = p.dstate;
  const int64_t dpg = p.dim / p.ngroups;
  const int64_t bg = int64_t(blockIdx.x) / f.bpg, rb = int64_t(blockIdx.x) % f.bpg;
  const int64_t b = bg / p.ngroups, g = bg % p.ngroups;
  const int tid = threadIdx.x, ch = tid / kP, s = tid % kP;
  const int64_t rig = rb * F::kCh + ch;
  const bool active = rig < dpg;
  const int64_t d = g * dpg + (active ? rig : 0);  // inactive channels shadow row 0, store nothing
  const int n0 = s * kS;

  float a2[kS], h[kS], Bfix[kS], Cfix[kS];
#pragma unroll
  for (int k = 0; k < kS; ++k) {
    const bool ok = n0 + k < N;
    a2[k] = ok ? clamp_finite(p.A[d * N + n0 + k] * kLog2e) : 0.0f;
    Bfix[k] = (!kVarBC && ok && !p.B.variable) ? static_cast<const float*>(p.B.ptr)[d * N + n0 + k] : 0.0f;
    Cfix[k] = (!kVarBC && ok && !p.C.variable) ? static_cast<const float*>(p.C.ptr)[d * N + n0 + k] : 0.0f;
    h[k] = 0.0f;
  }
  const float Dd = p.D != nullptr ? p.D[d] : 0.0f;
  const float bias = p.delta_bias != nullptr ? p.delta_bias[d] : 0.0f;
  const T* u = static_cast<const T*>(p.u) + offset3(p.u_s, b, d, 0);
  const T* delta = static_cast<const T*>(p.delta) + offset3(p.delta_s, b, d, 0);
  const T* z = p.z != nullptr ? static_cast<const T*>(p.z) + offset3(p.z_s, b, d, 0) : nullptr;

  // Staging a B/C tile: the first kLoaders threads, kLoadSteps consecutive steps each (runs of
  // 4, one vector load a run), of B (first half) or C.
  const bool loader = tid < F::kLoaders;
  const bool loads_c = tid >= F::kLoaders / 2;
  const int li = tid % (F::kLoaders / 2);
  // kLoadSteps steps of state ln, stored as a column of the [step][state] tile for kS > 1
  // (4-byte stores) or as a row of the [state][step] tile for kS = 1 (16-byte stores)
  constexpr int kLG = F::kLoadGroups;
  const int ln = li / (kTL / F::kLoadSteps);
  const int lt = F::kLoadSteps * (li % (kTL / F::kLoadSteps));
  // (fields picked one by one: a reference to either parameter struct would put both on the stack)
  const bool bc_var = loader && (loads_c ? p.C.variable : p.B.variable);
  const T* bc_base = nullptr;
  if (bc_var) {
    bc_base = loads_c ? static_cast<const T*>(p.C.ptr) + b * p.C.s_b + g * p.C.s_g
                      : static_cast<const T*>(p.B.ptr) + b * p.B.s_b + g * p.B.s_g;
  }
  const int64_t bc_sn = loads_c ? p.C.s_n : p.B.s_n, bc_sl = loads_c ? p.C.s_l : p.B.s_l;
  const bool bc_vec = loads_c ? f.vec_c : f.vec_b;
  Steps<T, 4> pf[kLG];  // the next tile's values, raw until stashed
  const bool bc_ok = bc_var && ln < N;
  const T* bc_at = bc_ok ? bc_base + ln * bc_sn + lt * bc_sl : nullptr;  // advanced per tile
  const int64_t bc_end = bc_ok ? L - lt : 0;  // left = bc_end - t0
  Steps<T, kQ> ru, rd, rz, cu, cz;  // (LanesThread: fetched ahead / this tile's)
  // the lane's first step of the tile to fetch (u, delta) or of this tile (z, out, out_z)
  const T* u_at = u + s * kQ * p.u_s.l;
  const T* delta_at = delta + s * kQ * p.delta_s.l;
  const T* z_at = z != nullptr ? z + s * kQ * p.z_s.l : nullptr;
  T* out_at = p.out != nullptr ? static_cast<T*>(p.out) + offset3(p.out_s, b, d, s * kQ) : nullptr;
  T* out_z_at = p.out_z != nullptr ? static_cast<T*>(p.out_z) + offset3(p.out_z_s, b, d, s * kQ) : nullptr;
  const int64_t lane_end = L - s * kQ;  // this lane's steps left in a tile at t0: lane_end - t0
  LanesThread<T, kS, kVarBC> th{p, f, sB, sC, sDT, sDTU, L, N, b, d, ch, s, n0, active, a2, h, Bfix, Cfix, Dd, bias, z,
                                 loader, loads_c, ln, lt, pf, bc_ok, bc_at, bc_end, bc_sl, bc_vec,
                                 ru, rd, rz, cu, cz, u_at, delta_at, z_at, out_at, out_z_at, lane_end};
  th.fetch_bc(0);
  th.fetch_rows(0, 0);
  th.stash_bc(0);
  __syncthreads();

  // Only at 1 and 2 states per lane, where the per-tile work is shared by the fewest states; at
  // 4 the second copy made the kernel spill.
  constexpr bool kFullCopy = kS <= 2;
  for (int64_t t0 = 0, k = 0; t0 < L; t0 += kTL, ++k) {
    bool full = false;
    if constexpr (kFullCopy) full = f.full_ok && t0 + 2 * kTL <= L;
    if (full) {
      if constexpr (kFullCopy) th.template tile<true>(t0, k);
    } else {
      th.template tile<false>(t0, k);
    }
    __syncthreads();  // (also orders this tile's dt rows before the next tile's writes)
  }
}

// Blocks of the launch at kS states per lane: a (batch, group)'s channels in blocks of kCh.
template <int kS>
int64_t lanes_blocks_per_group(const ScanParams& p) {
  return (p.dim / p.ngroups + FwdLanesPolicy<kS>::kCh - 1) / FwdLanesPolicy<kS>::kCh;
}

// States per lane: the most (fewest instructions per state) that still give the GPU enough
// warps to hide latency.
int lanes_states_per_lane(const ScanParams& p) {
  const int64_t want = int64_t(sm_count()) * LP::kMinFwdWarpsPerSm * kWarpSize;
  const int64_t channels = p.batch * p.dim;
  if (channels * (LP::kLanes / 4) >= want) return 4;
  if (channels * (LP::kLanes / 2) >= want) return 2;
  // One state per lane holds fewer blocks an SM (FwdLanesPolicy<1>::kMinBlocks: its registers);
  // where its blocks would not fit in one wave, two per lane run in one instead.
  const int64_t blocks = lanes_blocks_per_group<1>(p) * p.batch * p.ngroups;
  return blocks > int64_t(sm_count()) * FwdLanesPolicy<1>::kMinBlocks ? 2 : 1;
}

template <typename T, int kS, bool kVarBC>
cudaError_t launch_lanes(const ScanParams& p, cudaStream_t stream) {
  using F = FwdLanesPolicy<kS>;
  LanesFwdArgs f{};
  f.bpg = lanes_blocks_per_group<kS>(p);
  f.vec_b = bc_vec4(p.B, sizeof(T));
  f.vec_c = bc_vec4(p.C, sizeof(T));
  f.vec_u = steps_vec(p.u, p.u_s, sizeof(T), F::kQ);
  f.vec_delta = steps_vec(p.delta, p.delta_s, sizeof(T), F::kQ);
  f.vec_z = steps_vec(p.z, p.z_s, sizeof(T), F::kQ);
  f.vec_out = steps_vec(p.out, p.out_s, sizeof(T), F::kQ);
  f.vec_out_z = steps_vec(p.out_z, p.out_z_s, sizeof(T), F::kQ);
  // A lane's kQ steps of a row are one vector access where they make 4, 8 or 16 bytes (else
  // single elements, which need only the unit stride); B/C are staged 4 steps a vector.
  constexpr int kRowBytes = F::kQ * int(sizeof(T));
  constexpr bool kRowVec = kRowBytes == 4 || kRowBytes == 8 || kRowBytes == 16;
  auto row_ok = [&](const void* ptr, const Strides3& st, bool vec) {
    return ptr == nullptr || (st.l == 1 && (vec || !kRowVec));
  };
  f.full_ok = row_ok(p.u, p.u_s, f.vec_u) && row_ok(p.delta, p.delta_s, f.vec_delta) && row_ok(p.z, p.z_s, f.vec_z) &&
              row_ok(p.out, p.out_s, f.vec_out) && row_ok(p.out_z, p.out_z_s, f.vec_out_z) &&
              (!p.B.variable || f.vec_b) && (!p.C.variable || f.vec_c);
  const int64_t blocks = f.bpg * p.batch * p.ngroups;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  fwd_lanes_kernel<T, kS, kVarBC><<<unsigned(blocks), F::kThreads, 0, stream>>>(p, f);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_fwd_lanes(const ScanParams& p, cudaStream_t stream) {
  return with_dtype_complex(p.dtype, false, [&](auto tag, auto) -> cudaError_t {
    using T = typename decltype(tag)::type;
    // both B and C variable (the models' case) reads the tiles unconditionally
    auto by_states = [&](auto var) -> cudaError_t {
      switch (lanes_states_per_lane(p)) {
        case 4: return launch_lanes<T, 4, var.value>(p, stream);
        case 2: return launch_lanes<T, 2, var.value>(p, stream);
        default: return launch_lanes<T, 1, var.value>(p, stream);
      }
    };
    if (p.B.variable && p.C.variable) return by_states(std::true_type{});
    return by_states(std::false_type{});
  });
}

}  // namespace selective_scan
}  // namespace mamba_kernels
