// Backward of the gated norm (maths and policy in norm_gated.h), from the forward's mean and
// rstd. Per element, with xg the normalised input (x, or x * silu(z) when the gate comes
// first), xhat = (xg - mean) * rstd, y = xhat * w + b, and g the gradient reaching y (dy, or
// dy * silu(z) when the gate comes after the norm):
//   dz  = dy * y * silu'(z)                        (gate after the norm)
//   dxg = (w g - xhat * mean(xhat w g) - mean(w g)) * rstd   (the last mean: LayerNorm only)
//   dz  = dxg * x * silu'(z), dx = dxg * silu(z)   (gate first; else dx = dxg)
//   dw  = sum over rows of g * xhat, db = sum over rows of g
//
// Layout as the forward's: a team per (rows chunk, group), each thread owning the same packs
// of every row of its chunk, so it sums dw and db for its channels in registers with no
// atomics; at the chunk's end it writes them to its row of the workspace (chunk, n), and
// norm_reduce_kernel adds the chunks in order into dweight and dbias (weight's and bias's
// dtypes). The result is deterministic for a given GPU (the chunk count follows its SM count).
//
// Phases per row: load (x, z, dy packs), row sums (xhat w g and w g; dz and the recomputed
// output of the gate-after case written here, as they need no sums), team sum, and dx (dz of
// the gate-first case) recomputed from the packs and stored. 6 kernels and the reduce kernel.
#include <cstdint>

#include "device_info.h"
#include "norm_common.cuh"

