// Selective-scan backward for real A and dstate <= 16, in the lane-per-state layout
// (scan_lanes.cuh): lane n of a channel's 16 owns state n and walks the sequence backwards,
// chunk by chunk, from the forward's saved states.
//
// The saved states may be 2^k chunks apart (k <= 4: one every 64 to 1024 steps, the
// original's x layout too, ckpt_slot): on entering such a segment from its end, the block sweeps
// the segment's earlier chunks forward from the segment's saved state, staging each chunk's
// dt, dt*u and B as the chunk itself is staged later, and keeps each chunk's start state in
// shared memory. The sweep computes exactly what the forward computed, in the same order, so
// the states and every gradient are bitwise those of a state every chunk; it costs one more
// exponential per element of the segment's earlier chunks, and saves keeping (or recomputing
// in a separate forward) a state for every chunk.
//
// A block owns a range of channels of one (batch, group) and takes them 16 at a time, each
// time over the whole sequence; the grid's blocks (batch x group x channel ranges) are sized to
// fill the GPU about twice. Per chunk of 64 steps the block stages the chunk's B and C (shared by
// all its channels) and each channel's dt, dt*u, the gated dout and u (each lane discretising
// its own 4 steps; dz, and out_z when asked for, are written there too). A forward sweep records the state at the start of
// each 16-step window (shared memory); each window, from the last, is recomputed into registers
// (states and decays, the chunk's second exponential for 3/4 of the steps) and swept in reverse
// with the adjoint g_t = C_t dy_t + a_{t+1} g_{t+1}.
//
// Sums, all in fixed orders (bitwise repeatable, no atomics):
// - over the states (du, ddelta): a reduce-scatter over the 16 lanes per window;
// - over the channels (variable dB, dC): the warp's two channels by one exchange of halves (lanes
//   0-15 end with dB, 16-31 with dC), the block's 8 warps through shared memory in warp order,
//   then either
//   - the block's channel groups in order into the block's own fp32 row of the partials, or
//   - with variable B and C, where the GPU holds them all at once, over a cluster of 16 (or 8)
//     blocks in rank order, each block owning 1/16 of a chunk's elements (the others' sums reach
//     it by st.async, counted on its mbarrier), then the groups in order into the cluster's
//     row: a sixteenth of the rows, so the rows of a whole sequence cost less memory than the
//     windows' (bwd_window_chunks);
//   the caller then sums the rows (launch_sum_jobs);
// - over the steps (dA, fixed dB / dC, dD, ddelta_bias): per lane, written per (batch, channel).
//
// Instantiations: 3 (dtype) x 3 (B and C both variable, with or without clusters; either fixed).
#include <cstddef>
#include <mutex>

#include "cluster.cuh"
#include "scan_lanes.cuh"

