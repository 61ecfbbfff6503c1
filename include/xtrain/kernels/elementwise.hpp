#pragma once
/// \file elementwise.hpp
/// Element-wise activation kernels (forward and backward) and row/column helpers, vectorised with
/// xsimd. Scalar twin: kernels/reference/elementwise.hpp.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/simd.hpp"

namespace xtrain::kernels {

/// Activation functions. The backward of each reads what its forward saved (`saves_input`).
namespace ops {

/// e^x for the activations: Cody-Waite reduction, Cephes' degree-5 polynomial (relative error
/// below 2e-7), 2^n assembled in the exponent bits; x is clamped to [-87.3, 88.3] so 2^n stays a
/// normal number (e^x below 1.2e-38 returns about 1.2e-38, above 2e38 about 2e38; no Inf, no NaN
/// for finite x; NaN stays NaN: the clamp's constants are the first operands of min and max,
/// which x86 returns the second of when one is NaN). About half the work of xsimd::exp, which
/// also handles the edges exactly.
template <class B>
B exp_clamped(B x) noexcept {
  using I = xsimd::batch<std::int32_t, typename B::arch_type>;
  x = xsimd::max(B(-87.3365447504f), xsimd::min(B(88.3762626647949f), x));
  const B n = xsimd::nearbyint(x * B(1.44269504088896341f));
  B r = xsimd::fnma(n, B(0.693359375f), x);
  r = xsimd::fnma(n, B(-2.12194440e-4f), r);
  B p = xsimd::fma(B(1.9875691500e-4f), r, B(1.3981999507e-3f));
  p = xsimd::fma(p, r, B(8.3334519073e-3f));
  p = xsimd::fma(p, r, B(4.1665795894e-2f));
  p = xsimd::fma(p, r, B(1.6666665459e-1f));
  p = xsimd::fma(p, r, B(5.0000001201e-1f));
  p = xsimd::fma(p, r * r, r + B(1.0f));
  const I bits = (xsimd::batch_cast<std::int32_t>(n) + I(127)) << 23;
  return p * xsimd::bitwise_cast<B>(bits);
}

/// 1 / x: AVX-512's rcp14 estimate (14 bits) and one Newton step, relative error below 3e-7 and
/// several times cheaper than a division; with fewer lanes (SSE, AVX2), where the estimate
/// (rcpps) has 12 bits and one step leaves about 1e-7, a division: GELU's backward multiplies
/// 1 - sigmoid of a saturated input by x^3, so that 1e-7 became an error of 4e-4 at x = 30.
template <class B>
B refined_reciprocal(const B& x) noexcept {
  if constexpr (B::size < 16) {
    return B(1.0f) / x;
  } else {
    const B r = xsimd::reciprocal(x);
    return r * xsimd::fnma(x, r, B(2.0f));
  }
}

struct Relu {
  static constexpr bool saves_input = false;  // backward reads y
  template <class B>
  static B forward(const B& x) noexcept {
    return xsimd::max(x, B(0.0f));
  }
  template <class B>
  static B backward(const B& y, const B& dy) noexcept {
    return xsimd::select(y > B(0.0f), dy, B(0.0f));
  }
};

struct Tanh {
  static constexpr bool saves_input = false;
  /// Cephes' tanhf: an odd polynomial below |x| = 0.625, 1 - 2 / (e^(2|x|) + 1) above, with the
  /// clamped exp and a refined reciprocal (relative error about 3e-7).
  template <class B>
  static B forward(const B& x) noexcept {
    const B a = xsimd::abs(x), z = x * x;
    B p = xsimd::fma(B(-5.70498872745e-3f), z, B(2.06390887954e-2f));
    p = xsimd::fma(p, z, B(-5.37397155531e-2f));
    p = xsimd::fma(p, z, B(1.33314422036e-1f));
    p = xsimd::fma(p, z, B(-3.33332819422e-1f));
    const B small = xsimd::fma(p * z, x, x);
    const B large = xsimd::fnma(B(2.0f), refined_reciprocal(exp_clamped(a + a) + B(1.0f)), B(1.0f));
    return xsimd::select(a < B(0.625f), small, xsimd::copysign(large, x));
  }
  template <class B>
  static B backward(const B& y, const B& dy) noexcept {
    return dy * xsimd::fnma(y, y, B(1.0f));  // dy * (1 - y^2)
  }
};

struct Sigmoid {
  static constexpr bool saves_input = false;
  template <class B>
  static B forward(const B& x) noexcept {
    return refined_reciprocal(B(1.0f) + exp_clamped(-x));
  }
  template <class B>
  static B backward(const B& y, const B& dy) noexcept {
    return dy * y * (B(1.0f) - y);
  }
};

/// GELU with the exact erf form: x * Phi(x) (Hendrycks & Gimpel, arXiv:1606.08415), Phi(x) =
/// (1 + erf(x / sqrt 2)) / 2 with erf as a rational function on [-4, 4] (the odd/even minimax
/// pair Eigen and XLA use; |error| below 1e-7, exactly +-1 beyond): no exp, no branch. The
/// backward adds x * pdf(x) with one exp.
struct GeluErf {
  static constexpr bool saves_input = true;  // backward reads x
  template <class B>
  static B cdf(const B& x) noexcept {
    const B z = xsimd::max(xsimd::min(x * B(0.70710678118654752f), B(4.0f)), B(-4.0f));
    const B z2 = z * z;
    B p = xsimd::fma(z2, B(-2.72614225801306e-10f), B(2.77068142495902e-08f));
    p = xsimd::fma(z2, p, B(-2.10102402082508e-06f));
    p = xsimd::fma(z2, p, B(-5.69250639462346e-05f));
    p = xsimd::fma(z2, p, B(-7.34990630326855e-04f));
    p = xsimd::fma(z2, p, B(-2.95459980854025e-03f));
    p = xsimd::fma(z2, p, B(-1.60960333262415e-02f));
    B q = xsimd::fma(z2, B(-1.45660718464996e-05f), B(-2.13374055278905e-04f));
    q = xsimd::fma(z2, q, B(-1.68282697438203e-03f));
    q = xsimd::fma(z2, q, B(-7.37332916720468e-03f));
    q = xsimd::fma(z2, q, B(-1.42647390514189e-02f));
    const B erf = z * p * refined_reciprocal(q);
    return xsimd::fma(B(0.5f), erf, B(0.5f));
  }
  template <class B>
  static B forward(const B& x) noexcept {
    return x * cdf(x);
  }
  template <class B>
  static B backward(const B& x, const B& dy) noexcept {
    const B pdf = exp_clamped(B(-0.5f) * x * x) * B(0.39894228040143268f);
    return dy * xsimd::fma(x, pdf, cdf(x));  // Phi(x) + x pdf(x)
  }
};

/// GELU with PyTorch's tanh approximation (`approximate="tanh"`), computed as x * sigmoid(2u)
/// (= x (1 + tanh u) / 2, u = sqrt(2/pi) (x + 0.044715 x^3)): one exp and one division.
struct GeluTanh {
  static constexpr bool saves_input = true;
  template <class B>
  static B sigmoid_2u(const B& x) noexcept {
    const B u2 = B(2.0f * 0.79788456080286536f) * xsimd::fma(B(0.044715f) * x, x * x, x);
    return refined_reciprocal(B(1.0f) + exp_clamped(-u2));  // finite: x -> -inf gives y -> 0
  }
  template <class B>
  static B forward(const B& x) noexcept {
    return x * sigmoid_2u(x);
  }
  template <class B>
  static B backward(const B& x, const B& dy) noexcept {
    const B s = sigmoid_2u(x);
    const B du2 = B(2.0f * 0.79788456080286536f) * xsimd::fma(B(3.0f * 0.044715f), x * x, B(1.0f));
    return dy * xsimd::fma(x * s * (B(1.0f) - s), du2, s);  // s + x s (1 - s) 2u'
  }
};

/// SiLU (swish): x * sigmoid(x) (Elfwing et al., arXiv:1702.03118).
struct Silu {
  static constexpr bool saves_input = true;
  template <class B>
  static B forward(const B& x) noexcept {
    return x * refined_reciprocal(B(1.0f) + exp_clamped(-x));
  }
  template <class B>
  static B backward(const B& x, const B& dy) noexcept {
    const B s = refined_reciprocal(B(1.0f) + exp_clamped(-x));
    return dy * s * xsimd::fma(x, B(1.0f) - s, B(1.0f));  // dy * s * (1 + x (1 - s))
  }
};

}  // namespace ops

/// y[i] = Op::forward(x[i]) for i < n.
template <class Op, class Arch = simd::default_arch>
void activation_forward(const float* x, float* y, std::size_t n) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t w = B::size;
  std::size_t i = 0;
  for (; i + w <= n; i += w) Op::forward(B::load_unaligned(x + i)).store_unaligned(y + i);
  if (i < n) {
    alignas(64) float tmp[w] = {};
    std::copy(x + i, x + n, tmp);
    Op::forward(B::load_aligned(tmp)).store_aligned(tmp);
    std::copy(tmp, tmp + (n - i), y + i);
  }
}

