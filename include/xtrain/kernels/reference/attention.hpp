#pragma once
/// \file reference/attention.hpp
/// Scalar twin of kernels/attention.hpp: causal attention by its definition, in double, the
/// probabilities stored whole. Tests compare the kernels against it.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace xtrain::kernels::reference {

/// As kernels::causal_attention_forward (lse included).
inline void causal_attention_forward(std::size_t T, std::size_t d, float scale, const float* q, const float* k,
                                     const float* v, std::size_t ld, float* out, std::size_t ldo, float* lse) {
  std::vector<double> s(T);
  for (std::size_t i = 0; i < T; ++i) {
    double m = -1e300;
    for (std::size_t j = 0; j <= i; ++j) {
      double dot = 0.0;
      for (std::size_t c = 0; c < d; ++c) dot += static_cast<double>(q[i * ld + c]) * k[j * ld + c];
      s[j] = dot * scale;
      m = std::max(m, s[j]);
    }
    double sum = 0.0;
    for (std::size_t j = 0; j <= i; ++j) sum += std::exp(s[j] - m);
    for (std::size_t c = 0; c < d; ++c) {
      double acc = 0.0;
      for (std::size_t j = 0; j <= i; ++j) acc += std::exp(s[j] - m) / sum * v[j * ld + c];
      out[i * ldo + c] = static_cast<float>(acc);
    }
    lse[i] = static_cast<float>(m + std::log(sum));
  }
}

/// As kernels::causal_attention_backward: dq, dk, dv written.
inline void causal_attention_backward(std::size_t T, std::size_t d, float scale, const float* q, const float* k,
                                      const float* v, std::size_t ld, const float* dout, std::size_t ldo, float* dq,
                                      float* dk, float* dv, std::size_t ldg) {
  std::vector<double> p(T * T, 0.0), dp(T * T, 0.0);
  for (std::size_t i = 0; i < T; ++i) {
    double m = -1e300;
    for (std::size_t j = 0; j <= i; ++j) {
      double dot = 0.0;
      for (std::size_t c = 0; c < d; ++c) dot += static_cast<double>(q[i * ld + c]) * k[j * ld + c];
      p[i * T + j] = dot * scale;
      m = std::max(m, p[i * T + j]);
    }
    double sum = 0.0;
    for (std::size_t j = 0; j <= i; ++j) sum += std::exp(p[i * T + j] - m);
    for (std::size_t j = 0; j <= i; ++j) p[i * T + j] = std::exp(p[i * T + j] - m) / sum;
  }
  for (std::size_t i = 0; i < T; ++i) {
    double dsum = 0.0;
    for (std::size_t j = 0; j <= i; ++j) {
      double dot = 0.0;
      for (std::size_t c = 0; c < d; ++c) dot += static_cast<double>(dout[i * ldo + c]) * v[j * ld + c];
      dp[i * T + j] = dot;
      dsum += p[i * T + j] * dot;
    }
    for (std::size_t j = 0; j <= i; ++j) dp[i * T + j] = p[i * T + j] * (dp[i * T + j] - dsum) * scale;
  }
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t c = 0; c < d; ++c) {
      double gq = 0.0, gk = 0.0, gv = 0.0;
      for (std::size_t j = 0; j <= i; ++j) gq += dp[i * T + j] * k[j * ld + c];
      for (std::size_t r = i; r < T; ++r) {
        gk += dp[r * T + i] * q[r * ld + c];
        gv += p[r * T + i] * dout[r * ldo + c];
      }
      dq[i * ldg + c] = static_cast<float>(gq);
      dk[i * ldg + c] = static_cast<float>(gk);
      dv[i * ldg + c] = static_cast<float>(gv);
    }
}

}  // namespace xtrain::kernels::reference
