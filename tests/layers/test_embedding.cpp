// layers/embedding.hpp: Embedding against PyTorch: rows by id, repeated ids summing into the
// gradient.
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

TEST_CASE("Embedding matches PyTorch: rows, and repeated ids summing into the gradient", "[transformer][parity]") {
  nn::Embedding e{11, 6};
  load_gpt_init(e, "embedding");
  const Tensor<std::int32_t> ids = ids_fixture("embedding.ids");
  Context ctx;
  const Tensor<float> y = e.forward<float>(ctx, ids);
  require_parity("y", y, gpt_fixture("embedding.y"));
  const Tensor<float> dx = e.backward(ctx, gpt_fixture("embedding.dy"));
  CHECK(dx.size() == 0);
  require_parity("grad weight", std::span<const float>(e.weight().grads()), gpt_fixture("embedding.grad.weight"));
}
