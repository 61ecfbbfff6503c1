// layers/layer_norm.hpp: LayerNorm against PyTorch, with and without affine parameters. (Its
// kernels against a double definition: kernels/test_layer_norm.cpp; its gradcheck and 16-bit
// runs: test_transformer.cpp.)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "layers/helpers.hpp"
#include "parity.hpp"
#include "support.hpp"
#include "xtrain/kernels/reference/attention.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

TEST_CASE("LayerNorm matches PyTorch, with and without affine parameters", "[transformer][parity]") {
  nn::LayerNorm ln{8};
  check_against_torch(ln, "gpt", "layernorm");
  nn::LayerNorm plain{8, 1e-3f, false};
  check_against_torch(plain, "gpt", "layernorm_noaffine");
  CHECK(ln.describe() == "LayerNorm((8,), eps=1e-05, elementwise_affine=True)");
}
