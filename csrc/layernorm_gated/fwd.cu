// Forward of the gated norm (maths and policy in norm_gated.h).
//
// One team per (row, group), rows' groups in order so a block reads contiguous memory. Each
// thread owns packs lane, lane + team, ... of the group (consecutive lanes, consecutive 16 bytes:
// coalesced) and keeps them in registers from load to store, so x and z are read once and out
// written once: the kernel moves the minimum, and its speed is memory bandwidth.
//
// Phases per group: load (x, z packs, all issued first), gate (norm(x * silu(z)) only),
// statistics (team sums in fp32; the LayerNorm subtracts its mean before the second sum, as the
// definition does, rather than using E[x^2] - E[x]^2), normalise (weight, bias, gate) and store.
//
// Templates: norm_fwd_kernel<T, kVec>: T the dtype of x, z and out; kVec 16-byte packs or
// single elements (odd widths, unaligned rows). Weight and bias dtypes are read at run time (a
// uniform switch; they are small and cached). 6 kernels.
#include <cstdint>

#include "norm_common.cuh"

namespace mamba_kernels {
namespace layernorm_gated {
namespace {

template <typename T, bool kVec>
__global__ void __launch_bounds__(kFwdMaxTeam) norm_fwd_kernel(const NormFwdParams p, const int team) {
  using PO = PackOf<T, kVec, kFwdThreadBytes>;
  constexpr int kE = PO::kElems;
  constexpr int kP = PO::kPerThread;
  __shared__ float smem[2 * 2 * (kMaxTeam / kWarpSize)];
  const TeamPos t = team_pos(team);
  const int64_t packs = p.group_size / kE;
  const int64_t units = p.rows * p.ngroups;
  const bool has_z = p.z.ptr != nullptr;
  const bool gate_first = has_z && !p.norm_before_gate;
  const float inv_g = 1.0f / float(p.group_size);
  int parity = 0;
  for (int64_t u = int64_t(blockIdx.x) * t.teams + t.team_id; u < units; u += int64_t(gridDim.x) * t.teams) {
    const int64_t row = u / p.ngroups;
    const int64_t grp = u - row * p.ngroups;
    const int64_t col0 = grp * p.group_size;
    const T* xr = static_cast<const T*>(p.x.ptr) + row * p.x.row + col0;
    const T* zr = static_cast<const T*>(p.z.ptr) + row * p.z.row + col0;

    // Phase 1: load every pack of the thread (the loads are independent: all in flight).
    Pack<T, kE> xp[kP], zp[kP];
#pragma unroll
    for (int k = 0; k < kP; ++k) {
      const int64_t i = int64_t(k) * team + t.lane;
      if (i < packs) {
        load_pack(xp[k], xr + i * kE);
        if (has_z) load_pack(zp[k], zr + i * kE);
      }
    }

    // Phase 2: the values the statistics see (gated first for norm(x * silu(z))), recomputed
    // from the packs wherever needed rather than held: the packs are half the registers.
    auto value = [&](int k, int e) {
      const float a = to_float(xp[k].e[e]);
      if (!gate_first) return a;
      const float zz = to_float(zp[k].e[e]);
      return a * zz * sigmoid(zz);
    };

    // Phase 3: statistics over the group.
    float mean = 0.f;
    if (!p.rms) {
      float s[1] = {0.f};
#pragma unroll
      for (int k = 0; k < kP; ++k) {
        if (int64_t(k) * team + t.lane < packs) {
#pragma unroll
          for (int e = 0; e < kE; ++e) s[0] += value(k, e);
        }
      }
      team_sum(s, t, smem, parity);
      parity ^= 1;
      mean = s[0] * inv_g;
    }
    float q[1] = {0.f};
#pragma unroll
    for (int k = 0; k < kP; ++k) {
      if (int64_t(k) * team + t.lane < packs) {
#pragma unroll
        for (int e = 0; e < kE; ++e) {
          const float d = value(k, e) - mean;
          q[0] += d * d;
        }
      }
    }
    team_sum(q, t, smem, parity);
    parity ^= 1;
    const float rstd = rsqrtf(q[0] * inv_g + p.eps);
    if (t.lane == 0) {
      const int64_t at = grp * p.rows + row;
      p.rstd[at] = rstd;
      if (p.mean != nullptr) p.mean[at] = mean;
    }

    // Phase 4: normalise, scale, shift, gate and store.
    T* outr = static_cast<T*>(p.out.ptr) + row * p.out.row + col0;
#pragma unroll
    for (int k = 0; k < kP; ++k) {
      const int64_t i = int64_t(k) * team + t.lane;
      if (i < packs) {
        float w[kE], y[kE];
        load_param(w, p.w, p.w_dtype, col0 + i * kE);
        float b[kE];
        if (p.b != nullptr) {
          load_param(b, p.b, p.b_dtype, col0 + i * kE);
        } else {
#pragma unroll
          for (int e = 0; e < kE; ++e) b[e] = 0.f;
        }
#pragma unroll
        for (int e = 0; e < kE; ++e) {
          float a = (value(k, e) - mean) * rstd * w[e] + b[e];
          if (has_z && p.norm_before_gate) a *= silu(to_float(zp[k].e[e]));
          y[e] = a;
        }
        store_out<T, kE>(outr + i * kE, y);
      }
    }
  }
}

template <typename T>
cudaError_t launch_typed(const NormFwdParams& p, cudaStream_t stream) {
  const int eb = int(sizeof(T));
  const int64_t ve = kVectorBytes / eb;
  const bool vec = p.group_size % ve == 0 && vector_ok(p.x, ve) && vector_ok(p.z, ve) && vector_ok(p.out, ve) &&
                   aligned16(p.w) && (p.b == nullptr || aligned16(p.b));
  const TeamShape s = team_shape(p.group_size, eb, vec, kFwdThreadBytes, kFwdMaxTeam);
  if (s.team == 0) return cudaErrorInvalidValue;
  const unsigned grid = grid_for(p.rows * p.ngroups, s);
  if (vec) {
    norm_fwd_kernel<T, true><<<grid, s.block, 0, stream>>>(p, s.team);
  } else {
    norm_fwd_kernel<T, false><<<grid, s.block, 0, stream>>>(p, s.team);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_norm_fwd(const NormFwdParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.n == 0) return cudaSuccess;
  if (p.group_size < 1 || p.group_size * dtype_size(p.dtype) > kMaxGroupBytes) return cudaErrorInvalidValue;
  switch (p.dtype) {
    case DType::kFloat16: return launch_typed<__half>(p, stream);
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(p, stream);
    default: return launch_typed<float>(p, stream);
  }
}

}  // namespace layernorm_gated
}  // namespace mamba_kernels