/// dx[i] = Op::backward(saved[i], dy[i]) for i < n; `saved` is x or y as Op::saves_input says.
template <class Op, class Arch = simd::default_arch>
void activation_backward(const float* saved, const float* dy, float* dx, std::size_t n) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t w = B::size;
  std::size_t i = 0;
  for (; i + w <= n; i += w)
    Op::backward(B::load_unaligned(saved + i), B::load_unaligned(dy + i)).store_unaligned(dx + i);
  if (i < n) {
    alignas(64) float s[w] = {}, d[w] = {};
    std::copy(saved + i, saved + n, s);
    std::copy(dy + i, dy + n, d);
    Op::backward(B::load_aligned(s), B::load_aligned(d)).store_aligned(s);
    std::copy(s, s + (n - i), dx + i);
  }
}

namespace detail {
#if defined(__AVX512F__)
/// 16 bf16/fp16 values widened into an AVX-512 register, and back (nearest even).
template <class B>
B load16(const bf16* p) noexcept {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return B(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
}
template <class B>
B load16(const fp16* p) noexcept {
  return B(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
}
template <class B>
void store16(bf16* p, const B& v) noexcept {
#if XTRAIN_HAS_AVX512_BF16  // one instruction; unlike round_bf16 it flushes |v| < 2^-126 to zero
  const __m256bh r = _mm512_cvtneps_pbh(v);
  std::memcpy(static_cast<void*>(p), &r, sizeof r);  // (one store; nvcc rejects a cast of __m256bh to __m256i)
#else
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), round_bf16(static_cast<__m512>(v)));
#endif
}
template <class B>
void store16(fp16* p, const B& v) noexcept {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(static_cast<__m512>(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
template <class Arch>
inline constexpr bool fused_lowp = simd::lanes<Arch> == 16;
#else
template <class Arch>
inline constexpr bool fused_lowp = false;
#endif
}  // namespace detail

/// Activation kernels over bf16/fp16 storage, computed in fp32 and rounded back (nearest even):
/// with AVX-512 each register is widened, computed and narrowed in place; otherwise the values
/// are widened in L1-sized chunks and run through the fp32 kernels above.
template <class Op, class T, class Arch = simd::default_arch>
requires(!std::is_same_v<T, float>) void activation_forward(const T* x, T* y, std::size_t n) noexcept {
#if defined(__AVX512F__)
  if constexpr (detail::fused_lowp<Arch>) {
    using B = simd::batch<float, Arch>;
    std::size_t i = 0;
    for (; i + 16 <= n; i += 16) detail::store16(y + i, Op::forward(detail::load16<B>(x + i)));
    x += i;
    y += i;
    n -= i;
  }
#endif
  constexpr std::size_t chunk = 1024;

  alignas(64) float buf[chunk];
  for (std::size_t i = 0; i < n; i += chunk) {
    const std::size_t m = std::min(chunk, n - i);
    to_float(x + i, buf, m);
    activation_forward<Op, Arch>(buf, buf, m);
    from_float(buf, y + i, m);
  }
}

template <class Op, class T, class Arch = simd::default_arch>
requires(!std::is_same_v<T, float>) void activation_backward(const T* saved, const T* dy, T* dx,
                                                             std::size_t n) noexcept {
#if defined(__AVX512F__)
  if constexpr (detail::fused_lowp<Arch>) {
    using B = simd::batch<float, Arch>;
    std::size_t i = 0;
    for (; i + 16 <= n; i += 16)
      detail::store16(dx + i, Op::backward(detail::load16<B>(saved + i), detail::load16<B>(dy + i)));
    saved += i;
    dy += i;
    dx += i;
    n -= i;
  }
#endif
  constexpr std::size_t chunk = 1024;
  alignas(64) float s[chunk], d[chunk];
  for (std::size_t i = 0; i < n; i += chunk) {
    const std::size_t m = std::min(chunk, n - i);
    to_float(saved + i, s, m);
    to_float(dy + i, d, m);
    activation_backward<Op, Arch>(s, d, d, m);
    from_float(d, dx + i, m);
  }
}

/// out[j] (+)= sum over rows of x[r, j] (the bias gradient of a Linear layer), rows in order, x
/// stored as fp32, bf16 or fp16 (widened as it is read). Row r starts at x + r * ld (ld = 0:
/// cols). The rows are read in order, along each row, into 8 registers of columns at a time.
template <class Arch = simd::default_arch, class S>
void column_sums(const S* x, std::size_t rows, std::size_t cols, float* out, bool accumulate,
                 std::size_t ld = 0) noexcept {
  if (ld == 0) ld = cols;
  using B = simd::batch<float, Arch>;
  constexpr std::size_t w = B::size, regs = 8;
  alignas(64) float wide[regs * w];
  for (std::size_t j = 0; j < cols; j += regs * w) {
    const std::size_t width = std::min(regs * w, cols - j), full = width / w;
    B acc[regs];
    for (std::size_t q = 0; q < full; ++q) acc[q] = accumulate ? B::load_unaligned(out + j + q * w) : B(0.0f);
    float tail[w] = {};
    for (std::size_t i = full * w; i < width; ++i) tail[i - full * w] = accumulate ? out[j + i] : 0.0f;
    for (std::size_t r = 0; r < rows; ++r) {
      const float* row;
      if constexpr (std::is_same_v<S, float>) {
        row = x + r * ld + j;
      } else {
        to_float(x + r * ld + j, wide, width);
        row = wide;
      }
      for (std::size_t q = 0; q < full; ++q) acc[q] += B::load_unaligned(row + q * w);
      for (std::size_t i = full * w; i < width; ++i) tail[i - full * w] += row[i];
    }
    for (std::size_t q = 0; q < full; ++q) acc[q].store_unaligned(out + j + q * w);
    for (std::size_t i = full * w; i < width; ++i) out[j + i] = tail[i - full * w];
  }
}

// BatchNorm over [rows, cols] (one feature per column), columns [0, cols) of rows at stride ld.
// Each column is summed over the rows in order in double: the same value whatever the split of
// the columns. Plain loops over restrict-qualified rows, which the compiler vectorises.

/// sum[j] += x[r, j] over the rows, in double.
inline void column_sums_f64(const float* x, std::size_t rows, std::size_t ld, std::size_t cols,
                            double* __restrict sum) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * ld;
    for (std::size_t j = 0; j < cols; ++j) sum[j] += static_cast<double>(xr[j]);
  }
}

/// out[j] += (x[r, j] - mean[j])^2 over the rows, in double.
inline void column_sq_dev_f64(const float* x, std::size_t rows, std::size_t ld, std::size_t cols,
                              const float* __restrict mean, double* __restrict out) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * ld;
    for (std::size_t j = 0; j < cols; ++j) {
      const double d = static_cast<double>(xr[j]) - static_cast<double>(mean[j]);
      out[j] += d * d;
    }
  }
}

