// selective_state_update: one decode step of the scan (math in state_update.h).
//
// The step streams the state (read once, written once) and touches a few values per row of
// everything else, so its speed is the state's bandwidth. The kernel is built for that:
//
// - Typed at compile time. state_update_kernel<S, T>: S the state's dtype, T the dtype of x,
//   dt, z, B, C (and out), A in fp32; D and dt_bias each fp32 or T (a warp-uniform choice
//   between two typed loads). That is the layout models keep (activations in one dtype,
//   weights in fp32): 9 kernels. Every other mix runs state_update_kernel<S, AnyDtype>, which
//   reads each operand through a run-time dtype switch: 3 more. Each typed pair also has two
//   lean kernels, state_update_lean<S, T, kP>, which the launcher picks whenever the problem
//   fits them (one chunk per lane, batch and heads within the grid's y and z axes, every
//   offset below 2^31): a warp per 32 rows doing each row's scalar work once, its passes in
//   pairs (kP = 2), or per 32 / lanes rows for small launches (kP = 1); fp32 states also take
//   their passes four at a time (kP = 4) on mid-sized launches. Small and mid-sized launches
//   over dense operands with fp32 D and dt_bias take the row kernel, state_update_row<S, T, M>,
//   instead: one pass, its parameters in 144 bytes (a step that short waits on its launch and
//   its first reads); M = true is Mamba-1's step with its fixed shape at compile time. 51
//   kernels in all.
// - Whole rows, coalesced. A row is one (batch, head, channel); `lanes` consecutive threads of
//   a warp (a power of two, 1..32) own it, each one 16-byte chunk of its states (4 fp32 or 8
//   16-bit states). Lane l holds chunk l, so a row's lanes read one contiguous run and, with the
//   state contiguous, a warp reads 32 x 16 = 512 contiguous bytes per access (dstate 16 fp32:
//   4 lanes per row, 8 rows per warp).
// - Two chunks per thread when it pays: "pair" gives a thread the same channel in two batch
//   rows (b, b + 1; A, D and dt_bias loaded once for both), chosen when the launch still fills
//   the GPU, so each thread has 32 bytes of state in flight; "wide" gives it two chunks of one
//   row (lane l and l + 32), needed only for fp32 rows of more than 32 chunks (dstate > 128).
// - Every load before the first use: the slot index, the state of both chunks, then x, dt, z,
//   D, dt_bias, A, B and C are issued, then the arithmetic runs, then the stores. Each lane
//   reads its own B and C values from global memory (cached; the block's rows share them), so
//   there is no shared memory and no barrier; a row's output is a butterfly sum over its lanes.
// - Anything the fast path needs but the operands do not offer (unit stride, 16-byte
//   alignment, a full chunk) falls back to element accesses with the operand's strides, per
//   operand, at run time.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "device_info.h"
#include "device_utils.cuh"
#include "scan_policy.cuh"
#include "state_update.h"

namespace mamba_kernels {
namespace selective_scan {
namespace {

constexpr int kThreads = UpdatePolicy::kThreads;
constexpr int64_t kPairMinThreads = UpdatePolicy::kPairMinThreads;
constexpr int kMaxLanes = UpdatePolicy::kMaxLanes;

struct AnyDtype {};  // the operand's dtype is read at run time (the generic kernel)

enum Mode : int { kOne = 0, kPair = 1, kWide = 2 };

// n / d for 0 <= n and a fixed 0 < d. When both are below 2^31 (the launcher checks d; the
// kernel checks n), a multiply-high and a shift: q = (umulhi(n, m) + n) >> l with
// l = ceil(log2 d), m = floor(2^32 (2^l - d) / d) + 1, exact for every such n and d. Else a
// 64-bit division (a long subroutine, for sizes no GPU holds today).
__device__ __forceinline__ uint32_t div_by(uint32_t n, uint32_t m, uint32_t l) { return (__umulhi(n, m) + n) >> l; }

struct Divider {
  int64_t d = 1;
  uint32_t m = 1, l = 0;
  bool fits = true;  // d < 2^31

  Divider() = default;
  explicit Divider(int64_t div) : d(div), m(0), l(0), fits(div < (int64_t(1) << 31)) {
    if (!fits) return;
    while ((int64_t(1) << l) < div) ++l;
    m = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << l) - uint64_t(div))) / uint64_t(div) + 1);
  }
  __device__ __forceinline__ int64_t div(int64_t n) const {
    if (fits && (n >> 31) == 0) return int64_t(div_by(uint32_t(n), m, l));
    return n / d;
  }
};

// Host-chosen launch shape, passed by value with the params; uniform over the launch.
struct Shape {
  int lanes_log2 = 0;  // threads per row = 1 << lanes_log2
  int mode = kOne;
  int64_t dblocks = 1;       // blocks along the channel axis
  int64_t block_offset = 0;  // of this launch's first block (launches of at most 2^31 - 1)
  Divider by_dblocks, by_nheads, by_group;  // dblocks, nheads, heads_per_group
  bool state_vec = false;                           // 16-byte state accesses are aligned
  bool A_vec = false, B_vec = false, C_vec = false;  // whole-chunk reads of that operand
  bool A_bcast = false;  // A has stride 0 along the states (one value per channel)
};

// --------------------------------------------------------------------- element conversion

