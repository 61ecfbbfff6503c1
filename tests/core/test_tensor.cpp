// core/tensor.hpp: tensors of rank 0 to 6, storage that only grows, shapes in messages.
#include <cstdint>
#include <utility>

#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;

TEST_CASE("Tensor: ranks 0 to 6, storage that only grows, shapes in messages", "[modules]") {
  Tensor<float> t({2, 3, 4});
  REQUIRE(t.dimension() == 3);
  REQUIRE(t.size() == 24);
  REQUIRE(t.rows() == 6);
  REQUIRE(t.cols() == 4);
  t(1, 2, 3) = 5.0f;
  REQUIRE(t[23] == 5.0f);
  const float* before = t.data();
  t.resize({2, 2});  // fewer elements: no reallocation
  REQUIRE(t.data() == before);
  REQUIRE(t.shape() == Shape{2, 2});
  REQUIRE(Shape{1, 2, 3, 4, 5, 6}.elements() == 720);
  REQUIRE_THROWS_WITH((Shape{1, 2, 3, 4, 5, 6, 7}), Catch::Contains("at most 6 dimensions"));
  REQUIRE(Shape{32, 784}.str() == "[32, 784]");
  Tensor<std::int32_t> ids({2, 5});
  REQUIRE(ids.size() == 10);
  Tensor<float> scalar(Shape{});  // rank 0: one element
  REQUIRE(scalar.size() == 1);
  REQUIRE(Tensor<float>{}.size() == 0);
  const Tensor<float> moved = std::move(t);
  REQUIRE(moved.shape() == Shape{2, 2});
  REQUIRE(t.size() == 0);  // NOLINT(bugprone-use-after-move): a moved-from tensor is empty
}
