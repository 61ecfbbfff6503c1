// kernels/gemm.hpp: the SIMD GEMM against its scalar reference twin at every transposition, with
// the default architecture and SSE2, and exactly on integers.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/helpers.hpp"
#include "xtrain/kernels/gemm.hpp"
#include "xtrain/kernels/reference/gemm.hpp"

using namespace xtrain;
using namespace xtrain::test;
using kernels::Trans;

namespace {
template <class Arch>
void check_gemm(std::size_t M, std::size_t N, std::size_t K, Trans ta, Trans tb, float alpha, float beta) {
  const std::size_t lda = (ta == Trans::no ? K : M) + 3, ldb = (tb == Trans::no ? N : K) + 1, ldc = N + 2;
  const auto A = random_vector((ta == Trans::no ? M : K) * lda, 1);
  const auto B = random_vector((tb == Trans::no ? K : N) * ldb, 2);
  auto C = random_vector(M * ldc, 3);
  if (beta == 0.0f)  // beta = 0 must ignore C, NaN included
    for (float& c : C) c = std::numeric_limits<float>::quiet_NaN();
  auto ref = C;
  kernels::gemm<Arch>(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  kernels::reference::gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, ref.data(), ldc);
  const float tol = 2e-6f * static_cast<float>(K + 4);
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < N; ++j) {
      INFO(Arch::name() << " M=" << M << " N=" << N << " K=" << K << " ta=" << (ta == Trans::yes)
                        << " tb=" << (tb == Trans::yes) << " at (" << i << ", " << j << ")");
      REQUIRE(std::abs(C[i * ldc + j] - ref[i * ldc + j]) <= tol);
    }
  // Padding columns between N and ldc are never written.
  if (beta != 0.0f)
    for (std::size_t i = 0; i < M; ++i) REQUIRE(C[i * ldc + N] == ref[i * ldc + N]);
}

template <class Arch>
void gemm_suite() {
  const std::array<std::size_t, 3> sizes[] = {{1, 1, 1},     {3, 5, 7},    {8, 32, 17},    {32, 32, 784}, {33, 65, 257},
                                              {100, 3, 300}, {7, 100, 33}, {129, 47, 513}, {2, 2100, 3}};
  for (auto [M, N, K] : sizes)
    for (Trans ta : {Trans::no, Trans::yes})
      for (Trans tb : {Trans::no, Trans::yes}) check_gemm<Arch>(M, N, K, ta, tb, 1.0f, 0.0f);
  check_gemm<Arch>(31, 45, 70, Trans::no, Trans::yes, 0.5f, 1.0f);
  check_gemm<Arch>(31, 10, 300, Trans::no, Trans::yes, 0.5f, 1.0f);  // dot tiles (AVX-512), alpha and beta
  check_gemm<Arch>(33, 45, 300, Trans::no, Trans::yes, -1.5f, 0.25f);
  check_gemm<Arch>(31, 45, 70, Trans::no, Trans::no, 0.5f, 1.0f);  // A and B in place
  check_gemm<Arch>(5, 70, 600, Trans::no, Trans::no, 1.0f, 1.0f);  // one tile of rows, K in blocks
  check_gemm<Arch>(31, 45, 70, Trans::yes, Trans::no, -2.0f, 0.25f);
  check_gemm<Arch>(20, 20, 0, Trans::no, Trans::no, 1.0f, 0.5f);  // K = 0 scales C
}
}  // namespace

TEST_CASE("GEMM matches the scalar reference (default arch)", "[kernels][gemm]") { gemm_suite<simd::default_arch>(); }

TEST_CASE("GEMM matches the scalar reference (SSE2: the plain x86-64 path)", "[kernels][gemm]") {
  gemm_suite<xsimd::sse2>();
}

