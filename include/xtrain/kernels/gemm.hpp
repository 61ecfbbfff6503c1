#pragma once
/// \file gemm.hpp
/// Single-precision GEMM, C = alpha * op(A) * op(B) + beta * C, row-major, any transposition.
/// Blocked and packed as in BLIS (Van Zee & van de Geijn, "BLIS: A Framework for Rapidly
/// Instantiating BLAS Functionality", TOMS 2015): op(B) is packed into NR-wide column panels,
/// op(A) into MR-high row panels, and an MR x NR register-blocked xsimd micro-kernel does the
/// FMAs. Scalar twin: kernels/reference/gemm.hpp.

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <type_traits>

#include "xtrain/backend/executor.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/simd.hpp"

#if defined(__AVX__)
#include <immintrin.h>
#endif

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

/// n elements of S as fp32 values rounded to the compute type T: copied (S = T = float),
/// widened (S = T), or rounded through T (S = float, T = bf16/fp16).
template <class T, class S>
void load_rounded(const S* src, std::size_t n, float* out) noexcept {
  if constexpr (std::is_same_v<S, float> && std::is_same_v<T, float>) {
    std::copy(src, src + n, out);
  } else if constexpr (std::is_same_v<S, float>) {
    alignas(64) T tmp[256];
    for (std::size_t i = 0; i < n; i += 256) {
      const std::size_t m = std::min<std::size_t>(256, n - i);
      from_float(src + i, tmp, m);
      to_float(tmp, out + i, m);
    }
  } else {
    to_float(src, out, n);
  }
}

