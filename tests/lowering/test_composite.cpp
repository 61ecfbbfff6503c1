// lowering/composite.hpp: Residual and BasicBlock lowered on the host device against the CPU
// layers (output, input gradient, every parameter's gradient); Sequential is exercised by every
// model test (tests/lowering/test_model.cpp).
#include <catch2/catch.hpp>

#include "lowering/helpers.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

TEST_CASE("lowered: Residual and BasicBlock as the CPU layers", "[lowering]") {
  set_seed(21);
  SECTION("Residual{Sequential{Linear, ReLU, Linear}}") {
    test::layer_against_cpu(nn::Residual{nn::Sequential{nn::Linear{6, 8}, nn::ReLU{}, nn::Linear{8, 6}}}, Shape{5, 6},
                            1);
  }
  SECTION("BasicBlock with the identity shortcut") {
    test::layer_against_cpu(nn::BasicBlock{4, 4}, Shape{3, 4, 6, 6}, 2);
  }
  SECTION("BasicBlock with a downsampling shortcut (stride 2, more channels)") {
    test::layer_against_cpu(nn::BasicBlock{4, 8, 2}, Shape{3, 4, 7, 7}, 3);
  }
}