template <typename T>
struct Bits;  // T's bits in the low part of a 32-bit word, and back
template <>
struct Bits<float> {
  static __device__ __forceinline__ float to_f(uint32_t u) { return __uint_as_float(u); }
  static __device__ __forceinline__ uint32_t of(float v) { return __float_as_uint(v); }
};
template <>
struct Bits<__half> {
  static __device__ __forceinline__ float to_f(uint32_t u) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(u & 0xffffu)));
  }
  static __device__ __forceinline__ uint32_t of(float v) { return __half_as_ushort(__float2half_rn(v)); }
};
template <>
struct Bits<__nv_bfloat16> {
  static __device__ __forceinline__ float to_f(uint32_t u) { return __uint_as_float(u << 16); }
  static __device__ __forceinline__ uint32_t of(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};

template <typename T>
__device__ __forceinline__ uint32_t raw_at(const T* p, int64_t i) {
  if constexpr (sizeof(T) == 4) {
    return reinterpret_cast<const uint32_t*>(p)[i];
  } else {
    return reinterpret_cast<const unsigned short*>(p)[i];
  }
}

// ------------------------------------------------------------------------------- chunks

// V consecutive elements of T along the state axis, kept as raw 32-bit words (16-bit values
// two to a word) and converted at use: half the registers of fp32 copies for 16-bit data, and
// stores built from integer words stay single vector stores.
template <typename T, int V>
struct Chunk {
  static constexpr int kPerWord = 4 / int(sizeof(T));
  static constexpr int kWords = V / kPerWord;
  static_assert(kWords == 2 || kWords % 4 == 0, "a chunk is 8 bytes or whole 16-byte words");
  uint32_t u[kWords];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int w = 0; w < kWords; ++w) u[w] = 0;
  }
  __device__ __forceinline__ float get(int i) const {
    if constexpr (kPerWord == 1) {
      return Bits<T>::to_f(u[i]);
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      const uint32_t w = u[i / 2];
      return __uint_as_float((i & 1) ? (w & 0xffff0000u) : (w << 16));
    } else {
      return Bits<T>::to_f((i & 1) ? u[i / 2] >> 16 : u[i / 2]);
    }
  }
  __device__ __forceinline__ void set(int i, float v) {
    if constexpr (kPerWord == 1) {
      u[i] = Bits<T>::of(v);
    } else if (i & 1) {
      u[i / 2] = (u[i / 2] & 0xffffu) | (Bits<T>::of(v) << 16);
    } else {
      u[i / 2] = (u[i / 2] & 0xffff0000u) | Bits<T>::of(v);
    }
  }
  // Whole chunk from / to p (aligned to min(16, V * sizeof(T)) bytes): 8- or 16-byte accesses.
  __device__ __forceinline__ void load_vec(const T* p) {
    if constexpr (kWords == 2) {
      const uint2 w = *reinterpret_cast<const uint2*>(p);
      u[0] = w.x, u[1] = w.y;
    } else {
#pragma unroll
      for (int q = 0; q < kWords / 4; ++q) {
        const uint4 w = reinterpret_cast<const uint4*>(p)[q];
        u[4 * q] = w.x, u[4 * q + 1] = w.y, u[4 * q + 2] = w.z, u[4 * q + 3] = w.w;
      }
    }
  }
  __device__ __forceinline__ void store_vec(T* p) const {
    if constexpr (kWords == 2) {
      *reinterpret_cast<uint2*>(p) = make_uint2(u[0], u[1]);
    } else {
#pragma unroll
      for (int q = 0; q < kWords / 4; ++q) {
        reinterpret_cast<uint4*>(p)[q] = make_uint4(u[4 * q], u[4 * q + 1], u[4 * q + 2], u[4 * q + 3]);
      }
    }
  }
  // Elements i < valid from p at `stride` elements apart; the rest 0. (A chunk past the row is
  // all zeros: it then adds nothing to the row's sum.)
  __device__ __forceinline__ void load_elems(const T* p, int64_t stride, int valid) {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      uint32_t word = 0;
#pragma unroll
      for (int k = 0; k < kPerWord; ++k) {
        const int i = w * kPerWord + k;
        if (i < valid) word |= raw_at(p, i * stride) << (16 * k);
      }
      u[w] = word;
    }
  }
  __device__ __forceinline__ void store_elems(T* p, int64_t stride, int valid) const {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if (i < valid) {
        const uint32_t w = u[i / kPerWord];
        if constexpr (kPerWord == 1) {
          reinterpret_cast<uint32_t*>(p)[i * stride] = w;
        } else {
          reinterpret_cast<unsigned short*>(p)[i * stride] = static_cast<unsigned short>((i & 1) ? w >> 16 : w);
        }
      }
    }
  }
};

// The generic kernel's chunks of run-time dtype: plain fp32 values.
template <int V>
struct Chunk<AnyDtype, V> {
  float v[V];
  __device__ __forceinline__ float get(int i) const { return v[i]; }
};

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

// The slot row b reads and writes: b itself, or state_batch_indices[b] (int64 or int32 indices,
// `stride` apart). Every decode kernel reads it here, in its own offset type I.
template <typename I>
__device__ __forceinline__ int64_t slot_of(const void* idx, bool idx_64, I stride, I b) {
  if (idx == nullptr) return b;
  const I o = b * stride;
  return idx_64 ? static_cast<const int64_t*>(idx)[o] : int64_t(static_cast<const int32_t*>(idx)[o]);
}

__device__ __forceinline__ float softplus(float v) { return v <= 20.0f ? log1pf(expf(v)) : v; }

// Butterfly sum over the row's lanes (all 32 lanes of the warp call it; `lanes` is uniform).
__device__ __forceinline__ float row_sum(float v, int lanes) {
#pragma unroll
  for (int off = 1; off < kMaxLanes; off <<= 1) {
    if (off < lanes) v += __shfl_xor_sync(kFullMask, v, off);
  }
  return v;
}

// One chunk of a row's step: state = exp(a dt) state + B (dt x), in place; returns the chunk's
// part of the output, sum C state. A chunk that is not there was read as zeros (state, A, B
// and C), so it adds exactly 0. Both kinds of kernel use it, in this order of operations.
template <typename S, typename TA, typename T, int V>
__device__ __forceinline__ float chunk_step(Chunk<S, V>& s, const Chunk<TA, V>& a, const Chunk<T, V>& B,
                                            const Chunk<T, V>& C, float dtv, float dtx) {
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const float v = __expf(a.get(i) * dtv) * s.get(i) + B.get(i) * dtx;
    acc += C.get(i) * v;
    s.set(i, v);
  }
  return acc;
}

// ------------------------------------------------------------------------------- kernel

// The operand accesses of the two kinds of kernel. Typed (kFast): the launcher has checked
// that every chunk is whole and every chunked operand vector-readable (A may instead be one
// value per channel, stride 0 along the states: Mamba-2's expanded A), so a chunk is one or
// two vector accesses or nothing. Generic: element accesses with the operand's strides wherever
// the vector test fails, dtypes read at run time.
template <bool kFast, typename T, int V>
__device__ __forceinline__ void load_op(Chunk<T, V>& c, const StepOperand& o, int64_t off, int valid, bool vec) {
  if constexpr (kFast) {
    if (valid > 0) {
      c.load_vec(static_cast<const T*>(o.ptr) + off);
    } else {
      c.zero();
    }
  } else {
    load_chunk(c, o, off, valid, vec);
  }
}

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

