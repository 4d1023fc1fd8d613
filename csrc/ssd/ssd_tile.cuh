// Block-wide products of shared-memory tiles for the SSD forward and backward: TileAcc<TS, R, Cols, NT, kTC>
// accumulates an (R x Cols) fp32 tile of A (R x K) times B (K x Cols), both in shared memory in
// TS, each operand row- or column-major. Two forms with one interface:
//   kTC = true  (16-bit TS, sm_80 on): warp w of the block owns rows 16w..16w+15 as Cols / 16
//               wmma accumulator fragments (mma.sync m16n8k16, fp32 accumulation). R is
//               16 warps. A causal product (k <= row) skips the k-steps at and above the warp's
//               strip: the caller adds the 16 x 16 diagonal blocks itself (kSplitsDiagonal),
//               unless B's rows there are all finite (tile_finite): then mma_through /
//               mma_upper_from take the diagonal blocks on tensor cores too, the masked terms
//               adding exact zeros.
//   kTC = false (fp32 TS, or sm_75): FMAs, each thread owning a small block of rows and
//               columns; a causal product takes exactly the terms k <= row.
// Either way a term the causal mask drops never meets a non-finite B: it is not multiplied, or
// (the dense forms) B's rows there were checked finite; so a NaN or Inf in B's row k cannot reach
// the rows above k through 0 * NaN.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "vec_io.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MK_SSD_TENSOR_CORES 1
#include <mma.h>
#else
#define MK_SSD_TENSOR_CORES 0
#endif

namespace mamba_kernels {
namespace ssd {

template <typename T>
struct Is16Bit : std::integral_constant<bool, std::is_same<T, __half>::value ||
                                                  std::is_same<T, __nv_bfloat16>::value> {};

template <typename TS, int R, int Cols, int NT, bool kTC>
struct TileAcc;

template <typename TS, int R, int Cols, int NT>
struct TileAcc<TS, R, Cols, NT, false> {
  // Each thread holds a kTM x kTN block of the tile: columns cg + j * kCG, rows rg + i * kRG
  // (cg = thread % kCG, rg = thread / kCG), so a k-step loads kTM + kTN values for kTM * kTN
  // FMAs; a warp's loads of B's row are consecutive and of A's column two addresses.
  static constexpr bool kSplitsDiagonal = false;
  static constexpr int kTN = 4;
  static constexpr int kCG = Cols / kTN;  // column groups
  static constexpr int kRG = NT / kCG;    // row groups
  static constexpr int kTM = R / kRG;
  static_assert(Cols % kTN == 0 && NT % kCG == 0 && R % kRG == 0 && kTM >= 1, "TileAcc: threads must tile the tile");
  float v[kTM][kTN];

  __device__ __forceinline__ int col(int j) const { return int(threadIdx.x) % kCG + j * kCG; }
  __device__ __forceinline__ int row(int i) const { return int(threadIdx.x) / kCG + i * kRG; }

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
#pragma unroll
      for (int j = 0; j < kTN; ++j) v[i][j] = 0.0f;
    }
  }

  // A (R x K): (r, k) at a[r * lda + k] when kARow, else a[k * lda + r]; B (K x Cols): (k, c)
  // at b[k * ldb + c] when kBRow, else b[c * ldb + k].
  template <bool kARow, bool kBRow>
  __device__ __forceinline__ void mma(const TS* a, int lda, const TS* b, int ldb, int K, bool causal) {
#pragma unroll 2
    for (int k = 0; k < K; ++k) {
      float bk[kTN];
#pragma unroll
      for (int j = 0; j < kTN; ++j) bk[j] = to_float(kBRow ? b[k * ldb + col(j)] : b[col(j) * ldb + k]);
#pragma unroll
      for (int i = 0; i < kTM; ++i) {
        const int r = row(i);
        if (causal && k > r) continue;
        const float ak = to_float(kARow ? a[r * lda + k] : a[k * lda + r]);
#pragma unroll
        for (int j = 0; j < kTN; ++j) v[i][j] += ak * bk[j];
      }
    }
  }

