// lowering/dense.hpp: Linear, the activations, Flatten, Dropout and LayerNorm lowered on the host device against the
// CPU layers (Dropout's masks bitwise: the same Philox stream and counter).
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

TEST_CASE("lowered: Tanh, Sigmoid, GELU (both forms) and SiLU as the CPU layers", "[lowering]") {
  // The device computes them with libm, the CPU with its polynomials: equal to 1e-5 (the helper's
  // margin), on inputs out to +-4 (a Linear of 7 uniform inputs in [-1, 1], weights scaled up).
  set_seed(4);
  const auto check = [](auto activation, std::uint64_t seed) {
    nn::Linear linear{7, 6};
    for (float& w : linear.weight().values()) w *= 4.0f;
    test::layer_against_cpu(nn::Sequential{linear, activation}, Shape{5, 7}, seed);
  };
  check(nn::Tanh{}, 11);
  check(nn::Sigmoid{}, 12);
  check(nn::GELU{}, 13);
  check(nn::GELU{nn::Approximate::tanh}, 14);
  check(nn::SiLU{}, 15);
  check(nn::Activation{"gelu_tanh"}, 16);
  // After a BatchNorm only a ReLU is fused into it; an Activation chosen by name is whichever it names.
  test::layer_against_cpu(nn::Sequential{nn::Linear{7, 6}, nn::BatchNorm1d{6}, nn::Activation{"silu"}}, Shape{5, 7},
                          17);
  test::layer_against_cpu(nn::Sequential{nn::Linear{7, 6}, nn::BatchNorm1d{6}, nn::Activation{"relu"}}, Shape{5, 7},
                          18);
}

TEST_CASE("lowered: Linear's products in bf16 and fp16 (MixedPrecision) round exactly their operands", "[lowering]") {
  set_seed(5);
  using lowering::Products;
  test::layer_against_cpu(nn::Linear{37, 21}, Shape{6, 37}, 21, Products::bf16);
  test::layer_against_cpu(nn::Linear{16, 9, false}, Shape{2, 5, 16}, 22, Products::bf16);
  test::layer_against_cpu(nn::Linear{37, 21}, Shape{6, 37}, 23, Products::fp16);
  test::layer_against_cpu(nn::Linear{16, 9, false}, Shape{2, 5, 16}, 24, Products::fp16);
}

TEST_CASE("lowered: LayerNorm as the CPU layer, with and without affine parameters", "[lowering]") {
  set_seed(7);
  nn::LayerNorm ln{24};
  Generator g(31);
  for (float& w : ln.weight().values()) w = g.uniform(0.5f, 1.5f);  // not the identity it starts as
  for (float& b : ln.bias().values()) b = g.uniform(-0.5f, 0.5f);
  test::layer_against_cpu(ln, Shape{5, 24}, 32);
  test::layer_against_cpu(nn::LayerNorm{20, 1e-3f}, Shape{3, 4, 20}, 33);  // [N, T, C]: rows of every token
  test::layer_against_cpu(nn::LayerNorm{16, 1e-5f, false}, Shape{6, 16}, 34);
  // Inside a model, before a Linear (an MLP's hidden block), the gradients flowing through it.
  test::layer_against_cpu(nn::Sequential{nn::Linear{12, 24}, nn::LayerNorm{24}, nn::GELU{}, nn::Linear{24, 5}},
                          Shape{7, 12}, 35);
}

TEST_CASE("lowered: Dropout draws the CPU layer's masks, bitwise", "[lowering]") {
  test::layer_against_cpu(nn::Dropout{0.3f}, Shape{3, 70}, 8);
  test::layer_against_cpu(nn::Dropout{0.5f}, Shape{2, 4, 3, 3}, 9);
}
