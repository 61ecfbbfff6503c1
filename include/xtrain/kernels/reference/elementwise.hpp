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

/// BatchNorm over the columns of x[rows, cols] (row stride ld), from the definitions: the biased
/// mean and variance of each column, xhat = (x - mean) / sqrt(var + eps), y = gamma xhat + beta;
/// and backward: dgamma = sum dy xhat, dbeta = sum dy,
/// dx = gamma / sqrt(var + eps) (dy - mean(dy) - xhat mean(dy xhat)).
inline void batch_norm_columns(const float* x, const float* dy, std::size_t rows, std::size_t ld, std::size_t cols,
                               const float* gamma, const float* beta, double eps, double* y, double* dx, double* dgamma,
                               double* dbeta) {
  for (std::size_t j = 0; j < cols; ++j) {
    double mean = 0, var = 0;
    for (std::size_t r = 0; r < rows; ++r) mean += x[r * ld + j];
    mean /= static_cast<double>(rows);
    for (std::size_t r = 0; r < rows; ++r) var += (x[r * ld + j] - mean) * (x[r * ld + j] - mean);
    var /= static_cast<double>(rows);
    const double invstd = 1.0 / std::sqrt(var + eps);
    double sdy = 0, sdyx = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      const double xhat = (x[r * ld + j] - mean) * invstd;
      y[r * ld + j] = gamma[j] * xhat + beta[j];
      sdy += dy[r * ld + j];
      sdyx += dy[r * ld + j] * xhat;
    }
    dgamma[j] = sdyx;
    dbeta[j] = sdy;
    const double n = static_cast<double>(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      const double xhat = (x[r * ld + j] - mean) * invstd;
      dx[r * ld + j] = gamma[j] * invstd * (dy[r * ld + j] - sdy / n - xhat * sdyx / n);
    }
  }
}

}  // namespace xtrain::kernels::reference