namespace mamba_kernels {
namespace selective_scan {
namespace {

using LP = LanePolicy;

using BL = BwdLanesPolicy;

struct LanesBwdArgs {
  int64_t row_blocks;  // blocks per (batch, group): channel ranges
  int64_t groups_per_block;  // 16-channel groups per block
  int cluster;  // blocks per cluster (consecutive ranges), which share a row of the dB/dC partials
  int stage_offset;  // bytes into the dynamic shared memory of the cluster's stage (cluster > 1)
  bool vec_b, vec_c;
  bool vec_u, vec_delta, vec_dout, vec_z, vec_y, vec_dz, vec_out_z;  // 4-step vector access of the rows
};

struct BwdLanesSmem {
  float B[LP::kLanes * BL::kRow];                      // variable B of the chunk, [n][step]
  float C[LP::kLanes * BL::kRow];
  // per channel and step of the chunk; rows of 68 put the warp's two channels in other banks
  float dt[LP::kChannels][BL::kRow];
  float dtu[LP::kChannels][BL::kRow];
  float dy[LP::kChannels][BL::kRow];                   // dout * silu(z)
  float u[LP::kChannels][BL::kRow];
  float starts[BL::kWins][LP::kThreads];               // state at each window start
  // warp sums of dB (lanes < 16) and dC (lanes >= 16) per lane and window step; rows of 17 keep
  // both the writes (by lane) and the block sum's reads (by step) free of bank conflicts
  float red[2][BL::kWarps][kWarpSize][BL::kWin + 1];
  // the state entering each chunk of the segment (only with states 2^k chunks apart, k > 0:
  // the launch leaves this member out of the dynamic shared memory otherwise)
  float seg[1 << BL::kMaxStateShift][LP::kThreads];
};

// Shared memory a block takes with the segments' chunk starts. Devices whose blocks hold less
// (sm_75: 64 KB) cannot run a backward from spaced states: selective_scan/scan_fn.py asks for
// such states only where they fit (SPACED_BWD_SHARED_BYTES, which a test checks against this).
constexpr int kSpacedSmemBytes = 81408;
static_assert(sizeof(BwdLanesSmem) == kSpacedSmemBytes, "update kSpacedSmemBytes and SPACED_BWD_SHARED_BYTES");

// Elements of a chunk's variable dB/dC sums: [matrix][state][step].
constexpr int kStageFloats = 2 * LanePolicy::kLanes * kChunk;
// A cluster's shared memory past the rest (f.stage_offset): the receive buffers' barriers, the
// block's own sums of a chunk ([matrix][state][step]), and two receive buffers ([sender][share]
// each, a chunk's sums) taken in turn.
constexpr int kStageOffset = 16;
constexpr int kRecvOffset = kStageOffset + kStageFloats * int(sizeof(float));
constexpr int kClusterBytes = kRecvOffset + 2 * kStageFloats * int(sizeof(float));

// Item j of a chunk's variable B or C tile: 4 steps of state row j / 16 from tc0 + 4 (j % 16)
// (zero past L or for rows n >= N), one 16-byte store into the tile.
template <typename T>
__device__ __forceinline__ void stage_bc_item(float* tile, const T* base, int64_t s_n, int64_t s_l, bool vec,
                                              int64_t L, int64_t N, int64_t tc0, int j) {
  const int n = j / (kChunk / 4), q = j % (kChunk / 4);
  float v[4];
  load_bc4(v, base + n * s_n, s_l, tc0 + q * 4, L, n < N, vec);
  *reinterpret_cast<float4*>(tile + n * BL::kRow + q * 4) = make_float4(v[0], v[1], v[2], v[3]);
}

// A lane's kQ steps from t of its channel: u as fp32, dt (softplus(delta + bias) or delta +
// bias; 0 from stop on) and dt * u, as the forward computes them.
template <typename T, int kQ>
__device__ __forceinline__ void discretise_steps(const Steps<T, kQ>& ru, const Steps<T, kQ>& rd, int64_t t,
                                                 int64_t stop, float bias, bool softplus_on, float (&uu)[kQ],
                                                 float (&dt)[kQ], float (&dtu)[kQ]) {
#pragma unroll
  for (int j = 0; j < kQ; ++j) {
    const bool ok = t + j < stop;
    uu[j] = ru.at(j);
    const float v = rd.at(j) + bias;
    dt[j] = ok ? (softplus_on ? softplus(v) : v) : 0.0f;
    dtu[j] = uu[j] * dt[j];
  }
}

// What a segment's sweep reads of one channel (one thread's state of it).
template <typename T>
struct SegmentSweep {
  const T* B;  // the block's variable B at (b, g), or null: B fixed, Bfix
  int64_t B_sn, B_sl;
  bool vec_b;
  const T* u;  // the channel's rows
  const T* delta;
  int64_t u_sl, delta_sl;
  bool vec_u, vec_delta, softplus_on;
  int64_t L, N;
  float a2, Bfix, bias;
};

// The chunks [seg0, seg0 + chunks) swept forward from h, the state entering chunk seg0, as the
// forward computed them; sm.seg[k][tid] gets the state entering chunk seg0 + k (k <= chunks).
// Every thread of the block calls it (it stages the B tiles together, with barriers). Inlined:
// out of line, the registers saved around the call spilled more (bench/RESULTS.md, eighth pass).
template <typename T, bool kVarBC>
__device__ __forceinline__ void sweep_segment(BwdLanesSmem& sm, const SegmentSweep<T>& a, int64_t seg0, int chunks,
                                              float h) {
  constexpr int kQ = kChunk / LP::kLanes;
  const int tid = threadIdx.x, ch = tid / LP::kLanes, s = tid % LP::kLanes;
  sm.seg[0][tid] = h;
  for (int k = 0; k < chunks; ++k) {
    const int64_t ts0 = (seg0 + k) * kChunk;  // a whole chunk: only the sequence's last is partial
    if (a.B != nullptr) {
      for (int j = tid; j < LP::kLanes * (kChunk / 4); j += LP::kThreads) {
        stage_bc_item(sm.B, a.B, a.B_sn, a.B_sl, a.vec_b, a.L, a.N, ts0, j);
      }
    }
    {
      const int64_t t = ts0 + s * kQ;
      Steps<T, kQ> ru, rd;
      load_steps(ru, a.u, a.u_sl, t, a.L, a.vec_u);
      load_steps(rd, a.delta, a.delta_sl, t, a.L, a.vec_delta);
      float uu[kQ], dt[kQ], dtu[kQ];
      discretise_steps(ru, rd, t, a.L, a.bias, a.softplus_on, uu, dt, dtu);
      store_pack<float, kQ>(&sm.dt[ch][s * kQ], dt);
      store_pack<float, kQ>(&sm.dtu[ch][s * kQ], dtu);
    }
    __syncthreads();  // the B tile and the channel rows are in place
#pragma unroll 4
    for (int tt = 0; tt < kChunk; tt += 4) {
      const float4 dt4 = *reinterpret_cast<const float4*>(sm.dt[ch] + tt);
      const float4 du4 = *reinterpret_cast<const float4*>(sm.dtu[ch] + tt);
      float b4[4];
      if (kVarBC || a.B != nullptr) {
        const float4 v = *reinterpret_cast<const float4*>(sm.B + s * BL::kRow + tt);
        b4[0] = v.x, b4[1] = v.y, b4[2] = v.z, b4[3] = v.w;
      } else {
        b4[0] = b4[1] = b4[2] = b4[3] = a.Bfix;
      }
      h = fmaf(fast_exp2(dt4.x * a.a2), h, du4.x * b4[0]);
      h = fmaf(fast_exp2(dt4.y * a.a2), h, du4.y * b4[1]);
      h = fmaf(fast_exp2(dt4.z * a.a2), h, du4.z * b4[2]);
      h = fmaf(fast_exp2(dt4.w * a.a2), h, du4.w * b4[3]);
    }
    sm.seg[k + 1][tid] = h;
    __syncthreads();  // read before the next chunk is staged over them
  }
}

// One block's walk in phases. The block: the constructor (its rows of the partials, its share
// as a cluster's owner) and cluster_init; per channel group begin_group (A, fixed B/C, carried
// sums) and end_group; per chunk enter (the state entering it), stage (B/C tile, the channels'
// rows) and sweep (the states at window starts); per window in reverse: prefetch_prev,
// recompute, reverse, over_states (du, ddelta) and block_sum; with clusters chunk_done, flush
// and drain. All inlined: out of line, the registers saved around calls would spill.
template <typename T, bool kVarBC, bool kCluster>
struct BwdLanesAgent {
  static constexpr int kW = BL::kWin, kRow = BL::kRow;
  static constexpr int kQ = kChunk / LP::kLanes;

