#pragma once
/// \file gemm_lowp.hpp
/// Mixed-precision GEMM: C(fp32) = alpha * op(A) * op(B) + beta * C, where the operands are
/// rounded to the compute type T (bf16 or fp16) and the products are accumulated in fp32. Each
/// operand may be stored as T (activations) or as fp32 (master weights: rounded to T while
/// packing, so the weights are never copied to a separate low-precision buffer).
///
/// Implementations, chosen at compile time (and AMX at run time):
/// - bf16 with AMX (kernels/gemm_amx.hpp; Intel Xeons of 2023 on): `tdpbf16ps` on 16 x 16 fp32
///   tiles, the B panels below and A as rows of pairs, where the processor and Linux allow it
///   (`amx::usable()`); 2.5-5x the `vdpbf16ps` rate on a Xeon, where `vdpbf16ps` is no faster than
///   fp32 FMA.
/// - bf16 with AVX512_BF16: `vdpbf16ps`, two multiply-adds per fp32 lane per instruction, twice
///   the fp32 FMA rate on AMD Zen 4. Operands are packed as bf16 pairs along K (B in 32-column
///   panels, A in 8-row panels, or read in place when it is already bf16 and not transposed).
/// - otherwise (fp16 on any CPU, bf16 without AVX512_BF16): operands are widened to fp32 while
///   packing (F16C / AVX-512 conversions where the target has them) and the fp32 micro-kernel of
///   kernels/gemm.hpp runs. Correct everywhere, and as fast as fp32, not faster.
/// Scalar twin: kernels/reference/gemm.hpp (`reference::gemm_lowp`).

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "xtrain/core/precision.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/gemm.hpp"
#include "xtrain/kernels/gemm_amx.hpp"
#include "xtrain/kernels/simd.hpp"

// GCC 12 warns "'__Y' may be used uninitialized" inside its own AVX-512 headers (the
// _mm512_undefined_* idiom, GCC bug 105593); silenced for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace xtrain::kernels {

/// Whether products in T run on native low-precision hardware in this build (else: widened to fp32).
template <class T>
inline constexpr bool native_lowp_gemm = std::is_same_v<T, bf16>&& XTRAIN_HAS_AVX512_BF16;

/// What the GEMM in precision T runs on in this build, for the start-up report.
template <class T>
std::string gemm_kernel_name() {
  if constexpr (std::is_same_v<T, float>) {
    return std::string("fp32 FMA (") + simd::arch_name() + ")";
  } else if constexpr (std::is_same_v<T, bf16>) {
    if constexpr (native_lowp_gemm<bf16>) {
      if (amx::usable()) return "amx (tdpbf16ps)";
      if constexpr (XTRAIN_HAS_AMX_BF16) return "avx512_bf16 (vdpbf16ps); AMX not used: " + std::string(amx::refusal());
      return "avx512_bf16 (vdpbf16ps)";
    }
    return std::string("emulated: widened to fp32 (") + simd::arch_name() + "), no AVX512_BF16 in this build";
  } else {
    if (std::string(fp16_convert_isa()) == "scalar")
      return std::string("emulated: scalar conversion to fp32 (") + simd::arch_name() + "), no F16C in this build";
    return std::string("") + fp16_convert_isa() + " conversion + fp32 FMA (" + simd::arch_name() + ")";
  }
}