namespace mamba_kernels {
namespace layernorm_gated {
namespace {

// Chunks of rows per group: about kBwdThreadsPerSm threads per SM in teams, at most one row each.
int64_t bwd_chunks(const NormBwdParams& p, int team, int device_index) {
  const int64_t teams = int64_t(sm_count(device_index)) * (kBwdThreadsPerSm / team);
  int64_t chunks = (teams + p.ngroups - 1) / p.ngroups;
  if (chunks > p.rows) chunks = p.rows;
  return chunks < 1 ? 1 : chunks;
}

bool bwd_vector(const NormBwdParams& p, int eb) {
  const int64_t ve = kVectorBytes / eb;
  return p.group_size % ve == 0 && vector_ok(p.x, ve) && vector_ok(p.z, ve) && vector_ok(p.dy, ve) &&
         vector_ok(p.dx, ve) && vector_ok(p.dz, ve) && vector_ok(p.out, ve) && aligned16(p.w) &&
         (p.b == nullptr || aligned16(p.b));
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kBwdMaxTeam)
    norm_bwd_kernel(const NormBwdParams p, const int team, const int64_t chunks, float* ws) {
  using PO = PackOf<T, kVec, kBwdThreadBytes>;
  constexpr int kE = PO::kElems;
  constexpr int kP = PO::kPerThread;
  __shared__ float smem[2 * 2 * (kMaxTeam / kWarpSize)];
  const TeamPos t = team_pos(team);
  const int64_t packs = p.group_size / kE;
  const int64_t units = chunks * p.ngroups;
  const int64_t rows_per = (p.rows + chunks - 1) / chunks;
  const bool has_z = p.z.ptr != nullptr;
  const bool gate_first = has_z && !p.norm_before_gate;
  const bool gate_after = has_z && p.norm_before_gate;
  const bool has_b = p.b != nullptr;
  const float inv_g = 1.0f / float(p.group_size);
  int parity = 0;
  for (int64_t u = int64_t(blockIdx.x) * t.teams + t.team_id; u < units; u += int64_t(gridDim.x) * t.teams) {
    const int64_t chunk = u / p.ngroups;
    const int64_t grp = u - chunk * p.ngroups;
    const int64_t col0 = grp * p.group_size;
    const int64_t r0 = chunk * rows_per;
    const int64_t r1 = r0 + rows_per < p.rows ? r0 + rows_per : p.rows;
    float dw[kP][kE], db[kP][kE];
#pragma unroll
    for (int k = 0; k < kP; ++k) {
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        dw[k][e] = 0.f;
        db[k][e] = 0.f;
      }
    }
    for (int64_t row = r0; row < r1; ++row) {
      // Phase 1: load the thread's packs of x, z and dy.
      const T* xr = static_cast<const T*>(p.x.ptr) + row * p.x.row + col0;
      const T* zr = static_cast<const T*>(p.z.ptr) + row * p.z.row + col0;
      const T* dyr = static_cast<const T*>(p.dy.ptr) + row * p.dy.row + col0;
      Pack<T, kE> xp[kP], zp[kP], gp[kP];
#pragma unroll
      for (int k = 0; k < kP; ++k) {
        const int64_t i = int64_t(k) * team + t.lane;
        if (i < packs) {
          load_pack(xp[k], xr + i * kE);
          load_pack(gp[k], dyr + i * kE);
          if (has_z) load_pack(zp[k], zr + i * kE);
        }
      }
      const int64_t at = grp * p.rows + row;
      const float rstd = p.rstd[at];
      const float mean = p.mean != nullptr ? p.mean[at] : 0.f;

      // Phase 2: row sums; the gate-after case's dz and recomputed output.
      float s[2] = {0.f, 0.f};  // sum of xhat w g, sum of w g
      T* dzr = static_cast<T*>(p.dz.ptr) + row * p.dz.row + col0;
      T* outr = static_cast<T*>(p.out.ptr) + row * p.out.row + col0;
#pragma unroll
      for (int k = 0; k < kP; ++k) {
        const int64_t i = int64_t(k) * team + t.lane;
        if (i < packs) {
          float w[kE], b[kE], dzv[kE], ov[kE];
          load_param(w, p.w, p.w_dtype, col0 + i * kE);
          if (has_b) load_param(b, p.b, p.b_dtype, col0 + i * kE);
#pragma unroll
          for (int e = 0; e < kE; ++e) {
            float xg = to_float(xp[k].e[e]);
            const float zz = has_z ? to_float(zp[k].e[e]) : 0.f;
            if (gate_first) xg *= zz * sigmoid(zz);
            const float xhat = (xg - mean) * rstd;
            float g = to_float(gp[k].e[e]);
            if (gate_after) {
              const float y = xhat * w[e] + (has_b ? b[e] : 0.f);
              const float sg = sigmoid(zz);
              dzv[e] = g * y * sg * (1.f + zz * (1.f - sg));
              ov[e] = y * silu(zz);  // as the forward rounds it: the recomputed output equals it bitwise
              g *= zz * sg;
            } else {
              ov[e] = xhat * w[e] + (has_b ? b[e] : 0.f);
            }
            const float wg = w[e] * g;
            s[0] += xhat * wg;
            s[1] += wg;
            dw[k][e] += g * xhat;
            db[k][e] += g;
          }
          if (gate_after) store_out<T, kE>(dzr + i * kE, dzv);
          if (p.out.ptr != nullptr) store_out<T, kE>(outr + i * kE, ov);
        }
      }

      // Phase 3: the group's sums.
      team_sum(s, t, smem, parity);
      parity ^= 1;
      const float c1 = s[0] * inv_g;
      const float c2 = p.rms ? 0.f : s[1] * inv_g;

      // Phase 4: dx (and the gate-first case's dz), recomputed from the packs.
      T* dxr = static_cast<T*>(p.dx.ptr) + row * p.dx.row + col0;
#pragma unroll
      for (int k = 0; k < kP; ++k) {
        const int64_t i = int64_t(k) * team + t.lane;
        if (i < packs) {
          float w[kE], dxv[kE], dzv[kE];
          load_param(w, p.w, p.w_dtype, col0 + i * kE);
#pragma unroll
          for (int e = 0; e < kE; ++e) {
            const float x = to_float(xp[k].e[e]);
            const float zz = has_z ? to_float(zp[k].e[e]) : 0.f;
            const float sg = has_z ? sigmoid(zz) : 0.f;
            const float xg = gate_first ? x * zz * sg : x;
            const float xhat = (xg - mean) * rstd;
            float g = to_float(gp[k].e[e]);
            if (gate_after) g *= zz * sg;
            const float d = (w[e] * g - (xhat * c1 + c2)) * rstd;
            if (gate_first) {
              dzv[e] = d * x * sg * (1.f + zz * (1.f - sg));
              dxv[e] = d * zz * sg;
            } else {
              dxv[e] = d;
            }
          }
          store_out<T, kE>(dxr + i * kE, dxv);
          if (gate_first) store_out<T, kE>(dzr + i * kE, dzv);
        }
      }
    }

    // Phase 5: the chunk's dw and db partial sums, one row of the workspace each.
    float* wsw = ws + chunk * p.n + col0;
    float* wsb = ws + (chunks + chunk) * p.n + col0;
#pragma unroll
    for (int k = 0; k < kP; ++k) {
      const int64_t i = int64_t(k) * team + t.lane;
      if (i < packs) {
#pragma unroll
        for (int e = 0; e < kE; ++e) {
          wsw[i * kE + e] = dw[k][e];
          if (has_b) wsb[i * kE + e] = db[k][e];
        }
      }
    }
  }
}

// dweight[c] (and dbias[c]) = the chunks' partial sums added in chunk order, in W's dtype.
template <typename W>
__device__ __forceinline__ void store_param(void* base, int64_t c, float v) {
  static_cast<W*>(base)[c] = from_float<W>(v);
}

__device__ __forceinline__ void store_param_any(void* base, DType dt, int64_t c, float v) {
  switch (dt) {
    case DType::kBFloat16: store_param<__nv_bfloat16>(base, c, v); break;
    case DType::kFloat16: store_param<__half>(base, c, v); break;
    default: store_param<float>(base, c, v); break;
  }
}

__global__ void __launch_bounds__(kReduceThreads)
    norm_reduce_kernel(const NormBwdParams p, const int64_t chunks, const float* ws) {
  for (int64_t c = int64_t(blockIdx.x) * kReduceThreads + threadIdx.x; c < p.n;
       c += int64_t(gridDim.x) * kReduceThreads) {
    float w = 0.f, b = 0.f;
    for (int64_t k = 0; k < chunks; ++k) {
      w += ws[k * p.n + c];
      if (p.db != nullptr) b += ws[(chunks + k) * p.n + c];
    }
    store_param_any(p.dw, p.w_dtype, c, w);
    if (p.db != nullptr) store_param_any(p.db, p.b_dtype, c, b);
  }
}

template <typename T>
cudaError_t launch_typed(const NormBwdParams& p, const TeamShape& s, int64_t chunks, float* ws,
                         cudaStream_t stream) {
  const unsigned grid = grid_for(chunks * p.ngroups, s);
  if (s.vec) {
    norm_bwd_kernel<T, true><<<grid, s.block, 0, stream>>>(p, s.team, chunks, ws);
  } else {
    norm_bwd_kernel<T, false><<<grid, s.block, 0, stream>>>(p, s.team, chunks, ws);
  }
  return cudaGetLastError();
}

TeamShape bwd_shape(const NormBwdParams& p) {
  const int eb = dtype_size(p.dtype);
  return team_shape(p.group_size, eb, bwd_vector(p, eb), kBwdThreadBytes, kBwdMaxTeam);
}

}  // namespace

int64_t norm_bwd_workspace(const NormBwdParams& p, int device_index) {
  if (p.rows == 0 || p.n == 0 || p.group_size < 1) return 0;
  const TeamShape s = bwd_shape(p);
  if (s.team == 0) return 0;
  return 2 * bwd_chunks(p, s.team, device_index) * p.n;
}

cudaError_t launch_norm_bwd(const NormBwdParams& p, float* workspace, int device_index, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  int64_t chunks = 0;
  if (p.rows > 0) {
    if (p.group_size < 1 || p.group_size * dtype_size(p.dtype) > kMaxGroupBytes) return cudaErrorInvalidValue;
    const TeamShape s = bwd_shape(p);
    if (s.team == 0 || workspace == nullptr) return cudaErrorInvalidValue;
    chunks = bwd_chunks(p, s.team, device_index);
    cudaError_t err = cudaSuccess;
    switch (p.dtype) {
      case DType::kFloat16: err = launch_typed<__half>(p, s, chunks, workspace, stream); break;
      case DType::kBFloat16: err = launch_typed<__nv_bfloat16>(p, s, chunks, workspace, stream); break;
      default: err = launch_typed<float>(p, s, chunks, workspace, stream); break;
    }
    if (err != cudaSuccess) return err;
  }
  // no rows: the sums over nothing are zeros (chunks 0)
  int64_t blocks = (p.n + kReduceThreads - 1) / kReduceThreads;
  if (blocks > 65535) blocks = 65535;
  norm_reduce_kernel<<<unsigned(blocks), kReduceThreads, 0, stream>>>(p, chunks, workspace);
  return cudaGetLastError();
}

}  // namespace layernorm_gated
}  // namespace mamba_kernels