#if defined(__AVX__)
/// The 8 x 8 transpose of r in registers (unpack, shuffle, permute: the classic in-register
/// transpose): on return r[j] holds what was lane j of r[0..7].
inline void transpose8x8(__m256 (&r)[8]) noexcept {
  __m256 t[8];
  for (std::size_t i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (std::size_t i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (std::size_t i = 0; i < 4; ++i) {
    t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
    t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
  }
  for (std::size_t i = 0; i < 8; ++i) r[i] = t[i];
}

/// dst[j * ld_dst + i] = src[i * ld_src + j] for an 8 x 8 block, so that packing a transposed
/// operand moves 8 floats per store.
inline void transpose8x8(const float* src, std::size_t ld_src, float* dst, std::size_t ld_dst) noexcept {
  __m256 r[8];
  for (std::size_t i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ld_src);
  transpose8x8(r);
  for (std::size_t i = 0; i < 8; ++i) _mm256_storeu_ps(dst + i * ld_dst, r[i]);
}
#endif

/// Packs `count` lines (columns of op(B), or rows of op(A)) starting at line c0, over depth
/// [k0, k0 + kc), into panels of W lines: panel p holds kc groups of W floats, zero-padded past
/// the last line. Element (k, c) is X[k * ld + c] when `contiguous` (a depth step is a row of X),
/// else X[c * ld + k]. Values are rounded to the compute type T (float: copied as they are).
/// Requires kc <= 256 (GemmShape::kc).
template <std::size_t W, class T = float, class S>
void pack_panels(bool contiguous, const S* X, std::size_t ld, std::size_t c0, std::size_t count, std::size_t k0,
                 std::size_t kc, float* dst) {
  constexpr std::size_t max_kc = 256;
  alignas(64) float row[max_kc];  // a converted line (16-bit sources)
  for (std::size_t cp = 0; cp < count; cp += W) {
    const std::size_t width = std::min(W, count - cp);
    float* panel = dst + cp * kc;
    if (contiguous) {
      if constexpr (std::is_same_v<S, float> && std::is_same_v<T, float>) {
        if (width == W) {  // a constant count: moves in registers, not a call to memmove per line
          for (std::size_t k = 0; k < kc; ++k) {
            const float* line = X + (k0 + k) * ld + c0 + cp;
            XTRAIN_UNROLL(32)
            for (std::size_t i = 0; i < W; ++i) panel[k * W + i] = line[i];
          }
          continue;
        }
      }
      for (std::size_t k = 0; k < kc; ++k) {
        float* out = panel + k * W;
        load_rounded<T>(X + (k0 + k) * ld + c0 + cp, width, out);
        std::fill(out + width, out + W, 0.0f);
      }
      continue;
    }
    if (width < W)
      for (std::size_t k = 0; k < kc; ++k) std::fill(panel + k * W + width, panel + (k + 1) * W, 0.0f);
    std::size_t c_done = 0;
#if defined(__AVX__)
    if constexpr (std::is_same_v<S, float> && std::is_same_v<T, float> && W % 8 == 0) {
      // Whole 8 x 8 blocks through registers; the ragged edges below, one float at a time.
      const std::size_t c8 = width / 8 * 8, k8 = kc / 8 * 8;
      for (std::size_t c = 0; c < c8; c += 8) {
        const float* lines = X + (c0 + cp + c) * ld + k0;
        for (std::size_t k = 0; k < k8; k += 8) transpose8x8(lines + k, ld, panel + k * W + c, W);
        for (std::size_t k = k8; k < kc; ++k)
          for (std::size_t i = 0; i < 8; ++i) panel[k * W + c + i] = lines[i * ld + k];
      }
      c_done = c8;
    }
#endif
    for (std::size_t c = c_done; c < width; ++c) {
      const S* line = X + (c0 + cp + c) * ld + k0;
      const float* src;
      if constexpr (std::is_same_v<S, float> && std::is_same_v<T, float>) {
        src = line;
      } else {
        assert(kc <= max_kc && "gemm_blocked packs blocks of at most 256");
        load_rounded<T>(line, kc, row);
        src = row;
      }
      for (std::size_t k = 0; k < kc; ++k) panel[k * W + c] = src[k];
    }
  }
}

/// Packs op(B)[k0:k0+kc, j0:j0+nc] into panels of NR columns.
template <class Arch, class T = float, class S>
void pack_b(Trans tb, const S* B, std::size_t ldb, std::size_t k0, std::size_t kc, std::size_t j0, std::size_t nc,
            float* dst) {
  pack_panels<GemmShape<Arch>::nr, T>(tb == Trans::no, B, ldb, j0, nc, k0, kc, dst);
}

/// Packs op(A)[i0:i0+mc, k0:k0+kc] into panels of MR rows.
template <class Arch, class T = float, class S>
void pack_a(Trans ta, const S* A, std::size_t lda, std::size_t i0, std::size_t mc, std::size_t k0, std::size_t kc,
            float* dst) {
  pack_panels<GemmShape<Arch>::mr, T>(ta == Trans::yes, A, lda, i0, mc, k0, kc, dst);
}

/// Requests the lines of a register tile of C (rows x cols elements, cols <= 32) for writing, before the
/// products that fill it: a layer's output is usually not in cache (the step's activations
/// outgrow it), and the tile's stores at the end would each wait for their line. With the misses
/// overlapping the products, products of 768 x 512 x 128 into cold memory ran at 94-96 GFLOP/s
/// instead of 67-72 (benchmarks/RESULTS.md, "Prefetching C, ...").
template <class E>
inline void prefetch_tile(const E* c, std::size_t ldc, std::size_t rows, std::size_t cols) noexcept {
  // In asm: GCC deletes a loop of __builtin_prefetch as a loop without effects.
  const auto line = [](const E* p) {
#if defined(__PRFCHW__)
    asm volatile("prefetchw %0" : : "m"(*p));
#elif defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetcht0 %0" : : "m"(*p));
#else
    __builtin_prefetch(p, 1, 3);
#endif
  };
  for (std::size_t r = 0; r < rows; ++r) {
    const E* row = c + r * ldc;
    line(row);
    line(row + std::min<std::size_t>(16, cols - 1));
    line(row + cols - 1);
  }
}

/// c[r, j] = alpha * tile[r, j] + beta * c[r, j] (+ bias[j] when not null; beta == 0 ignores c)
/// for r < rows, j < cols: the store of a partial register tile.
inline void store_tile(const float* tile, std::size_t ld_tile, float alpha, float beta, const float* bias, float* c,
                       std::size_t ldc, std::size_t rows, std::size_t cols) noexcept {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < cols; ++j) {
      float& out = c[r * ldc + j];
      const float base = beta == 0.0f ? 0.0f : beta * out;
      if (bias)
        out = alpha * tile[r * ld_tile + j] + (beta == 0.0f ? bias[j] : base + bias[j]);
      else
        out = beta == 0.0f ? alpha * tile[r * ld_tile + j] : alpha * tile[r * ld_tile + j] + base;
    }
}

/// C[0:mr, 0:nr] = alpha * A * Bp + beta * C for a packed B panel; `rows`/`cols` clip the store.
/// A is a packed panel (PackedA: element (r, k) at a[k * mr + r]) or, when op(A) = A, the rows of A
/// itself (element (r, k) at a[r * lda + k]; rows past `rows` re-read the last row, never stored):
/// skipping A's packing saves a copy of A per call, which dominates small GEMMs.
/// With PackedB false, bp is B itself (row k at bp + k * ldb, NR columns of it read in place).
/// A bias, when not null, is added to each row of the tile (bias[j] to column j) as the tile is
/// stored: alpha * A * Bp + beta * C + bias.
template <class Arch, bool PackedA, bool PackedB = true>
inline void micro_kernel(std::size_t kc, const float* __restrict a, std::size_t lda, const float* __restrict bp,
                         float alpha, float beta, float* __restrict c, std::size_t ldc, std::size_t rows,
                         std::size_t cols, std::size_t ldb = 0, const float* __restrict bias = nullptr) {
  using shape = GemmShape<Arch>;
  using B = simd::batch<float, Arch>;
  constexpr std::size_t mr = shape::mr, nr = shape::nr, w = shape::lanes;
  constexpr std::size_t k_stride = PackedA ? mr : 1;
  const float* arow[mr];
  for (std::size_t r = 0; r < mr; ++r) arow[r] = PackedA ? a + r : a + std::min(r, rows - 1) * lda;
  prefetch_tile(c, ldc, rows, cols);
  B acc0[mr], acc1[mr];
  XTRAIN_UNROLL(16)
  for (std::size_t r = 0; r < mr; ++r) acc0[r] = acc1[r] = B(0.0f);
  for (std::size_t k = 0; k < kc; ++k) {
    B b0, b1;
    if constexpr (PackedB) {
      b0 = B::load_aligned(bp + k * nr);
      b1 = B::load_aligned(bp + k * nr + w);
    } else {
      b0 = B::load_unaligned(bp + k * ldb);
      b1 = B::load_unaligned(bp + k * ldb + w);
    }
    XTRAIN_UNROLL(16)
    for (std::size_t r = 0; r < mr; ++r) {
      const B av(arow[r][k * k_stride]);
      acc0[r] = xsimd::fma(av, b0, acc0[r]);
      acc1[r] = xsimd::fma(av, b1, acc1[r]);
    }
  }
  const B va(alpha), vb(beta);
  if (rows == mr && cols == nr) {
    if (beta == 0.0f && !bias) {
      XTRAIN_UNROLL(16)
      for (std::size_t r = 0; r < mr; ++r) {
        (va * acc0[r]).store_unaligned(c + r * ldc);
        (va * acc1[r]).store_unaligned(c + r * ldc + w);
      }
      return;
    }
    const B bias0 = bias ? B::load_unaligned(bias) : B(0.0f), bias1 = bias ? B::load_unaligned(bias + w) : B(0.0f);
    XTRAIN_UNROLL(16)
    for (std::size_t r = 0; r < mr; ++r) {
      float* row = c + r * ldc;
      if (beta == 0.0f) {
        xsimd::fma(va, acc0[r], bias0).store_unaligned(row);
        xsimd::fma(va, acc1[r], bias1).store_unaligned(row + w);
      } else if (!bias) {
        xsimd::fma(va, acc0[r], vb * B::load_unaligned(row)).store_unaligned(row);
        xsimd::fma(va, acc1[r], vb * B::load_unaligned(row + w)).store_unaligned(row + w);
      } else {
        xsimd::fma(va, acc0[r], xsimd::fma(vb, B::load_unaligned(row), bias0)).store_unaligned(row);
        xsimd::fma(va, acc1[r], xsimd::fma(vb, B::load_unaligned(row + w), bias1)).store_unaligned(row + w);
      }
    }
    return;
  }
  alignas(64) float tile[mr * nr];
  for (std::size_t r = 0; r < mr; ++r) {
    acc0[r].store_aligned(tile + r * nr);
    acc1[r].store_aligned(tile + r * nr + w);
  }
  store_tile(tile, nr, alpha, beta, bias, c, ldc, rows, cols);
}

#if defined(__AVX512F__)
/// {sum of a's lanes, of b's, of c's, of d's}. Every sum is taken in the same order whichever
/// slot it is in (lanes l and l + 2 of each 128-bit quarter, then the pairs, then quarters 0 + 2
/// and 1 + 3, then those two), so an element of C does not depend on the tile it falls in.
inline __m128 sum_lanes4(__m512 a, __m512 b, __m512 c, __m512 d) noexcept {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 q = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  // AVX512F only (no DQ's extractf32x8): the upper half through the double view.
  const __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(q), 1));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(q), upper);
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/// C[0:rows, 0:cols] = alpha * A B^T + beta * C for a tile of at most 4 x 4, where A's rows and
/// B's rows lie along K (op(A) = A, op(B) = B^T, both read in place): 4 x 4 accumulators of 16
/// lanes of K, the last step masked, then each summed across its lanes (sum_lanes4). Rows or
/// columns past `rows`/`cols` re-read the last one and are never stored. No packing: for a
/// Linear layer's forward with few rows or columns, transposing an operand into panels costs
/// as much as the products (benchmarks/RESULTS.md, "The small GEMM").
[[gnu::always_inline]] inline void dot_tile(std::size_t K, const float* a, std::size_t lda, const float* b,
                                            std::size_t ldb, float alpha, float beta, float* c, std::size_t ldc,
                                            std::size_t rows, std::size_t cols, const float* bias) noexcept {
  constexpr std::size_t T = 4;
  // Four named rows of each (an array of pointers is vectorised by the compiler and then read
  // back lane by lane at every step).
  const float* const a0 = a;
  const float* const a1 = a + std::min<std::size_t>(1, rows - 1) * lda;
  const float* const a2 = a + std::min<std::size_t>(2, rows - 1) * lda;
  const float* const a3 = a + std::min<std::size_t>(3, rows - 1) * lda;
  const float* const b0 = b;
  const float* const b1 = b + std::min<std::size_t>(1, cols - 1) * ldb;
  const float* const b2 = b + std::min<std::size_t>(2, cols - 1) * ldb;
  const float* const b3 = b + std::min<std::size_t>(3, cols - 1) * ldb;
  __m512 acc[T][T];
  XTRAIN_UNROLL(4)
  for (std::size_t i = 0; i < T; ++i) XTRAIN_UNROLL(4)
  for (std::size_t j = 0; j < T; ++j) acc[i][j] = _mm512_setzero_ps();
  const auto step = [&](__m512 av0, __m512 av1, __m512 av2, __m512 av3, __m512 bv0, __m512 bv1, __m512 bv2, __m512 bv3)
      __attribute__((always_inline)) {
    // Both operands in registers: left to itself the compiler folds B's loads into the FMAs,
    // loading each of them four times, and the loop becomes bound by loads (1.35x slower).
    asm("" : "+v"(av0), "+v"(av1), "+v"(av2), "+v"(av3), "+v"(bv0), "+v"(bv1), "+v"(bv2), "+v"(bv3));
    const __m512 av[T] = {av0, av1, av2, av3}, bv[T] = {bv0, bv1, bv2, bv3};
    XTRAIN_UNROLL(4)
    for (std::size_t i = 0; i < T; ++i) XTRAIN_UNROLL(4)
    for (std::size_t j = 0; j < T; ++j) acc[i][j] = _mm512_fmadd_ps(av[i], bv[j], acc[i][j]);
  };
  std::size_t k = 0;
  for (; k + 16 <= K; k += 16)
    step(_mm512_loadu_ps(a0 + k), _mm512_loadu_ps(a1 + k), _mm512_loadu_ps(a2 + k), _mm512_loadu_ps(a3 + k),
         _mm512_loadu_ps(b0 + k), _mm512_loadu_ps(b1 + k), _mm512_loadu_ps(b2 + k), _mm512_loadu_ps(b3 + k));
  if (k < K) {  // the last step masked
    const auto m = static_cast<__mmask16>((1u << (K - k)) - 1);
    step(_mm512_maskz_loadu_ps(m, a0 + k), _mm512_maskz_loadu_ps(m, a1 + k), _mm512_maskz_loadu_ps(m, a2 + k),
         _mm512_maskz_loadu_ps(m, a3 + k), _mm512_maskz_loadu_ps(m, b0 + k), _mm512_maskz_loadu_ps(m, b1 + k),
         _mm512_maskz_loadu_ps(m, b2 + k), _mm512_maskz_loadu_ps(m, b3 + k));
  }
  // Sums of all four rows first: indexing acc by the run-time row count would keep it in memory.
  const __m128 va = _mm_set1_ps(alpha), vb = _mm_set1_ps(beta);
  __m128 sums[T];
  XTRAIN_UNROLL(4)
  for (std::size_t i = 0; i < T; ++i) sums[i] = _mm_mul_ps(va, sum_lanes4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
  for (std::size_t i = 0; i < rows; ++i) {
    const __m128 s = sums[i];
    float* row = c + i * ldc;
    if (cols == T) {
      __m128 base = _mm_setzero_ps();
      if (beta != 0.0f) base = _mm_mul_ps(vb, _mm_loadu_ps(row));
      if (bias) base = beta == 0.0f ? _mm_loadu_ps(bias) : _mm_add_ps(base, _mm_loadu_ps(bias));
      _mm_storeu_ps(row, beta == 0.0f && !bias ? s : _mm_add_ps(base, s));
      continue;
    }
    alignas(16) float t[T];
    _mm_store_ps(t, s);
    store_tile(t, T, 1.0f, beta, bias, row, ldc, 1, cols);
  }
}
#endif

/// Whether gemm computes C = A B^T with dot_tile rather than packed panels: with AVX-512, where
/// B is at most 128k values (512 KiB: it stays in L2 while every tile of 4 rows of A sweeps it;
/// at 2048^3 sweeping B from memory made the product 1.6x slower than packed panels), K is at
/// most 2048 (the 8 rows a tile reads, 64 KiB at most, stay in L1 or near it), and either K is at least 256 (the lane
/// sums are paid back: at K = 128 and 768 rows the packed panels are 8 % faster) or N is below the packed tile's width
/// (whose lanes would idle). The choice depends on the product's N and K only, never on M (the
/// batch), so splitting a batch over ranks or threads does not change it. Measured:
/// benchmarks/RESULTS.md, "The small GEMM".
template <class Arch>
constexpr bool use_dot_tiles(Trans ta, Trans tb, std::size_t N, std::size_t K) noexcept {
#if defined(__AVX512F__)
  if constexpr (simd::lanes<Arch> == 16)
    return ta == Trans::no && tb == Trans::yes && K <= 2048 && N * K <= (std::size_t{1} << 17) &&
           (K >= 256 || N < GemmShape<Arch>::nr);
#endif
  (void)ta, (void)tb, (void)N, (void)K;
  return false;
}

/// The BLIS loop nest: blocks of op(B) packed by `pack_b(k0, kc, j0, nc, dst)`, blocks of op(A)
/// packed by `pack_a(i0, mc, k0, kc, dst)` or, when `a_rows` is not null, read in place (row i
/// at a_rows + i * lda). When `b_rows` is not null (op(B) = B, K within one block), B's whole
/// register tiles of columns are read in place (row k at b_rows + k * ldb) and only a ragged last
/// tile is packed: with few rows of C each packed element would serve few tiles, and the copy
/// cost more than it saves. Every element of C is summed in the same order either way. Shared by
/// the fp32 GEMM and the widening low-precision one. The packed blocks live in `ws` (the calling
/// thread's workspace).
template <class Arch, class PackB, class PackA>
void gemm_blocked(backend::Workspace& ws, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* a_rows,
                  std::size_t lda, float beta, float* C, std::size_t ldc, PackB&& pack_b, PackA&& pack_a,
                  const float* b_rows = nullptr, std::size_t ldb = 0, const float* bias = nullptr) {
  using shape = GemmShape<Arch>;
  static_assert(shape::kc <= 256, "pack_panels converts lines of at most 256 values");
  assert(!b_rows || K <= shape::kc);
  const std::size_t nc_max = std::min(shape::nc, (N + shape::nr - 1) / shape::nr * shape::nr);
  const std::size_t mc_max = std::min(shape::mc, (M + shape::mr - 1) / shape::mr * shape::mr);
  const std::size_t kc_max = std::min(shape::kc, K);
  float* const bbuf = ws.get<float>(backend::Workspace::Slot::pack_b, (b_rows ? shape::nr : nc_max) * kc_max);
  float* const abuf = a_rows ? nullptr : ws.get<float>(backend::Workspace::Slot::pack_a, mc_max * kc_max);

  for (std::size_t j0 = 0; j0 < N; j0 += shape::nc) {
    const std::size_t nc = std::min(shape::nc, N - j0);
    const std::size_t n_full = b_rows ? nc / shape::nr * shape::nr : 0;  // tiles read in place
    for (std::size_t k0 = 0; k0 < K; k0 += shape::kc) {
      const std::size_t kc = std::min(shape::kc, K - k0);
      const float beta_block = k0 == 0 ? beta : 1.0f;
      const float* bias_block = k0 == 0 && bias ? bias + j0 : nullptr;  // added with the first block, as beta
      if (n_full < nc) pack_b(k0, kc, j0 + n_full, nc - n_full, bbuf);
      for (std::size_t i0 = 0; i0 < M; i0 += shape::mc) {
        const std::size_t mc = std::min(shape::mc, M - i0);
        if (!a_rows) pack_a(i0, mc, k0, kc, abuf);
        for (std::size_t jr = 0; jr < nc; jr += shape::nr) {
          const bool in_place = jr < n_full;
          const float* bp = in_place ? b_rows + k0 * ldb + j0 + jr : bbuf + (jr - n_full) * kc;
          for (std::size_t ir = 0; ir < mc; ir += shape::mr) {
            float* c = C + (i0 + ir) * ldc + j0 + jr;
            const std::size_t rows = std::min(shape::mr, mc - ir), cols = std::min(shape::nr, nc - jr);
            const float* ap = a_rows ? a_rows + (i0 + ir) * lda + k0 : abuf + ir * kc;
            const float* bias_tile = bias_block ? bias_block + jr : nullptr;
            if (a_rows && in_place)
              micro_kernel<Arch, false, false>(kc, ap, lda, bp, alpha, beta_block, c, ldc, rows, cols, ldb, bias_tile);
            else if (a_rows)
              micro_kernel<Arch, false>(kc, ap, lda, bp, alpha, beta_block, c, ldc, rows, cols, 0, bias_tile);
            else if (in_place)
              micro_kernel<Arch, true, false>(kc, ap, 0, bp, alpha, beta_block, c, ldc, rows, cols, ldb, bias_tile);
            else
              micro_kernel<Arch, true>(kc, ap, 0, bp, alpha, beta_block, c, ldc, rows, cols, 0, bias_tile);
          }
        }
      }
    }
  }
}

/// C = beta * C + bias (beta == 0 ignores C; bias[j] on column j, none when null): a product
/// with K == 0 or alpha == 0.
inline void scale_add_bias(std::size_t M, std::size_t N, float beta, const float* bias, float* C,
                           std::size_t ldc) noexcept {
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < N; ++j) {
      float& out = C[i * ldc + j];
      out = beta == 0.0f ? 0.0f : beta * out;
      if (bias) out += bias[j];
    }
}

