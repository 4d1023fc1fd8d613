// The row decode kernel, state_update_row<S, T, kMamba1>, its parameter block and its launcher.
#include <algorithm>
#include <cstdint>

#include "update_common.cuh"

namespace mamba_kernels {
namespace selective_scan {
namespace decode {
namespace {

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

}  // namespace

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

// Instantiated here for update.cu: every (state, activation) dtype pair.
#define MK_LAUNCH_ROW(S, T) template cudaError_t launch_row<S, T>(const StateUpdateParams&, const Shape&, cudaStream_t);
MK_DECODE_DTYPE_PAIRS(MK_LAUNCH_ROW)
#undef MK_LAUNCH_ROW

}  // namespace decode
}  // namespace selective_scan
}  // namespace mamba_kernels
