// The lean decode kernel, state_update_lean<S, T, kP>, its parameter block and its launcher.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "device_info.h"
#include "update_common.cuh"

namespace mamba_kernels {
namespace selective_scan {
namespace decode {
namespace {

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

template <typename S, typename T, int kP>
__global__ void __launch_bounds__(kThreads, UpdatePolicy::lean_min_blocks(kP, int(sizeof(S)), int(sizeof(T))))
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

}  // namespace

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

// Instantiated here for update.cu: every (state, activation) dtype pair.
#define MK_LAUNCH_LEAN(S, T) template cudaError_t launch_lean<S, T>(const StateUpdateParams&, const Shape&, cudaStream_t);
MK_DECODE_DTYPE_PAIRS(MK_LAUNCH_LEAN)
#undef MK_LAUNCH_LEAN

}  // namespace decode
}  // namespace selective_scan
}  // namespace mamba_kernels
