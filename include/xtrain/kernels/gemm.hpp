#pragma once
/// \file gemm.hpp
/// Single-precision GEMM, C = alpha * op(A) * op(B) + beta * C, row-major, any transposition.
/// Blocked and packed as in BLIS (Van Zee & van de Geijn, "BLIS: A Framework for Rapidly
/// Instantiating BLAS Functionality", TOMS 2015): op(B) is packed into NR-wide column panels,
/// op(A) into MR-high row panels, and an MR x NR register-blocked xsimd micro-kernel does the
/// FMAs. Scalar twin: kernels/reference/gemm.hpp.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "xtrain/kernels/simd.hpp"

namespace xtrain::kernels {

/// Whether an operand is used as stored or transposed.
enum class Trans : bool { no = false, yes = true };

namespace detail {

template <class Arch>
struct GemmShape {
  static constexpr std::size_t lanes = simd::lanes<Arch>;
  static constexpr std::size_t nr = 2 * lanes;  ///< columns of a register tile
  /// Rows of a register tile: 8 x 2 accumulators fit the 32 registers of AVX-512, 6 x 2 the 16 of SSE/AVX.
  static constexpr std::size_t mr = lanes >= 16 ? 8 : 6;
  static constexpr std::size_t kc = 256;      ///< depth of a packed block (fits L1 with a B panel)
  static constexpr std::size_t mc = mr * 16;  ///< rows of a packed A block (fits L2)
  static constexpr std::size_t nc = 2048;     ///< columns of a packed B block
};

/// Scratch for packed panels, reused across calls on the same thread (no allocation per call
/// once warm).
inline std::vector<float, xsimd::aligned_allocator<float, 64>>& pack_buffer(int which) {
  thread_local std::vector<float, xsimd::aligned_allocator<float, 64>> buffers[2];
  return buffers[which];
}

/// Packs op(B)[k0:k0+kc, j0:j0+nc] into panels of NR columns: panel p holds kc rows of NR floats,
/// zero-padded past the last column.
template <class Arch>
void pack_b(Trans tb, const float* B, std::size_t ldb, std::size_t k0, std::size_t kc, std::size_t j0, std::size_t nc,
            float* dst) {
  constexpr std::size_t nr = GemmShape<Arch>::nr;
  for (std::size_t jp = 0; jp < nc; jp += nr) {
    const std::size_t width = std::min(nr, nc - jp);
    float* panel = dst + jp * kc;
    if (tb == Trans::no) {
      for (std::size_t k = 0; k < kc; ++k) {
        const float* src = B + (k0 + k) * ldb + j0 + jp;
        float* out = panel + k * nr;
        std::size_t j = 0;
        for (; j < width; ++j) out[j] = src[j];
        for (; j < nr; ++j) out[j] = 0.0f;
      }
    } else {
      if (width < nr)
        for (std::size_t k = 0; k < kc; ++k)
          for (std::size_t j = width; j < nr; ++j) panel[k * nr + j] = 0.0f;
      for (std::size_t j = 0; j < width; ++j) {
        const float* src = B + (j0 + jp + j) * ldb + k0;
        for (std::size_t k = 0; k < kc; ++k) panel[k * nr + j] = src[k];
      }
    }
  }
}

/// Packs op(A)[i0:i0+mc, k0:k0+kc] into panels of MR rows: panel p holds kc columns of MR floats.
template <class Arch>
void pack_a(Trans ta, const float* A, std::size_t lda, std::size_t i0, std::size_t mc, std::size_t k0, std::size_t kc,
            float* dst) {
  constexpr std::size_t mr = GemmShape<Arch>::mr;
  for (std::size_t ip = 0; ip < mc; ip += mr) {
    const std::size_t height = std::min(mr, mc - ip);
    float* panel = dst + ip * kc;
    if (ta == Trans::yes) {
      for (std::size_t k = 0; k < kc; ++k) {
        const float* src = A + (k0 + k) * lda + i0 + ip;
        float* out = panel + k * mr;
        std::size_t i = 0;
        for (; i < height; ++i) out[i] = src[i];
        for (; i < mr; ++i) out[i] = 0.0f;
      }
    } else {
      if (height < mr)
        for (std::size_t k = 0; k < kc; ++k)
          for (std::size_t i = height; i < mr; ++i) panel[k * mr + i] = 0.0f;
      for (std::size_t i = 0; i < height; ++i) {
        const float* src = A + (i0 + ip + i) * lda + k0;
        for (std::size_t k = 0; k < kc; ++k) panel[k * mr + i] = src[k];
      }
    }
  }
}

/// C[0:mr, 0:nr] = alpha * A * Bp + beta * C for a packed B panel; `rows`/`cols` clip the store.
/// A is a packed panel (PackedA: element (r, k) at a[k * mr + r]) or, when op(A) = A, the rows of A
/// itself (element (r, k) at a[r * lda + k]; rows past `rows` re-read the last row, never stored):
/// skipping A's packing saves a copy of A per call, which dominates small GEMMs.
template <class Arch, bool PackedA>
inline void micro_kernel(std::size_t kc, const float* __restrict a, std::size_t lda, const float* __restrict bp,
                         float alpha, float beta, float* __restrict c, std::size_t ldc, std::size_t rows,
                         std::size_t cols) {
  using shape = GemmShape<Arch>;
  using B = simd::batch<float, Arch>;
  constexpr std::size_t mr = shape::mr, nr = shape::nr, w = shape::lanes;
  constexpr std::size_t k_stride = PackedA ? mr : 1;
  const float* arow[mr];
  for (std::size_t r = 0; r < mr; ++r) arow[r] = PackedA ? a + r : a + std::min(r, rows - 1) * lda;
  B acc0[mr], acc1[mr];
#pragma GCC unroll 16
  for (std::size_t r = 0; r < mr; ++r) acc0[r] = acc1[r] = B(0.0f);
  for (std::size_t k = 0; k < kc; ++k) {
    const B b0 = B::load_aligned(bp + k * nr);
    const B b1 = B::load_aligned(bp + k * nr + w);
#pragma GCC unroll 16
    for (std::size_t r = 0; r < mr; ++r) {
      const B av(arow[r][k * k_stride]);
      acc0[r] = xsimd::fma(av, b0, acc0[r]);
      acc1[r] = xsimd::fma(av, b1, acc1[r]);
    }
  }
  const B va(alpha), vb(beta);
  if (rows == mr && cols == nr) {
#pragma GCC unroll 16
    for (std::size_t r = 0; r < mr; ++r) {
      float* row = c + r * ldc;
      if (beta == 0.0f) {
        (va * acc0[r]).store_unaligned(row);
        (va * acc1[r]).store_unaligned(row + w);
      } else {
        xsimd::fma(va, acc0[r], vb * B::load_unaligned(row)).store_unaligned(row);
        xsimd::fma(va, acc1[r], vb * B::load_unaligned(row + w)).store_unaligned(row + w);
      }
    }
    return;
  }
  alignas(64) float tile[mr * nr];
  for (std::size_t r = 0; r < mr; ++r) {
    acc0[r].store_aligned(tile + r * nr);
    acc1[r].store_aligned(tile + r * nr + w);
  }
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < cols; ++j) {
      float& out = c[r * ldc + j];
      out = beta == 0.0f ? alpha * tile[r * nr + j] : alpha * tile[r * nr + j] + beta * out;
    }
}

/// The BLIS loop nest: blocks of op(B) packed by `pack_b(k0, kc, j0, nc, dst)`, blocks of op(A)
/// packed by `pack_a(i0, mc, k0, kc, dst)` or, when `a_rows` is not null, read in place (row i
/// at a_rows + i * lda). Shared by the fp32 GEMM and the widening low-precision one.
template <class Arch, class PackB, class PackA>
void gemm_blocked(std::size_t M, std::size_t N, std::size_t K, float alpha, const float* a_rows, std::size_t lda,
                  float beta, float* C, std::size_t ldc, PackB&& pack_b, PackA&& pack_a) {
  using shape = GemmShape<Arch>;
  auto& bbuf = pack_buffer(0);
  auto& abuf = pack_buffer(1);
  const std::size_t nc_max = std::min(shape::nc, (N + shape::nr - 1) / shape::nr * shape::nr);
  const std::size_t mc_max = std::min(shape::mc, (M + shape::mr - 1) / shape::mr * shape::mr);
  const std::size_t kc_max = std::min(shape::kc, K);
  if (bbuf.size() < nc_max * kc_max) bbuf.resize(nc_max * kc_max);
  if (abuf.size() < mc_max * kc_max) abuf.resize(mc_max * kc_max);

  for (std::size_t j0 = 0; j0 < N; j0 += shape::nc) {
    const std::size_t nc = std::min(shape::nc, N - j0);
    for (std::size_t k0 = 0; k0 < K; k0 += shape::kc) {
      const std::size_t kc = std::min(shape::kc, K - k0);
      const float beta_block = k0 == 0 ? beta : 1.0f;
      pack_b(k0, kc, j0, nc, bbuf.data());
      for (std::size_t i0 = 0; i0 < M; i0 += shape::mc) {
        const std::size_t mc = std::min(shape::mc, M - i0);
        if (!a_rows) pack_a(i0, mc, k0, kc, abuf.data());
        for (std::size_t jr = 0; jr < nc; jr += shape::nr)
          for (std::size_t ir = 0; ir < mc; ir += shape::mr) {
            float* c = C + (i0 + ir) * ldc + j0 + jr;
            const std::size_t rows = std::min(shape::mr, mc - ir), cols = std::min(shape::nr, nc - jr);
            if (!a_rows)
              micro_kernel<Arch, true>(kc, abuf.data() + ir * kc, 0, bbuf.data() + jr * kc, alpha, beta_block, c, ldc,
                                       rows, cols);
            else
              micro_kernel<Arch, false>(kc, a_rows + (i0 + ir) * lda + k0, lda, bbuf.data() + jr * kc, alpha,
                                        beta_block, c, ldc, rows, cols);
          }
      }
    }
  }
}

}  // namespace detail

/// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C (row-major; op(X) = X or X^T).
/// Requires: lda/ldb/ldc are the row strides of A, B, C as stored. beta == 0 ignores C's contents
/// (NaN in C does not propagate), as BLAS does.
template <class Arch = simd::default_arch>
void gemm(Trans ta, Trans tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A, std::size_t lda,
          const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.0f) {
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  detail::gemm_blocked<Arch>(
      M, N, K, alpha, ta == Trans::no ? A : nullptr, lda, beta, C, ldc,
      [&](std::size_t k0, std::size_t kc, std::size_t j0, std::size_t nc, float* dst) {
        detail::pack_b<Arch>(tb, B, ldb, k0, kc, j0, nc, dst);
      },
      [&](std::size_t i0, std::size_t mc, std::size_t k0, std::size_t kc, float* dst) {
        detail::pack_a<Arch>(ta, A, lda, i0, mc, k0, kc, dst);
      });
}

}  // namespace xtrain::kernels
