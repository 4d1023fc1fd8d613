// selective_state_update: one decode step of the scan (math in state_update.h).
//
// Template instantiations: 3, one per state dtype (fp32, fp16, bf16). The state is the only
// data the kernel streams (read once, written once), so only its accesses are typed at compile
// time; every other operand is a handful of values per row, read with a run-time dtype switch
// that is uniform across the warp. Optional operands, softplus and slot indices are run-time
// branches too.
//
// Work split: a row is one (batch, head, channel); a group of `lanes` consecutive threads of a
// warp (a power of two, 1..32) owns it. A lane holds up to kStatesPerThread states of the row in
// registers, as chunks of 16 bytes: chunk c of lane l covers states (c * lanes + l) * kVec ...,
// so the lanes of a row read consecutive 16-byte pieces and a warp's accesses coalesce. All
// loads of a thread are issued before its first store (nothing in between can alias), so a
// thread waits for memory about once; the row's output is a butterfly sum over its lanes.
#include <algorithm>
#include <cstdint>

#include "device_utils.cuh"
#include "state_update.h"

namespace mamba_kernels {
namespace selective_scan {
namespace {

constexpr int kThreads = 128;
constexpr int kStatesPerThread = 16;  // register budget: 16 fp32 (64 B) or 16 half (32 B) in flight
// Below this many threads the GPU idles on latency; give rows more lanes (fewer states each).
constexpr int64_t kMinThreads = 32768;

// Host-chosen launch shape, passed by value with the params.
struct Shape {
  int lanes_log2 = 0;                          // threads per row = 1 << lanes_log2
  bool state_vec = false;                      // 16-byte state accesses are aligned
  bool A_vec = false, B_vec = false, C_vec = false;  // vector reads of that operand's chunks
};

__device__ __forceinline__ float load_scalar(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kFloat16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_scalar(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kFloat16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case DType::kBFloat16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// v[i] = p[i * stride] for i < valid, else 0. With vec (unit stride, aligned, a full chunk) the
// run is read as 16-byte words (or one narrower word when the run is shorter).
template <typename T, int N>
__device__ __forceinline__ void load_run(float (&v)[N], const T* p, int64_t stride, int valid, bool vec) {
  constexpr int kPer = N * int(sizeof(T)) < 16 ? N : 16 / int(sizeof(T));
  if (vec && valid == N) {
#pragma unroll
    for (int w = 0; w < N / kPer; ++w) {
      Pack<T, kPer> pk;
      load_pack(pk, p + w * kPer);
#pragma unroll
      for (int i = 0; i < kPer; ++i) v[w * kPer + i] = to_float(pk.e[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = i < valid ? to_float(p[i * stride]) : 0.0f;
  }
}

// How many of the chunk's kVec states at n0.. exist (0..kVec).
__device__ __forceinline__ int chunk_valid(int64_t dstate, int n0, int vec) {
  const int64_t left = dstate - n0;
  return left <= 0 ? 0 : (left >= vec ? vec : int(left));
}

// v[c] = the chunk of this lane at n0 = (c * lanes + lane) * kN, read from o at element offset
// off along axis 2. The dtype switch sits outside the chunk loop so that every load is issued
// before the first use.
template <typename T, int kC, int kN>
__device__ __forceinline__ void load_chunks(float (&v)[kC][kN], const T* p, int64_t stride, int lanes, int lane,
                                            int64_t dstate, bool vec) {
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    const int n0 = (c * lanes + lane) * kN;
    load_run(v[c], p + n0 * stride, stride, chunk_valid(dstate, n0, kN), vec);
  }
}

template <int kC, int kN>
__device__ __forceinline__ void load_chunks(float (&v)[kC][kN], const StepOperand& o, int64_t off, int lanes,
                                            int lane, int64_t dstate, bool vec) {
  switch (o.dtype) {
    case DType::kFloat16:
      load_chunks(v, static_cast<const __half*>(o.ptr) + off, o.s2, lanes, lane, dstate, vec);
      break;
    case DType::kBFloat16:
      load_chunks(v, static_cast<const __nv_bfloat16*>(o.ptr) + off, o.s2, lanes, lane, dstate, vec);
      break;
    default: load_chunks(v, static_cast<const float*>(o.ptr) + off, o.s2, lanes, lane, dstate, vec); break;
  }
}

// At most 80 registers (6 blocks of 128 per SM): without the bound the fp32 kernel takes 96
// and fewer rows are in flight; at 64 it spills.
template <typename S>
__global__ void __launch_bounds__(kThreads, 6) state_update_kernel(const StateUpdateParams p, const Shape sh) {
  constexpr int kVec = 16 / int(sizeof(S));  // states per 16-byte chunk
  constexpr int kChunks = kStatesPerThread / kVec;
  constexpr int kStage = int(kStateUpdateMaxDstate / kThreads);  // B, C values staged per thread
  static_assert(kStage * kThreads == kStateUpdateMaxDstate, "B/C staging covers dstate");
  // B and C of the block's (batch, group), shared by all its rows: read from global memory once
  // per block, in fp32, whatever their dtype.
  __shared__ __align__(16) float B_s[kStateUpdateMaxDstate];
  __shared__ __align__(16) float C_s[kStateUpdateMaxDstate];
  const int lanes = 1 << sh.lanes_log2;
  const int lane = int(threadIdx.x) & (lanes - 1);
  const int64_t d = int64_t(blockIdx.x) * (kThreads >> sh.lanes_log2) + (int(threadIdx.x) >> sh.lanes_log2);
  const bool row_ok = d < p.dim;
  const int64_t rows_bh = p.batch * p.nheads;
  // Block-uniform loop (one pass unless batch * nheads > 65535): every thread reaches the
  // barriers and every lane the shuffles.
  for (int64_t bh = blockIdx.y; bh < rows_bh; bh += gridDim.y) {
    const int64_t b = bh / p.nheads;
    const int64_t h = bh - b * p.nheads;
    const int64_t g = h / p.heads_per_group;
    int64_t slot = b;
    if (p.slot_idx != nullptr) {
      slot = p.slot_idx_64 ? static_cast<const int64_t*>(p.slot_idx)[b * p.slot_idx_s]
                           : int64_t(static_cast<const int32_t*>(p.slot_idx)[b * p.slot_idx_s]);
    }
    const bool live = row_ok && slot >= 0 && slot < p.nslots;
    S* st = static_cast<S*>(p.state) + (live ? slot * p.state_s0 + h * p.state_s1 + d * p.state_s2 : 0);

    // Loads only, in the order their latency matters: the state (DRAM), then the rest.
    Pack<S, kVec> sv[kChunks];
    float a[kChunks][kVec];
    float xv = 0.0f, dtv = 0.0f, zv = 0.0f, Dv = 0.0f;
    if (live) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int n0 = (c * lanes + lane) * kVec;
        const int valid = chunk_valid(p.dstate, n0, kVec);
        if (sh.state_vec && valid == kVec) {
          load_pack(sv[c], st + n0);
        } else {
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            sv[c].e[i] = i < valid ? st[(n0 + i) * p.state_s3] : from_float<S>(0.0f);
          }
        }
      }
      load_chunks(a, p.A, h * p.A.s0 + d * p.A.s1, lanes, lane, p.dstate, sh.A_vec);
      xv = load_scalar(p.x.ptr, p.x.dtype, b * p.x.s0 + h * p.x.s1 + d * p.x.s2);
      dtv = load_scalar(p.dt.ptr, p.dt.dtype, b * p.dt.s0 + h * p.dt.s1 + d * p.dt.s2);
      if (p.dt_bias.ptr != nullptr) {
        dtv += load_scalar(p.dt_bias.ptr, p.dt_bias.dtype, h * p.dt_bias.s0 + d * p.dt_bias.s1);
      }
      if (p.z.ptr != nullptr) zv = load_scalar(p.z.ptr, p.z.dtype, b * p.z.s0 + h * p.z.s1 + d * p.z.s2);
      if (p.D.ptr != nullptr) Dv = load_scalar(p.D.ptr, p.D.dtype, h * p.D.s0 + d * p.D.s1);
    }
    float bst[kStage], cst[kStage];
#pragma unroll
    for (int k = 0; k < kStage; ++k) {
      const int n = int(threadIdx.x) + k * kThreads;
      bst[k] = n < p.dstate ? load_scalar(p.B.ptr, p.B.dtype, b * p.B.s0 + g * p.B.s1 + n * p.B.s2) : 0.0f;
      cst[k] = n < p.dstate ? load_scalar(p.C.ptr, p.C.dtype, b * p.C.s0 + g * p.C.s1 + n * p.C.s2) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kStage; ++k) {
      B_s[threadIdx.x + k * kThreads] = bst[k];
      C_s[threadIdx.x + k * kThreads] = cst[k];
    }
    __syncthreads();

    float acc = 0.0f;
    if (live) {
      if (p.dt_softplus) dtv = dtv <= 20.0f ? log1pf(expf(dtv)) : dtv;
      const float dtx = dtv * xv;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int n0 = (c * lanes + lane) * kVec;
        const int valid = chunk_valid(p.dstate, n0, kVec);
        if (valid == 0) continue;
        float bv[kVec], cv[kVec];
#pragma unroll
        for (int w = 0; w < kVec; w += 4) {  // n0 is a multiple of 4: aligned 16-byte reads
          const float4 b4 = *reinterpret_cast<const float4*>(B_s + n0 + w);
          const float4 c4 = *reinterpret_cast<const float4*>(C_s + n0 + w);
          bv[w] = b4.x, bv[w + 1] = b4.y, bv[w + 2] = b4.z, bv[w + 3] = b4.w;
          cv[w] = c4.x, cv[w + 1] = c4.y, cv[w + 2] = c4.z, cv[w + 3] = c4.w;
        }
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          if (i < valid) {
            const float s = __expf(a[c][i] * dtv) * to_float(sv[c].e[i]) + bv[i] * dtx;
            acc += cv[i] * s;
            sv[c].e[i] = from_float<S>(s);
          }
        }
      }
    }
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {  // butterfly over the row's lanes (uniform bound)
      if (off < lanes) acc += __shfl_xor_sync(kFullMask, acc, off);
    }
    if (row_ok && lane == 0) {
      float o;
      if (live) {
        o = p.D.ptr != nullptr ? acc + Dv * xv : acc;
        if (p.z.ptr != nullptr) o *= silu(zv);
      } else {
        o = slot < 0 ? 0.0f : __int_as_float(0x7fc00000);  // padding: 0; index past the cache: NaN
      }
      store_scalar(p.out, p.x.dtype, b * p.out_s0 + h * p.out_s1 + d * p.out_s2, o);
    }
    if (live) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int n0 = (c * lanes + lane) * kVec;
        const int valid = chunk_valid(p.dstate, n0, kVec);
        if (sh.state_vec && valid == kVec) {
          *reinterpret_cast<uint4*>(st + n0) = sv[c].raw;
        } else {
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            if (i < valid) st[(n0 + i) * p.state_s3] = sv[c].e[i];
          }
        }
      }
    }
    __syncthreads();  // B_s / C_s are read before the next pass overwrites them
  }
}

