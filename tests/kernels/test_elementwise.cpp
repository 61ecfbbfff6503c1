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