// Blocks of kThreads per SM the register budget allows: 8 (64 registers, which the typed
// kernels need without spilling), 6 (80) for the generic kernel and for fp32 activations with a
// 16-bit state (8 fp32 values per B/C chunk).
template <typename S, typename T>
constexpr int min_blocks() {
  return std::is_same<T, AnyDtype>::value || sizeof(T) > sizeof(S) ? 6 : 8;
}

// S: the state's dtype. T: x, dt, z, B, C's (A fp32; D, dt_bias fp32 or T), or AnyDtype.
template <typename S, typename T>
__global__ void __launch_bounds__(kThreads, min_blocks<S, T>())
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

// --------------------------------------------------------------------------- lean kernel

// The typed kernels' hot case. A warp owns `rows` consecutive rows (channels) of one (batch
// row, head) and does them in `passes` passes of 32 / lanes rows (`lanes` threads per row, one
// 16-byte chunk each: a pass reads 512 contiguous bytes of a contiguous state), so
// rows = passes * 32 / lanes.
// - Lane j does row j's scalar work (x, dt, z, D, dt_bias, the softplus, the gate) and the
//   passes take it by shuffles. With passes = lanes (32 rows a warp) that work is done once
//   per row, where the general kernel repeats it on every lane of a row: at batch 256 the
//   general kernel was issue-bound on it (bench/RESULTS.md).
// - Large launches take passes = lanes in groups of kP = 2: a group's state and A chunks are
//   loaded before its first use and its two passes interleave. (Groups of 4 hold twice the
//   registers; the lost occupancy cost more than the overlap gained. Measured in RESULTS.md.)
// - Small launches take one pass a warp (kP = 1, rows = 32 / lanes): `lanes` times the warps,
//   each with 1 / lanes of the chain of dependent instructions, which is what they wait on.
// - One slot per block (the grid's z axis is the batch row, y the head): padding and bad
//   slot indices are block-uniform. 32-bit offsets: the launcher checks that every operand's
//   largest element offset, and the state's, is below 2^31.
struct Lean {
  int lanes_log2 = 0;  // threads per row in a pass (chunks per row, rounded up to a power of 2)
  int passes = 1;      // per warp: 1, or lanes (a multiple of kP = 2)
  Divider by_group;    // heads_per_group
  bool A_bcast = false;
};

// Everything the lean kernel reads, packed into 200-odd bytes: the launch shape and flags
// first (the prologue's first reads), then pointers, then 32-bit strides (lean_fits has checked
// every offset against 2^31). The step is too short to hide the kernel's first reads of its
// parameters, and StateUpdateParams with Lean spreads them over 520 bytes of constant memory;
// these fit a few cache lines, read in the order the kernel needs them.
// z, D and dt_bias are never null here: an absent one points at an operand that is there (x,
// or A as fp32) with that operand's strides and its has_ flag cleared, so that the kernel
// issues every load unconditionally, before any of them is used.
struct LeanParams {
  int8_t lanes_log2;
  bool slot_idx_64, dt_softplus, A_bcast, D_f32, bias_f32, has_z, has_D, has_bias;
  int32_t passes;
  int32_t dim, dstate;
  uint32_t group_m, group_l;  // by_group's multiplier and shift (div_by; lean_fits checks by_group.fits)
  int64_t nslots;
  const void* slot_idx;
  const void* dt;
  const void* dt_bias;
  const void* x;
  const void* z;
  const void* D;
  void* state;
  const void* A;
  const void* B;
  const void* C;
  void* out;
  int32_t slot_idx_s;
  int32_t dt_s0, dt_s1, dt_s2;
  int32_t bias_s0, bias_s1;
  int32_t x_s0, x_s1, x_s2;
  int32_t z_s0, z_s1, z_s2;
  int32_t D_s0, D_s1;
  int32_t state_s0, state_s1, state_s2;
  int32_t A_s0, A_s1;
  int32_t B_s0, B_s1;
  int32_t C_s0, C_s1;
  int32_t out_s0, out_s1, out_s2;
};

// The raw bits of a per-channel weight (D, dt_bias) of the lean kernel, fp32 or T (the flag is
// warp-uniform), and their value.
template <typename T>
__device__ __forceinline__ uint32_t lean_weight_bits(const void* ptr, bool f32, int32_t i) {
  if constexpr (std::is_same<T, float>::value) {
    return raw_at(static_cast<const float*>(ptr), i);
  } else {
    return f32 ? raw_at(static_cast<const float*>(ptr), i) : raw_at(static_cast<const T*>(ptr), i);
  }
}
template <typename T>
__device__ __forceinline__ float lean_weight_value(uint32_t bits, bool f32) {
  if constexpr (std::is_same<T, float>::value) {
    return Bits<float>::to_f(bits);
  } else {
    return f32 ? Bits<float>::to_f(bits) : Bits<T>::to_f(bits);
  }
}

// Blocks of kThreads per SM, as many as the registers of kP interleaved passes allow without
// spilling: a pass holds a chunk of state and one of A (8 fp32 values for 16-bit states), and
// fp32 activations double B and C.
template <typename S, typename T, int kP>
constexpr int lean_min_blocks() {
  constexpr bool wide = sizeof(S) == 2 || sizeof(T) == 4;
  if (kP == 4) return wide ? 4 : 5;
  return kP == 1 ? (sizeof(T) > sizeof(S) ? 10 : 12) : (wide ? 6 : 8);
}