  const ScanParams& p;
  const LanesBwdArgs& f;
  BwdLanesSmem& sm;
  int64_t L, N, dpg, b, g, rb, n_chunks, c_hi, c_lo, P, t_lo;
  int tid, ch, s, warp, lane;
  bool upper, has_n, varB, varC;
  const T* Bv;
  const T* Cv;
  float* part_row_B;
  float* part_row_C;
  // With kCluster (variable B and C), a cluster of f.cluster blocks shares a row. Each block
  // owns 1/cs of a chunk's elements (`share`, whole state rows). A block keeps its sums of a
  // chunk in its stage; after the chunk it sends each element to the element's owner (st_async
  // into the owner's receive buffer, counted on the owner's barrier), and after the next chunk
  // the owner adds them in rank order into the row (flush): each wait has a chunk of slack.
  // Without, a block adds each window's sums to its own row.
  int cs, share, se, s_isC, s_n, s_t;
  unsigned my_rank;
  uint64_t* bars;  // one a receive buffer
  float* stage;
  float* recv;
  float* s_dst;  // this thread's element as owner (+ the chunk's column)
  int64_t kc = 0;        // chunks sent: chunk k to buffer k & 1, that barrier's phase k >> 1
  bool pending = false;  // a chunk's sums await their flush: its number, column, steps
  int64_t pend_k = 0, pend_col = 0;
  int pend_len = 0;
  bool pend_add = false;   // a later channel group: the flush adds to the row
  float pend_prev = 0.0f;  // the row's element before this group's sum
  bool owe_wait = false;   // the wait matching the last flush's cluster arrive
  // The channel group's: its index, this thread's channel, A, fixed B/C and running sums.
  int64_t gi, d;
  bool active;
  float Af, a2, Bfix, Cfix, Dd, bias;
  float dA, dBf, dCf, dD, dbias, gc;

  __device__ __forceinline__ BwdLanesAgent(const ScanParams& params, const LanesBwdArgs& args, float4* smem)
      : p(params), f(args), sm(*reinterpret_cast<BwdLanesSmem*>(smem)) {
    L = p.seqlen, N = p.dstate;
    dpg = p.dim / p.ngroups;
    const int64_t bg = int64_t(blockIdx.x) / f.row_blocks;
    rb = int64_t(blockIdx.x) % f.row_blocks;
    b = bg / p.ngroups, g = bg % p.ngroups;
    tid = threadIdx.x, ch = tid / LP::kLanes, s = tid % LP::kLanes;
    warp = tid / kWarpSize, lane = tid % kWarpSize;
    upper = lane >= LP::kLanes;  // the warp's second channel
    has_n = s < N;
    n_chunks = (L + kChunk - 1) / kChunk;
    varB = kVarBC || p.B.variable, varC = kVarBC || p.C.variable;
    Bv = varB ? static_cast<const T*>(p.B.ptr) + b * p.B.s_b + g * p.B.s_g : nullptr;
    Cv = varC ? static_cast<const T*>(p.C.ptr) + b * p.C.s_b + g * p.C.s_g : nullptr;
    // This launch's chunks (all, or a window of them: ScanParams.chunk_lo / chunk_hi) and where
    // its partial rows start: column 0 of a row is step chunk_lo * kChunk.
    c_hi = p.chunk_hi < 0 ? n_chunks : p.chunk_hi, c_lo = p.chunk_lo;
    P = p.part_len, t_lo = c_lo * kChunk;
    cs = kCluster ? f.cluster : 1;
    const int64_t row = (b * p.ngroups + g) * (f.row_blocks / cs) + rb / cs;
    part_row_B = varB ? p.dB_part + row * N * P : nullptr;
    part_row_C = varC ? p.dC_part + row * N * P : nullptr;
    char* const cl_base = reinterpret_cast<char*>(smem) + f.stage_offset;
    bars = reinterpret_cast<uint64_t*>(cl_base);
    stage = reinterpret_cast<float*>(cl_base + kStageOffset);
    recv = reinterpret_cast<float*>(cl_base + kRecvOffset);
    share = kStageFloats / cs;
    my_rank = cluster_rank();
    se = int(my_rank) * share + tid;  // if tid < share
    s_isC = se / (LP::kLanes * kChunk), s_n = (se / kChunk) % LP::kLanes, s_t = se % kChunk;
    s_dst = (s_isC ? part_row_C : part_row_B) + s_n * P + s_t;
  }

  // Whether this thread owns an element of the row as a cluster's owner. Recomputed where used:
  // kept in the agent, sm_90 spilled one more register (12 -> 16 bytes).
  __device__ __forceinline__ bool s_mine() const { return kCluster && tid < share && s_n < N; }

  __device__ __forceinline__ void cluster_init() {
    if constexpr (kCluster) {
      if (tid == 0) {
        mbar_init(&bars[0]);
        mbar_init(&bars[1]);
        mbar_init_fence();
      }
      cluster_sync_all();  // every barrier initialised before any block sends
    }
  }

