#pragma once
/// \file elementwise.hpp
/// Element-wise activation kernels (forward and backward) and row/column helpers, vectorised with
/// xsimd. Scalar twin: kernels/reference/elementwise.hpp.

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/simd.hpp"

namespace xtrain::kernels {

/// Activation functions. The backward of each reads what its forward saved (`saves_input`).
namespace ops {

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
  template <class B>
  static B forward(const B& x) noexcept {
    return xsimd::tanh(x);
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
    return B(1.0f) / (B(1.0f) + xsimd::exp(-x));
  }
  template <class B>
  static B backward(const B& y, const B& dy) noexcept {
    return dy * y * (B(1.0f) - y);
  }
};

/// GELU with the exact erf form: x * Phi(x) (Hendrycks & Gimpel, arXiv:1606.08415).
struct GeluErf {
  static constexpr bool saves_input = true;  // backward reads x
  template <class B>
  static B forward(const B& x) noexcept {
    return B(0.5f) * x * (B(1.0f) + xsimd::erf(x * B(0.70710678118654752f)));
  }
  template <class B>
  static B backward(const B& x, const B& dy) noexcept {
    const B cdf = B(0.5f) * (B(1.0f) + xsimd::erf(x * B(0.70710678118654752f)));
    const B pdf = xsimd::exp(B(-0.5f) * x * x) * B(0.39894228040143268f);
    return dy * xsimd::fma(x, pdf, cdf);
  }
};

/// GELU with PyTorch's tanh approximation (`approximate="tanh"`).
struct GeluTanh {
  static constexpr bool saves_input = true;
  template <class B>
  static B forward(const B& x) noexcept {
    const B u = B(0.79788456080286536f) * xsimd::fma(B(0.044715f) * x, x * x, x);
    return B(0.5f) * x * (B(1.0f) + xsimd::tanh(u));
  }
  template <class B>
  static B backward(const B& x, const B& dy) noexcept {
    const B x2 = x * x;
    const B u = B(0.79788456080286536f) * xsimd::fma(B(0.044715f) * x, x2, x);
    const B t = xsimd::tanh(u);
    const B du = B(0.79788456080286536f) * xsimd::fma(B(3.0f * 0.044715f), x2, B(1.0f));
    return dy * (B(0.5f) * (B(1.0f) + t) + B(0.5f) * x * xsimd::fnma(t, t, B(1.0f)) * du);
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

/// Activation kernels over bf16/fp16 storage: widened in L1-sized chunks, computed in fp32 by
/// the kernels above, rounded back (nearest even).
template <class Op, class T, class Arch = simd::default_arch>
requires(!std::is_same_v<T, float>) void activation_forward(const T* x, T* y, std::size_t n) noexcept {
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

/// out[j] (+)= sum over rows of x[r, j] (the bias gradient of a Linear layer).
template <class Arch = simd::default_arch>
void column_sums(const float* x, std::size_t rows, std::size_t cols, float* out, bool accumulate) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t w = B::size;
  std::size_t j = 0;
  for (; j + w <= cols; j += w) {
    B acc = accumulate ? B::load_unaligned(out + j) : B(0.0f);
    for (std::size_t r = 0; r < rows; ++r) acc += B::load_unaligned(x + r * cols + j);
    acc.store_unaligned(out + j);
  }
  for (; j < cols; ++j) {
    float acc = accumulate ? out[j] : 0.0f;
    for (std::size_t r = 0; r < rows; ++r) acc += x[r * cols + j];
    out[j] = acc;
  }
}

/// Each row of y[rows, cols] = v (broadcast a row vector, e.g. a bias before a GEMM with beta = 1).
inline void broadcast_rows(const float* v, std::size_t rows, std::size_t cols, float* y) noexcept {
  for (std::size_t r = 0; r < rows; ++r) std::copy(v, v + cols, y + r * cols);
}

}  // namespace xtrain::kernels
