#pragma once
/// \file conv_lanes_bf16.hpp
/// The image_lanes convolution (kernels/conv_lanes.hpp) with bf16 multiply-adds (vdpbf16ps,
/// AVX512_BF16) for bf16 layers: lanes::pairs. Without AVX512_BF16 this header declares nothing
/// and bf16 layers take the fp32 kernels on widened planes.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "xtrain/kernels/conv_lanes.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/simd.hpp"
#include "xtrain/kernels/transpose.hpp"

namespace xtrain::kernels::lanes {

#if XTRAIN_HAS_AVX512_BF16
/// bf16 multiply-adds (vdpbf16ps, AVX512_BF16) for bf16 layers, straight from their bf16 planes.
/// The forward and the input gradient interleave channels 2k and 2k + 1 into one framed plane of
/// 32-bit words (channel 2k's bf16 in the low half of each (position, image) word, 2k + 1's in the
/// high half: frame_pairs) and pair the kernel's weights the same way (pack_weights). One
/// instruction then does two multiply-adds per lane, one per channel of the pair, summed in fp32:
/// half the instructions of the fp32 kernels. The weight gradient pairs columns instead
/// (column_pairs, output_pairs). Sixteen images per group (AVX-512's fp32 lanes). Each output is
/// summed over channel pairs, then kernel rows, then columns, in that fixed order.
namespace pairs {

namespace detail {

// dst[j * 16 + t] = word j of row(t) for t < 8 and j < cols (<= 8): the 8 x 8 transpose of the
// rows' 32-bit words, stored as the low or high half of `cols` 16-lane words (dst 32-byte aligned).
template <class Row>
inline void store_transposed(Row&& row, std::size_t cols, std::uint32_t* dst) noexcept {
  __m256 r[8];
  XTRAIN_UNROLL(8)
  for (std::size_t t = 0; t < 8; ++t) r[t] = _mm256_castsi256_ps(row(t));
  kernels::detail::transpose8x8(r);
  for (std::size_t j = 0; j < cols; ++j)
    _mm256_store_si256(reinterpret_cast<__m256i*>(dst + j * 16), _mm256_castps_si256(r[j]));
}

}  // namespace detail

/// The channel pairs of bf16 planes, framed: out[k][(r + top) * wf + left + j][i] = x_i[2k][r][j] |
/// x_i[2k + 1][r][j] << 16 for the images i < `count` (<= 16, `image` values apart, `channels`
/// planes of g.h x g.w each); zero in the frame, in the lanes past `count` and in the high halves
/// past the last channel. Layout [(channels + 1) / 2][hf][wf][16] (Frame f of window g).
inline void frame_pairs(const bf16* x, std::size_t image, std::size_t count, std::size_t channels, const Window& g,
                        const Frame& f, std::uint32_t* out) noexcept {
  constexpr std::size_t L = 16;
  const std::size_t plane = g.h * g.w, row_words = f.wf * L;
  const auto* src = reinterpret_cast<const std::uint16_t*>(x);
  for (std::size_t k = 0; 2 * k < channels; ++k) {
    std::uint32_t* o = out + k * f.in_plane;
    std::fill(o, o + f.top * row_words, 0u);
    std::fill(o + (f.top + g.h) * row_words, o + f.hf * row_words, 0u);
    const std::uint16_t* lo = src + 2 * k * plane;
    const bool has_hi = 2 * k + 1 < channels;
    for (std::size_t r = 0; r < g.h; ++r) {
      std::uint32_t* row = o + (r + f.top) * row_words;
      std::fill(row, row + f.left * L, 0u);
      std::fill(row + (f.left + g.w) * L, row + row_words, 0u);
      for (std::size_t j = 0; j < g.w; j += 8) {
        const std::size_t cols = std::min<std::size_t>(8, g.w - j);
        const auto mask = static_cast<__mmask8>((1u << cols) - 1);
        for (std::size_t i0 = 0; i0 < L; i0 += 8)
          detail::store_transposed(
              [&](std::size_t t) {
                if (i0 + t >= count) return _mm256_setzero_si256();
                const std::uint16_t* at = lo + (i0 + t) * image + r * g.w + j;
                const __m128i a = _mm_maskz_loadu_epi16(mask, at);
                const __m128i b = has_hi ? _mm_maskz_loadu_epi16(mask, at + plane) : _mm_setzero_si128();
                return _mm256_set_m128i(_mm_unpackhi_epi16(a, b), _mm_unpacklo_epi16(a, b));
              },
              cols, row + (f.left + j) * L + i0);
      }
    }
  }
}

/// For the weight gradient, pairs of columns of each channel: out[c][p][i] = (x[c][p], x[c][p +
/// 1]) at every framed position p (the last column of a row paired with zero), from the channel
/// pairs `in` that frame_pairs wrote for `channels` channels (Frame f). Layout [channels][hf][wf][16].
inline void column_pairs(const std::uint32_t* in, std::size_t channels, const Frame& f, std::uint32_t* out) noexcept {
  constexpr std::size_t L = 16;
  constexpr __mmask32 high = 0xAAAAAAAA;  // the high halves of the 32-bit words
  for (std::size_t k = 0; 2 * k < channels; ++k) {
    const bool has_hi = 2 * k + 1 < channels;
    for (std::size_t r = 0; r < f.hf; ++r) {
      const std::uint32_t* row = in + k * f.in_plane + r * f.wf * L;
      std::uint32_t* even = out + 2 * k * f.in_plane + r * f.wf * L;
      std::uint32_t* odd = even + f.in_plane;
      __m512i next = _mm512_load_si512(row);
      for (std::size_t j = 0; j < f.wf; ++j) {
        const __m512i now = next;
        next = j + 1 < f.wf ? _mm512_load_si512(row + (j + 1) * L) : _mm512_setzero_si512();
        _mm512_store_si512(even + j * L, _mm512_mask_blend_epi16(high, now, _mm512_slli_epi32(next, 16)));
        if (has_hi) _mm512_store_si512(odd + j * L, _mm512_mask_blend_epi16(high, _mm512_srli_epi32(now, 16), next));
      }
    }
  }
}

/// The output gradient's columns in disjoint pairs: out[o][r][k][i] = dy_i[o][r][2k] |
/// dy_i[o][r][2k + 1] << 16 for the images i < `count` (<= 16, `image` values apart, `outs` planes
/// of OH x OW), an odd last column paired with zero, zero in the lanes past `count`. Layout
/// [outs][OH][(OW + 1) / 2][16].
inline void output_pairs(const bf16* dy, std::size_t image, std::size_t count, std::size_t outs, const Window& g,
                         std::uint32_t* out) noexcept {
  constexpr std::size_t L = 16;
  const std::size_t plane = g.oh * g.ow, half = (g.ow + 1) / 2;
  const auto* src = reinterpret_cast<const std::uint16_t*>(dy);
  for (std::size_t o = 0; o < outs; ++o)
    for (std::size_t r = 0; r < g.oh; ++r)
      for (std::size_t k = 0; k < half; k += 8) {
        const std::size_t values = std::min<std::size_t>(16, g.ow - 2 * k);
        const auto mask = static_cast<__mmask16>((1u << values) - 1);
        for (std::size_t i0 = 0; i0 < L; i0 += 8)
          detail::store_transposed(
              [&](std::size_t t) {
                if (i0 + t >= count) return _mm256_setzero_si256();
                return _mm256_maskz_loadu_epi16(mask, src + (i0 + t) * image + o * plane + r * g.ow + 2 * k);
              },
              std::min<std::size_t>(8, half - k), out + ((o * g.oh + r) * half + k) * L + i0);
      }
}

/// w[outs][channels][taps] paired over channels into out[outs][(channels + 1) / 2][taps] words.
inline void pack_weights(const float* w, std::size_t outs, std::size_t channels, std::size_t taps,
                         std::uint32_t* out) noexcept {
  const std::size_t cp = (channels + 1) / 2;
  for (std::size_t o = 0; o < outs; ++o)
    for (std::size_t k = 0; k < cp; ++k)
      for (std::size_t t = 0; t < taps; ++t) {
        const float* wo = w + o * channels * taps;
        const std::uint32_t lo = bf16(wo[2 * k * taps + t]).bits;
        const std::uint32_t hi = 2 * k + 1 < channels ? bf16(wo[(2 * k + 1) * taps + t]).bits : 0u;
        out[(o * cp + k) * taps + t] = lo | hi << 16;
      }
}

namespace detail {

// As lanes::detail::forward_tile over kernel rows [ki_begin, ki_end), every column.
template <std::size_t P>
inline void forward_tile(const std::uint32_t* x, std::size_t pairs, const Frame& f, const std::uint32_t* w,
                         std::size_t kh, std::size_t kw, std::size_t ki_begin, std::size_t ki_end, float bias,
                         float* out) noexcept {
  constexpr std::size_t L = 16;
  __m512 acc[P];
  XTRAIN_UNROLL(16)
  for (std::size_t p = 0; p < P; ++p) acc[p] = _mm512_set1_ps(bias);
  for (std::size_t k = 0; k < pairs; ++k)
    for (std::size_t ki = ki_begin; ki < ki_end; ++ki) {
      const std::uint32_t* xr = x + k * f.in_plane + ki * f.wf * L;
      const std::uint32_t* wr = w + (k * kh + ki) * kw;
      for (std::size_t kj = 0; kj < kw; ++kj) {
        const __m512bh wv = (__m512bh)_mm512_set1_epi32(static_cast<int>(wr[kj]));
        XTRAIN_UNROLL(16)
        for (std::size_t p = 0; p < P; ++p)
          acc[p] = _mm512_dpbf16_ps(acc[p], (__m512bh)_mm512_load_si512(xr + (p + kj) * L), wv);
      }
    }
  XTRAIN_UNROLL(16)
  for (std::size_t p = 0; p < P; ++p) _mm512_store_ps(out + p * L, acc[p]);
}

}  // namespace detail

/// lanes::forward with bf16 multiply-adds: x the channel pairs frame_pairs writes, w the packed
/// weights (pack_weights), y fp32 [outs][OH][OW][16].
inline void forward(const std::uint32_t* x, std::size_t channels, const std::uint32_t* w, const float* bias,
                    std::size_t outs, const Window& g, const Frame& f, float* y) noexcept {
  constexpr std::size_t L = 16;
  const std::size_t taps = g.kernel.h * g.kernel.w, cp = (channels + 1) / 2;
  for (std::size_t o = 0; o < outs; ++o)
    for (std::size_t r = 0; r < g.oh; ++r) {
      const std::uint32_t* xr = x + r * f.wf * L;
      float* out = y + (o * g.oh + r) * g.ow * L;
      const float b = bias ? bias[o] : 0.0f;
      const std::pair<std::size_t, std::size_t> rows = lanes::detail::real_kernel_rows(f, g.kernel.h, r);
      const std::size_t ki_begin = rows.first, ki_end = rows.second;  // (clang 14: no bindings in lambdas)
      lanes::detail::for_each_tile<14>(g.ow, [&]<std::size_t P>() {
        detail::forward_tile<P>(xr, cp, f, w + o * cp * taps, g.kernel.h, g.kernel.w, ki_begin, ki_end, b, out);
        xr += P * L;
        out += P * L;
      });
    }
}

namespace detail {

// dw[o][ki][kj] of O consecutive output channels (dy planes `dy_plane` words apart) and one input
// channel: each word of dy pairs output columns (2k, 2k + 1) and meets the x word pairing columns
// (2k + kj, 2k + kj + 1) of row r + ki. O = 2 shares each x load between two output channels.
template <std::size_t KH, std::size_t KW, std::size_t O>
inline void weight_tile(const std::uint32_t* dy, std::size_t dy_plane, std::size_t oh, std::size_t half,
                        const std::uint32_t* x, std::size_t wf, float* sums) noexcept {
  constexpr std::size_t L = 16;
  __m512 acc[O][KH][KW];
  XTRAIN_UNROLL(2)
  for (std::size_t o = 0; o < O; ++o) XTRAIN_UNROLL(8)
  for (std::size_t i = 0; i < KH; ++i) XTRAIN_UNROLL(8)
  for (std::size_t j = 0; j < KW; ++j) acc[o][i][j] = _mm512_setzero_ps();
  for (std::size_t r = 0; r < oh; ++r) {
    const std::uint32_t* d = dy + r * half * L;
    const std::uint32_t* xr = x + r * wf * L;
    for (std::size_t k = 0; k < half; ++k) {
      __m512bh dv[O];
      XTRAIN_UNROLL(2)
      for (std::size_t o = 0; o < O; ++o) dv[o] = (__m512bh)_mm512_load_si512(d + o * dy_plane + k * L);
      const std::uint32_t* xq = xr + 2 * k * L;
      if constexpr (KH * KW > 16) simd::opaque(xq);  // as lanes::detail::weight_tile
      XTRAIN_UNROLL(8)
      for (std::size_t i = 0; i < KH; ++i) XTRAIN_UNROLL(8)
      for (std::size_t j = 0; j < KW; ++j) {
        const __m512bh xv = (__m512bh)_mm512_load_si512(xq + (i * wf + j) * L);
        XTRAIN_UNROLL(2)
        for (std::size_t o = 0; o < O; ++o) acc[o][i][j] = _mm512_dpbf16_ps(acc[o][i][j], dv[o], xv);
      }
    }
  }
  XTRAIN_UNROLL(2)
  for (std::size_t o = 0; o < O; ++o) XTRAIN_UNROLL(8)
  for (std::size_t i = 0; i < KH; ++i) XTRAIN_UNROLL(8)
  for (std::size_t j = 0; j < KW; ++j) sums[o * KH * KW + i * KW + j] = _mm512_reduce_add_ps(acc[o][i][j]);
}

}  // namespace detail

/// lanes::weight_grad with bf16 multiply-adds: dy as output_pairs writes it ((OW + 1) / 2 words
/// per row), x as column_pairs writes it (Frame fx); written, not added.
inline void weight_grad(const std::uint32_t* dy, std::size_t outs, const std::uint32_t* x, const Frame& fx,
                        std::size_t channels, const Window& g, float* dw) noexcept {
  constexpr std::size_t L = 16;
  const std::size_t taps = g.kernel.h * g.kernel.w, half = (g.ow + 1) / 2, dy_plane = g.oh * half * L;
  float sums[2 * 25];
  for (std::size_t c = 0; c < channels; ++c)
    for (std::size_t o = 0; o < outs;) {
      const std::uint32_t* d = dy + o * dy_plane;
      const std::uint32_t* xc = x + c * fx.in_plane;
      std::size_t n = 1;
      if (g.kernel == Size2{5}) {
        detail::weight_tile<5, 5, 1>(d, dy_plane, g.oh, half, xc, fx.wf, sums);
      } else if (o + 1 < outs) {
        detail::weight_tile<3, 3, 2>(d, dy_plane, g.oh, half, xc, fx.wf, sums);
        n = 2;
      } else {
        detail::weight_tile<3, 3, 1>(d, dy_plane, g.oh, half, xc, fx.wf, sums);
      }
      for (std::size_t m = 0; m < n; ++m) std::copy_n(sums + m * taps, taps, dw + ((o + m) * channels + c) * taps);
      o += n;
    }
}

}  // namespace pairs
#endif

}  // namespace xtrain::kernels::lanes