  // The owner's sum of element se of the pending chunk over the senders in rank order, into the
  // row (every sender sends a whole stage); the cluster barrier then says the buffer is read.
  __device__ __forceinline__ void flush() {
    const int buf = int(pend_k & 1);
    if (tid == 0) mbar_expect(&bars[buf], uint32_t(kStageFloats * sizeof(float)));
    mbar_wait(&bars[buf], uint32_t((pend_k >> 1) & 1));
    if (tid < share) {
      const float* in = recv + buf * kStageFloats + tid;
      float acc = in[0];
      for (int r = 1; r < cs; ++r) acc += in[r * share];
      if (s_mine() && s_t < pend_len) s_dst[pend_col] = pend_add ? pend_prev + acc : acc;
    }
    cluster_arrive_relaxed();
    owe_wait = true;
    pending = false;
  }

  // After a chunk: the chunk before it flushed, this one's stage sent to the owners (16 bytes a
  // store, two a thread) into the buffer the flush before last emptied.
  __device__ __forceinline__ void chunk_done(int64_t col, int len, bool add) {
    if (owe_wait) cluster_wait();  // every owner's flush before last: its buffer is read
    owe_wait = false;
    if (pending) flush();
    const int buf = int(kc & 1);
    const uint32_t bar_local = smem_addr(&bars[buf]);
#pragma unroll
    for (int k = 0; k < kStageFloats / 4 / LP::kThreads; ++k) {
      const int e = (tid + k * LP::kThreads) * 4;
      const unsigned owner = unsigned(e / share);
      const float4 v = *reinterpret_cast<const float4*>(stage + e);
      const uint32_t at = smem_addr(recv + buf * kStageFloats + int(my_rank) * share + e % share);
      st_async4(cluster_map(at, owner), v, cluster_map(bar_local, owner));
    }
    pending = true;
    pend_k = kc++;
    pend_col = col;
    pend_len = len;
    pend_add = add;
    if (add && s_mine() && s_t < len) pend_prev = s_dst[col];  // it arrives meanwhile
  }

  // The cluster's last chunk flushed, its barrier's phases ended.
  __device__ __forceinline__ void drain() {
    if constexpr (kCluster) {
      if (owe_wait) cluster_wait();
      owe_wait = false;
      if (pending) flush();
      if (owe_wait) cluster_wait();  // the last flush's arrive matched: the barrier's phases end even
    }
  }

  // A window that does not end the sequence goes on from the running sums the window after it
  // left, so each lane adds in the order of one pass. (The sums' address is recomputed where
  // used, so that nothing more stays live across the chunk loop. An inactive channel reads
  // row 0's, as it reads row 0's inputs, and stores nothing computed from them; skipping
  // its read doubled the bf16 kernel's spills, 12 to 24 bytes.)
  __device__ __forceinline__ float* carry() const {
    return p.carry + ((b * p.dim + d) * LP::kLanes + s) * kBwdCarry;
  }
  __device__ __forceinline__ const T* u_row() const { return static_cast<const T*>(p.u) + offset3(p.u_s, b, d, 0); }
  __device__ __forceinline__ const T* delta_row() const {
    return static_cast<const T*>(p.delta) + offset3(p.delta_s, b, d, 0);
  }

  // Channel group gi: false past the block's channels (block-uniform).
  __device__ __forceinline__ bool begin_group(int64_t gi_) {
    gi = gi_;
    const int64_t rig = (rb * f.groups_per_block + gi) * LP::kChannels + ch;
    if ((rb * f.groups_per_block + gi) * LP::kChannels >= dpg) return false;
    active = rig < dpg;
    d = g * dpg + (active ? rig : 0);  // inactive channels shadow row 0, store nothing
    Af = has_n ? p.A[d * N + s] : 0.0f;
    a2 = clamp_finite(Af * kLog2e);  // as the forward: its states are recomputed here
    Bfix = (has_n && !varB) ? static_cast<const float*>(p.B.ptr)[d * N + s] : 0.0f;
    Cfix = (has_n && !varC) ? static_cast<const float*>(p.C.ptr)[d * N + s] : 0.0f;
    Dd = p.D != nullptr ? p.D[d] : 0.0f;
    bias = p.delta_bias != nullptr ? p.delta_bias[d] : 0.0f;
    dA = 0.0f, dBf = 0.0f, dCf = 0.0f, dD = 0.0f, dbias = 0.0f, gc = 0.0f;
    if (p.carry != nullptr && c_hi < n_chunks) {
      const float* in = carry();
      gc = in[0], dA = in[1], dBf = in[2], dCf = in[3], dD = in[4], dbias = in[5];
    }
    return true;
  }

