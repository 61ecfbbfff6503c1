// Every loss's gradient against finite differences (testing/gradcheck.hpp): cross-entropy and MSE.
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "layers/helpers.hpp"
#include "support.hpp"
#include "xtrain/testing/gradcheck.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;

TEST_CASE("gradcheck passes for every loss", "[loss][gradcheck]") {
  const Tensor<float> logits = random_matrix(6, 5, 9, 3.0f);
  SECTION("cross-entropy") {
    const std::vector<std::int32_t> labels{0, 4, 2, 2, 1, 3};
    loss::CrossEntropyLoss ce;
    ce.forward(logits, labels);
    const Tensor<float> grad = ce.backward();
    auto f = [&](const Tensor<float>& z) { return loss::CrossEntropyLoss{}.forward(z, labels); };
    require_gradcheck(testing::gradcheck_function(f, logits, grad));
  }
  SECTION("MSE") {
    const Tensor<float> target = random_matrix(6, 5, 10);
    loss::MSELoss mse;
    mse.forward(logits, target);
    const Tensor<float> grad = mse.backward();
    auto f = [&](const Tensor<float>& z) { return loss::MSELoss{}.forward(z, target); };
    require_gradcheck(testing::gradcheck_function(f, logits, grad));
  }
}