template <typename S, typename T, int kP>
__global__ void __launch_bounds__(kThreads, lean_min_blocks<S, T, kP>())
    state_update_lean(const LeanParams p) {
  constexpr int V = 16 / int(sizeof(S));
  using I = int32_t;
  const int lane = int(threadIdx.x) & 31;
  const int lg = p.lanes_log2, lanes = 1 << lg;
  const int rows_log2 = 5 - lg;  // rows per pass = 32 / lanes
  const int passes = kP == 1 ? 1 : p.passes;
  const I rows = I(passes) << rows_log2;
  const I d0 = (I(blockIdx.x) * I(blockDim.x >> 5) + I(threadIdx.x >> 5)) * rows;
  const I h = I(blockIdx.y), b = I(blockIdx.z);

  const int64_t slot = slot_of<I>(p.slot_idx, p.slot_idx_64, p.slot_idx_s, b);
  const I dj = d0 + lane;  // the row whose scalars this lane computes
  const bool own_ok = lane < rows && dj < p.dim;
  const I dcj = own_ok ? dj : 0;
  if (slot < 0 || slot >= p.nslots) {  // uniform: a padded row (0) or an index past the cache (NaN)
    const float kNaN = __int_as_float(0x7fc00000);
    if (own_ok) {
      static_cast<T*>(p.out)[b * p.out_s0 + h * p.out_s1 + dcj * p.out_s2] = from_float<T>(slot < 0 ? 0.0f : kNaN);
    }
    return;
  }
  const int c = lane & (lanes - 1);  // this thread's chunk of a row in every pass
  const I nc = I(c) * V;
  const bool chunk_ok = nc < p.dstate;  // whole chunks: dstate % V == 0
  const I ncc = chunk_ok ? nc : 0;
  S* const st = static_cast<S*>(p.state) + I(slot) * p.state_s0 + h * p.state_s1 + nc;
  const float* const A = static_cast<const float*>(p.A) + h * p.A_s0;
  const I row0 = d0 + I(lane >> lg);  // this thread's row in pass 0; pass q adds q << rows_log2

  Chunk<S, V> sc[kP];
  Chunk<float, V> ac[kP];
  auto load_group = [&](int q0) {
#pragma unroll
    for (int i = 0; i < kP; ++i) {
      const I d = row0 + (I(q0 + i) << rows_log2);
      if (chunk_ok && d < p.dim) {
        sc[i].load_vec(st + d * p.state_s2);
        if (!p.A_bcast) ac[i].load_vec(A + d * p.A_s1 + nc);
      } else {
        sc[i].zero();
        if (!p.A_bcast) ac[i].zero();
      }
    }
  };
  // Every load of the step is issued before any is used, so the warp waits on memory once:
  // the row's scalars as raw bits (dt and dt_bias first: they start the longest chain, the
  // softplus then the shuffles), then the state and A chunks, B and C. The addresses are all
  // valid (a lane without a row reads row 0; absent operands point at present ones), so no
  // load sits behind a branch that the compiler would close by converting what it loaded.
  const uint32_t dt_w = raw_at(static_cast<const T*>(p.dt), b * p.dt_s0 + h * p.dt_s1 + dcj * p.dt_s2);
  const uint32_t bias_w = lean_weight_bits<T>(p.dt_bias, p.bias_f32, h * p.bias_s0 + dcj * p.bias_s1);
  const uint32_t x_w = raw_at(static_cast<const T*>(p.x), b * p.x_s0 + h * p.x_s1 + dcj * p.x_s2);
  const uint32_t z_w = raw_at(static_cast<const T*>(p.z), b * p.z_s0 + h * p.z_s1 + dcj * p.z_s2);
  const uint32_t D_w = lean_weight_bits<T>(p.D, p.D_f32, h * p.D_s0 + dcj * p.D_s1);
  const float a1 = A[dcj * p.A_s1];  // the row's A when it is one value per channel (A_bcast)
  load_group(0);
  Chunk<T, V> Bc, Cc;  // the same for every row of the block
  const I grp = I(div_by(uint32_t(h), p.group_m, p.group_l));
  if (chunk_ok) {
    Bc.load_vec(static_cast<const T*>(p.B) + b * p.B_s0 + grp * p.B_s1 + ncc);
    Cc.load_vec(static_cast<const T*>(p.C) + b * p.C_s0 + grp * p.C_s1 + ncc);
  } else {
    Bc.zero();
    Cc.zero();
  }
  float dtv = Bits<T>::to_f(dt_w) + (p.has_bias ? lean_weight_value<T>(bias_w, p.bias_f32) : 0.0f);
  if (p.dt_softplus) dtv = softplus(dtv);
  const float x = Bits<T>::to_f(x_w);
  const float dtx = dtv * x;
  const float Dx = p.has_D ? lean_weight_value<T>(D_w, p.D_f32) * x : 0.0f;
  const float gate = p.has_z ? silu(Bits<T>::to_f(z_w)) : 1.0f;

  for (int q0 = 0;;) {
#pragma unroll
    for (int i = 0; i < kP; ++i) {
      const int r = ((q0 + i) << rows_log2) + (lane >> lg);  // the pass's row, as a lane
      const float dtv_r = __shfl_sync(kFullMask, dtv, r), dtx_r = __shfl_sync(kFullMask, dtx, r);
      const float Dx_r = __shfl_sync(kFullMask, Dx, r), gate_r = __shfl_sync(kFullMask, gate, r);
      if (p.A_bcast) {
        const uint32_t w = __float_as_uint(__shfl_sync(kFullMask, a1, r));
#pragma unroll
        for (int k = 0; k < Chunk<float, V>::kWords; ++k) ac[i].u[k] = w;
      }
      const float acc = row_sum(chunk_step(sc[i], ac[i], Bc, Cc, dtv_r, dtx_r), lanes);
      const I d = d0 + r;
      if (d < p.dim) {
        if (c == 0) {
          float o = p.has_D ? acc + Dx_r : acc;
          if (p.has_z) o *= gate_r;
          static_cast<T*>(p.out)[b * p.out_s0 + h * p.out_s1 + d * p.out_s2] = from_float<T>(o);
        }
        if (chunk_ok) sc[i].store_vec(st + d * p.state_s2);
      }
    }
    q0 += kP;
    if (q0 >= passes) break;
    load_group(q0);
  }
}

// ---------------------------------------------------------------------------- row kernel