namespace detail {

/// The widening implementation: packs fp32 panels and runs the fp32 micro-kernel.
template <class Arch, class T, class TA, class TB>
void gemm_widen(backend::Workspace& ws, Trans ta, Trans tb, std::size_t M, std::size_t N, std::size_t K, float alpha,
                const TA* A, std::size_t lda, const TB* B, std::size_t ldb, float beta, float* C, std::size_t ldc,
                const float* bias) {
  gemm_blocked<Arch>(
      ws, M, N, K, alpha, nullptr, 0, beta, C, ldc,
      [&](std::size_t k0, std::size_t kc, std::size_t j0, std::size_t nc, float* dst) {
        pack_b<Arch, T>(tb, B, ldb, k0, kc, j0, nc, dst);
      },
      [&](std::size_t i0, std::size_t mc, std::size_t k0, std::size_t kc, float* dst) {
        pack_a<Arch, T>(ta, A, lda, i0, mc, k0, kc, dst);
      },
      nullptr, 0, bias);
}

#if XTRAIN_HAS_AVX512_BF16
/// The AVX512_BF16 implementation. A "word" holds the bf16 pair (k, k+1) of one row or column,
/// element k in the low half, as `vdpbf16ps` reads it.
namespace dot {

constexpr std::size_t mr = 8;     ///< rows of a register tile (8 x 2 accumulators)
constexpr std::size_t nr = 32;    ///< columns of a register tile (two zmm of 16 fp32)
constexpr std::size_t kc = 512;   ///< K elements per packed block (256 words: a B panel is 32 KiB)
constexpr std::size_t mc = 128;   ///< rows of a packed A block
constexpr std::size_t nc = 1024;  ///< columns of a packed B block

using word_unaligned = std::uint32_t __attribute__((aligned(2), may_alias));

/// Up to 16 consecutive elements as 16 bf16 (zero past n).
inline __m256i load16(const float* p, std::size_t n) noexcept {
  const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
  return kernels::detail::round_bf16(_mm512_maskz_loadu_ps(m, p));
}
inline __m256i load16(const bf16* p, std::size_t n) noexcept {
  const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
  return _mm256_maskz_loadu_epi16(m, p);
}

/// Words of two rows: lane j = (lo[j], hi[j]).
inline __m512i interleave(__m256i lo, __m256i hi) noexcept {
  return _mm512_or_si512(_mm512_cvtepu16_epi32(lo), _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
}

/// Pairs ACROSS stored rows: op(X)(k, c) = X[k * ld + c] (B not transposed, or A transposed).
/// Writes panels of `pw` words per k-pair (pw = nr for B, mr for A) for columns [c0, c0 + width),
/// `kp_rows` pairs per panel (at least (klen + 1) / 2; the pairs past K zero: AMX's whole tiles).
template <class S>
void pack_across(const S* X, std::size_t ld, std::size_t k0, std::size_t klen, std::size_t c0, std::size_t width,
                 std::size_t pw, std::uint32_t* dst, std::size_t kp_rows) {
  const std::size_t kp = (klen + 1) / 2;
  for (std::size_t cp = 0; cp < width; cp += pw) {
    const std::size_t w = std::min(pw, width - cp);
    std::uint32_t* panel = dst + cp * kp_rows;
    if (kp_rows > kp) std::memset(panel + kp * pw, 0, (kp_rows - kp) * pw * sizeof(std::uint32_t));
    for (std::size_t p = 0; p < kp; ++p) {
      const S* r0 = X + (k0 + 2 * p) * ld + c0 + cp;
      const bool has_hi = 2 * p + 1 < klen;
      for (std::size_t g = 0; g < pw; g += 16) {
        const std::size_t n = w > g ? std::min<std::size_t>(16, w - g) : 0;
        const __m256i lo = n ? load16(r0 + g, n) : _mm256_setzero_si256();
        const __m256i hi = n && has_hi ? load16(r0 + ld + g, n) : _mm256_setzero_si256();
        const __m512i words = interleave(lo, hi);
        const std::size_t store = std::min<std::size_t>(16, pw - g);
        _mm512_mask_storeu_epi32(panel + p * pw + g, __mmask16((1u << store) - 1u), words);
      }
    }
  }
}

/// Transposes a 16 x 16 matrix of 32-bit words held in 16 registers (row i -> column i).
inline void transpose16(__m512i r[16]) noexcept {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

/// Pairs ALONG stored rows: op(X)(k, c) = X[c * ld + k] (B transposed, or A not transposed).
/// 16 columns at a time: each column's 32 values become 16 words in one register, and a 16 x 16
/// transpose turns them into 16 k-pair rows of the panel.
/// Panels of `kp_rows` pairs, as pack_across.
template <class S>
void pack_along(const S* X, std::size_t ld, std::size_t k0, std::size_t klen, std::size_t c0, std::size_t width,
                std::size_t pw, std::uint32_t* dst, std::size_t kp_rows) {
  const std::size_t kp = (klen + 1) / 2;
  for (std::size_t cp = 0; cp < width; cp += pw) {
    const std::size_t w = std::min(pw, width - cp);
    std::uint32_t* panel = dst + cp * kp_rows;
    if (kp_rows > kp) std::memset(panel + kp * pw, 0, (kp_rows - kp) * pw * sizeof(std::uint32_t));
    for (std::size_t g = 0; g < pw; g += 16) {
      const std::size_t group = std::min<std::size_t>(16, pw - g);  // columns stored (8 for A panels)
      const __mmask16 store_mask = __mmask16((1u << group) - 1u);
      for (std::size_t k = 0; k < klen; k += 32) {
        const std::size_t n = std::min<std::size_t>(32, klen - k);
        __m512i r[16];
        for (std::size_t c = 0; c < 16; ++c) {
          if (g + c >= w || c >= group) {
            r[c] = _mm512_setzero_si512();
            continue;
          }
          const S* row = X + (c0 + cp + g + c) * ld + k0 + k;
          const __m256i lo = load16(row, n), hi = n > 16 ? load16(row + 16, n - 16) : _mm256_setzero_si256();
          r[c] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        }
        transpose16(r);
        const std::size_t words = (n + 1) / 2;
        for (std::size_t q = 0; q < words; ++q)
          _mm512_mask_storeu_epi32(panel + (k / 2 + q) * pw + g, store_mask, r[q]);
      }
    }
  }
}

/// C[0:mr, 0:nr] = alpha * A * B + beta * C over `kp` word pairs. A: packed (word (r, p) at
/// a[p * mr + r]) or in place (`arow[r][p]`).
/// One bf16 pair read where it lies (2-byte aligned): memcpy is the portable unaligned load (clang
/// does not lower an under-aligned typedef's access, and UBSan rightly flags it); it compiles to
/// one mov.
inline std::uint32_t load_word(const word_unaligned* q) noexcept {
  std::uint32_t w;
  std::memcpy(&w, static_cast<const void*>(q), sizeof w);
  return w;
}

/// The fp32 store of micro_kernel's tile.
[[gnu::always_inline]] inline void micro_kernel_store(const __m512 (&acc0)[mr], const __m512 (&acc1)[mr], __m512 va,
                                                      __m512 vb, float alpha, float beta, float* __restrict c,
                                                      std::size_t ldc, std::size_t rows, std::size_t cols,
                                                      const float* __restrict bias) {
  if (rows == mr && cols == nr) {
    const __m512 bias0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    const __m512 bias1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
    XTRAIN_UNROLL(8)
    for (std::size_t r = 0; r < mr; ++r) {
      float* row = c + r * ldc;
      if (beta == 0.0f && !bias) {
        _mm512_storeu_ps(row, _mm512_mul_ps(va, acc0[r]));
        _mm512_storeu_ps(row + 16, _mm512_mul_ps(va, acc1[r]));
      } else if (beta == 0.0f) {
        _mm512_storeu_ps(row, _mm512_fmadd_ps(va, acc0[r], bias0));
        _mm512_storeu_ps(row + 16, _mm512_fmadd_ps(va, acc1[r], bias1));
      } else if (!bias) {
        _mm512_storeu_ps(row, _mm512_fmadd_ps(va, acc0[r], _mm512_mul_ps(vb, _mm512_loadu_ps(row))));
        _mm512_storeu_ps(row + 16, _mm512_fmadd_ps(va, acc1[r], _mm512_mul_ps(vb, _mm512_loadu_ps(row + 16))));
      } else {
        _mm512_storeu_ps(row, _mm512_fmadd_ps(va, acc0[r], _mm512_fmadd_ps(vb, _mm512_loadu_ps(row), bias0)));
        _mm512_storeu_ps(row + 16, _mm512_fmadd_ps(va, acc1[r], _mm512_fmadd_ps(vb, _mm512_loadu_ps(row + 16), bias1)));
      }
    }
    return;
  }
  alignas(64) float tile[mr * nr];
  for (std::size_t r = 0; r < mr; ++r) {
    _mm512_store_ps(tile + r * nr, acc0[r]);
    _mm512_store_ps(tile + r * nr + 16, acc1[r]);
  }
  store_tile(tile, nr, alpha, beta, bias, c, ldc, rows, cols);
}

/// Stores a register tile: C = alpha * acc + beta * C (+ bias), C fp32, or bf16 (TC = bf16: beta
/// must be 0; the fp32 tile is rounded to bf16 as it is stored, as from_float would round it).
template <class TC>
[[gnu::always_inline]] inline void store_acc(const __m512 (&acc0)[mr], const __m512 (&acc1)[mr], float alpha,
                                             float beta, TC* __restrict c, std::size_t ldc, std::size_t rows,
                                             std::size_t cols, const float* __restrict bias) {
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  if constexpr (std::is_same_v<TC, bf16>) {
    assert(beta == 0.0f);
    (void)vb;
    if (rows == mr && cols == nr) {
      const __m512 bias0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
      const __m512 bias1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
      XTRAIN_UNROLL(8)
      for (std::size_t r = 0; r < mr; ++r) {
        auto* row = reinterpret_cast<__m256i*>(c + r * ldc);
        const __m512 v0 = bias ? _mm512_fmadd_ps(va, acc0[r], bias0) : _mm512_mul_ps(va, acc0[r]);
        const __m512 v1 = bias ? _mm512_fmadd_ps(va, acc1[r], bias1) : _mm512_mul_ps(va, acc1[r]);
        _mm256_storeu_si256(row, round_bf16(v0));
        _mm256_storeu_si256(row + 1, round_bf16(v1));
      }
      return;
    }
    alignas(64) float tile[mr * nr], out[mr * nr];
    for (std::size_t r = 0; r < mr; ++r) {
      _mm512_store_ps(tile + r * nr, acc0[r]);
      _mm512_store_ps(tile + r * nr + 16, acc1[r]);
    }
    store_tile(tile, nr, alpha, 0.0f, bias, out, nr, rows, cols);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < cols; ++j) c[r * ldc + j] = bf16::from_bits(float_to_bf16_bits(out[r * nr + j]));
  } else {
    micro_kernel_store(acc0, acc1, va, vb, alpha, beta, c, ldc, rows, cols, bias);
  }
}

/// C tile = alpha * A * B + beta * C (+ bias), stored by store_acc.
template <bool PackedA, class TC = float>
inline void micro_kernel(std::size_t kp, const std::uint32_t* __restrict a, const word_unaligned* const* arow,
                         const std::uint32_t* __restrict b, float alpha, float beta, TC* __restrict c, std::size_t ldc,
                         std::size_t rows, std::size_t cols, const float* __restrict bias) {
  prefetch_tile(c, ldc, rows, cols);
  __m512 acc0[mr], acc1[mr];
  XTRAIN_UNROLL(8)
  for (std::size_t r = 0; r < mr; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (std::size_t p = 0; p < kp; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_load_si512(b + p * nr);
    const __m512bh b1 = (__m512bh)_mm512_load_si512(b + p * nr + 16);
    XTRAIN_UNROLL(8)
    for (std::size_t r = 0; r < mr; ++r) {
      const std::uint32_t word = PackedA ? a[p * mr + r] : load_word(arow[r] + p);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(word));
      acc0[r] = _mm512_dpbf16_ps(acc0[r], av, b0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], av, b1);
    }
  }
  store_acc<TC>(acc0, acc1, alpha, beta, c, ldc, rows, cols, bias);
}

#if XTRAIN_HAS_AMX_BF16
/// op(A)'s rows [i0, i0 + mcur) and K [k0, k0 + klen) as AMX's A tiles read them: row r's pairs
/// at dst + r * kp_rows, zero past K up to kp_rows pairs and for the rows up to a multiple of 16.
template <class S>
void pack_rows(Trans ta, const S* A, std::size_t lda, std::size_t i0, std::size_t mcur, std::size_t k0,
               std::size_t klen, std::size_t kp_rows, std::uint32_t* dst) {
  const std::size_t mpad = (mcur + 15) / 16 * 16;
  if (ta == Trans::no) {
    for (std::size_t r = 0; r < mpad; ++r)
      for (std::size_t k = 0; k < 2 * kp_rows; k += 32) {
        const std::size_t n = r < mcur && k < klen ? std::min<std::size_t>(32, klen - k) : 0;
        const S* row = n ? A + (i0 + r) * lda + k0 + k : nullptr;
        const __m256i lo = n ? load16(row, n) : _mm256_setzero_si256();
        const __m256i hi = n > 16 ? load16(row + 16, n - 16) : _mm256_setzero_si256();
        _mm512_storeu_si512(dst + r * kp_rows + k / 2, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
      }
    return;
  }
  // op(A)(i, k) = A[k * lda + i]: 16 pairs of 16 rows as 16 registers of words, transposed.
  for (std::size_t g = 0; g < mpad; g += 16) {
    const std::size_t n = g < mcur ? std::min<std::size_t>(16, mcur - g) : 0;
    for (std::size_t p0 = 0; p0 < kp_rows; p0 += 16) {
      __m512i r[16];
      for (std::size_t q = 0; q < 16; ++q) {
        const std::size_t k = 2 * (p0 + q);
        const S* row = n && k < klen ? A + (k0 + k) * lda + i0 + g : nullptr;
        const __m256i lo = row ? load16(row, n) : _mm256_setzero_si256();
        const __m256i hi = row && k + 1 < klen ? load16(row + lda, n) : _mm256_setzero_si256();
        r[q] = interleave(lo, hi);
      }
      transpose16(r);
      for (std::size_t j = 0; j < 16; ++j) _mm512_storeu_si512(dst + (g + j) * kp_rows + p0, r[j]);
    }
  }
}

/// The product on AMX tiles, blocked as gemm below: B panels of 32 columns (the same packing),
/// A as pack_rows lays it out, 32 x 32 blocks of C (2 x 2 tiles; 16 x 32 for a last strip of 16
/// rows or fewer) computed into an fp32 block and stored 8 rows at a time by store_acc.
template <class TA, class TB, class TC>
void gemm_amx(backend::Workspace& ws, Trans ta, Trans tb, std::size_t M, std::size_t N, std::size_t K, float alpha,
              const TA* A, std::size_t lda, const TB* B, std::size_t ldb, float beta, TC* C, std::size_t ldc,
              const float* bias) {
  const auto pad16 = [](std::size_t n) { return (n + 15) / 16 * 16; };
  const std::size_t kp_max = pad16((std::min(kc, K) + 1) / 2);
  const std::size_t nc_max = std::min(nc, (N + nr - 1) / nr * nr), mc_max = pad16(std::min(mc, M));
  std::uint32_t* const bbuf = ws.get<std::uint32_t>(backend::Workspace::Slot::words_b, nc_max * kp_max);
  std::uint32_t* const abuf = ws.get<std::uint32_t>(backend::Workspace::Slot::words_a, mc_max * kp_max);
  amx::configure();
  alignas(64) float block[32 * 32];
  for (std::size_t j0 = 0; j0 < N; j0 += nc) {
    const std::size_t ncur = std::min(nc, N - j0);
    for (std::size_t k0 = 0; k0 < K; k0 += kc) {
      const std::size_t kcur = std::min(kc, K - k0), kp = pad16((kcur + 1) / 2);
      const float beta_block = k0 == 0 ? beta : 1.0f;
      const float* bias_block = k0 == 0 && bias ? bias + j0 : nullptr;
      if (tb == Trans::no)
        pack_across(B, ldb, k0, kcur, j0, ncur, nr, bbuf, kp);
      else
        pack_along(B, ldb, k0, kcur, j0, ncur, nr, bbuf, kp);
      for (std::size_t i0 = 0; i0 < M; i0 += mc) {
        const std::size_t mcur = std::min(mc, M - i0);
        pack_rows(ta, A, lda, i0, mcur, k0, kcur, kp, abuf);
        for (std::size_t jr = 0; jr < ncur; jr += nr)
          for (std::size_t ir = 0; ir < mcur; ir += 32) {
            const std::size_t rows = std::min<std::size_t>(32, mcur - ir), cols = std::min(nr, ncur - jr);
            if (rows > 16)
              amx::block<2>(kp, abuf + ir * kp, kp, bbuf + jr * kp, block);
            else
              amx::block<1>(kp, abuf + ir * kp, kp, bbuf + jr * kp, block);
            const float* bias_tile = bias_block ? bias_block + jr : nullptr;
            for (std::size_t r0 = 0; r0 < rows; r0 += mr) {
              __m512 acc0[mr], acc1[mr];
              XTRAIN_UNROLL(8)
              for (std::size_t r = 0; r < mr; ++r) {
                acc0[r] = _mm512_load_ps(block + (r0 + r) * 32);
                acc1[r] = _mm512_load_ps(block + (r0 + r) * 32 + 16);
              }
              store_acc<TC>(acc0, acc1, alpha, beta_block, C + (i0 + ir + r0) * ldc + j0 + jr, ldc,
                            std::min(mr, rows - r0), cols, bias_tile);
            }
          }
      }
    }
  }
  amx::release();
}
#endif

/// The packed blocks live in `ws` (the calling thread's workspace).
/// C is fp32, or bf16 when K <= kc and beta == 0 (each tile rounded as it is stored).
/// On AMX (amx::usable()) the product runs on tiles (gemm_amx), else on vdpbf16ps.
template <class TA, class TB, class TC>
void gemm(backend::Workspace& ws, Trans ta, Trans tb, std::size_t M, std::size_t N, std::size_t K, float alpha,
          const TA* A, std::size_t lda, const TB* B, std::size_t ldb, float beta, TC* C, std::size_t ldc,
          const float* bias) {
  static_assert(std::is_same_v<TC, float> || std::is_same_v<TC, bf16>);
  assert((std::is_same_v<TC, float> || (K <= kc && beta == 0.0f)));
#if XTRAIN_HAS_AMX_BF16
  if (amx::usable()) {
    gemm_amx(ws, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
    return;
  }
#endif
  const std::size_t kp_max = (std::min(kc, K) + 1) / 2;
  const std::size_t nc_max = std::min(nc, (N + nr - 1) / nr * nr), mc_max = std::min(mc, (M + mr - 1) / mr * mr);
  std::uint32_t* const bbuf = ws.get<std::uint32_t>(backend::Workspace::Slot::words_b, nc_max * kp_max);
  // bf16 rows of A (K even: every block's depth is even) are read in place: no A panel.
  const bool a_in_place = std::is_same_v<TA, bf16> && ta == Trans::no && K % 2 == 0;
  std::uint32_t* const abuf =
      a_in_place ? nullptr : ws.get<std::uint32_t>(backend::Workspace::Slot::words_a, mc_max * kp_max);
  for (std::size_t j0 = 0; j0 < N; j0 += nc) {
    const std::size_t ncur = std::min(nc, N - j0);
    for (std::size_t k0 = 0; k0 < K; k0 += kc) {
      const std::size_t kcur = std::min(kc, K - k0), kp = (kcur + 1) / 2;
      const float beta_block = k0 == 0 ? beta : 1.0f;
      const float* bias_block = k0 == 0 && bias ? bias + j0 : nullptr;  // added with the first block, as beta
      if (tb == Trans::no)
        pack_across(B, ldb, k0, kcur, j0, ncur, nr, bbuf, kp);
      else
        pack_along(B, ldb, k0, kcur, j0, ncur, nr, bbuf, kp);
      // bf16 rows of A already hold the words the kernel broadcasts: no packing.
      const bool in_place = std::is_same_v<TA, bf16> && ta == Trans::no && kcur % 2 == 0;
      for (std::size_t i0 = 0; i0 < M; i0 += mc) {
        const std::size_t mcur = std::min(mc, M - i0);
        if (!in_place) {
          if (ta == Trans::yes)
            pack_across(A, lda, k0, kcur, i0, mcur, mr, abuf, kp);
          else
            pack_along(A, lda, k0, kcur, i0, mcur, mr, abuf, kp);
        }
        for (std::size_t jr = 0; jr < ncur; jr += nr)
          for (std::size_t ir = 0; ir < mcur; ir += mr) {
            const std::size_t rows = std::min(mr, mcur - ir), cols = std::min(nr, ncur - jr);
            TC* c = C + (i0 + ir) * ldc + j0 + jr;
            const float* bias_tile = bias_block ? bias_block + jr : nullptr;
            if (in_place) {
              const word_unaligned* arow[mr];
              for (std::size_t r = 0; r < mr; ++r)
                arow[r] = reinterpret_cast<const word_unaligned*>(A + (i0 + ir + std::min(r, rows - 1)) * lda + k0);
              micro_kernel<false, TC>(kp, nullptr, arow, bbuf + jr * kp, alpha, beta_block, c, ldc, rows, cols,
                                      bias_tile);
            } else {
              micro_kernel<true, TC>(kp, abuf + ir * kp, nullptr, bbuf + jr * kp, alpha, beta_block, c, ldc, rows, cols,
                                     bias_tile);
            }
          }
      }
    }
  }
}

}  // namespace dot
#endif

}  // namespace detail

/// C[M,N] (fp32) = alpha * op(A) * op(B) + beta * C (+ bias[j] on column j when `bias` is not
/// null) with the operands rounded to T (bf16 or fp16) and fp32 accumulation. TA and TB are each
/// T or float. Same conventions as kernels::gemm (row-major, strides as stored, beta == 0 ignores
/// C, split over the executor's threads with bitwise the same result).
template <class T, class Arch = simd::default_arch, class TA, class TB>
void gemm_lowp(Trans ta, Trans tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const TA* A,
               std::size_t lda, const TB* B, std::size_t ldb, float beta, float* C, std::size_t ldc,
               backend::Executor* executor = nullptr, const float* bias = nullptr) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, fp16>, "gemm_lowp computes in bf16 or fp16");
  static_assert(
      (std::is_same_v<TA, T> || std::is_same_v<TA, float>)&&(std::is_same_v<TB, T> || std::is_same_v<TB, float>),
      "gemm_lowp operands are stored as the compute type or as fp32");
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.0f) {
    detail::scale_add_bias(M, N, beta, bias, C, ldc);
    return;
  }
  constexpr bool dot_path =
