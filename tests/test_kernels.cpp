// Kernels: the SIMD GEMM and element-wise kernels against their scalar reference twins.
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "xtrain/core/rng.hpp"
#include "xtrain/kernels/elementwise.hpp"
#include "xtrain/kernels/gemm.hpp"
#include "xtrain/kernels/reference/elementwise.hpp"
#include "xtrain/kernels/reference/gemm.hpp"

using namespace xtrain;
using kernels::Trans;

namespace {
std::vector<float> random_vector(std::size_t n, std::uint64_t seed) {
  Generator g(seed, streams::user);
  std::vector<float> v(n);
  for (float& x : v) x = g.uniform(-1.0f, 1.0f);
  return v;
}

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
  check_gemm<Arch>(31, 45, 70, Trans::yes, Trans::no, -2.0f, 0.25f);
  check_gemm<Arch>(20, 20, 0, Trans::no, Trans::no, 1.0f, 0.5f);  // K = 0 scales C
}
}  // namespace

TEST_CASE("GEMM matches the scalar reference (default arch)", "[kernels][gemm]") { gemm_suite<simd::default_arch>(); }

TEST_CASE("GEMM matches the scalar reference (SSE2: the plain x86-64 path)", "[kernels][gemm]") {
  gemm_suite<xsimd::sse2>();
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

namespace {
template <class Op>
void check_activation(double (*f)(double), double (*df)(double)) {
  std::vector<float> x = random_vector(1003, 11);  // odd length: exercises the tail
  for (float& v : x) v *= 8.0f;
  x[0] = 0.0f;
  x[1] = 30.0f;
  x[2] = -30.0f;
  x[3] = 1e-6f;
  std::vector<float> y(x.size()), dy = random_vector(x.size(), 12), dx(x.size());
  kernels::activation_forward<Op>(x.data(), y.data(), x.size());
  kernels::activation_backward<Op>(Op::saves_input ? x.data() : y.data(), dy.data(), dx.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("x = " << x[i]);
    REQUIRE(std::isfinite(y[i]));
    REQUIRE(y[i] == Approx(f(x[i])).epsilon(1e-5).margin(1e-6));
    if (x[i] != 0.0f) REQUIRE(dx[i] == Approx(dy[i] * df(x[i])).epsilon(1e-4).margin(2e-6));
  }
}
}  // namespace

TEST_CASE("Activation kernels match their double-precision definitions", "[kernels][activations]") {
  namespace ref = kernels::reference;
  SECTION("relu") { check_activation<kernels::ops::Relu>(ref::relu, ref::relu_grad); }
  SECTION("tanh") { check_activation<kernels::ops::Tanh>(ref::tanh, ref::tanh_grad); }
  SECTION("sigmoid") { check_activation<kernels::ops::Sigmoid>(ref::sigmoid, ref::sigmoid_grad); }
  SECTION("gelu") { check_activation<kernels::ops::GeluErf>(ref::gelu_erf, ref::gelu_erf_grad); }
  SECTION("silu") { check_activation<kernels::ops::Silu>(ref::silu, ref::silu_grad); }
  SECTION("gelu tanh") { check_activation<kernels::ops::GeluTanh>(ref::gelu_tanh, ref::gelu_tanh_grad); }
}

TEST_CASE("column_sums matches the reference and accumulates on request", "[kernels]") {
  const std::size_t rows = 13, cols = 37;
  const auto x = random_vector(rows * cols, 5);
  std::vector<float> out(cols, 0.0f), ref(cols);
  kernels::column_sums(x.data(), rows, cols, out.data(), false);
  kernels::reference::column_sums(x.data(), rows, cols, ref.data());
  for (std::size_t j = 0; j < cols; ++j) REQUIRE(out[j] == Approx(ref[j]).margin(1e-5));
  kernels::column_sums(x.data(), rows, cols, out.data(), true);
  for (std::size_t j = 0; j < cols; ++j) REQUIRE(out[j] == Approx(2 * ref[j]).margin(2e-5));
}