// The typed kernels' small and mid-sized launches (up to UpdatePolicy::kRowMaxRowsPerSm rows a SM) over
// dense operands: `lanes` threads per row, one chunk each, one pass, as the lean kernel with
// kP = 1 but with a parameter block of 144 bytes instead of 230 and no load chosen by a flag.
// A decode step this short waits on its launch and its first reads; of what set the lean kernel
// apart from a minimal one for one layout, those two measured largest (bench/RESULTS.md,
// eighteenth pass). At batch 1 this kernel takes 1.80 us a step in a CUDA graph, the lean one
// 1.93 and the minimal one 1.44.
// Dense: the channel axis of x, dt, z, out, D and dt_bias has unit stride and, with heads, heads
// are dim apart; the state and A are (.., head, dim, dstate) contiguous after their first axis;
// B and C have unit state stride and groups dstate apart. Only the batch (slot) strides vary.
// D and dt_bias are fp32: an absent one points at A, with its has_ flag cleared.
struct RowParams {
  void* state;
  const void* A;
  const void* B;
  const void* C;
  const void* dt;
  const void* x;
  const void* z;  // x when absent (has_z cleared)
  const float* dt_bias;
  const float* D;
  void* out;
  const void* slot_idx;  // null: row b uses slot b
  int32_t dim, dstate, nslots;
  int32_t state_s0, B_s0, C_s0, dt_s0, x_s0, z_s0, out_s0, slot_idx_s;
  uint32_t group_m, group_l;  // heads_per_group as div_by's multiplier and shift
  uint32_t flags;             // lanes_log2 in bits 0-2, then the kRow* bits
};

constexpr uint32_t kRowSlot64 = 1u << 3, kRowSoftplus = 1u << 4, kRowHasZ = 1u << 5, kRowHasD = 1u << 6,
                   kRowHasBias = 1u << 7;

// Mamba-1's step (kMamba1, launch_row: row_is_mamba1) fixes at compile time what its every call
// has: one head and group, no slot index, dstate 16 (so 16 / V lanes, every chunk whole), and
// softplus with z, D and dt_bias all given. Each piece alone measured 0.00-0.04 us a step at
// batch 1; together, in a CUDA graph, 1.46 us against the run-time kernel's 1.66-1.79
// (bench/RESULTS.md, nineteenth pass). Same arithmetic in the same order: the same bits.
template <typename S>
constexpr int kMamba1LanesLog2 = sizeof(S) == 4 ? 2 : 1;  // 16 states in chunks of 16 / sizeof(S)

template <typename S, typename T, bool kMamba1>
__global__ void __launch_bounds__(kThreads) state_update_row(const RowParams p) {
  constexpr int V = 16 / int(sizeof(S));
  using I = int32_t;
  const int lg = kMamba1 ? kMamba1LanesLog2<S> : int(p.flags & 7u), lane = int(threadIdx.x) & 31;
  const I t = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x);
  const I row = t >> lg;           // this thread's channel
  const I w0 = (t & ~31) >> lg;    // the warp's first channel
  const I h = kMamba1 ? 0 : I(blockIdx.y), b = I(blockIdx.z);
  const I hd = kMamba1 ? 0 : h * p.dim;  // the head's first channel in (head, dim) operands
  const I dstate = kMamba1 ? 16 : p.dstate;
  const bool row_ok = row < p.dim;
  // lane j computes channel w0 + j's scalars (a lane past the channels: the last one's, unused)
  const I rj = min(w0 + I(lane), p.dim - 1);
  const int64_t slot = kMamba1 ? int64_t(b) : slot_of<I>(p.slot_idx, p.flags & kRowSlot64, p.slot_idx_s, b);
  const int c = lane & ((1 << lg) - 1);
  // uniform: a padded row (0) or an index past the cache (NaN)
  if (!kMamba1 && (slot < 0 || slot >= p.nslots)) {
    if (row_ok && c == 0) {
      const float v = slot < 0 ? 0.0f : __int_as_float(0x7fc00000);
      static_cast<T*>(p.out)[b * p.out_s0 + hd + row] = from_float<T>(v);
    }
    return;
  }
  const I nc = I(c) * V;
  const bool chunk_ok = kMamba1 || nc < dstate;  // whole chunks: dstate % V == 0
  const I ncc = chunk_ok ? nc : 0;
  const I rc = row_ok ? row : 0;
  // every load unconditional (valid addresses), zeros where there is no chunk
  S* const st = static_cast<S*>(p.state) + I(slot) * p.state_s0 + (hd + rc) * dstate + ncc;
  Chunk<S, V> sc;
  Chunk<float, V> ac;
  Chunk<T, V> Bc, Cc;
  sc.load_vec(st);
  ac.load_vec(static_cast<const float*>(p.A) + (hd + rc) * dstate + ncc);
  const I grp = kMamba1 ? 0 : I(div_by(uint32_t(h), p.group_m, p.group_l));
  Bc.load_vec(static_cast<const T*>(p.B) + b * p.B_s0 + grp * dstate + ncc);
  Cc.load_vec(static_cast<const T*>(p.C) + b * p.C_s0 + grp * dstate + ncc);
  const uint32_t dt_w = raw_at(static_cast<const T*>(p.dt), b * p.dt_s0 + hd + rj);
  const float bias = p.dt_bias[hd + rj];
  const uint32_t x_w = raw_at(static_cast<const T*>(p.x), b * p.x_s0 + hd + rj);
  const uint32_t z_w = raw_at(static_cast<const T*>(p.z), b * p.z_s0 + hd + rj);
  const float Dw = p.D[hd + rj];
  if (!chunk_ok) {
    sc.zero();
    ac.zero();
    Bc.zero();
    Cc.zero();
  }
  // the lean kernel's arithmetic, in its order (the two give the same bits)
  float dtv = Bits<T>::to_f(dt_w) + ((kMamba1 || (p.flags & kRowHasBias)) ? bias : 0.0f);
  if (kMamba1 || (p.flags & kRowSoftplus)) dtv = softplus(dtv);
  const float x = Bits<T>::to_f(x_w);
  const float dtx = dtv * x;
  const bool has_D = kMamba1 || (p.flags & kRowHasD), has_z = kMamba1 || (p.flags & kRowHasZ);
  const float Dx = has_D ? Dw * x : 0.0f;
  const float gate = has_z ? silu(Bits<T>::to_f(z_w)) : 1.0f;
  const int r = lane >> lg;  // this thread's channel, as a lane
  const float dtv_r = __shfl_sync(kFullMask, dtv, r), dtx_r = __shfl_sync(kFullMask, dtx, r);
  const float Dx_r = __shfl_sync(kFullMask, Dx, r), gate_r = __shfl_sync(kFullMask, gate, r);
  const float acc = row_sum(chunk_step(sc, ac, Bc, Cc, dtv_r, dtx_r), 1 << lg);
  if (row_ok) {
    if (c == 0) {
      float o = has_D ? acc + Dx_r : acc;
      if (has_z) o *= gate_r;
      static_cast<T*>(p.out)[b * p.out_s0 + hd + row] = from_float<T>(o);
    }
    if (chunk_ok) sc.store_vec(st);
  }
}

