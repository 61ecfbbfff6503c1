// lowering/attention.hpp: CausalSelfAttention lowered onto the host device against the CPU layer
// (output, input gradient, both projections' gradients), at head sizes of 8 and 5.
#include <catch2/catch.hpp>

#include "lowering/helpers.hpp"

using namespace xtrain;
namespace nn = xtrain::layers;

TEST_CASE("lowered: CausalSelfAttention as the CPU layer", "[lowering]") {
  set_seed(3);
  test::layer_against_cpu(nn::CausalSelfAttention{16, 2}, Shape{3, 5, 16}, 41);
  test::layer_against_cpu(nn::CausalSelfAttention{15, 3}, Shape{2, 9, 15}, 42);
  // A transformer block's attention half, over float features: LayerNorm, attention, a residual.
  test::layer_against_cpu(
      nn::Sequential{nn::Linear{6, 12}, nn::Residual{nn::Sequential{nn::LayerNorm{12}, nn::CausalSelfAttention{12, 2}}},
                     nn::Linear{12, 4}},
      Shape{2, 7, 6}, 43);
}
