// Warp-level tensor-core pieces for the SSD kernels on sm_80 and later: mma.sync m16n8k16 with
// fp32 accumulation, ldmatrix, cp.async. Unlike wmma, these fix which thread holds which element
// of a fragment, so a kernel can build an operand in registers (chunk_scan's decayed C B^T) and
// scale or store its accumulators without a round trip through shared memory.
//
// Fragment layout of m16n8k16 (lane = 4 g + q, g = lane / 4, q = lane % 4):
//   A (16 x 16, row-major): a[0] = (g, 2q..2q+1), a[1] = (g + 8, 2q..), a[2] = (g, 2q+8..),
//                           a[3] = (g + 8, 2q+8..); two 16-bit values a register, low half first
//   B (16 x 8):             b[0] = (k 2q..2q+1, n g), b[1] = (k 2q+8.., n g)
//   C (16 x 8, fp32):       c[0..1] = (g, 2q..2q+1), c[2..3] = (g + 8, 2q..2q+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "vec_io.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MK_SSD_MMA 1
#else
#define MK_SSD_MMA 0
#endif

namespace mamba_kernels {
namespace ssd {
namespace mma {

#if MK_SSD_MMA

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 matrices of 16-bit values; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

// The same, each matrix transposed (a K x N operand stored with N contiguous, as B).
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

// d += a b on the tensor cores (16-bit operands, fp32 accumulators).
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a register of two 16-bit values (lo in the low half), rounded to nearest even.
__device__ __forceinline__ uint32_t pack2(float lo, float hi, __nv_bfloat16) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi, __half) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 16 bytes global -> shared without passing through registers; completes at cp_async_wait.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Whether both 16-bit values of a register are finite (exponent not all ones).
__device__ __forceinline__ bool finite2(uint32_t v, __nv_bfloat16) {
  return (v & 0x7f80u) != 0x7f80u && (v & 0x7f800000u) != 0x7f800000u;
}
__device__ __forceinline__ bool finite2(uint32_t v, __half) {
  return (v & 0x7c00u) != 0x7c00u && (v & 0x7c000000u) != 0x7c000000u;
}

// An (R x Cols) tile of 16-bit T into shared memory (rows of `ld`): rows row_at(r) for r < rows,
// columns < cols (element stride cs), zeros elsewhere; whole 16-byte pieces by cp.async when
// vec (the caller commits and waits), the rest element by element.
template <int R, int Cols, int NT, typename T, typename Row>
__device__ __forceinline__ void stage_async(T* dst, int ld, const Row& row_at, int rows, int cols, int64_t cs,
                                            bool vec) {
  constexpr int V = 8;
  static_assert(sizeof(T) == 2 && Cols % V == 0, "16-bit tiles of whole 16-byte pieces");
  for (int i = threadIdx.x; i < R * (Cols / V); i += NT) {
    const int r = i / (Cols / V), c = (i % (Cols / V)) * V;
    T* d = dst + r * ld + c;
    if (r < rows && vec && c + V <= cols) {
      cp_async16(d, row_at(r) + c);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) d[j] = r < rows && c + j < cols ? row_at(r)[(c + j) * cs] : from_float<T>(0.0f);
    }
  }
}

// acc += A B^T over K for a warp: A's 16 rows (the warp's strip, row-major, k along a row) and
// B's kNT * 8 rows (n, k along a row), both 16-bit in shared memory; acc in the C layout above.
template <typename T, int kNT, int K>
__device__ __forceinline__ void rows_times_rows(float (&acc)[kNT][4], const T* a, int lda, const T* b, int ldb) {
  static_assert(kNT % 2 == 0 && K % 16 == 0, "pairs of 8-column tiles, 16-step k");
  const int lane = int(threadIdx.x) % 32;
#pragma unroll
  for (int kk = 0; kk < K; kk += 16) {
    uint32_t fa[4];
    ldsm_x4(fa, a + (lane % 16) * lda + kk + lane / 16 * 8);
#pragma unroll
    for (int jp = 0; jp < kNT / 2; ++jp) {
      uint32_t fb[4];
      ldsm_x4(fb, b + (16 * jp + lane % 8 + lane / 16 * 8) * ldb + kk + lane / 8 % 2 * 8);
      mma16816<T>(acc[2 * jp], fa, fb[0], fb[1]);
      mma16816<T>(acc[2 * jp + 1], fa, fb[2], fb[3]);
    }
  }
}

// An (R x Cols) fp32 tile, rows row_at(r) for r < rows, columns < cols, into shared memory as
// 16-bit T (zeros outside), 16-byte reads when vec: the fp32 states and dy as mma operands.
template <int R, int Cols, int NT, typename T, typename Row>
__device__ __forceinline__ void stage_f32_as(T* dst, int ld, const Row& row_at, int rows, int cols, bool vec) {
  constexpr int V = 8;
  static_assert(sizeof(T) == 2 && Cols % V == 0, "16-bit tiles of whole 16-byte pieces");
  for (int i = threadIdx.x; i < R * (Cols / V); i += NT) {
    const int r = i / (Cols / V), c = (i % (Cols / V)) * V;
    const float* src = row_at(r) + c;
    float v[V];
    if (r < rows && vec && c + V <= cols) {
      const float4 lo = *reinterpret_cast<const float4*>(src), hi = *reinterpret_cast<const float4*>(src + 4);
      v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = r < rows && c + j < cols ? src[j] : 0.0f;
    }
    uint4 w;
    w.x = pack2(v[0], v[1], T()), w.y = pack2(v[2], v[3], T());
    w.z = pack2(v[4], v[5], T()), w.w = pack2(v[6], v[7], T());
    *reinterpret_cast<uint4*>(dst + r * ld + c) = w;
  }
}

// A register of two 16-bit values, each times its weight in fp32 and rounded once; a weight of
// exactly 0 gives 0 whatever the value (a masked step's NaN stays out).
template <typename T>
__device__ __forceinline__ uint32_t scale2(uint32_t v, float w_lo, float w_hi) {
  const T* e = reinterpret_cast<const T*>(&v);
  const float lo = w_lo != 0.0f ? to_float(e[0]) * w_lo : 0.0f;
  const float hi = w_hi != 0.0f ? to_float(e[1]) * w_hi : 0.0f;
  return pack2(lo, hi, T());
}

#endif  // MK_SSD_MMA

}  // namespace mma
}  // namespace ssd
}  // namespace mamba_kernels
