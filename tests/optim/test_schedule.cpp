// optim/schedule.hpp: constant, step, cosine and warmup learning-rate schedules follow their formulas.
#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;

TEST_CASE("LR schedules follow their formulas", "[optim][schedule]") {
  const float base = 0.1f;
  REQUIRE(optim::LrSchedule::constant().lr(base, 12345) == base);
  const auto step = optim::LrSchedule::step(10, 0.5f);
  REQUIRE(step.lr(base, 9) == Approx(0.1));
  REQUIRE(step.lr(base, 10) == Approx(0.05));
  REQUIRE(step.lr(base, 25) == Approx(0.025));
  const auto cosine = optim::LrSchedule::cosine(100, 0.01f);
  REQUIRE(cosine.lr(base, 0) == Approx(0.1));
  REQUIRE(cosine.lr(base, 50) == Approx(0.055));
  REQUIRE(cosine.lr(base, 100) == Approx(0.01));
  REQUIRE(cosine.lr(base, 500) == Approx(0.01));
  auto warm = optim::LrSchedule::cosine(100).warmup(10);
  REQUIRE(warm.lr(base, 0) == 0.0f);
  REQUIRE(warm.lr(base, 5) == Approx(0.05));
  REQUIRE(warm.lr(base, 10) == Approx(0.1));
  REQUIRE(warm.lr(base, 60) == Approx(0.05));
  REQUIRE_THROWS_AS(optim::LrSchedule::step(0), ValueError);
}