// ------------------------------------------------------------------------------- launch

// Chunks of `chunk` elements of o along axis 2, at element offsets that are multiples of
// `chunk` along it, may be read whole: unit stride and min(16, chunk * size)-byte alignment.
bool vec_ok(const StepOperand& o, int chunk) {
  const int size = dtype_size(o.dtype);
  const int per = std::min(chunk, 16 / size);
  const uintptr_t align = uintptr_t(per) * uintptr_t(size);
  return o.s2 == 1 && reinterpret_cast<uintptr_t>(o.ptr) % align == 0 && o.s0 % per == 0 && o.s1 % per == 0;
}

// The launch shape for chunks of V states; sets *fast when the typed kernels' access rules
// hold (whole chunks, vector-readable state, A, B and C, or A broadcast over the states).
Shape shape_for(const StateUpdateParams& p, int V, bool* fast) {
  const int64_t chunks = (p.dstate + V - 1) / V;  // per row, <= 64 (dstate <= 256)
  Shape sh;
  while ((int64_t(1) << sh.lanes_log2) < std::min<int64_t>(chunks, kMaxLanes)) ++sh.lanes_log2;
  const int64_t lanes = int64_t(1) << sh.lanes_log2;
  if (chunks > kMaxLanes) {
    sh.mode = kWide;  // fp32 and dstate > 128: two chunks per lane
  } else if (p.batch >= 2 && (p.batch / 2) * p.nheads * p.dim * lanes >= kPairMinThreads) {
    sh.mode = kPair;
  }
  sh.state_vec = p.state_s3 == 1 && reinterpret_cast<uintptr_t>(p.state) % 16 == 0 && p.state_s0 % V == 0 &&
                 p.state_s1 % V == 0 && p.state_s2 % V == 0;
  sh.A_vec = vec_ok(p.A, V);
  sh.A_bcast = p.A.s2 == 0;
  sh.B_vec = vec_ok(p.B, V);
  sh.C_vec = vec_ok(p.C, V);
  *fast = p.dstate % V == 0 && sh.state_vec && (sh.A_vec || sh.A_bcast) && sh.B_vec && sh.C_vec;
  return sh;
}

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

// The largest element offset of an operand of sizes (n0, n1, n2) and its strides (none are
// negative in torch), saturated far above 2^31.
constexpr int64_t kOffsetCap = int64_t(1) << 40;

int64_t offset_term(int64_t n, int64_t stride) {
  return n > 1 ? std::min(n - 1, kOffsetCap) * std::min(stride, kOffsetCap) : 0;
}

int64_t max_offset(int64_t n0, int64_t s0, int64_t n1, int64_t s1, int64_t n2, int64_t s2, int64_t n3 = 1,
                   int64_t s3 = 0) {
  return std::min(kOffsetCap, offset_term(n0, s0) + offset_term(n1, s1) + offset_term(n2, s2) + offset_term(n3, s3));
}

// Whether the lean kernel covers a typed launch of shape sh: one chunk per lane, the grid's y
// and z axes wide enough for the heads and the batch, and every offset below 2^31.
bool lean_fits(const StateUpdateParams& p, const Shape& sh) {
  constexpr int64_t kMax32 = (int64_t(1) << 31) - 1;
  constexpr int64_t kMaxGridYZ = 65535;
  if (sh.mode == kWide || p.nheads > kMaxGridYZ || p.batch > kMaxGridYZ || !sh.by_group.fits) return false;
  const int64_t ngroups = p.nheads / p.heads_per_group;
  const int64_t offs[] = {
      max_offset(p.nslots, p.state_s0, p.nheads, p.state_s1, p.dim, p.state_s2, p.dstate, p.state_s3),
      max_offset(p.batch, p.x.s0, p.nheads, p.x.s1, p.dim, p.x.s2),
      max_offset(p.batch, p.dt.s0, p.nheads, p.dt.s1, p.dim, p.dt.s2),
      p.z.ptr != nullptr ? max_offset(p.batch, p.z.s0, p.nheads, p.z.s1, p.dim, p.z.s2) : 0,
      max_offset(p.batch, p.out_s0, p.nheads, p.out_s1, p.dim, p.out_s2),
      max_offset(p.nheads, p.A.s0, p.dim, p.A.s1, p.dstate, p.A.s2),
      max_offset(p.batch, p.B.s0, ngroups, p.B.s1, p.dstate, p.B.s2),
      max_offset(p.batch, p.C.s0, ngroups, p.C.s1, p.dstate, p.C.s2),
      p.D.ptr != nullptr ? max_offset(p.nheads, p.D.s0, p.dim, p.D.s1, 1, 0) : 0,
      p.dt_bias.ptr != nullptr ? max_offset(p.nheads, p.dt_bias.s0, p.dim, p.dt_bias.s1, 1, 0) : 0,
      p.slot_idx != nullptr ? max_offset(p.batch, p.slot_idx_s, 1, 0, 1, 0) : 0,
  };
  for (int64_t o : offs) {
    if (o > kMax32) return false;
  }
  return true;
}

