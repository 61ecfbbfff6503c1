// layers/sequential.hpp: names as PyTorch's state_dict, buffers, describe(), and the first layer
// skipping the input gradient.
#include <string>
#include <type_traits>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

TEST_CASE("Sequential: names as PyTorch's state_dict and the first layer skips the input gradient", "[layers]") {
  auto model = nn::Sequential{nn::Linear{6, 4}, nn::BatchNorm1d{4}, nn::ReLU{}, nn::Linear{4, 3}};
  static_assert(std::is_same_v<decltype(model), nn::Sequential<nn::Linear, nn::BatchNorm1d, nn::ReLU, nn::Linear>>);
  std::vector<std::string> params, buffers;
  visit_parameters(model, [&](const std::string& n, Param&, ParamKind) { params.push_back(n); });
  visit_buffers(model, [&](const std::string& n, auto&&) { buffers.push_back(n); });
  REQUIRE(params == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"});
  REQUIRE(buffers == std::vector<std::string>{"1.running_mean", "1.running_var", "1.num_batches_tracked"});

  Context ctx;
  const Tensor<float> x = random_matrix(5, 6, 1);
  Tensor<float> dy = random_matrix(5, 3, 2);
  model.forward(ctx, x);
  ctx.input_grad = false;
  REQUIRE(model.backward(ctx, dy).size() == 0);
  model.forward(ctx, x);
  ctx.input_grad = true;
  REQUIRE(model.backward(ctx, dy).shape(1) == 6);
  REQUIRE_THAT(model.describe(), Catch::Contains("(1): BatchNorm1d(4)"));
}
