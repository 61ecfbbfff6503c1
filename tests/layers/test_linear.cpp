// layers/linear.hpp: PyTorch's default initialisation, a wrong input shape named in the error,
// and Linear (with an activation) on [B, T, C] as on its rows.
#include <algorithm>
#include <cmath>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "xtrain/testing/gradcheck.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

TEST_CASE("Linear: PyTorch's default initialisation bounds and statistics", "[layers]") {
  set_seed(11);
  nn::Linear l(784, 256);
  const float bound = 1.0f / std::sqrt(784.0f);
  double sum = 0, sq = 0;
  for (float w : l.weight().values()) {
    REQUIRE(std::abs(w) <= bound);
    sum += w;
    sq += static_cast<double>(w) * w;
  }
  const double n = static_cast<double>(l.weight().size());
  REQUIRE(sum / n == Approx(0.0).margin(bound * 0.01));
  REQUIRE(std::sqrt(sq / n) == Approx(bound / std::sqrt(3.0)).epsilon(0.01));  // std of U(-b, b)
  for (float b : l.bias().values()) REQUIRE(std::abs(b) <= bound);
}

TEST_CASE("Linear: a wrong input shape names the layer and both shapes", "[layers][errors]") {
  nn::Linear l(784, 32);
  Context ctx;
  const Tensor<float> x({32, 512});
  REQUIRE_THROWS_AS(l.forward(ctx, x), ShapeError);
  REQUIRE_THROWS_WITH(l.forward(ctx, x), Catch::Contains("Linear(784, 32)") && Catch::Contains("[32, 512]") &&
                                             Catch::Contains("[*, 784]"));
}

TEST_CASE("Last-dimension modules run unchanged on [B, T, C] as on its rows", "[modules]") {
  set_seed(4);
  auto model = nn::Sequential{nn::Linear{5, 7}, nn::GELU{}, nn::Linear{7, 3}};
  Context ctx;
  const Tensor<float> x3 = random_tensor({2, 4, 5}, 1);
  Tensor<float> x2 = x3;
  x2.resize({8, 5});
  const Tensor<float> y3 = model.forward(ctx, x3);
  REQUIRE(y3.shape() == Shape{2, 4, 3});
  const Tensor<float> dy3 = random_tensor({2, 4, 3}, 2);
  REQUIRE(model.backward(ctx, dy3).shape() == Shape{2, 4, 5});
  const Tensor<float> y2 = model.forward(ctx, x2);
  REQUIRE(std::equal(y2.begin(), y2.end(), y3.begin()));
  // A wrong last dimension is refused with the module and both shapes.
  REQUIRE_THROWS_WITH(model.forward(ctx, random_tensor({2, 4, 6}, 3)),
                      Catch::Contains("Linear(5, 7)") && Catch::Contains("[2, 4, 6]") && Catch::Contains("[*, 5]"));
  // gradcheck over a rank-3 input: d/dx and every parameter.
  const auto r = testing::gradcheck(model, random_tensor({2, 3, 5}, 4));
  INFO(r.report);
  REQUIRE(r.ok);
}
