#pragma once
/// \file transpose.hpp
/// A plane transposed and converted between fp32 and bf16 at once: the layout changes of the
/// direct and image-per-lane convolutions (images to SIMD lanes and back, output channels to
/// lanes). Bit-exact with converting one value at a time (a test checks NaN and halfway cases).

#include <cstddef>
#include <type_traits>

#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/gemm.hpp"

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace xtrain::kernels {

/// dst[j * ld_dst + i] = src[i * ld_src + j] for i < rows, j < cols, widened or rounded from S to
/// D; 8 x 8 blocks through registers where both are fp32, or (AVX-512) one is bf16: widened
/// before the block's transpose, or rounded after it (to nearest even, as narrow<bf16>).
template <class S, class D>
void transpose_convert(const S* src, std::size_t rows, std::size_t cols, std::size_t ld_src, D* dst,
                       std::size_t ld_dst) noexcept {
  std::size_t r8 = 0, c8 = 0;
  bool cols_done = false, rows_done = false;  // the masked edges below ran
#if defined(__AVX__)
  if constexpr (std::is_same_v<S, float> && std::is_same_v<D, float>) {
    r8 = rows / 8 * 8;
    c8 = cols / 8 * 8;
    for (std::size_t i = 0; i < r8; i += 8)
      for (std::size_t j = 0; j < c8; j += 8)
        kernels::detail::transpose8x8(src + i * ld_src + j, ld_src, dst + j * ld_dst + i, ld_dst);
    // The ragged edges (planes of 14 or 28 columns, 100 or 196 positions) in masked 8 x 8 blocks:
    // the last cols % 8 columns of each 8 rows, then the last rows % 8 rows of each 8 columns.
    alignas(32) static constexpr int ones[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    if (const std::size_t rest = cols - c8; rest > 0 && r8 > 0) {
      const __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ones + 8 - rest));
      for (std::size_t i = 0; i < r8; i += 8) {
        __m256 r[8];
        for (std::size_t k = 0; k < 8; ++k) r[k] = _mm256_maskload_ps(src + (i + k) * ld_src + c8, mask);
        kernels::detail::transpose8x8(r);
        for (std::size_t j = 0; j < rest; ++j) _mm256_storeu_ps(dst + (c8 + j) * ld_dst + i, r[j]);
      }
      cols_done = true;
    }
    if (const std::size_t rest = rows - r8; rest > 0 && c8 > 0) {
      const __m256i mask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ones + 8 - rest));
      for (std::size_t j = 0; j + 8 <= c8; j += 8) {
        __m256 r[8];
        for (std::size_t k = 0; k < 8; ++k)
          r[k] = k < rest ? _mm256_loadu_ps(src + (r8 + k) * ld_src + j) : _mm256_setzero_ps();
        kernels::detail::transpose8x8(r);
        for (std::size_t k = 0; k < 8; ++k) _mm256_maskstore_ps(dst + (j + k) * ld_dst + r8, mask, r[k]);
      }
      rows_done = true;  // their last cols % 8 columns are left to the loop below
    }
  }
#endif
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<S, bf16> && std::is_same_v<D, float>) {
    r8 = rows / 8 * 8;
    c8 = cols / 8 * 8;
    alignas(64) float block[64];
    for (std::size_t i = 0; i < r8; i += 8)
      for (std::size_t j = 0; j < c8; j += 8) {
        for (std::size_t k = 0; k < 8; ++k) {
          const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (i + k) * ld_src + j));
          _mm256_store_ps(block + 8 * k, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
        }
        kernels::detail::transpose8x8(block, 8, dst + j * ld_dst + i, ld_dst);
      }
  } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, bf16>) {
    r8 = rows / 8 * 8;
    c8 = cols / 8 * 8;
    alignas(64) float block[64];
    for (std::size_t i = 0; i < r8; i += 8)
      for (std::size_t j = 0; j < c8; j += 8) {
        kernels::detail::transpose8x8(src + i * ld_src + j, ld_src, block, 8);
        for (std::size_t k = 0; k < 8; k += 2) {  // 16 values: destination rows j + k and j + k + 1
          const __m256i h = kernels::detail::round_bf16(_mm512_load_ps(block + 8 * k));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (j + k) * ld_dst + i), _mm256_castsi256_si128(h));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (j + k + 1) * ld_dst + i), _mm256_extracti128_si256(h, 1));
        }
      }
  }
#endif
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = i < r8 ? (cols_done ? cols : c8) : (rows_done ? c8 : 0); j < cols; ++j) {
      if constexpr (std::is_same_v<D, float>)
        dst[j * ld_dst + i] = widen(src[i * ld_src + j]);
      else
        dst[j * ld_dst + i] = narrow<D>(src[i * ld_src + j]);
    }
}

}  // namespace xtrain::kernels