namespace detail {
// g where y > 0, else +0: ReLU's backward select as bit operations (g & (y > 0 ? ~0 : 0)), which
// the loops below vectorise where a conditional expression kept them scalar.
inline float relu_masked(float g, float y) noexcept {
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(g) & (0u - static_cast<std::uint32_t>(y > 0.0f)));
}
// The column kernels below with the ReLU fused (Relu) or not, as plain loops over restrict rows.
template <bool Relu>
void normalize_columns(const float* x, std::size_t rows, std::size_t ld, std::size_t cols, const float* __restrict mean,
                       const float* __restrict invstd, const float* __restrict gamma, const float* __restrict beta,
                       float* xhat, float* y) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict xr = x + r * ld;
    float* __restrict hr = xhat + r * ld;
    float* __restrict yr = y + r * ld;
    for (std::size_t j = 0; j < cols; ++j) {
      const float v = (xr[j] - mean[j]) * invstd[j];
      hr[j] = v;
      const float out = gamma[j] * v + beta[j];
      yr[j] = Relu ? (out > 0.0f ? out : 0.0f) : out;
    }
  }
}
template <bool Relu>
void column_sum_dot_f64(const float* dy, const float* xhat, const float* relu_out, std::size_t rows, std::size_t ld,
                        std::size_t cols, double* __restrict sum_dy, double* __restrict sum_dy_xhat) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict dr = dy + r * ld;
    const float* __restrict hr = xhat + r * ld;
    const float* __restrict yr = Relu ? relu_out + r * ld : dr;
    for (std::size_t j = 0; j < cols; ++j) {
      const float d = Relu ? relu_masked(dr[j], yr[j]) : dr[j];
      sum_dy[j] += static_cast<double>(d);
      sum_dy_xhat[j] += static_cast<double>(d) * static_cast<double>(hr[j]);
    }
  }
}
template <bool Relu>
void batch_norm_dx_columns(const float* dy, const float* xhat, const float* relu_out, std::size_t rows, std::size_t ld,
                           std::size_t cols, const float* __restrict scale, const float* __restrict mean_dy,
                           const float* __restrict mean_dy_xhat, float* dx) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict dr = dy + r * ld;
    const float* __restrict hr = xhat + r * ld;
    const float* __restrict yr = Relu ? relu_out + r * ld : dr;
    float* __restrict out = dx + r * ld;
    for (std::size_t j = 0; j < cols; ++j) {
      const float d = Relu ? relu_masked(dr[j], yr[j]) : dr[j];
      out[j] = scale[j] * (d - mean_dy[j] - hr[j] * mean_dy_xhat[j]);
    }
  }
}
}  // namespace detail