// The lean kernel's parameters from the step's (lean_fits has checked that each offset, and so
// each stride that is ever multiplied by a non-zero index, fits 32 bits). An absent z reads x,
// an absent D or dt_bias reads A (fp32, and of at least (nheads, dim) elements with A's
// strides): loads of memory that is there, whose values the kernel then ignores.
LeanParams lean_params(const StateUpdateParams& p, const Lean& ln) {
  auto i32 = [](int64_t v) { return int32_t(v); };
  LeanParams q{};
  q.lanes_log2 = int8_t(ln.lanes_log2);
  q.slot_idx_64 = p.slot_idx_64;
  q.dt_softplus = p.dt_softplus;
  q.A_bcast = ln.A_bcast;
  q.has_z = p.z.ptr != nullptr;
  q.has_D = p.D.ptr != nullptr;
  q.has_bias = p.dt_bias.ptr != nullptr;
  q.passes = ln.passes;
  q.dim = i32(p.dim);
  q.dstate = i32(p.dstate);
  q.group_m = ln.by_group.m;
  q.group_l = ln.by_group.l;
  q.nslots = p.nslots;
  q.slot_idx = p.slot_idx;
  q.slot_idx_s = i32(p.slot_idx_s);
  q.dt = p.dt.ptr;
  q.dt_s0 = i32(p.dt.s0), q.dt_s1 = i32(p.dt.s1), q.dt_s2 = i32(p.dt.s2);
  q.x = p.x.ptr;
  q.x_s0 = i32(p.x.s0), q.x_s1 = i32(p.x.s1), q.x_s2 = i32(p.x.s2);
  const StepOperand& z = q.has_z ? p.z : p.x;
  q.z = z.ptr;
  q.z_s0 = i32(z.s0), q.z_s1 = i32(z.s1), q.z_s2 = i32(z.s2);
  // a per-channel weight, or A's first state of the channel in its place
  auto weight = [&](const StepOperand& w, const void** ptr, int32_t* s0, int32_t* s1, bool* f32) {
    const bool has = w.ptr != nullptr;
    *ptr = has ? w.ptr : p.A.ptr;
    *s0 = i32(has ? w.s0 : p.A.s0);
    *s1 = i32(has ? w.s1 : p.A.s1);
    *f32 = has ? w.dtype == DType::kFloat32 : true;
  };
  weight(p.D, &q.D, &q.D_s0, &q.D_s1, &q.D_f32);
  weight(p.dt_bias, &q.dt_bias, &q.bias_s0, &q.bias_s1, &q.bias_f32);
  q.state = p.state;
  q.state_s0 = i32(p.state_s0), q.state_s1 = i32(p.state_s1), q.state_s2 = i32(p.state_s2);
  q.A = p.A.ptr;
  q.A_s0 = i32(p.A.s0), q.A_s1 = i32(p.A.s1);
  q.B = p.B.ptr;
  q.B_s0 = i32(p.B.s0), q.B_s1 = i32(p.B.s1);
  q.C = p.C.ptr;
  q.C_s0 = i32(p.C.s0), q.C_s1 = i32(p.C.s1);
  q.out = p.out;
  q.out_s0 = i32(p.out_s0), q.out_s1 = i32(p.out_s1), q.out_s2 = i32(p.out_s2);
  return q;
}

// Whether a lean-fitting typed launch takes the row kernel: A per state (not broadcast), D
// and dt_bias fp32 or absent, the dense layout RowParams describes, and at most
// UpdatePolicy::kRowMaxRowsPerSm rows per SM of the running device.
bool row_fits(const StateUpdateParams& p, const Shape& sh) {
  if (sh.A_bcast || p.batch * p.nheads * p.dim > UpdatePolicy::kRowMaxRowsPerSm * sm_count()) return false;
  const bool heads = p.nheads > 1;
  const int64_t ngroups = p.nheads / p.heads_per_group;
  // (batch, head, dim) operands: unit channel stride, heads dim apart
  auto act = [&](const StepOperand& o) { return o.s2 == 1 && (!heads || o.s1 == p.dim); };
  // (head, dim) weights, fp32 or absent
  auto weight = [&](const StepOperand& w) {
    return w.ptr == nullptr || (w.dtype == DType::kFloat32 && w.s1 == 1 && (!heads || w.s0 == p.dim));
  };
  auto bc = [&](const StepOperand& o) { return o.s2 == 1 && (ngroups == 1 || o.s1 == p.dstate); };
  const bool state = p.state_s3 == 1 && p.state_s2 == p.dstate && (!heads || p.state_s1 == p.dim * p.dstate);
  const bool A = p.A.s2 == 1 && p.A.s1 == p.dstate && (!heads || p.A.s0 == p.dim * p.dstate);
  const bool out = p.out_s2 == 1 && (!heads || p.out_s1 == p.dim);
  return state && A && out && act(p.x) && act(p.dt) && (p.z.ptr == nullptr || act(p.z)) && weight(p.D) &&
         weight(p.dt_bias) && bc(p.B) && bc(p.C);
}

// The row kernel's parameters (lean_fits has checked every offset against 2^31, so the
// batch strides and nslots fit 32 bits).
RowParams row_params(const StateUpdateParams& p, const Shape& sh) {
  auto i32 = [](int64_t v) { return int32_t(v); };
  RowParams q{};
  const bool has_z = p.z.ptr != nullptr, has_D = p.D.ptr != nullptr, has_bias = p.dt_bias.ptr != nullptr;
  q.state = p.state;
  q.A = p.A.ptr;
  q.B = p.B.ptr;
  q.C = p.C.ptr;
  q.dt = p.dt.ptr;
  q.x = p.x.ptr;
  q.z = has_z ? p.z.ptr : p.x.ptr;
  q.dt_bias = static_cast<const float*>(has_bias ? p.dt_bias.ptr : p.A.ptr);
  q.D = static_cast<const float*>(has_D ? p.D.ptr : p.A.ptr);
  q.out = p.out;
  q.slot_idx = p.slot_idx;
  q.dim = i32(p.dim);
  q.dstate = i32(p.dstate);
  q.nslots = i32(p.nslots);
  q.state_s0 = i32(p.state_s0);
  q.B_s0 = i32(p.B.s0);
  q.C_s0 = i32(p.C.s0);
  q.dt_s0 = i32(p.dt.s0);
  q.x_s0 = i32(p.x.s0);
  q.z_s0 = i32(has_z ? p.z.s0 : p.x.s0);
  q.out_s0 = i32(p.out_s0);
  q.slot_idx_s = i32(p.slot_idx_s);
  q.group_m = sh.by_group.m;
  q.group_l = sh.by_group.l;
  q.flags = uint32_t(sh.lanes_log2) | (p.slot_idx_64 ? kRowSlot64 : 0u) | (p.dt_softplus ? kRowSoftplus : 0u) |
            (has_z ? kRowHasZ : 0u) | (has_D ? kRowHasD : 0u) | (has_bias ? kRowHasBias : 0u);
  return q;
}

