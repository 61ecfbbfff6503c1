// core/error.hpp: XTRAIN_CHECK throws the named exception type with the streamed message.
#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;

TEST_CASE("XTRAIN_CHECK throws the named type with the streamed message", "[error]") {
  auto f = [](int v) { XTRAIN_CHECK(v > 0, ValueError, "value ", v, " must be positive"); };
  REQUIRE_NOTHROW(f(1));
  REQUIRE_THROWS_AS(f(-3), ValueError);
  REQUIRE_THROWS_WITH(f(-3), "value -3 must be positive");
  REQUIRE(shape_string({32, 784}) == "[32, 784]");
}