  // The state entering chunk c: a saved one, or with spaced states the segment's sweep's.
  // Slot k holds the state after (k + 1) 2^ckpt_shift chunks.
  __device__ __forceinline__ float enter(int64_t c) {
    const int64_t bd = b * p.dim + d;
    const int64_t seg_mask = (int64_t(1) << p.ckpt_shift) - 1;  // saved states 2^ckpt_shift chunks apart
    const int cj = int(c & seg_mask);  // the chunk's place in its segment
    if (p.ckpt_shift > 0 && (cj == seg_mask || c == c_hi - 1)) {
      // Entering the segment from its end: sweep its chunks before this one from the
      // segment's saved state, as the forward did, keeping each one's start state.
      const int64_t seg0 = c - cj;
      float h = 0.0f;
      if (seg0 > 0 && has_n) h = ckpt_slot(p, bd, (seg0 >> p.ckpt_shift) - 1, N, 1)[s * ckpt_elem_step(p)];
      SegmentSweep<T> a;
      a.B = varB ? Bv : nullptr;
      a.B_sn = p.B.s_n, a.B_sl = p.B.s_l, a.vec_b = f.vec_b;
      a.u = u_row(), a.delta = delta_row();
      a.u_sl = p.u_s.l, a.delta_sl = p.delta_s.l;
      a.vec_u = f.vec_u, a.vec_delta = f.vec_delta, a.softplus_on = p.softplus;
      a.L = L, a.N = N;
      a.a2 = a2, a.Bfix = Bfix, a.bias = bias;
      sweep_segment<T, kVarBC>(sm, a, seg0, cj, h);
    }
    float h_in = 0.0f;
    if (p.ckpt_shift > 0) {
      h_in = sm.seg[cj][tid];  // (this thread's own entry: written above, at this chunk or a later one)
    } else if (c > 0 && has_n) {
      h_in = ckpt_slot(p, bd, c - 1, N, 1)[s * ckpt_elem_step(p)];
    }
    return h_in;
  }

  // Stage the chunk: B/C by the whole block, the per-step values of each channel by its own
  // lanes.
  __device__ __forceinline__ void stage_chunk(int64_t tc0, int clen) {
    for (int i = tid; i < 2 * LP::kLanes * (kChunk / 4); i += LP::kThreads) {
      const bool isC = i >= LP::kLanes * (kChunk / 4);
      if (isC ? varC : varB) {
        const int j = i % (LP::kLanes * (kChunk / 4));
        if (isC) {
          stage_bc_item(sm.C, Cv, p.C.s_n, p.C.s_l, f.vec_c, L, N, tc0, j);
        } else {
          stage_bc_item(sm.B, Bv, p.B.s_n, p.B.s_l, f.vec_b, L, N, tc0, j);
        }
      }
    }
    stage_rows(tc0, clen);
    __syncthreads();  // the B/C tile and the channel rows are in place
  }

  // This lane's 4 consecutive steps of the channel's rows (vector access where allowed).
  __device__ __forceinline__ void stage_rows(int64_t tc0, int clen) {
    const int tt = s * kQ;
    const int64_t t = tc0 + tt;
    const int64_t stop = tc0 + clen;
    Steps<T, kQ> ru, rd, rg;
    load_steps(ru, u_row(), p.u_s.l, t, stop, f.vec_u);
    load_steps(rd, delta_row(), p.delta_s.l, t, stop, f.vec_delta);
    load_steps(rg, static_cast<const T*>(p.dout) + offset3(p.dout_s, b, d, 0), p.dout_s.l, t, stop, f.vec_dout);
    float uu[kQ], dt[kQ], dtu[kQ], gy[kQ];
    discretise_steps(ru, rd, t, stop, bias, p.softplus, uu, dt, dtu);
#pragma unroll
    for (int j = 0; j < kQ; ++j) gy[j] = rg.at(j);
    if (p.z != nullptr) gate(t, stop, gy);
    store_pack<float, kQ>(&sm.dt[ch][tt], dt);
    store_pack<float, kQ>(&sm.dtu[ch][tt], dtu);
    store_pack<float, kQ>(&sm.dy[ch][tt], gy);
    store_pack<float, kQ>(&sm.u[ch][tt], uu);
  }

  // The z gate of the lane's steps: gy *= silu(z); dz and out_z (when asked for) written.
  __device__ __forceinline__ void gate(int64_t t, int64_t stop, float (&gy)[kQ]) {
    Steps<T, kQ> rz, ry;
    load_steps(rz, static_cast<const T*>(p.z) + offset3(p.z_s, b, d, 0), p.z_s.l, t, stop, f.vec_z);
    load_steps(ry, static_cast<const T*>(p.y) + offset3(p.y_s, b, d, 0), p.y_s.l, t, stop, f.vec_y);
    float dzq[kQ], ozq[kQ];
#pragma unroll
    for (int j = 0; j < kQ; ++j) {
      const float zz = rz.at(j), yy = ry.at(j);
      dzq[j] = gy[j] * yy * silu_grad(zz);
      ozq[j] = yy * silu(zz);
      gy[j] *= silu(zz);
    }
    if (active) {
      store_steps(static_cast<T*>(p.dz) + offset3(p.dz_s, b, d, 0), p.dz_s.l, t, stop, dzq, f.vec_dz);
      if (p.out_z != nullptr) {
        store_steps(static_cast<T*>(p.out_z) + offset3(p.out_z_s, b, d, 0), p.out_z_s.l, t, stop, ozq,
                    f.vec_out_z);
      }
    }
  }

  // Four steps' values from a row (16-byte reads); B/C fixed: the constant.
  __device__ __forceinline__ static void row4(const float* row, int tt, float (&o)[4]) {
    const float4 v = *reinterpret_cast<const float4*>(row + tt);
    o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
  }
  __device__ __forceinline__ static void get4(const float* row, float fixed, bool var, int tt, float (&o)[4]) {
    if (kVarBC || var) {
      row4(row, tt, o);
    } else {
      o[0] = o[1] = o[2] = o[3] = fixed;
    }
  }