/// Products smaller than this many multiply-adds run on one thread: a fork-join costs about a
/// microsecond, which such a product would not repay (benchmarks/RESULTS.md, "Threads").
inline constexpr std::size_t parallel_gemm_macs = std::size_t{1} << 21;

/// Splits C[M,N] over the threads of `e` and calls f(m0, m1, n0, n1) for each block, all of C when
/// one thread or a small product. Columns split at multiples of 32 (a multiple of every register
/// tile's width), rows at multiples of `row_align` (the tile's height), so that each element of
/// C is computed by the same instructions as without a split: the result is bitwise the same on
/// any number of threads. The dimension with more tiles is split (a tie: the columns). In a
/// Linear layer that keeps each thread on the same output features through forward (columns of
/// y), backward (rows of dW) and the optimizer (rows of W, the same halves of the arena), so the
/// data a thread reads is mostly data it wrote: moving cache lines between cores costs more
/// than the arithmetic at these sizes.
template <class F>
void split_gemm(backend::Executor* e, std::size_t M, std::size_t N, std::size_t K, std::size_t row_align, F&& f) {
  const std::size_t threads = backend::threads_of(e);
  if (threads > 1 && M * N * K >= parallel_gemm_macs) {
    constexpr std::size_t col_align = 32;
    const std::size_t col_tiles = (N + col_align - 1) / col_align, row_tiles = (M + row_align - 1) / row_align;
    if (col_tiles >= 2 && col_tiles >= row_tiles) {
      backend::parallel_for(e, N, 1, col_align, [&](std::size_t n0, std::size_t n1) { f(0, M, n0, n1); });
      return;
    }
    if (row_tiles >= 2) {
      backend::parallel_for(e, M, 1, row_align, [&](std::size_t m0, std::size_t m1) { f(m0, m1, 0, N); });
      return;
    }
  }
  f(0, M, 0, N);
}

}  // namespace detail

/// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C (row-major; op(X) = X or X^T), plus
/// bias[j] on column j of every row when `bias` (N floats) is not null: a Linear layer's
/// y = x W^T + b in one pass over y. The bias is added where beta's term is, with the first
/// block of K (one fma(alpha, sum, bias) as that block's tile is stored), so the bits are those of
/// the bias written into C first and the product added with beta = 1.
/// Requires: lda/ldb/ldc are the row strides of A, B, C as stored. beta == 0 ignores C's contents
/// (NaN in C does not propagate), as BLAS does. With an executor of several threads, a large
/// product is split over them (detail::split_gemm), with bitwise the same result. The packed
/// panels live in the executor's workspaces (without an executor: allocated for the call).
template <class Arch = simd::default_arch>
void gemm(Trans ta, Trans tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A, std::size_t lda,
          const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc, backend::Executor* executor = nullptr,
          const float* bias = nullptr) {
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.0f) {
    detail::scale_add_bias(M, N, beta, bias, C, ldc);
    return;
  }
  using shape = detail::GemmShape<Arch>;
  // The path is chosen for the whole product, so that every block of a split takes it.
  const bool one_tile_of_rows = ta == Trans::no && tb == Trans::no && M <= shape::mr && N >= shape::nr;
  // B read in place (one block of K, at most one packed block of rows): a Linear layer's weight
  // gradient and input gradient at small batches.
  const bool b_in_place = tb == Trans::no && K <= shape::kc && M <= shape::mc;
  [[maybe_unused]] const bool dot_tiles = detail::use_dot_tiles<Arch>(ta, tb, N, K);
  detail::split_gemm(executor, M, N, K, shape::mr, [&](std::size_t m0, std::size_t m1, std::size_t n0, std::size_t n1) {
    const float* a = ta == Trans::no ? A + m0 * lda : A + m0;
    const float* b = tb == Trans::no ? B + n0 : B + n0 * ldb;
    float* c = C + m0 * ldc + n0;
    const float* bias_n = bias ? bias + n0 : nullptr;
    const std::size_t m = m1 - m0, n = n1 - n0;
#if defined(__AVX512F__)
    if (dot_tiles) {
      for (std::size_t i = 0; i < m; i += 4)
        for (std::size_t j = 0; j < n; j += 4)
          detail::dot_tile(K, a + i * lda, lda, b + j * ldb, ldb, alpha, beta, c + i * ldc + j, ldc,
                           std::min<std::size_t>(4, m - i), std::min<std::size_t>(4, n - j),
                           bias_n ? bias_n + j : nullptr);
      return;
    }
#endif
    if (one_tile_of_rows) {
      // One tile of rows (a convolution with few output channels): each packed element of B would
      // serve one register tile, so packing B costs as much as the product. Both operands are read
      // in place; the columns past the last whole tile go through the packed path.
      // K in blocks of KC, C rounded after each as the packed path does: the same sums whatever M.
      const std::size_t n_full = n / shape::nr * shape::nr;
      for (std::size_t j = 0; j < n_full; j += shape::nr)
        for (std::size_t k0 = 0; k0 < K; k0 += shape::kc)
          detail::micro_kernel<Arch, false, false>(std::min(shape::kc, K - k0), a + k0, lda, b + k0 * ldb + j, alpha,
                                                   k0 == 0 ? beta : 1.0f, c + j, ldc, m, shape::nr, ldb,
                                                   k0 == 0 && bias_n ? bias_n + j : nullptr);
      if (n_full < n)
        gemm<Arch>(ta, tb, m, n - n_full, K, alpha, a, lda, b + n_full, ldb, beta, c + n_full, ldc, executor,
                   bias_n ? bias_n + n_full : nullptr);
      return;
    }
    const backend::WorkspaceFor ws(executor);  // this thread's
    detail::gemm_blocked<Arch>(
        *ws, m, n, K, alpha, ta == Trans::no ? a : nullptr, lda, beta, c, ldc,
        [&](std::size_t k0, std::size_t kc, std::size_t j0, std::size_t nc, float* dst) {
          detail::pack_b<Arch>(tb, b, ldb, k0, kc, j0, nc, dst);
        },
        [&](std::size_t i0, std::size_t mc, std::size_t k0, std::size_t kc, float* dst) {
          detail::pack_a<Arch>(ta, a, lda, i0, mc, k0, kc, dst);
        },
        b_in_place ? b : nullptr, ldb, bias_n);
  });
}

}  // namespace xtrain::kernels
