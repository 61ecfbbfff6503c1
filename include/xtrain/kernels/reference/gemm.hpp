#pragma once
/// \file reference/gemm.hpp
/// Scalar twin of kernels/gemm.hpp: the definition tests compare the SIMD kernel against.

#include <cstddef>

#include "xtrain/kernels/gemm.hpp"

namespace xtrain::kernels::reference {

/// C = alpha * op(A) * op(B) + beta * C, accumulated in double, row-major.
inline void gemm(Trans ta, Trans tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
                 std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < N; ++j) {
      double sum = 0.0;
      for (std::size_t k = 0; k < K; ++k) {
        const float a = ta == Trans::no ? A[i * lda + k] : A[k * lda + i];
        const float b = tb == Trans::no ? B[k * ldb + j] : B[j * ldb + k];
        sum += static_cast<double>(a) * b;
      }
      float& c = C[i * ldc + j];
      c = static_cast<float>(alpha * sum + (beta == 0.0f ? 0.0 : static_cast<double>(beta) * c));
    }
}

/// C = alpha * op(A) * op(B) + beta * C with every operand rounded to T (bf16 or fp16) first,
/// accumulated in double: the definition of kernels::gemm_lowp<T>.
template <class T, class TA, class TB>
void gemm_lowp(Trans ta, Trans tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const TA* A,
               std::size_t lda, const TB* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  auto rounded = [](auto v) { return static_cast<float>(T(static_cast<float>(v))); };
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < N; ++j) {
      double sum = 0.0;
      for (std::size_t k = 0; k < K; ++k) {
        const float a = rounded(ta == Trans::no ? A[i * lda + k] : A[k * lda + i]);
        const float b = rounded(tb == Trans::no ? B[k * ldb + j] : B[j * ldb + k]);
        sum += static_cast<double>(a) * b;
      }
      float& c = C[i * ldc + j];
      c = static_cast<float>(alpha * sum + (beta == 0.0f ? 0.0 : static_cast<double>(beta) * c));
    }
}

}  // namespace xtrain::kernels::reference
