// kernels/elementwise.hpp: the SIMD activation kernels (forward and backward) and column sums
// against their double-precision and scalar reference twins.
#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/helpers.hpp"
#include "xtrain/kernels/elementwise.hpp"
#include "xtrain/kernels/reference/elementwise.hpp"

using namespace xtrain;
using namespace xtrain::test;

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

TEST_CASE("BatchNorm's column kernels match the definitions, on part of a wider matrix", "[kernels]") {
  // Columns [3, 3 + cols) of rows of ld = 45 floats: as a thread's share of the features.
  const std::size_t rows = 7, cols = 37, ld = 45, j0 = 3;
  const auto x = random_vector(rows * ld, 11), dy = random_vector(rows * ld, 12);
  const auto gamma = random_vector(ld, 13), beta = random_vector(ld, 14);
  const float eps = 1e-5f;
  const double n = static_cast<double>(rows);
  std::vector<double> y_ref(rows * ld), dx_ref(rows * ld), dgamma_ref(ld), dbeta_ref(ld);
  kernels::reference::batch_norm_columns(x.data() + j0, dy.data() + j0, rows, ld, cols, gamma.data() + j0,
                                         beta.data() + j0, eps, y_ref.data() + j0, dx_ref.data() + j0,
                                         dgamma_ref.data() + j0, dbeta_ref.data() + j0);
  // Forward: the statistics, then x-hat and y.
  std::vector<double> sum(ld, 0.0), ssd(ld, 0.0);
  kernels::column_sums_f64(x.data() + j0, rows, ld, cols, sum.data() + j0);
  std::vector<float> mean(ld), invstd(ld);
  for (std::size_t j = j0; j < j0 + cols; ++j) mean[j] = static_cast<float>(sum[j] / n);
  kernels::column_sq_dev_f64(x.data() + j0, rows, ld, cols, mean.data() + j0, ssd.data() + j0);
  for (std::size_t j = j0; j < j0 + cols; ++j) invstd[j] = static_cast<float>(1.0 / std::sqrt(ssd[j] / n + eps));
  std::vector<float> xhat(rows * ld, -7.0f), y(rows * ld, -7.0f);
  kernels::normalize_columns(x.data() + j0, rows, ld, cols, mean.data() + j0, invstd.data() + j0, gamma.data() + j0,
                             beta.data() + j0, xhat.data() + j0, y.data() + j0);
  // Backward: the sums, then dx.
  std::vector<double> sdy(ld, 0.0), sdyx(ld, 0.0);
  kernels::column_sum_dot_f64(dy.data() + j0, xhat.data() + j0, rows, ld, cols, sdy.data() + j0, sdyx.data() + j0);
  std::vector<float> scale(ld), mdy(ld), mdyx(ld), dx(rows * ld, -7.0f);
  for (std::size_t j = j0; j < j0 + cols; ++j) {
    scale[j] = gamma[j] * invstd[j];
    mdy[j] = static_cast<float>(sdy[j] / n);
    mdyx[j] = static_cast<float>(sdyx[j] / n);
  }
  kernels::batch_norm_dx_columns(dy.data() + j0, xhat.data() + j0, rows, ld, cols, scale.data() + j0, mdy.data() + j0,
                                 mdyx.data() + j0, dx.data() + j0);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < ld; ++j) {
      const std::size_t i = r * ld + j;
      if (j < j0 || j >= j0 + cols) {  // outside the columns: untouched
        REQUIRE(y[i] == -7.0f);
        REQUIRE(dx[i] == -7.0f);
        continue;
      }
      REQUIRE(y[i] == Approx(y_ref[i]).margin(1e-5));
      REQUIRE(dx[i] == Approx(dx_ref[i]).margin(1e-5));
    }
  for (std::size_t j = j0; j < j0 + cols; ++j) {
    REQUIRE(sdyx[j] == Approx(dgamma_ref[j]).margin(1e-5));
    REQUIRE(sdy[j] == Approx(dbeta_ref[j]).margin(1e-5));
  }
}

TEST_CASE("column_sums matches the reference and accumulates on request", "[kernels]") {
  for (const std::size_t cols : {37u, 300u}) {  // one partial block; two blocks of 128 and a ragged tail
    const std::size_t rows = 13;
    const auto x = random_vector(rows * cols, 5);
    std::vector<float> out(cols, 0.0f), ref(cols), sequential(cols, 0.0f);
    kernels::column_sums(x.data(), rows, cols, out.data(), false);
    kernels::reference::column_sums(x.data(), rows, cols, ref.data());
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < cols; ++j) sequential[j] += x[r * cols + j];
    for (std::size_t j = 0; j < cols; ++j) {
      REQUIRE(out[j] == Approx(ref[j]).margin(1e-5));
      REQUIRE(out[j] == sequential[j]);  // rows in order: any split of the columns gives these bits
    }
    kernels::column_sums(x.data(), rows, cols, out.data(), true);
    for (std::size_t j = 0; j < cols; ++j) REQUIRE(out[j] == Approx(2 * ref[j]).margin(2e-5));
    // bf16 rows are widened as they are read: the sums of the widened values, and a row stride.
    std::vector<bf16> x16(rows * (cols + 3));
    std::vector<float> widened(rows * cols);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < cols; ++j) {
        x16[r * (cols + 3) + j] = bf16(x[r * cols + j]);
        widened[r * cols + j] = static_cast<float>(x16[r * (cols + 3) + j]);
      }
    std::vector<float> out16(cols), ref16(cols);
    kernels::column_sums(x16.data(), rows, cols, out16.data(), false, cols + 3);
    kernels::column_sums(widened.data(), rows, cols, ref16.data(), false);
    REQUIRE(out16 == ref16);
  }
}
