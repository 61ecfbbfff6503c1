// parallel/sync_tree.hpp: the rank-count-invariant reduction gives bitwise identical parameters
// on 1, 2 and 4 thread-ranks, and the gradients of the default reduction up to rounding.
#include <catch2/catch.hpp>

#include "parallel/helpers.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;

TEST_CASE("Deterministic reduction: 1, 2 and 4 ranks give bitwise identical parameters", "[parallel]") {
  const auto options = TrainingOptions{}.global_batch_size(64).deterministic(16);
  const auto one = train_on(1, options, mlp), two = train_on(2, options, mlp), four = train_on(4, options, mlp);
  REQUIRE(one == two);
  REQUIRE(one == four);
  // The deterministic reduction computes the same gradients as the default one, up to rounding.
  const auto plain = train_on(2, TrainingOptions{}.global_batch_size(64), mlp);
  REQUIRE(max_abs_diff(one, plain) <= 1e-5f);
  REQUIRE_THROWS_WITH(train_on(3, options, mlp), Catch::Contains("power-of-two"));
}
