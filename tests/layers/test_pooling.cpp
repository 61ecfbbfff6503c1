// layers/pooling.hpp: MaxPool2d, AvgPool2d and AdaptiveAvgPool2d against PyTorch, in 16-bit
// activations, at the edges (NaN, windows in the padding), and the errors a user meets. (The 2 x 2
// fast path against the scalar loop: test_conv_kernels.cpp; a pool taking the ReLU before it:
// test_fusion.cpp.)
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "layers/helpers.hpp"
#include "parity.hpp"
#include "support.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

TEST_CASE("Pooling matches PyTorch", "[conv][parity]") {
  SECTION("MaxPool2d(2)") {
    nn::MaxPool2d m{2};
    check_against_torch(m, "cnn", "maxpool");
  }
  SECTION("MaxPool2d(3, stride=2, padding=1): overlapping windows sum their gradients") {
    nn::MaxPool2d m{3, 2, 1};
    check_against_torch(m, "cnn", "maxpool_pad");
  }
  SECTION("AvgPool2d(2)") {
    nn::AvgPool2d m{2};
    check_against_torch(m, "cnn", "avgpool");
  }
  SECTION("AvgPool2d(3, stride=2, padding=1), padding counted") {
    nn::AvgPool2d m{3, 2, 1};
    check_against_torch(m, "cnn", "avgpool_pad");
  }
  SECTION("AdaptiveAvgPool2d(1)") {
    nn::AdaptiveAvgPool2d m{1};
    check_against_torch(m, "cnn", "adaptive");
  }
}

TEMPLATE_TEST_CASE("MaxPool2d in 16-bit picks the maximum of the rounded values, exactly", "[conv][precision]", bf16,
                   fp16) {
  const Tensor<float> x = random_tensor({2, 3, 7, 7}, 13);
  Tensor<TestType> x16(x.shape());
  kernels::from_float(x.data(), x16.data(), x.size());
  Tensor<float> rounded(x.shape());
  kernels::to_float(x16.data(), rounded.data(), x.size());
  nn::MaxPool2d a{3, 2, 1}, b{3, 2, 1};
  Context ctx;
  const Tensor<float> y32 = a.forward(ctx, rounded);
  const Tensor<TestType>& y16 = b.forward(ctx, x16);
  Tensor<float> widened(y16.shape());
  kernels::to_float(y16.data(), widened.data(), y16.size());
  REQUIRE(widened == y32);
  const Tensor<float> dy = random_tensor(y32.shape(), 14);
  Tensor<TestType> dy16(dy.shape());
  kernels::from_float(dy.data(), dy16.data(), dy.size());
  Tensor<float> dy_rounded(dy.shape());
  kernels::to_float(dy16.data(), dy_rounded.data(), dy.size());
  const Tensor<float> dx32 = a.backward(ctx, dy_rounded);
  const Tensor<TestType>& dx16 = b.backward(ctx, dy16);
  Tensor<float> dx_widened(dx16.shape()), dx_expected(dx32.shape());
  kernels::to_float(dx16.data(), dx_widened.data(), dx16.size());
  Tensor<TestType> round_trip(dx32.shape());  // a sum of two overlapping windows' gradients rounds once
  kernels::from_float(dx32.data(), round_trip.data(), dx32.size());
  kernels::to_float(round_trip.data(), dx_expected.data(), dx32.size());
  REQUIRE(dx_widened == dx_expected);
}

TEST_CASE("Pooling edge cases: NaN, a window in the padding", "[conv]") {
  Context ctx;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  nn::MaxPool2d pool{2};
  Tensor<float> x({1, 1, 2, 4});
  x.assign({1, nan, 3, 4, 0, 0, 0, 0});
  const Tensor<float> y = pool.forward(ctx, x);  // NaN propagates, as in PyTorch (2 x 2 fast path included)
  REQUIRE(std::isnan(y[0]));
  REQUIRE(y[1] == 4.0f);
  const Tensor<float> tiny({1, 1, 2, 2});  // alive until backward, as the layers need
  nn::MaxPool2d dilated{2, 1, 1, 3};       // its only window reads rows and columns -1 and 2: padding
  REQUIRE(dilated.forward(ctx, tiny).shape() == Shape{1, 1, 1, 1});
  REQUIRE(dilated.backward(ctx, Tensor<float>({1, 1, 1, 1}, {1.0f})) == Tensor<float>({1, 1, 2, 2}));
}

TEST_CASE("Pooling says what is wrong", "[conv][errors]") {
  Context ctx;
  CHECK_THROWS_WITH(nn::MaxPool2d(2, 2, 2), Catch::Contains("padding should be at most half of the kernel size"));
  nn::MaxPool2d pool{2};
  CHECK_THROWS_WITH(pool.backward(ctx, Tensor<float>({1, 1, 2, 2})), Catch::Contains("backward called before forward"));
}
