#pragma once
/// \file reference/elementwise.hpp
/// Scalar twins of kernels/elementwise.hpp, in double precision, straight from the definitions.

#include <cmath>
#include <cstddef>

namespace xtrain::kernels::reference {

inline double relu(double x) { return x > 0 ? x : 0.0; }
inline double relu_grad(double x) { return x > 0 ? 1.0 : 0.0; }
inline double tanh(double x) { return std::tanh(x); }
inline double tanh_grad(double x) { return 1.0 - std::tanh(x) * std::tanh(x); }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double sigmoid_grad(double x) { return sigmoid(x) * (1.0 - sigmoid(x)); }
inline double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
inline double gelu_erf_grad(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}
inline double silu(double x) { return x * sigmoid(x); }
inline double silu_grad(double x) { return sigmoid(x) * (1.0 + x * (1.0 - sigmoid(x))); }
inline double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
inline double gelu_tanh_grad(double x) {
  const double k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

/// out[j] = sum over rows of x[r, j].
inline void column_sums(const float* x, std::size_t rows, std::size_t cols, float* out) {
  for (std::size_t j = 0; j < cols; ++j) {
    double s = 0;
    for (std::size_t r = 0; r < rows; ++r) s += x[r * cols + j];
    out[j] = static_cast<float>(s);
  }
}

}  // namespace xtrain::kernels::reference