// Whether a row launch is Mamba-1's step, which state_update_row<S, T, true> fixes at compile time.
template <typename S>
bool row_is_mamba1(const StateUpdateParams& p, const Shape& sh) {
  return p.nheads == 1 && p.slot_idx == nullptr && p.dstate == 16 && sh.lanes_log2 == kMamba1LanesLog2<S> &&
         p.dt_softplus && p.z.ptr != nullptr && p.D.ptr != nullptr && p.dt_bias.ptr != nullptr;
}

template <typename S, typename T>
cudaError_t launch_row(const StateUpdateParams& p, const Shape& sh, cudaStream_t stream) {
  const int64_t threads_needed = p.dim << sh.lanes_log2;  // < 2^31: the state's offsets are
  const int threads = int(std::min<int64_t>(kThreads, (threads_needed + 31) / 32 * 32));
  const int64_t blocks = (threads_needed + threads - 1) / threads;
  const dim3 grid(unsigned(blocks), unsigned(p.nheads), unsigned(p.batch));
  const RowParams q = row_params(p, sh);
  if (row_is_mamba1<S>(p, sh))
    state_update_row<S, T, true><<<grid, threads, 0, stream>>>(q);
  else
    state_update_row<S, T, false><<<grid, threads, 0, stream>>>(q);
  return cudaGetLastError();
}

template <typename S, typename T, int kP>
cudaError_t launch_lean_as(const StateUpdateParams& p, const Lean& ln, cudaStream_t stream) {
  const int64_t warp_rows = int64_t(ln.passes) << (5 - ln.lanes_log2);
  const int warps = int(std::min<int64_t>(kThreads / 32, (p.dim + warp_rows - 1) / warp_rows));
  const int64_t blocks = (p.dim + warp_rows * warps - 1) / (warp_rows * warps);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const dim3 grid(unsigned(blocks), unsigned(p.nheads), unsigned(p.batch));
  state_update_lean<S, T, kP><<<grid, 32 * warps, 0, stream>>>(lean_params(p, ln));
  return cudaGetLastError();
}

// Passes per warp: all of a row's lanes (the fewest instructions per row) once the launch has
// UpdatePolicy::kLeanFullRowsPerSm rows per SM, else one (more warps, each with a shorter chain
// of dependent instructions: what a small launch waits on). All passes go in groups of four up
// to kLeanQuadMaxRowsPerSm rows per SM when they can (fp32 states, four or more passes), else of
// two. (Per SM of the running device: the thresholds scale with the GPU.)
template <typename S, typename T>
cudaError_t launch_lean(const StateUpdateParams& p, const Shape& sh, cudaStream_t stream) {
  Lean ln;
  ln.lanes_log2 = sh.lanes_log2;
  ln.by_group = sh.by_group;
  ln.A_bcast = sh.A_bcast;
  const int lanes = 1 << sh.lanes_log2;
  const int64_t rows = p.batch * p.nheads * p.dim, sms = sm_count();
  ln.passes = lanes > 1 && rows >= UpdatePolicy::kLeanFullRowsPerSm * sms ? lanes : 1;
  if (ln.passes == 1) return launch_lean_as<S, T, 1>(p, ln, stream);
  if constexpr (sizeof(S) == 4) {
    if (ln.passes % 4 == 0 && rows < UpdatePolicy::kLeanQuadMaxRowsPerSm * sms) {
      return launch_lean_as<S, T, 4>(p, ln, stream);
    }
  }
  return launch_lean_as<S, T, 2>(p, ln, stream);
}

// The typed kernel for shape sh: the lean one where it fits, else the general one.
template <typename S, typename T>
cudaError_t launch_typed(const StateUpdateParams& p, Shape sh, cudaStream_t stream) {
  sh.by_group = Divider(p.heads_per_group);
  if (lean_fits(p, sh)) return row_fits(p, sh) ? launch_row<S, T>(p, sh, stream) : launch_lean<S, T>(p, sh, stream);
  return launch_kernel<S, T>(p, sh, stream);
}

bool is(const StepOperand& o, DType t) { return o.dtype == t; }
bool absent_or(const StepOperand& o, DType t) { return o.ptr == nullptr || o.dtype == t; }
bool absent_or_weight(const StepOperand& o, DType t) {
  return o.ptr == nullptr || o.dtype == t || o.dtype == DType::kFloat32;
}

// The typed kernel for activations of x's dtype when the operands fit it, else the generic one.
template <typename S>
cudaError_t launch_for_state(const StateUpdateParams& p, cudaStream_t stream) {
  bool fast = false;
  const Shape sh = shape_for(p, 16 / int(sizeof(S)), &fast);
  const DType t = p.x.dtype;
  const bool typed = fast && is(p.dt, t) && is(p.B, t) && is(p.C, t) && absent_or(p.z, t) &&
                     is(p.A, DType::kFloat32) && absent_or_weight(p.D, t) && absent_or_weight(p.dt_bias, t);
  if (!typed) return launch_kernel<S, AnyDtype>(p, sh, stream);
  switch (t) {
    case DType::kFloat32: return launch_typed<S, float>(p, sh, stream);
    case DType::kFloat16: return launch_typed<S, __half>(p, sh, stream);
    case DType::kBFloat16: return launch_typed<S, __nv_bfloat16>(p, sh, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_state_update(const StateUpdateParams& p, cudaStream_t stream) {
  if (p.dstate < 0 || p.dstate > kStateUpdateMaxDstate) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.nheads == 0 || p.dim == 0) return cudaSuccess;
  if (p.heads_per_group < 1) return cudaErrorInvalidValue;
  switch (p.state_dtype) {
    case DType::kFloat32: return launch_for_state<float>(p, stream);
    case DType::kFloat16: return launch_for_state<__half>(p, stream);
    case DType::kBFloat16: return launch_for_state<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace selective_scan
}  // namespace mamba_kernels