  // The dense forms (see the tensor-core TileAcc): here the same exact terms.
  template <bool kARow, bool kBRow>
  __device__ __forceinline__ void mma_through(const TS* a, int lda, const TS* b, int ldb, int K) {
    mma<kARow, kBRow>(a, lda, b, ldb, K, true);
  }
  template <bool kARow, bool kBRow>
  __device__ __forceinline__ void mma_upper_from(const TS* a, int lda, const TS* b, int ldb, int K) {
    mma_upper<kARow, kBRow>(a, lda, b, ldb, K);
  }

  // The anti-causal product (the backward's): exactly the terms k >= row.
  template <bool kARow, bool kBRow>
  __device__ __forceinline__ void mma_upper(const TS* a, int lda, const TS* b, int ldb, int K) {
#pragma unroll 2
    for (int k = 0; k < K; ++k) {
      float bk[kTN];
#pragma unroll
      for (int j = 0; j < kTN; ++j) bk[j] = to_float(kBRow ? b[k * ldb + col(j)] : b[col(j) * ldb + k]);
#pragma unroll
      for (int i = 0; i < kTM; ++i) {
        const int r = row(i);
        if (k < r) continue;
        const float ak = to_float(kARow ? a[r * lda + k] : a[k * lda + r]);
#pragma unroll
        for (int j = 0; j < kTN; ++j) v[i][j] += ak * bk[j];
      }
    }
  }

  __device__ __forceinline__ void store(float* s, int ld) const {
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
#pragma unroll
      for (int j = 0; j < kTN; ++j) s[row(i) * ld + col(j)] = v[i][j];
    }
  }
  __device__ __forceinline__ void load(const float* s, int ld) {
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
#pragma unroll
      for (int j = 0; j < kTN; ++j) v[i][j] = s[row(i) * ld + col(j)];
    }
  }
};

