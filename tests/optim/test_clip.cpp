// optim/clip.hpp: clip_grad_norm and clip_grad_value as PyTorch's.
#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;

TEST_CASE("clip_grad_norm and clip_grad_value follow PyTorch", "[optim][clip]") {
  std::vector<float> g{3.0f, 4.0f};
  REQUIRE(optim::clip_grad_norm(g, 1.0) == Approx(5.0));
  REQUIRE(g[0] == Approx(3.0f / (5.0f + 1e-6f)));
  REQUIRE(std::hypot(g[0], g[1]) <= 1.0f);
  std::vector<float> small{0.3f, 0.4f};
  optim::clip_grad_norm(small, 1.0);
  REQUIRE(small[1] == 0.4f);  // below the limit: untouched
  std::vector<float> v{-2.0f, 0.5f, 7.0f};
  optim::clip_grad_value(v, 1.0f);
  REQUIRE(v == std::vector<float>{-1.0f, 0.5f, 1.0f});
}
