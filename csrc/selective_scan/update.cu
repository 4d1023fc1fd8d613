// selective_state_update: one decode step of the scan (math in state_update.h). This file
// picks the kernel; each kind is defined with its launcher in update_full.cu
// (state_update_kernel), update_lean.cu and update_row.cu, on what update_common.cuh shares.
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

#include "device_info.h"
#include "update_common.cuh"

namespace mamba_kernels {
namespace selective_scan {
namespace decode {
namespace {

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
  } else if (p.batch >= 2 && (p.batch / 2) * p.nheads * p.dim * lanes >= UpdatePolicy::kPairMinThreadsPerSm * sm_count()) {
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

// Whether a lean-fitting typed launch takes the row kernel: A per state (not broadcast), D
// and dt_bias fp32 or absent, the dense layout RowParams (update_row.cu) describes, and at most
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
}  // namespace decode

cudaError_t launch_state_update(const StateUpdateParams& p, cudaStream_t stream) {
  if (p.dstate < 0 || p.dstate > kStateUpdateMaxDstate) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.nheads == 0 || p.dim == 0) return cudaSuccess;
  if (p.heads_per_group < 1) return cudaErrorInvalidValue;
  switch (p.state_dtype) {
    case DType::kFloat32: return decode::launch_for_state<float>(p, stream);
    case DType::kFloat16: return decode::launch_for_state<__half>(p, stream);
    case DType::kBFloat16: return decode::launch_for_state<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace selective_scan
}  // namespace mamba_kernels