  // Forward sweep: the state entering each window.
  __device__ __forceinline__ void sweep(int nwin, float h) {
    const float* rowB = sm.B + s * kRow;
    for (int w = 0; w < nwin; ++w) {
      sm.starts[w][tid] = h;
      if (w == nwin - 1) break;  // only the last window can be partial
#pragma unroll
      for (int q = 0; q < kW / 4; ++q) {
        const int tt = w * kW + q * 4;
        float dt4[4], du4[4], b4[4];
        row4(sm.dt[ch], tt, dt4);
        row4(sm.dtu[ch], tt, du4);
        get4(rowB, Bfix, varB, tt, b4);
#pragma unroll
        for (int j = 0; j < 4; ++j) h = fmaf(fast_exp2(dt4[j] * a2), h, du4[j] * b4[j]);
      }
    }
  }

  // This thread's elements of the block's partial row for the window (see block_sum), read
  // early so their latency hides behind the window's work.
  __device__ __forceinline__ void prefetch_prev(int64_t tc0, int w0, int valid, float (&prev)[2]) const {
    if (!kCluster && gi > 0 && (varB || varC)) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int o = tid + k * LP::kThreads;
        const int isC = o / (LP::kLanes * kW);
        const int n = (o / kW) % LP::kLanes, tw = o % kW;
        if ((isC ? varC : varB) && n < N && tw < valid) {
          prev[k] = (isC ? part_row_C : part_row_B)[n * P + (tc0 - t_lo) + w0 + tw];
        }
      }
    }
  }

  // Recompute the window: the state after each step and each step's decay (1 past valid).
  __device__ __forceinline__ void recompute(int w0, int valid, float hstart, float (&hs)[kW], float (&aa)[kW]) const {
    float hh = hstart;
#pragma unroll
    for (int q = 0; q < kW / 4; ++q) {
      const int tt = w0 + q * 4;
      float dt4[4], du4[4], b4[4];
      row4(sm.dt[ch], tt, dt4);
      row4(sm.dtu[ch], tt, du4);
      get4(sm.B + s * kRow, Bfix, varB, tt, b4);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool ok = q * 4 + j < valid;
        const float a = ok ? fast_exp2(dt4[j] * a2) : 1.0f;
        hh = ok ? fmaf(a, hh, du4[j] * b4[j]) : hh;
        aa[q * 4 + j] = a;
        hs[q * 4 + j] = hh;
      }
    }
  }

  // Reverse sweep. Steps beyond the sequence have dt = dt*u = dy = 0 and a = 1: they pass the
  // (zero) adjoint through and add nothing. qa, qb: each step's terms of the sums over states.
  __device__ __forceinline__ void reverse(int w, int w0, float hstart, const float (&hs)[kW], const float (&aa)[kW],
                                          float (&qa)[kW], float (&qb)[kW]) {
#pragma unroll
    for (int q = kW / 4 - 1; q >= 0; --q) {
      const int tt = w0 + q * 4;
      float dt4[4], du4[4], dy4[4], b4[4], c4[4];
      row4(sm.dt[ch], tt, dt4);
      row4(sm.dtu[ch], tt, du4);
      row4(sm.dy[ch], tt, dy4);
      get4(sm.B + s * kRow, Bfix, varB, tt, b4);
      get4(sm.C + s * kRow, Cfix, varC, tt, c4);
#pragma unroll
      for (int j = 3; j >= 0; --j) {
        const int k = q * 4 + j;
        const float gg = fmaf(c4[j], dy4[j], gc);
        const float hp = k == 0 ? hstart : hs[k - 1];
        const float da = aa[k] * hp * gg;
        dA = fmaf(dt4[j], da, dA);
        qa[k] = Af * da;
        qb[k] = b4[j] * gg;
        // (an inactive channel shadows row 0: its terms must be exactly 0, even where row 0
        // holds non-finite values)
        const float db = active ? gg * du4[j] : 0.0f;
        const float dc = active ? hs[k] * dy4[j] : 0.0f;
        dBf += db;
        dCf += dc;
        // The warp's two channels summed: lanes < 16 keep dB, lanes >= 16 dC.
        const float mine = select_bits(upper, dc, db), theirs = select_bits(upper, db, dc);
        sm.red[w & 1][warp][lane][k] = mine + __shfl_xor_sync(kFullMask, theirs, LP::kLanes);
        gc = aa[k] * gg;
      }
    }
  }

  // Over the states: lane s gets the sums of window step s, then du and ddelta of that step.
  __device__ __forceinline__ void over_states(int64_t tc0, int w0, int valid, float (&qa)[kW], float (&qb)[kW]) {
    reduce_scatter_over<LP::kLanes>(qa, s);
    reduce_scatter_over<LP::kLanes>(qb, s);
    if (s < valid) {
      const int tt = w0 + s;
      const int64_t t = tc0 + tt;
      const float dtt = sm.dt[ch][tt], ut = sm.u[ch][tt], dyt = sm.dy[ch][tt];
      float gdt = fmaf(ut, qb[0], qa[0]);
      if (p.softplus) gdt *= -expm1f(-dtt);  // sigmoid(x) = 1 - exp(-softplus(x))
      dbias += gdt;
      dD = fmaf(dyt, ut, dD);
      if (active) {
        static_cast<T*>(p.du)[offset3(p.du_s, b, d, t)] = from_float<T>(fmaf(dtt, qb[0], Dd * dyt));
        static_cast<T*>(p.ddelta)[offset3(p.ddelta_s, b, d, t)] = from_float<T>(gdt);
      }
    }
  }

