#pragma once
/// \file convert.hpp
/// Array conversions fp32 <-> bf16 / fp16, rounding to nearest even, NaN kept NaN (quieted),
/// Inf kept Inf, subnormals exact. The instruction set is chosen at compile time from the
/// target macros: AVX-512F or SSE4.1 integer arithmetic for bf16 (bit-exact with the scalar
/// conversion, unlike VCVTNEPS2BF16 which flushes subnormals), F16C / AVX-512F `vcvtps2ph` and
/// `vcvtph2ps` for fp16, the scalar conversion of core/precision.hpp otherwise.
/// Scalar twin: kernels/reference/convert.hpp.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE4_1__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

/// 1 when the target has AVX512_BF16 (vdpbf16ps, vcvtneps2bf16) and the AVX-512 subsets used with it.
#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define XTRAIN_HAS_AVX512_BF16 1
#else
#define XTRAIN_HAS_AVX512_BF16 0
#endif

#include "xtrain/backend/executor.hpp"
#include "xtrain/core/precision.hpp"

// GCC 12 warns "'__Y' may be used uninitialized" inside its own AVX-512 headers (the
// _mm512_undefined_* idiom, GCC bug 105593); silenced for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace xtrain::kernels {

/// Which instructions the conversions of this build use ("avx512f", "sse4.1", "f16c", "scalar").
constexpr const char* bf16_convert_isa() noexcept {
#if defined(__AVX512F__)
  return "avx512f";
#elif defined(__SSE4_1__)
  return "sse4.1";
#else
  return "scalar";
#endif
}
constexpr const char* fp16_convert_isa() noexcept {
#if defined(__AVX512F__)
  return "avx512f";
#elif defined(__F16C__)
  return "f16c";
#else
  return "scalar";
#endif
}

/// out[i] = in[i] widened to fp32 (exact).
inline void to_float(const bf16* in, float* out, std::size_t n) noexcept {
  std::size_t i = 0;
  const auto* src = reinterpret_cast<const std::uint16_t*>(in);
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_si512(out + i, _mm512_slli_epi32(w, 16));
  }
#elif defined(__SSE4_1__)
  for (; i + 4 <= n; i += 4) {
    std::uint64_t bits;
    std::memcpy(&bits, src + i, 8);
    const __m128i w = _mm_cvtepu16_epi32(_mm_cvtsi64_si128(static_cast<long long>(bits)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_slli_epi32(w, 16));
  }
#endif
  for (; i < n; ++i) out[i] = bf16_bits_to_float(src[i]);
}

inline void to_float(const fp16* in, float* out, std::size_t n) noexcept {
  std::size_t i = 0;
  const auto* src = reinterpret_cast<const std::uint16_t*>(in);
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) out[i] = fp16_bits_to_float(src[i]);
}

inline void to_float(const float* in, float* out, std::size_t n) noexcept {
  if (in != out) std::memmove(out, in, n * sizeof(float));
}

#if defined(__AVX512F__)
namespace detail {
/// 16 floats rounded to bf16 bits (nearest even, NaN quieted), as 32-bit lanes.
inline __m512i round_bf16_lanes(__m512 v) noexcept {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i hi = _mm512_srli_epi32(x, 16);
  const __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(hi, _mm512_set1_epi32(1)))), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
}
/// 16 floats rounded to 16 packed bf16.
inline __m256i round_bf16(__m512 v) noexcept { return _mm512_cvtepi32_epi16(round_bf16_lanes(v)); }
}  // namespace detail
#endif

/// out[i] = in[i] rounded to bf16 (nearest even; NaN quieted, never turned into Inf).
inline void from_float(const float* in, bf16* out, std::size_t n) noexcept {
  std::size_t i = 0;
  auto* dst = reinterpret_cast<std::uint16_t*>(out);
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), detail::round_bf16(_mm512_loadu_ps(in + i)));
#elif defined(__SSE4_1__)
  {
    const __m128i bias = _mm_set1_epi32(0x7FFF), one = _mm_set1_epi32(1), abs = _mm_set1_epi32(0x7FFFFFFF),
                  inf = _mm_set1_epi32(0x7F800000), quiet = _mm_set1_epi32(0x40);
    auto round4 = [&](const float* p) {
      const __m128i x = _mm_castps_si128(_mm_loadu_ps(p));
      const __m128i hi = _mm_srli_epi32(x, 16);
      const __m128i r = _mm_srli_epi32(_mm_add_epi32(x, _mm_add_epi32(bias, _mm_and_si128(hi, one))), 16);
      const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(x, abs), inf);
      return _mm_blendv_epi8(r, _mm_or_si128(hi, quiet), nan);
    };
    for (; i + 8 <= n; i += 8)  // values are <= 0xFFFF: the unsigned-saturating pack is exact
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm_packus_epi32(round4(in + i), round4(in + i + 4)));
  }
#endif
  for (; i < n; ++i) dst[i] = float_to_bf16_bits(in[i]);
}

/// out[i] = in[i] rounded to fp16 (nearest even; overflow to Inf, subnormals, NaN quieted).
inline void from_float(const float* in, fp16* out, std::size_t n) noexcept {
  std::size_t i = 0;
  auto* dst = reinterpret_cast<std::uint16_t*>(out);
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) dst[i] = float_to_fp16_bits(in[i]);
}

inline void from_float(const float* in, float* out, std::size_t n) noexcept {
  if (in != out) std::memmove(out, in, n * sizeof(float));
}

/// Elements of a conversion per part of a split one (a fork-join is worth about this many).
inline constexpr std::size_t parallel_convert_grain = std::size_t{1} << 15;

/// to_float over the executor's threads (the same values as on one).
template <class S>
void to_float(const S* in, float* out, std::size_t n, backend::Executor* e) {
  backend::parallel_for(e, n, parallel_convert_grain,
                        [&](std::size_t b, std::size_t end) { to_float(in + b, out + b, end - b); });
}

/// from_float over the executor's threads (the same values as on one).
template <class D>
void from_float(const float* in, D* out, std::size_t n, backend::Executor* e) {
  backend::parallel_for(e, n, parallel_convert_grain,
                        [&](std::size_t b, std::size_t end) { from_float(in + b, out + b, end - b); });
}

/// One element: fp32 value of a float, bf16 or fp16.
template <class T>
constexpr float widen(T v) noexcept {
  return static_cast<float>(v);
}

/// One element: a float rounded to T (identity for float).
template <class T>
constexpr T narrow(float v) noexcept {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return T(v);
}

}  // namespace xtrain::kernels

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