#if XTRAIN_HAS_AVX512_BF16
      std::is_same_v<T, bf16> && std::is_same_v<Arch, simd::default_arch>;
#else
      false;
#endif
  constexpr std::size_t row_align = dot_path ? 8 : detail::GemmShape<Arch>::mr;
  detail::split_gemm(executor, M, N, K, row_align, [&](std::size_t m0, std::size_t m1, std::size_t n0, std::size_t n1) {
    const TA* a = ta == Trans::no ? A + m0 * lda : A + m0;
    const TB* b = tb == Trans::no ? B + n0 : B + n0 * ldb;
    float* c = C + m0 * ldc + n0;
    const float* bias_n = bias ? bias + n0 : nullptr;
    const backend::WorkspaceFor ws(executor);  // this thread's
#if XTRAIN_HAS_AVX512_BF16
    if constexpr (dot_path) {
      detail::dot::gemm(*ws, ta, tb, m1 - m0, n1 - n0, K, alpha, a, lda, b, ldb, beta, c, ldc, bias_n);
      return;
    }
#endif
    detail::gemm_widen<Arch, T>(*ws, ta, tb, m1 - m0, n1 - n0, K, alpha, a, lda, b, ldb, beta, c, ldc, bias_n);
  });
}

/// C = op(A) op(B) + beta C (+ bias on every row when not null) computed in the activation type
/// T: kernels::gemm for fp32, gemm_lowp<T> (operands rounded to T, fp32 accumulation) for
/// bf16/fp16. What a layer calls for its products whatever precision it runs in, with its
/// context's executor.
template <class T, class TA, class TB>
void gemm_as(Trans ta, Trans tb, std::size_t M, std::size_t N, std::size_t K, const TA* A, std::size_t lda, const TB* B,
             std::size_t ldb, float beta, float* C, std::size_t ldc, backend::Executor* executor = nullptr,
             const float* bias = nullptr) {
  if constexpr (std::is_same_v<T, float>)
    gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, executor, bias);
  else
    gemm_lowp<T>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, executor, bias);
}