/// xhat[r, j] = (x[r, j] - mean[j]) * invstd[j]; y[r, j] = gamma[j] * xhat[r, j] + beta[j], or
/// with `relu` max(that, 0) as the ReLU layer computes it (vmaxps: +0 for a NaN and for -0).
inline void normalize_columns(const float* x, std::size_t rows, std::size_t ld, std::size_t cols, const float* mean,
                              const float* invstd, const float* gamma, const float* beta, float* xhat, float* y,
                              bool relu = false) noexcept {
  if (relu)
    detail::normalize_columns<true>(x, rows, ld, cols, mean, invstd, gamma, beta, xhat, y);
  else
    detail::normalize_columns<false>(x, rows, ld, cols, mean, invstd, gamma, beta, xhat, y);
}

/// sum_dy[j] += dy[r, j]; sum_dy_xhat[j] += dy[r, j] * xhat[r, j], over the rows, in double. With
/// `relu_out` (a fused ReLU's output), dy[r, j] counts only where relu_out[r, j] > 0, as after
/// the ReLU layer's backward.
inline void column_sum_dot_f64(const float* dy, const float* xhat, std::size_t rows, std::size_t ld, std::size_t cols,
                               double* sum_dy, double* sum_dy_xhat, const float* relu_out = nullptr) noexcept {
  if (relu_out)
    detail::column_sum_dot_f64<true>(dy, xhat, relu_out, rows, ld, cols, sum_dy, sum_dy_xhat);
  else
    detail::column_sum_dot_f64<false>(dy, xhat, relu_out, rows, ld, cols, sum_dy, sum_dy_xhat);
}