// Chunks of `chunk` elements of o along axis 2, at element offsets that are multiples of
// `chunk` along it, may be read as aligned words of min(16, chunk * size) bytes.
bool vec_ok(const StepOperand& o, int chunk) {
  const int size = dtype_size(o.dtype);
  const int per = std::min(chunk, 16 / size);
  const uintptr_t align = uintptr_t(per) * uintptr_t(size);
  return o.s2 == 1 && reinterpret_cast<uintptr_t>(o.ptr) % align == 0 && o.s0 % per == 0 && o.s1 % per == 0;
}

template <typename S>
cudaError_t launch_typed(const StateUpdateParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / int(sizeof(S));
  constexpr int kChunks = kStatesPerThread / kVec;
  Shape sh;
  const int64_t chunks_per_row = (p.dstate + kVec - 1) / kVec;
  int lanes = 1;
  while (int64_t(lanes) * kChunks < chunks_per_row) lanes *= 2;  // fit the row in registers
  // More lanes (fewer states each) while the launch is small, or most of a block would idle on a
  // short row axis; never more lanes than the row has chunks.
  const int64_t rows = p.batch * p.nheads * p.dim;
  while (lanes < 32 && lanes < chunks_per_row &&
         (rows * lanes < kMinThreads || kThreads / lanes >= 2 * p.dim)) {
    lanes *= 2;
  }
  while ((1 << sh.lanes_log2) < lanes) ++sh.lanes_log2;
  sh.state_vec = p.state_s3 == 1 && reinterpret_cast<uintptr_t>(p.state) % 16 == 0 && p.state_s0 % kVec == 0 &&
                 p.state_s1 % kVec == 0 && p.state_s2 % kVec == 0;
  sh.A_vec = vec_ok(p.A, kVec);
  sh.B_vec = vec_ok(p.B, kVec);
  sh.C_vec = vec_ok(p.C, kVec);
  const int64_t rows_per_block = kThreads / lanes;
  const int64_t xblocks = (p.dim + rows_per_block - 1) / rows_per_block;
  if (xblocks > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(xblocks), unsigned(std::min<int64_t>(p.batch * p.nheads, 65535)));
  state_update_kernel<S><<<grid, kThreads, 0, stream>>>(p, sh);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_state_update(const StateUpdateParams& p, cudaStream_t stream) {
  if (p.dstate < 0 || p.dstate > kStateUpdateMaxDstate) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.nheads == 0 || p.dim == 0) return cudaSuccess;
  if (p.heads_per_group < 1) return cudaErrorInvalidValue;
  switch (p.state_dtype) {
    case DType::kFloat32: return launch_typed<float>(p, stream);
    case DType::kFloat16: return launch_typed<__half>(p, stream);
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace selective_scan
}  // namespace mamba_kernels
