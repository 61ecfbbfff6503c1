// lowering/dense.hpp: Linear, ReLU, Flatten and Dropout lowered on the host device against the CPU
// layers (Dropout's masks bitwise: the same Philox stream and counter).
#include <catch2/catch.hpp>

#include "lowering/helpers.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

TEST_CASE("lowered: Linear, ReLU and Flatten as the CPU layers", "[lowering]") {
  set_seed(3);
  test::layer_against_cpu(nn::Linear{7, 5}, Shape{4, 7}, 1);
  test::layer_against_cpu(nn::Linear{7, 5, false}, Shape{2, 3, 7}, 2);  // [*, in]: rows of every leading index
  test::layer_against_cpu(nn::Sequential{nn::Flatten{}, nn::Linear{12, 3}, nn::ReLU{}}, Shape{3, 2, 2, 3}, 3);
}

TEST_CASE("lowered: Dropout draws the CPU layer's masks, bitwise", "[lowering]") {
  test::layer_against_cpu(nn::Dropout{0.3f}, Shape{3, 70}, 8);
  test::layer_against_cpu(nn::Dropout{0.5f}, Shape{2, 4, 3, 3}, 9);
}