namespace {
/// gemm with a bias against the two passes it replaces (the bias written into C, then beta = 1):
/// bitwise the same at alpha = 1, beta = 0, on every path (dot tiles, packed or in-place operands,
/// one tile of rows, K in several blocks, ragged tiles, K = 0); and against the reference plus
/// the bias at any alpha and beta.
template <class Arch>
void check_gemm_bias(std::size_t M, std::size_t N, std::size_t K, Trans ta, Trans tb) {
  const std::size_t lda = ta == Trans::no ? K : M, ldb = tb == Trans::no ? N : K, ldc = N + 2;
  const auto A = random_vector((ta == Trans::no ? M : K) * lda, 11);
  const auto B = random_vector((tb == Trans::no ? K : N) * ldb, 12);
  const auto bias = random_vector(N, 13);
  std::vector<float> fused(M * ldc, std::numeric_limits<float>::quiet_NaN()), two_pass(M * ldc, 0.0f);
  for (std::size_t i = 0; i < M; ++i) std::copy(bias.begin(), bias.end(), two_pass.data() + i * ldc);
  kernels::gemm<Arch>(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, fused.data(), ldc, nullptr,
                      bias.data());
  kernels::gemm<Arch>(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 1.0f, two_pass.data(), ldc);
  INFO(Arch::name() << " M=" << M << " N=" << N << " K=" << K << " ta=" << (ta == Trans::yes)
                    << " tb=" << (tb == Trans::yes));
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < N; ++j) REQUIRE(fused[i * ldc + j] == two_pass[i * ldc + j]);
  auto C = random_vector(M * ldc, 14), ref = C;
  kernels::gemm<Arch>(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 0.25f, C.data(), ldc, nullptr, bias.data());
  kernels::reference::gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 0.25f, ref.data(), ldc);
  const float tol = 2e-6f * static_cast<float>(K + 4);
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < N; ++j) REQUIRE(std::abs(C[i * ldc + j] - (ref[i * ldc + j] + bias[j])) <= tol);
}

template <class Arch>
void gemm_bias_suite() {
  // ... and N past a packed block of columns (2048): the bias follows the block.
  const std::array<std::size_t, 3> sizes[] = {{37, 45, 300}, {37, 10, 40}, {37, 70, 100}, {5, 70, 600}, {31, 45, 70},
                                              {33, 65, 600}, {1, 1, 1},    {20, 20, 0},   {3, 2100, 5}};
  for (auto [M, N, K] : sizes)
    for (Trans ta : {Trans::no, Trans::yes})
      for (Trans tb : {Trans::no, Trans::yes}) check_gemm_bias<Arch>(M, N, K, ta, tb);
}
}  // namespace

TEST_CASE("GEMM's bias equals the bias written first and beta = 1, bitwise", "[kernels][gemm]") {
  gemm_bias_suite<simd::default_arch>();
  gemm_bias_suite<xsimd::sse2>();
}

TEST_CASE("GEMM of the Linear shapes is exact on integers", "[kernels][gemm]") {
  // Small integers make every partial sum exact: any indexing slip shows as a wrong integer.
  const std::size_t M = 32, N = 32, K = 784;
  std::vector<float> A(M * K), B(N * K), C(M * N), R(M * N);
  for (std::size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
  for (std::size_t i = 0; i < B.size(); ++i) B[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
  kernels::gemm(Trans::no, Trans::yes, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);
  kernels::reference::gemm(Trans::no, Trans::yes, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, R.data(), N);
  REQUIRE(C == R);
}

TEST_CASE("A row of a Linear layer's products does not depend on the other rows", "[kernels][gemm]") {
  // A sample's output (x W^T) and input gradient (dY W) are the same in any batch, and in any
  // split of it over ranks or threads: each element's order of summation depends on N and K only.
  for (const Trans tb : {Trans::yes, Trans::no})
    for (const auto& [N, K] :
         std::vector<std::array<std::size_t, 2>>{{10, 300}, {50, 300}, {10, 40}, {70, 100}, {33, 2100}, {64, 600}}) {
      const std::size_t M = 37, ldb = tb == Trans::yes ? K : N;
      const auto A = random_vector(M * K, 4), B = random_vector(N * K, 5);
      std::vector<float> C(M * N), row(N);
      kernels::gemm(Trans::no, tb, M, N, K, 1.0f, A.data(), K, B.data(), ldb, 0.0f, C.data(), N);
      for (std::size_t i = 0; i < M; ++i) {
        kernels::gemm(Trans::no, tb, 1, N, K, 1.0f, A.data() + i * K, K, B.data(), ldb, 0.0f, row.data(), N);
        INFO("N=" << N << " K=" << K << " B transposed " << (tb == Trans::yes) << " row " << i);
        REQUIRE(std::equal(row.begin(), row.end(), C.begin() + static_cast<std::ptrdiff_t>(i * N)));
      }
    }
}
