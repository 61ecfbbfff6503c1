// lowering/batch_norm.hpp: BatchNorm1d and BatchNorm2d lowered on the host device against the CPU
// layers in training mode (output, input gradient, the affine gradients), and their running
// statistics copied back.
#include <catch2/catch.hpp>

#include "lowering/helpers.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

TEST_CASE("lowered: BatchNorm1d and BatchNorm2d as the CPU layers", "[lowering]") {
  SECTION("BatchNorm1d over [N, C]") { test::layer_against_cpu(nn::BatchNorm1d{5}, Shape{6, 5}, 7); }
  SECTION("BatchNorm2d over NCHW planes") { test::layer_against_cpu(nn::BatchNorm2d{3}, Shape{4, 3, 5, 6}, 8); }
  SECTION("each with the ReLU after it fused") {
    test::layer_against_cpu(nn::Sequential{nn::BatchNorm1d{5}, nn::ReLU{}}, Shape{6, 5}, 9);
    test::layer_against_cpu(nn::Sequential{nn::BatchNorm2d{3}, nn::ReLU{}}, Shape{4, 3, 5, 6}, 10);
  }
}