  // Over the block's warps in order, then into the stage (every element: each window sends the
  // same bytes), or into the block's row of partials (the first channel group writes it, later
  // ones add to it: the same thread owns the same elements every time).
  __device__ __forceinline__ void block_sum(int w, int64_t tc0, int w0, int valid, const float (&prev)[2]) {
    if (!(varB || varC)) return;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int o = tid + k * LP::kThreads;  // o = (matrix, n, step)
      const int isC = o / (LP::kLanes * kW);
      const int n = (o / kW) % LP::kLanes, tw = o % kW;
      if (!kCluster && (!(isC ? varC : varB) || n >= N || tw >= valid)) continue;
      float acc = 0.0f;
#pragma unroll
      for (int wp = 0; wp < BL::kWarps; ++wp) acc += sm.red[w & 1][wp][isC * LP::kLanes + n][tw];
      if constexpr (kCluster) {
        stage[(isC * LP::kLanes + n) * kChunk + w0 + tw] = acc;
      } else {
        float* dst = (isC ? part_row_C : part_row_B) + n * P + (tc0 - t_lo) + w0 + tw;
        *dst = gi == 0 ? acc : prev[k] + acc;
      }
    }
  }

  // Window w of the chunk from tc0 (clen steps), all phases.
  __device__ __forceinline__ void window(int64_t tc0, int clen, int w) {
    const int w0 = w * kW;
    const int valid = clen - w0 < kW ? clen - w0 : kW;
    const float hstart = sm.starts[w][tid];
    float prev[2] = {0.0f, 0.0f};
    prefetch_prev(tc0, w0, valid, prev);
    float hs[kW], aa[kW];
    recompute(w0, valid, hstart, hs, aa);
    float qa[kW], qb[kW];
    reverse(w, w0, hstart, hs, aa, qa, qb);
    over_states(tc0, w0, valid, qa, qb);
    __syncthreads();  // every warp's dB/dC sums of the window are in sm.red[w & 1]
    block_sum(w, tc0, w0, valid, prev);
  }

  // Chunk c, all phases.
  __device__ __forceinline__ void chunk(int64_t c) {
    const int64_t tc0 = c * kChunk;
    const int clen = int(L - tc0 < kChunk ? L - tc0 : kChunk);
    const int nwin = (clen + kW - 1) / kW;
    const float h_in = enter(c);
    stage_chunk(tc0, clen);
    sweep(nwin, h_in);
    for (int w = nwin - 1; w >= 0; --w) window(tc0, clen, w);
    __syncthreads();  // the chunk's tiles and rows are read before the next chunk is staged
    if constexpr (kCluster) chunk_done(tc0 - t_lo, clen, gi > 0);
  }

  // The group's sums: carried to the launch of the window before this one, or per (batch,
  // channel) dA and fixed dB / dC per state, dD and ddelta_bias over the lanes.
  __device__ __forceinline__ void end_group() {
    if (c_lo > 0) {  // a window before this one goes on from these sums
      if (active) {
        float* out = carry();
        out[0] = gc, out[1] = dA, out[2] = dBf, out[3] = dCf, out[4] = dD, out[5] = dbias;
      }
      return;
    }
    dD = warp_sum_width<LP::kLanes>(dD);
    dbias = warp_sum_width<LP::kLanes>(dbias);
    if (active) {
      const int64_t off = (b * p.dim + d) * N + s;
      if (has_n) {
        p.dA_part[off] = dA;
        if (!varB) p.dB_part[off] = dBf;
        if (!varC) p.dC_part[off] = dCf;
      }
      if (s == 0) {
        if (p.dD_part != nullptr) p.dD_part[b * p.dim + d] = dD;
        if (p.dbias_part != nullptr) p.dbias_part[b * p.dim + d] = dbias;
      }
    }
  }
};

template <typename T, bool kVarBC, bool kCluster>
__global__ void __launch_bounds__(LP::kThreads, BL::kBlocksPerSm)
    bwd_lanes_kernel(const ScanParams p, const LanesBwdArgs f) {
  extern __shared__ float4 smem_lanes[];  // BwdLanesSmem: more than the 48 KB of static shared memory
  BwdLanesAgent<T, kVarBC, kCluster> a(p, f, smem_lanes);
  a.cluster_init();
  for (int64_t gi = 0; gi < f.groups_per_block; ++gi) {
    if (!a.begin_group(gi)) break;  // block-uniform
    for (int64_t c = a.c_hi - 1; c >= a.c_lo; --c) a.chunk(c);
    a.end_group();
  }
  a.drain();
}

// A launch of `blocks` blocks in clusters of cs, with `smem` bytes of dynamic shared memory a
// block; `attr` holds the cluster's shape.
cudaLaunchConfig_t cluster_launch(cudaLaunchAttribute& attr, int64_t blocks, int smem, int cs, cudaStream_t stream) {
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(cs), attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(blocks)), cfg.blockDim = dim3(LP::kThreads), cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream, cfg.attrs = &attr, cfg.numAttrs = 1;
  return cfg;
}

