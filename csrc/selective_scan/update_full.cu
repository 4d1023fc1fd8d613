// The general decode kernel, state_update_kernel<S, T>, and its launcher: every shape, layout
// and mix of dtypes (T = AnyDtype reads each operand's dtype at run time); update.cu says when
// it runs.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "update_common.cuh"

namespace mamba_kernels {
namespace selective_scan {
namespace decode {

// The generic kernel's chunks of run-time dtype: plain fp32 values (outside the anonymous
// namespace: a partial specialization belongs in its template's namespace).
template <int V>
struct Chunk<AnyDtype, V> {
  float v[V];
  __device__ __forceinline__ float get(int i) const { return v[i]; }
};

namespace {

// Chunk of operand o at element offset off (its axis-2 stride is o.s2). vec: read it whole.
template <typename T, int V>
__device__ __forceinline__ void load_chunk(Chunk<T, V>& c, const StepOperand& o, int64_t off, int valid,
                                           bool vec) {
  const T* p = static_cast<const T*>(o.ptr) + off;
  if (vec && valid == V) {
    c.load_vec(p);
  } else {
    c.load_elems(p, o.s2, valid);
  }
}

template <typename T, int V>
__device__ __forceinline__ void load_any_as(Chunk<AnyDtype, V>& c, const StepOperand& o, int64_t off, int valid,
                                            bool vec) {
  Chunk<T, V> t;
  load_chunk(t, o, off, valid, vec);
#pragma unroll
  for (int i = 0; i < V; ++i) c.v[i] = t.get(i);
}

template <int V>
__device__ __forceinline__ void load_chunk(Chunk<AnyDtype, V>& c, const StepOperand& o, int64_t off, int valid,
                                           bool vec) {
  switch (o.dtype) {
    case DType::kFloat16: load_any_as<__half>(c, o, off, valid, vec); break;
    case DType::kBFloat16: load_any_as<__nv_bfloat16>(c, o, off, valid, vec); break;
    default: load_any_as<float>(c, o, off, valid, vec); break;
  }
}

// ----------------------------------------------------------------------- scalar operands

template <typename T>
__device__ __forceinline__ float load_typed(const void* p, int64_t i) {
  return Bits<T>::to_f(raw_at(static_cast<const T*>(p), i));
}


// An activation (x, dt, z): of dtype T in the typed kernels.
template <typename T>
__device__ __forceinline__ float load_act(const StepOperand& o, int64_t i) {
  if constexpr (std::is_same<T, AnyDtype>::value) {
    return load_as_float(o.ptr, o.dtype, i);
  } else {
    return load_typed<T>(o.ptr, i);
  }
}

// A per-channel weight (D, dt_bias): fp32 or T in the typed kernels.
template <typename T>
__device__ __forceinline__ float load_weight(const StepOperand& o, int64_t i) {
  if constexpr (std::is_same<T, AnyDtype>::value) {
    return load_as_float(o.ptr, o.dtype, i);
  } else if constexpr (std::is_same<T, float>::value) {
    return load_typed<float>(o.ptr, i);
  } else {
    return o.dtype == DType::kFloat32 ? load_typed<float>(o.ptr, i) : load_typed<T>(o.ptr, i);
  }
}

template <typename T>
__device__ __forceinline__ void store_out(void* p, DType t, int64_t i, float v) {
  if constexpr (std::is_same<T, AnyDtype>::value) {
    switch (t) {
      case DType::kFloat16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
      case DType::kBFloat16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
      default: static_cast<float*>(p)[i] = v; break;
    }
  } else {
    static_cast<T*>(p)[i] = from_float<T>(v);
  }
}

// How many of the chunk's V states at n0.. exist (0..V).
__device__ __forceinline__ int chunk_valid(int64_t dstate, int64_t n0, int vec) {
  const int64_t left = dstate - n0;
  return left <= 0 ? 0 : (left >= vec ? vec : int(left));
}

// ------------------------------------------------------------------------------- kernel

// The operand accesses of the two kinds of kernel. Typed (kFast): the launcher has checked
// that every chunk is whole and every chunked operand vector-readable (A may instead be one
// value per channel, stride 0 along the states: Mamba-2's expanded A), so a chunk is one or
// two vector accesses or nothing. Generic: element accesses with the operand's strides wherever
// the vector test fails, dtypes read at run time.
template <bool kFast, typename T, int V>
__device__ __forceinline__ void load_A(Chunk<T, V>& c, const StepOperand& o, int64_t off, int valid, bool vec,
                                       bool bcast) {
  if constexpr (kFast) {
    if (valid > 0) {
      if (bcast) {
        const uint32_t w = raw_at(static_cast<const T*>(o.ptr), off);
#pragma unroll
        for (int i = 0; i < Chunk<T, V>::kWords; ++i) c.u[i] = w;
      } else {
        c.load_vec(static_cast<const T*>(o.ptr) + off);
      }
    } else {
      c.zero();
    }
  } else {
    load_chunk(c, o, off, valid, vec);
  }
}

// B, C: as A, never broadcast.
template <bool kFast, typename T, int V>
__device__ __forceinline__ void load_op(Chunk<T, V>& c, const StepOperand& o, int64_t off, int valid, bool vec) {
  load_A<kFast>(c, o, off, valid, vec, false);
}

template <bool kFast, typename S, int V>
__device__ __forceinline__ void load_state(Chunk<S, V>& c, const S* p, int64_t stride, int valid, bool vec) {
  if (kFast || (vec && valid == V)) {
    if (valid > 0) {
      c.load_vec(p);
    } else {
      c.zero();
    }
  } else {
    c.load_elems(p, stride, valid);
  }
}

template <bool kFast, typename S, int V>
__device__ __forceinline__ void store_state(const Chunk<S, V>& c, S* p, int64_t stride, int valid, bool vec) {
  if (kFast || (vec && valid == V)) {
    if (valid > 0) c.store_vec(p);
  } else {
    c.store_elems(p, stride, valid);
  }
}

// S: the state's dtype. T: x, dt, z, B, C's (A fp32; D, dt_bias fp32 or T), or AnyDtype.
template <typename S, typename T>
__global__ void __launch_bounds__(
    kThreads, UpdatePolicy::full_min_blocks(std::is_same<T, AnyDtype>::value, int(sizeof(S)), int(sizeof(T))))
    state_update_kernel(const StateUpdateParams p, const Shape sh) {
  constexpr int V = 16 / int(sizeof(S));  // states per chunk: one 16-byte state access
  constexpr bool kFast = !std::is_same<T, AnyDtype>::value;
  using TA = typename std::conditional<kFast, float, AnyDtype>::type;  // A's type
  // "wide" is only ever chosen for fp32 states (16-bit rows have at most 32 chunks), so the
  // 16-bit kernels keep no second A chunk.
  constexpr bool kCanWide = V == 4;

  // Block blk (d fastest, then head, then batch row or pair of rows) owns rows_per_block
  // channels of one (batch, head): adjacent blocks touch adjacent state.
  const int64_t blk = sh.block_offset + blockIdx.x;
  const int64_t rest = sh.by_dblocks.div(blk);
  const int64_t dblk = blk - rest * sh.dblocks;
  const int64_t bidx = sh.by_nheads.div(rest);
  const int64_t h = rest - bidx * p.nheads;
  const int lanes = 1 << sh.lanes_log2;
  const int lane = int(threadIdx.x) & (lanes - 1);
  const int64_t d = dblk * (int(blockDim.x) >> sh.lanes_log2) + (int(threadIdx.x) >> sh.lanes_log2);
  const bool row_ok = d < p.dim;
  const bool pair = sh.mode == kPair;
  const bool wide = kCanWide && sh.mode == kWide;
  // this lane's chunk(s) of the row: k0 = lane, k1 = lane + 32 (wide) or lane (pair)
  const int64_t n0 = int64_t(lane) * V;
  const int64_t n1 = wide ? n0 + int64_t(kMaxLanes) * V : n0;
  const int valid0 = row_ok ? chunk_valid(p.dstate, n0, V) : 0;
  const int64_t grp = sh.by_group.div(h);
  const int64_t b0 = pair ? 2 * bidx : bidx;
  const int64_t b1 = pair ? b0 + 1 : b0;
  const bool has1 = pair ? b1 < p.batch : wide;  // the second chunk exists (uniform in the block)
  const int valid1 = has1 && row_ok ? chunk_valid(p.dstate, n1, V) : 0;
  // ---- loads: the slot index (the state's address needs it), the state, then everything else
  const int64_t slot0 = slot_of<int64_t>(p.slot_idx, p.slot_idx_64, p.slot_idx_s, b0);
  const int64_t slot1 = pair && has1 ? slot_of<int64_t>(p.slot_idx, p.slot_idx_64, p.slot_idx_s, b1) : slot0;
  const bool live0 = row_ok && slot0 >= 0 && slot0 < p.nslots;
  const bool live1 = has1 && row_ok && slot1 >= 0 && slot1 < p.nslots;

  // the state first: the one operand that comes from DRAM every step
  S* const st_base = static_cast<S*>(p.state) + h * p.state_s1 + d * p.state_s2;
  S* const st0 = st_base + (live0 ? slot0 * p.state_s0 + n0 * p.state_s3 : 0);
  S* const st1 = st_base + (live1 ? slot1 * p.state_s0 + n1 * p.state_s3 : 0);
  const int sv0 = live0 ? valid0 : 0, sv1 = live1 ? valid1 : 0;  // states to read and write
  Chunk<S, V> s0, s1;
  load_state<kFast>(s0, st0, p.state_s3, sv0, sh.state_vec);
  load_state<kFast>(s1, st1, p.state_s3, sv1, sh.state_vec);

  float x0 = 0.0f, dt0 = 0.0f, z0 = 0.0f, x1 = 0.0f, dt1 = 0.0f, z1 = 0.0f, Dv = 0.0f, bias = 0.0f;
  if (row_ok) {
    const int64_t ox = h * p.x.s1 + d * p.x.s2, odt = h * p.dt.s1 + d * p.dt.s2;
    x0 = load_act<T>(p.x, b0 * p.x.s0 + ox);
    dt0 = load_act<T>(p.dt, b0 * p.dt.s0 + odt);
    if (pair && has1) {
      x1 = load_act<T>(p.x, b1 * p.x.s0 + ox);
      dt1 = load_act<T>(p.dt, b1 * p.dt.s0 + odt);
    }
    if (p.z.ptr != nullptr) {
      const int64_t oz = h * p.z.s1 + d * p.z.s2;
      z0 = load_act<T>(p.z, b0 * p.z.s0 + oz);
      if (pair && has1) z1 = load_act<T>(p.z, b1 * p.z.s0 + oz);
    }
    if (p.D.ptr != nullptr) Dv = load_weight<T>(p.D, h * p.D.s0 + d * p.D.s1);
    if (p.dt_bias.ptr != nullptr) bias = load_weight<T>(p.dt_bias, h * p.dt_bias.s0 + d * p.dt_bias.s1);
  }

  const int64_t oA = h * p.A.s0 + d * p.A.s1;
  Chunk<TA, V> a0, a1;
  load_A<kFast>(a0, p.A, oA + n0 * p.A.s2, valid0, sh.A_vec, sh.A_bcast);
  if (wide) load_A<kFast>(a1, p.A, oA + n1 * p.A.s2, valid1, sh.A_vec, sh.A_bcast);

  // B and C: this lane's own values, for batch row b0 and for the second chunk's row
  Chunk<T, V> B0, C0, B1, C1;
  load_op<kFast>(B0, p.B, b0 * p.B.s0 + grp * p.B.s1 + n0 * p.B.s2, valid0, sh.B_vec);
  load_op<kFast>(C0, p.C, b0 * p.C.s0 + grp * p.C.s1 + n0 * p.C.s2, valid0, sh.C_vec);
  load_op<kFast>(B1, p.B, b1 * p.B.s0 + grp * p.B.s1 + n1 * p.B.s2, valid1, sh.B_vec);
  load_op<kFast>(C1, p.C, b1 * p.C.s0 + grp * p.C.s1 + n1 * p.C.s2, valid1, sh.C_vec);

  // ---- arithmetic
  float dtv0 = dt0 + bias;
  float dtv1 = (pair ? dt1 : dt0) + bias;
  if (p.dt_softplus) {
    dtv0 = softplus(dtv0);
    dtv1 = pair ? softplus(dtv1) : dtv0;
  }
  const float dtx0 = dtv0 * x0;
  const float dtx1 = dtv1 * (pair ? x1 : x0);
  // Unguarded: a chunk or element that is not there was read as zeros (state, A, B and C),
  // so it adds exactly 0 to the row and is not stored.
  float acc0 = chunk_step(s0, a0, B0, C0, dtv0, dtx0), acc1 = 0.0f;
  if (has1) {  // uniform over the block; the second chunk's A is a1 (wide) or a0 (pair)
    // (two calls, not one with `wide ? a1 : a0`: a reference to either chunk put both of
    // them in local memory, a 32-byte stack frame)
    if (wide) {
      acc1 = chunk_step(s1, a1, B1, C1, dtv1, dtx1);
    } else {
      acc1 = chunk_step(s1, a0, B1, C1, dtv1, dtx1);
    }
  }
  if (pair) {
    acc0 = row_sum(acc0, lanes);
    acc1 = row_sum(acc1, lanes);
  } else {
    acc0 = row_sum(acc0 + acc1, lanes);
  }

  // ---- stores: the output (lane 0 of the row), then the state
  if (row_ok && lane == 0) {
    // padding (negative index): 0; an index past the cache: NaN, so the mistake shows
    const float kNaN = __int_as_float(0x7fc00000);
    const bool hasD = p.D.ptr != nullptr;
    float o0 = live0 ? (hasD ? acc0 + Dv * x0 : acc0) : (slot0 < 0 ? 0.0f : kNaN);
    if (live0 && p.z.ptr != nullptr) o0 *= silu(z0);
    const int64_t oo = h * p.out_s1 + d * p.out_s2;
    store_out<T>(p.out, p.x.dtype, b0 * p.out_s0 + oo, o0);
    if (pair && has1) {
      float o1 = live1 ? (hasD ? acc1 + Dv * x1 : acc1) : (slot1 < 0 ? 0.0f : kNaN);
      if (live1 && p.z.ptr != nullptr) o1 *= silu(z1);
      store_out<T>(p.out, p.x.dtype, b1 * p.out_s0 + oo, o1);
    }
  }
  store_state<kFast>(s0, st0, p.state_s3, sv0, sh.state_vec);
  store_state<kFast>(s1, st1, p.state_s3, sv1, sh.state_vec);
}

}  // namespace

template <typename S, typename T>
cudaError_t launch_kernel(const StateUpdateParams& p, Shape sh, cudaStream_t stream) {
  // Block: whole warps, at most kThreads, no more rows than the channel axis has.
  const int lanes = 1 << sh.lanes_log2;
  const int64_t want = std::min<int64_t>(kThreads, p.dim * lanes);
  const int threads = int(std::max<int64_t>(32, (want + 31) / 32 * 32));
  const int64_t rows_per_block = threads / lanes;
  sh.dblocks = (p.dim + rows_per_block - 1) / rows_per_block;
  sh.by_dblocks = Divider(sh.dblocks);
  sh.by_nheads = Divider(p.nheads);
  sh.by_group = Divider(p.heads_per_group);
  const int64_t bsteps = sh.mode == kPair ? (p.batch + 1) / 2 : p.batch;
  const int64_t blocks = sh.dblocks * p.nheads * bsteps;  // < 2^63: at most one per state row
  constexpr int64_t kMaxGrid = 0x7fffffff;
  for (sh.block_offset = 0; sh.block_offset < blocks; sh.block_offset += kMaxGrid) {
    const int64_t n = std::min(kMaxGrid, blocks - sh.block_offset);
    state_update_kernel<S, T><<<unsigned(n), threads, 0, stream>>>(p, sh);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// Instantiated here for update.cu: every state dtype with each activation dtype and AnyDtype.
#define MK_LAUNCH_KERNEL(S, T) template cudaError_t launch_kernel<S, T>(const StateUpdateParams&, Shape, cudaStream_t);
MK_DECODE_DTYPE_PAIRS(MK_LAUNCH_KERNEL)
MK_LAUNCH_KERNEL(float, AnyDtype) MK_LAUNCH_KERNEL(__half, AnyDtype) MK_LAUNCH_KERNEL(__nv_bfloat16, AnyDtype)
#undef MK_LAUNCH_KERNEL

}  // namespace decode
}  // namespace selective_scan
}  // namespace mamba_kernels
