#pragma once
/// \file norm_planes.hpp
/// BatchNorm's passes over planes (the H x W values of one sample and channel, or the L of
/// [N, C, L]) in the activations' own type: 16-bit planes are widened to fp32 a chunk at a time
/// and the results rounded back (to nearest even, as from_float), so a bf16 or fp16 layer writes
/// no fp32 copy of a whole tensor. The backward pass recomputes x-hat = (x - mean) * invstd from
/// x, as the forward pass computed it, rather than keeping it. Sums: 16 fp32 partial sums (the
/// vectorised loop), added in double, then the plane's last n % 16 values in double: one fixed
/// order for a plane, whatever the thread count.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/simd.hpp"

namespace xtrain::kernels::planes {

namespace detail {

inline constexpr std::size_t chunk = 256;  // values widened at a time (a multiple of 16)

using B = simd::batch<float>;
inline constexpr std::size_t K = 16 / B::size;  // registers per 16 values
static_assert(B::size <= 16 && 16 % B::size == 0);

// x[0, len) as fp32: x itself (float), or widened into buf.
template <class S>
const float* widened(const S* x, std::size_t len, float* buf) noexcept {
  if constexpr (std::is_same_v<S, float>) {
    return x;
  } else {
    to_float(x, buf, len);
    return buf;
  }
}

// 16 fp32 partial sums (K registers), summed in double in lane order, plus `rest`.
inline double total(const B (&acc)[K], double rest) noexcept {
  alignas(64) float lanes[16];
  for (std::size_t k = 0; k < K; ++k) acc[k].store_aligned(lanes + k * B::size);
  double s = 0.0;
  for (float l : lanes) s += l;
  return s + rest;
}

}  // namespace detail

/// The largest float that rounds to +0 in S (0 for float): a ReLU after a layer whose output is
/// rounded to S passes its gradient where the unrounded output r > relu_floor<S>() (its output
/// round(r) > 0), so a fused ReLU masks on the same elements as a separate one.
template <class S>
constexpr float relu_floor() noexcept {
  if constexpr (std::is_same_v<S, float>) {
    return 0.0f;
  } else {
    std::uint32_t lo = 0, hi = 0x3f800000u;  // +0 rounds to 0, 1.0 does not; rounding is monotone
    while (hi - lo > 1) {
      const std::uint32_t mid = lo + (hi - lo) / 2;
      (S(std::bit_cast<float>(mid)).bits == 0 ? lo : hi) = mid;
    }
    return std::bit_cast<float>(lo);
  }
}
static_assert(relu_floor<fp16>() == 0x1p-25f && relu_floor<bf16>() == 0x1p-134f);

/// Sum of x over a plane of n values.
template <class S>
double sum(const S* x, std::size_t n) noexcept {
  using detail::B, detail::K;
  alignas(64) float buf[detail::chunk];
  B acc[K];
  for (B& a : acc) a = B(0.0f);
  double rest = 0.0;
  for (std::size_t i0 = 0; i0 < n; i0 += detail::chunk) {
    const std::size_t len = std::min(detail::chunk, n - i0);
    const float* v = detail::widened(x + i0, len, buf);
    std::size_t i = 0;
    for (; i + 16 <= len; i += 16)
      for (std::size_t k = 0; k < K; ++k) acc[k] += B::load_unaligned(v + i + k * B::size);
    for (; i < len; ++i) rest += v[i];
  }
  return detail::total(acc, rest);
}

/// Sum of (x - mean)^2 over a plane of n values.
template <class S>
double sq_dev(const S* x, std::size_t n, float mean) noexcept {
  using detail::B, detail::K;
  alignas(64) float buf[detail::chunk];
  B acc[K];
  for (B& a : acc) a = B(0.0f);
  double rest = 0.0;
  const B m(mean);
  for (std::size_t i0 = 0; i0 < n; i0 += detail::chunk) {
    const std::size_t len = std::min(detail::chunk, n - i0);
    const float* v = detail::widened(x + i0, len, buf);
    std::size_t i = 0;
    for (; i + 16 <= len; i += 16)
      for (std::size_t k = 0; k < K; ++k) {
        const B d = B::load_unaligned(v + i + k * B::size) - m;
        acc[k] = xsimd::fma(d, d, acc[k]);
      }
    for (; i < len; ++i) rest += static_cast<double>(v[i] - mean) * (v[i] - mean);
  }
  return detail::total(acc, rest);
}

/// y = gamma * (x - mean) * invstd + beta over a plane of n values, rounded to S; with `relu`,
/// max(y, 0) (as ReLU's kernel: NaN and -0 give +0). The three passes over a plane compute
/// gamma * x-hat + beta by the same instructions at each position: vectors over the first
/// multiple of 16 values, scalar code over the rest.
template <class S>
void normalize(const S* x, std::size_t n, float mean, float invstd, float gamma, float beta, bool relu, S* y) noexcept {
  using detail::B, detail::K;
  alignas(64) float buf[detail::chunk], out[detail::chunk];
  const B m(mean), is(invstd), g(gamma), b(beta);
  for (std::size_t i0 = 0; i0 < n; i0 += detail::chunk) {
    const std::size_t len = std::min(detail::chunk, n - i0);
    const float* v = detail::widened(x + i0, len, buf);
    float* o = out;
    if constexpr (std::is_same_v<S, float>) o = y + i0;
    std::size_t i = 0;
    for (; i + 16 <= len; i += 16)
      for (std::size_t k = 0; k < K; ++k) {
        const std::size_t at = i + k * B::size;
        B r = xsimd::fma(g, (B::load_unaligned(v + at) - m) * is, b);
        if (relu) r = xsimd::max(r, B(0.0f));
        r.store_unaligned(o + at);
      }
    for (; i < len; ++i) {
      const float r = gamma * ((v[i] - mean) * invstd) + beta;
      o[i] = relu && !(r > 0.0f) ? 0.0f : r;
    }
    if constexpr (!std::is_same_v<S, float>) from_float(out, y + i0, len);
  }
}

/// sum_dy += the sum of dy and sum_dy_xhat += the sum of dy * x-hat over a plane of n values,
/// x-hat = (x - mean) * invstd (as normalize computes it). With `relu`, dy is first zeroed where
/// normalize's output gamma * x-hat + beta (recomputed, then rounded to S) is not positive:
/// ReLU's backward.
template <class S>
void sum_dot_xhat(const S* dy, const S* x, std::size_t n, float mean, float invstd, float gamma, float beta, bool relu,
                  double& sum_dy, double& sum_dy_xhat) noexcept {
  using detail::B, detail::K;
  alignas(64) float gbuf[detail::chunk], vbuf[detail::chunk];
  B s[K], d[K];
  for (std::size_t k = 0; k < K; ++k) s[k] = d[k] = B(0.0f);
  double s_rest = 0.0, d_rest = 0.0;
  constexpr float cut = relu_floor<S>();
  const B m(mean), is(invstd), ga(gamma), be(beta);
  for (std::size_t i0 = 0; i0 < n; i0 += detail::chunk) {
    const std::size_t len = std::min(detail::chunk, n - i0);
    const float* g = detail::widened(dy + i0, len, gbuf);
    const float* v = detail::widened(x + i0, len, vbuf);
    std::size_t i = 0;
    for (; i + 16 <= len; i += 16)
      for (std::size_t k = 0; k < K; ++k) {
        const std::size_t at = i + k * B::size;
        const B xhat = (B::load_unaligned(v + at) - m) * is;
        B gv = B::load_unaligned(g + at);
        if (relu) gv = xsimd::select(xsimd::fma(ga, xhat, be) > B(cut), gv, B(0.0f));
        s[k] += gv;
        d[k] = xsimd::fma(gv, xhat, d[k]);
      }
    for (; i < len; ++i) {
      const float xhat = (v[i] - mean) * invstd;
      const float gi = relu && !(gamma * xhat + beta > cut) ? 0.0f : g[i];
      s_rest += gi;
      d_rest += static_cast<double>(gi) * xhat;
    }
  }
  sum_dy += detail::total(s, s_rest);
  sum_dy_xhat += detail::total(d, d_rest);
}

/// dx = scale * (dy - mean_dy - x-hat * mean_dy_xhat) over a plane of n values, x-hat and dy (zeroed
/// with `relu`) as in sum_dot_xhat, rounded to S (BatchNorm's input gradient in training mode).
/// Without `statistics` (eval mode: the statistics are constants), dx = scale * dy, which does not
/// read x-hat (a non-finite x leaves dx finite, as in PyTorch) unless `relu` needs it for the mask.
template <class S>
void input_grad(const S* dy, const S* x, std::size_t n, float mean, float invstd, float gamma, float beta, bool relu,
                bool statistics, float scale, float mean_dy, float mean_dy_xhat, S* dx) noexcept {
  using detail::B, detail::K;
  constexpr float cut = relu_floor<S>();
  alignas(64) float gbuf[detail::chunk], vbuf[detail::chunk], out[detail::chunk];
  const B m(mean), is(invstd), ga(gamma), be(beta), sc(scale), md(mean_dy), mdx(mean_dy_xhat);
  for (std::size_t i0 = 0; i0 < n; i0 += detail::chunk) {
    const std::size_t len = std::min(detail::chunk, n - i0);
    const float* g = detail::widened(dy + i0, len, gbuf);
    const float* v = statistics || relu ? detail::widened(x + i0, len, vbuf) : nullptr;
    float* o = out;
    if constexpr (std::is_same_v<S, float>) o = dx + i0;
    std::size_t i = 0;
    for (; i + 16 <= len; i += 16)
      for (std::size_t k = 0; k < K; ++k) {
        const std::size_t at = i + k * B::size;
        B gv = B::load_unaligned(g + at);
        if (!statistics && !relu) {
          (sc * gv).store_unaligned(o + at);
          continue;
        }
        const B xhat = (B::load_unaligned(v + at) - m) * is;
        if (relu) gv = xsimd::select(xsimd::fma(ga, xhat, be) > B(cut), gv, B(0.0f));
        (statistics ? sc * xsimd::fnma(xhat, mdx, gv - md) : sc * gv).store_unaligned(o + at);
      }
    for (; i < len; ++i) {
      float gi = g[i];
      if (!statistics && !relu) {
        o[i] = scale * gi;
        continue;
      }
      const float xhat = (v[i] - mean) * invstd;
      if (relu && !(gamma * xhat + beta > cut)) gi = 0.0f;
      o[i] = statistics ? scale * (gi - mean_dy - xhat * mean_dy_xhat) : scale * gi;
    }
    if constexpr (!std::is_same_v<S, float>) from_float(out, dx + i0, len);
  }
}

}  // namespace xtrain::kernels::planes
