// Every layer's backward against finite differences (testing/gradcheck.hpp): Linear, BatchNorm1d
// in training and evaluation, every activation, Dropout, and the homework's SimpleModel.
#include <catch2/catch.hpp>

#include "layers/helpers.hpp"
#include "support.hpp"
#include "xtrain/testing/gradcheck.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

namespace {
// Inputs at least 0.1 away from 0, where ReLU has its kink.
Tensor<float> away_from_zero(std::size_t rows, std::size_t cols, std::uint64_t seed) {
  Tensor<float> m = random_matrix(rows, cols, seed, 2.0f);
  for (float& v : m) v = v >= 0 ? v + 0.1f : v - 0.1f;
  return m;
}
}  // namespace

TEST_CASE("gradcheck passes for every layer", "[layers][gradcheck]") {
  set_seed(3);
  SECTION("Linear") {
    nn::Linear l(7, 5);
    require_gradcheck(testing::gradcheck(l, random_matrix(6, 7, 1)));
  }
  SECTION("Linear without bias") {
    nn::Linear l(7, 5, false);
    require_gradcheck(testing::gradcheck(l, random_matrix(6, 7, 1)));
  }
  SECTION("BatchNorm1d, training (gradient through the batch statistics)") {
    nn::BatchNorm1d bn(4);
    for (float& w : bn.weight().values()) w = 1.5f;
    for (float& b : bn.bias().values()) b = -0.2f;
    require_gradcheck(testing::gradcheck(bn, random_matrix(8, 4, 2, 3.0f)));
  }
  SECTION("BatchNorm1d, evaluation") {
    nn::BatchNorm1d bn(4);
    testing::GradcheckOptions o;
    o.training = false;
    require_gradcheck(testing::gradcheck(bn, random_matrix(8, 4, 2, 3.0f), o));
  }
  SECTION("activations") {
    for (auto kind : {nn::ActivationKind::relu, nn::ActivationKind::tanh, nn::ActivationKind::sigmoid,
                      nn::ActivationKind::gelu, nn::ActivationKind::gelu_tanh, nn::ActivationKind::silu}) {
      nn::Activation a(kind);
      INFO(a.describe());
      require_gradcheck(testing::gradcheck(a, away_from_zero(5, 9, 4)));
    }
  }
  SECTION("Dropout (the mask is fixed by the context)") {
    nn::Dropout d(0.3f);
    require_gradcheck(testing::gradcheck(d, random_matrix(6, 10, 5)));
  }
  SECTION("the homework's SimpleModel as a whole") {
    auto model = nn::Sequential{nn::Linear{12, 8}, nn::BatchNorm1d{8}, nn::Tanh{}, nn::Linear{8, 3}};
    require_gradcheck(testing::gradcheck(model, random_matrix(10, 12, 6)));
  }
}