// Loads an (R x Cols) tile into shared memory: dst[r * ld + c] = row(r)[c * cs] * scale(r)
// (scale only with kScaled) in TS; 0 for r >= rows, c >= cols, and (kScaled) rows whose scale is
// exactly 0, whatever their values (a masked row's NaN stays out of the tile). With vec, row(r)
// is 16-byte aligned and unit-stride, and full 16-byte pieces are read as one vector; the rest
// element by element.
template <int R, int Cols, int NT, bool kScaled, typename TS, typename TG, typename Row, typename Scale>
__device__ __forceinline__ void load_tile(TS* dst, int ld, const Row& row, const Scale& scale, int rows, int cols,
                                          int64_t cs, bool vec) {
  constexpr int V = 16 / int(sizeof(TG));
  static_assert(Cols % V == 0, "tile columns in whole vectors");
  constexpr int CV = Cols / V;
  for (int i = threadIdx.x; i < R * CV; i += NT) {
    const int r = i / CV, c = (i % CV) * V;
    const float s = kScaled && r < rows ? scale(r) : 1.0f;
    const bool live = r < rows && (!kScaled || s != 0.0f);
    float v[V];
    if (live && vec && c + V <= cols) {
      load_floats<TG, V>(v, row(r) + c);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = live && c + j < cols ? to_float(row(r)[(c + j) * cs]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < V; ++j) dst[r * ld + c + j] = from_float<TS>(kScaled ? v[j] * s : v[j]);
  }
}

// Whether every value of an (R x Cols) shared-memory tile is finite, in every thread (a barrier:
// every thread must call it). A tile that passes may go through the dense causal products.
template <int R, int Cols, int NT, typename TS>
__device__ __forceinline__ bool tile_finite(const TS* t, int ld) {
  int ok = 1;
#pragma unroll 1
  for (int i = threadIdx.x; i < R * Cols; i += NT) ok &= isfinite(to_float(t[(i / Cols) * ld + i % Cols])) ? 1 : 0;
  return __syncthreads_and(ok) != 0;
}

#if MK_SSD_TENSOR_CORES
template <typename TS, int R, int Cols, int NT>
struct TileAcc<TS, R, Cols, NT, true> {
  static_assert(R == 16 * (NT / 32) && Cols % 16 == 0, "TileAcc: a 16-row strip per warp");
  static constexpr bool kSplitsDiagonal = true;
  static constexpr int kF = Cols / 16;
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> f[kF];

  __device__ __forceinline__ int row0() const { return (int(threadIdx.x) / 32) * 16; }

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int j = 0; j < kF; ++j) nvcuda::wmma::fill_fragment(f[j], 0.0f);
  }

  // K a multiple of 16; lda / ldb multiples of 8; operands 32-byte aligned at 16-row steps.
  template <bool kARow, bool kBRow>
  __device__ __forceinline__ void mma(const TS* a, int lda, const TS* b, int ldb, int K, bool causal) {
    mma_range<kARow, kBRow>(a, lda, b, ldb, 0, causal ? row0() : K);  // causal: strictly below the strip
  }

  // The causal product with the diagonal blocks on tensor cores: the k-steps below and through
  // the warp's strip. Only for a B whose rows there are all finite (tile_finite) and an A whose
  // entries above the diagonal are exact zeros: the masked terms then add exact zeros, and no
  // fix-up is needed.
  template <bool kARow, bool kBRow>
  __device__ __forceinline__ void mma_through(const TS* a, int lda, const TS* b, int ldb, int K) {
    const int kmax = row0() + 16;
    mma_range<kARow, kBRow>(a, lda, b, ldb, 0, kmax < K ? kmax : K);
  }

  // The anti-causal product (the backward's): the k-steps strictly above the warp's strip; the
  // caller adds the 16 x 16 diagonal blocks' terms k >= row itself (kSplitsDiagonal).
  template <bool kARow, bool kBRow>
  __device__ __forceinline__ void mma_upper(const TS* a, int lda, const TS* b, int ldb, int K) {
    mma_range<kARow, kBRow>(a, lda, b, ldb, row0() + 16, K);
  }

  // The anti-causal product from the warp's strip on, under mma_through's conditions (B finite
  // there, A's entries below the diagonal exact zeros).
  template <bool kARow, bool kBRow>
  __device__ __forceinline__ void mma_upper_from(const TS* a, int lda, const TS* b, int ldb, int K) {
    mma_range<kARow, kBRow>(a, lda, b, ldb, row0(), K);
  }

  // The k-steps [k_lo, k_hi) of the product (multiples of 16).
  template <bool kARow, bool kBRow>
  __device__ __forceinline__ void mma_range(const TS* a, int lda, const TS* b, int ldb, int k_lo, int k_hi) {
    namespace w = nvcuda::wmma;
    using ALayout = typename std::conditional<kARow, w::row_major, w::col_major>::type;
    using BLayout = typename std::conditional<kBRow, w::row_major, w::col_major>::type;
    const int r0 = row0();
    for (int k0 = k_lo; k0 < k_hi; k0 += 16) {
      w::fragment<w::matrix_a, 16, 16, 16, TS, ALayout> fa;
      w::load_matrix_sync(fa, kARow ? a + r0 * lda + k0 : a + k0 * lda + r0, lda);
#pragma unroll
      for (int j = 0; j < kF; ++j) {
        w::fragment<w::matrix_b, 16, 16, 16, TS, BLayout> fb;
        w::load_matrix_sync(fb, kBRow ? b + k0 * ldb + 16 * j : b + 16 * j * ldb + k0, ldb);
        w::mma_sync(f[j], fa, fb, f[j]);
      }
    }
  }

  __device__ __forceinline__ void store(float* s, int ld) const {
#pragma unroll
    for (int j = 0; j < kF; ++j) {
      nvcuda::wmma::store_matrix_sync(s + row0() * ld + 16 * j, f[j], ld, nvcuda::wmma::mem_row_major);
    }
  }
  __device__ __forceinline__ void load(const float* s, int ld) {
#pragma unroll
    for (int j = 0; j < kF; ++j) {
      nvcuda::wmma::load_matrix_sync(f[j], s + row0() * ld + 16 * j, ld, nvcuda::wmma::mem_row_major);
    }
  }
};
#endif

}  // namespace ssd
}  // namespace mamba_kernels
