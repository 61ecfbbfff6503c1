// layers/resnet.hpp: BasicBlock against PyTorch (torchvision's layout and names), with the
// downsample shortcut and without. (Its gradcheck: test_conv2d.cpp; bn1 taking relu1:
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

TEST_CASE("BasicBlock matches PyTorch, with and without its downsample shortcut", "[conv][parity]") {
  SECTION("BasicBlock(4, 8, stride=2) with its downsample shortcut") {
    nn::BasicBlock b{4, 8, 2};
    REQUIRE(b.has_downsample());
    check_against_torch(b, "cnn", "block_down");
  }
  SECTION("BasicBlock(4, 4): identity shortcut") {
    nn::BasicBlock b{4, 4};
    REQUIRE(!b.has_downsample());
    check_against_torch(b, "cnn", "block_identity");
  }
}
