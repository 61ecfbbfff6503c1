// layers/dropout.hpp: rate, scale and identity in evaluation; masks that depend on the sample's
// global position (not on how the batch is split) and on the module's id.
#include <algorithm>

#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

TEST_CASE("Dropout: rate and scale and identity in eval and masks independent of how the batch is split", "[layers]") {
  nn::Dropout d(0.25f);
  Context ctx;
  ctx.seed = 9;
  ctx.step = 4;
  Tensor<float> x({200, 50});
  x.fill(1.0f);
  const Tensor<float> y = d.forward(ctx, x);
  std::size_t zeros = 0;
  for (float v : y) {
    REQUIRE((v == 0.0f || v == Approx(1.0f / 0.75f)));
    zeros += v == 0.0f;
  }
  REQUIRE(static_cast<double>(zeros) / static_cast<double>(y.size()) == Approx(0.25).margin(0.02));
  // Rows 100..199 computed alone, as rank 1 of 2 would, give the same mask.
  Tensor<float> half({100, 50});
  half.fill(1.0f);
  ctx.sample_offset = 100;
  const Tensor<float> y2 = d.forward(ctx, half);
  for (std::size_t i = 0; i < y2.size(); ++i) REQUIRE(y2.data()[i] == y.data()[100 * 50 + i]);
  ctx.sample_offset = 0;
  ctx.step = 5;
  REQUIRE(d.forward(ctx, x) != y);  // a new step draws a new mask
  ctx.training = false;
  REQUIRE(&d.forward(ctx, x) == &x);
  REQUIRE_THROWS_AS(nn::Dropout(1.5f), ValueError);
}

TEST_CASE("Two Dropouts at the same position in different blocks draw different masks", "[modules]") {
  auto model = nn::Sequential{nn::Sequential{nn::Dropout{0.5f}}, nn::Sequential{nn::Dropout{0.5f}}};
  assign_module_ids(model);
  Context ctx;
  ctx.seed = 42;
  ctx.step = 3;
  Tensor<float> x({4, 64});
  x.fill(1.0f);
  const Tensor<float> a = model.get<0>().forward(ctx, x);
  const Tensor<float> b = model.get<1>().forward(ctx, x);
  REQUIRE(a != b);
  // The same module draws the same mask again (a pure function of seed, id, step, position).
  REQUIRE(model.get<0>().forward(ctx, x) == a);
  // A mask follows the global position of the sample, whatever the rank of the tensor.
  Tensor<float> x3({4, 8, 8});
  x3.fill(1.0f);
  const Tensor<float> a3 = model.get<0>().forward(ctx, x3);
  REQUIRE(std::equal(a3.begin(), a3.end(), a.begin()));
}