/// dx[r, j] = scale[j] * (dy[r, j] - mean_dy[j] - xhat[r, j] * mean_dy_xhat[j]) (BatchNorm's input
/// gradient in training; scale = gamma * invstd), dy masked by `relu_out` > 0 when given.
inline void batch_norm_dx_columns(const float* dy, const float* xhat, std::size_t rows, std::size_t ld,
                                  std::size_t cols, const float* scale, const float* mean_dy, const float* mean_dy_xhat,
                                  float* dx, const float* relu_out = nullptr) noexcept {
  if (relu_out)
    detail::batch_norm_dx_columns<true>(dy, xhat, relu_out, rows, ld, cols, scale, mean_dy, mean_dy_xhat, dx);
  else
    detail::batch_norm_dx_columns<false>(dy, xhat, relu_out, rows, ld, cols, scale, mean_dy, mean_dy_xhat, dx);
}

/// Sum of a plane of n floats: 16 fp32 partial sums (vectorised), added in double.
inline double plane_sum(const float* x, std::size_t n) noexcept {
  float lanes[16] = {};
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (std::size_t j = 0; j < 16; ++j) lanes[j] += x[i + j];
  double s = 0.0;
  for (float l : lanes) s += l;
  for (; i < n; ++i) s += x[i];
  return s;
}

}  // namespace xtrain::kernels