// How many clusters of cs blocks (16 or 8) of the cluster kernel the current device holds at
// once: 0 where clusters are not available (a kernel compiled below sm_90 or by nvcc before
// 12.1, or a device without them). A GPC holds whole clusters only, so this can be fewer than
// the SMs' blocks over cs. Measured once per device, with the most shared memory a launch takes.
int64_t bwd_lanes_cluster_capacity(int cs) {
  constexpr int kDevices = 64;
  struct Capacity {
    int64_t c16 = 0, c8 = 0;
  };
  static Capacity caps[kDevices];
  static std::once_flag measured[kDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kDevices) {
    cudaGetLastError();
    return 0;
  }
  std::call_once(measured[dev], [dev] {
    auto kernel = bwd_lanes_kernel<float, true, true>;
    cudaFuncAttributes attr{};
    const int smem = int(sizeof(BwdLanesSmem)) + kClusterBytes;
    if (!kClusterSum || cudaFuncGetAttributes(&attr, kernel) != cudaSuccess || attr.ptxVersion < 90 ||
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    for (int size : {16, 8}) {
      cudaLaunchAttribute at;
      const cudaLaunchConfig_t cfg = cluster_launch(at, int64_t(size) * 64, smem, size, nullptr);
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
        cudaGetLastError();
        clusters = 0;
      }
      (size == 16 ? caps[dev].c16 : caps[dev].c8) = clusters;
    }
  });
  return cs == 16 ? caps[dev].c16 : cs == 8 ? caps[dev].c8 : 0;
}

LanesBwdArgs lanes_bwd_args(const ScanParams& p) {
  LanesBwdArgs f{};
  const int64_t dpg = p.dim / p.ngroups;
  const int64_t groups = (dpg + LP::kChannels - 1) / LP::kChannels;  // 16-channel groups per (batch, group)
  const int64_t bg = p.batch * p.ngroups;
  const int64_t target = int64_t(sm_count()) * BL::kBlocksPerSm;
  int64_t rows = (target + bg - 1) / bg;
  rows = rows < 1 ? 1 : (rows > groups ? groups : rows);
  f.groups_per_block = (groups + rows - 1) / rows;
  f.row_blocks = (groups + f.groups_per_block - 1) / f.groups_per_block;
  // Clusters (16 blocks, else 8) with variable B and C, where each block of a (batch, group)
  // takes the same number of groups (a cluster's blocks pass the same barriers), whole clusters
  // make its ranges, and the device holds every cluster at once: a cluster left for a second wave
  // would double the time.
  f.cluster = 1;
  if (p.B.variable && p.C.variable && groups % f.groups_per_block == 0) {
    for (int cs = 16; cs >= 8 && f.cluster == 1; cs /= 2) {
      if (f.row_blocks % cs == 0 && bg * (f.row_blocks / cs) <= bwd_lanes_cluster_capacity(cs)) f.cluster = cs;
    }
  }
  return f;
}

template <typename T, bool kVarBC>
cudaError_t launch_bwd_lanes_for(const ScanParams& p, cudaStream_t stream) {
  constexpr int kQ = kChunk / LP::kLanes;
  LanesBwdArgs f = lanes_bwd_args(p);
  f.vec_b = bc_vec4(p.B, sizeof(T));
  f.vec_c = bc_vec4(p.C, sizeof(T));
  f.vec_u = steps_vec(p.u, p.u_s, sizeof(T), kQ);
  f.vec_delta = steps_vec(p.delta, p.delta_s, sizeof(T), kQ);
  f.vec_dout = steps_vec(p.dout, p.dout_s, sizeof(T), kQ);
  f.vec_z = steps_vec(p.z, p.z_s, sizeof(T), kQ);
  f.vec_y = steps_vec(p.y, p.y_s, sizeof(T), kQ);
  f.vec_dz = steps_vec(p.dz, p.dz_s, sizeof(T), kQ);
  f.vec_out_z = steps_vec(p.out_z, p.out_z_s, sizeof(T), kQ);
  const int64_t blocks = f.row_blocks * p.batch * p.ngroups;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  // the segments' start states (the last member) only where states are 2^k chunks apart; then
  // a cluster's buffers
  f.stage_offset = int(p.ckpt_shift > 0 ? sizeof(BwdLanesSmem) : offsetof(BwdLanesSmem, seg));
  if (f.cluster == 1) {
    auto kernel = bwd_lanes_kernel<T, kVarBC, false>;
    const int smem = f.stage_offset;
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    kernel<<<unsigned(blocks), LP::kThreads, smem, stream>>>(p, f);
    return cudaGetLastError();
  }
  if constexpr (kVarBC) {  // (lanes_bwd_args forms clusters only then)
    auto kernel = bwd_lanes_kernel<T, true, true>;
    const int smem = f.stage_offset + kClusterBytes;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess) err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err != cudaSuccess) return err;
    cudaLaunchAttribute at;
    const cudaLaunchConfig_t cfg = cluster_launch(at, blocks, smem, f.cluster, stream);
    err = cudaLaunchKernelEx(&cfg, kernel, p, f);
    return err != cudaSuccess ? err : cudaGetLastError();
  }
  return cudaErrorInvalidConfiguration;
}

}  // namespace

int64_t bwd_lanes_row_blocks(const ScanParams& p) {
  const LanesBwdArgs f = lanes_bwd_args(p);
  return f.row_blocks / f.cluster;  // a row of partials per cluster
}

cudaError_t launch_bwd_lanes(const ScanParams& p, cudaStream_t stream) {
  return with_dtype_complex(p.dtype, false, [&](auto tag, auto) -> cudaError_t {
    using T = typename decltype(tag)::type;
    // both B and C variable (the models' case) reads the tiles without per-step checks
    if (p.B.variable && p.C.variable) return launch_bwd_lanes_for<T, true>(p, stream);
    return launch_bwd_lanes_for<T, false>(p, stream);
  });
}

}  // namespace selective_scan
}  // namespace mamba_kernels