/// Y[M,N] (stored as T, rows of N) = op(A) op(B) (+ bias on every row when not null), computed in
/// T: a layer's output. fp32: kernels::gemm into Y. bf16 on AVX512_BF16 with K <= 512 (one block
/// of K): each register tile is rounded to bf16 as it is stored, so no fp32 copy of Y is written
/// and read back. Otherwise the product goes to fp32 scratch in `ws` (the calling thread's
/// workspace, slot `accumulate`) and is rounded after. Either way each element is rounded once
/// from the same fp32 value: the results are bitwise the same.
template <class T, class TA, class TB>
void gemm_into(Trans ta, Trans tb, std::size_t M, std::size_t N, std::size_t K, const TA* A, std::size_t lda,
               const TB* B, std::size_t ldb, T* Y, backend::Workspace& ws, backend::Executor* executor = nullptr,
               const float* bias = nullptr) {
  if constexpr (std::is_same_v<T, float>) {
    (void)ws;
    gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, Y, N, executor, bias);
  } else {
#if XTRAIN_HAS_AVX512_BF16
    if constexpr (std::is_same_v<T, bf16>) {
      if (M > 0 && N > 0 && K > 0 && K <= detail::dot::kc) {
        detail::split_gemm(executor, M, N, K, detail::dot::mr,
                           [&](std::size_t m0, std::size_t m1, std::size_t n0, std::size_t n1) {
                             const TA* a = ta == Trans::no ? A + m0 * lda : A + m0;
                             const TB* b = tb == Trans::no ? B + n0 : B + n0 * ldb;
                             const backend::WorkspaceFor part_ws(executor);  // this thread's
                             detail::dot::gemm(*part_ws, ta, tb, m1 - m0, n1 - n0, K, 1.0f, a, lda, b, ldb, 0.0f,
                                               Y + m0 * N + n0, N, bias ? bias + n0 : nullptr);
                           });
        return;
      }
    }
#endif
    float* acc = ws.get<float>(backend::Workspace::Slot::accumulate, M * N);
    gemm_lowp<T>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, acc, N, executor, bias);
    from_float(acc, Y, M * N, executor);
  }
}

}  // namespace xtrain::kernels

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
