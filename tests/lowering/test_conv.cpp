// lowering/conv.hpp: Conv2d, MaxPool2d, AvgPool2d and AdaptiveAvgPool2d lowered on the host
// device against the CPU layers (output, input gradient, parameter gradients).
#include <catch2/catch.hpp>

#include "lowering/helpers.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

TEST_CASE("lowered: Conv2d as the CPU layer", "[lowering]") {
  set_seed(1);
  test::layer_against_cpu(nn::Conv2d{1, 6, 5, 1, 2}, Shape{3, 1, 12, 12}, 2);                        // LeNet's first
  test::layer_against_cpu(nn::Conv2d{3, 4, {3, 2}, 2, 1, {1, 2}, 1, false}, Shape{2, 3, 9, 10}, 3);  // strided, dilated
  test::layer_against_cpu(nn::Conv2d{4, 8, 1, 2}, Shape{2, 4, 7, 7}, 4);                   // a ResNet shortcut's shape
  test::layer_against_cpu(nn::Conv2d{4, 6, 3, 2, 1, 1, 1, false}, Shape{2, 4, 8, 8}, 10);  // a ResNet stage's first
}

TEST_CASE("lowered: Conv2d's products in bf16 and fp16 (MixedPrecision) round exactly their operands", "[lowering]") {
  set_seed(2);
  using lowering::Products;
  test::layer_against_cpu(nn::Conv2d{3, 5, 3, 1, 1}, Shape{2, 3, 9, 8}, 23, Products::bf16);
  test::layer_against_cpu(nn::Conv2d{4, 6, 3, 2, 1, 1, 1, false}, Shape{2, 4, 8, 8}, 24, Products::bf16);
  test::layer_against_cpu(nn::Conv2d{3, 5, 3, 1, 1}, Shape{2, 3, 9, 8}, 25, Products::fp16);
  test::layer_against_cpu(nn::Conv2d{4, 6, 3, 2, 1, 1, 1, false}, Shape{2, 4, 8, 8}, 26, Products::fp16);
}

TEST_CASE("lowered: max and average pooling as the CPU layers", "[lowering]") {
  SECTION("max pooling: 2 x 2, overlapping 3 x 3 windows with padding") {
    test::layer_against_cpu(nn::MaxPool2d{2}, Shape{2, 3, 8, 6}, 5);
    test::layer_against_cpu(nn::MaxPool2d{3, 2, 1}, Shape{2, 2, 7, 7}, 6);
  }
  SECTION("average pooling: 2 x 2; overlapping padded windows with and without the padding counted") {
    test::layer_against_cpu(nn::AvgPool2d{2}, Shape{2, 3, 8, 6}, 11);
    test::layer_against_cpu(nn::AvgPool2d{3, 2, 1}, Shape{2, 2, 7, 7}, 12);
    test::layer_against_cpu(nn::AvgPool2d{{3, 2}, {2, 1}, {1, 1}}.count_include_pad(false), Shape{2, 2, 7, 6}, 13);
  }
  SECTION("adaptive average pooling: global (the ResNet's), and to uneven 3 x 2 windows") {
    test::layer_against_cpu(nn::AdaptiveAvgPool2d{1}, Shape{3, 4, 7, 7}, 14);
    test::layer_against_cpu(nn::AdaptiveAvgPool2d{{3, 2}}, Shape{2, 2, 7, 5}, 15);
  }
}
