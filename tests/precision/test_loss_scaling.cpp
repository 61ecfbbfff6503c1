// precision/loss_scaling.hpp: what a precision policy adds to a step. fp16 unscales once per
// step, agrees on an overflow (through the caller's rule: a sum over ranks when each checked its
// own block) and skips the step, halving the scale; other policies scale by 1 and always step.
#include <cmath>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "xtrain/precision/loss_scaling.hpp"

using namespace xtrain;

TEST_CASE("LossScaling under fp16: unscale once per step, agree on overflow, skip and halve", "[precision][scaler]") {
  LossScaling<MixedPrecision<fp16>> s(1024.0f, 2);
  REQUIRE(s.enabled);
  REQUIRE(s.factor() == 1024.0f);
  std::vector<float> g{2048.0f, -512.0f};
  s.unscale(g);
  s.unscale(g);  // a second call in the same step (clip first, then step) changes nothing
  REQUIRE(g == std::vector<float>{2.0f, -0.5f});
  bool asked = false;
  REQUIRE(s.end_step([&](bool found) {
    asked = true;
    REQUIRE_FALSE(found);
    return found;
  }));
  REQUIRE(asked);
  // This rank's gradients are finite, another rank's were not: the agreed answer skips the step.
  std::vector<float> h{1.0f};
  s.unscale(h);
  REQUIRE_FALSE(s.end_step([](bool) { return true; }));
  REQUIRE(s.factor() == 512.0f);
  REQUIRE(s.scaler().skipped_steps() == 1);
  // A NaN found here skips it too.
  std::vector<float> bad{std::numeric_limits<float>::quiet_NaN()};
  s.unscale(bad);
  REQUIRE_FALSE(s.end_step([](bool found) { return found; }));
  REQUIRE(s.factor() == 256.0f);
  // Two clean steps in a row (the growth interval) double it.
  for (int i = 0; i < 2; ++i) {
    std::vector<float> ok{1.0f};
    s.unscale(ok);
    REQUIRE(s.end_step([](bool found) { return found; }));
  }
  REQUIRE(s.factor() == 512.0f);
}

TEST_CASE("LossScaling under fp32 and bf16 does nothing: scale 1, gradients untouched, always a step",
          "[precision][scaler]") {
  LossScaling<FullPrecision> full(1024.0f, 2);
  LossScaling<MixedPrecision<bf16>> brain(1024.0f, 2);
  REQUIRE_FALSE(full.enabled);
  REQUIRE_FALSE(brain.enabled);
  REQUIRE(full.factor() == 1.0f);
  REQUIRE(brain.factor() == 1.0f);
  std::vector<float> g{std::numeric_limits<float>::infinity()};
  full.unscale(g);
  REQUIRE(std::isinf(g[0]));
  REQUIRE(full.end_step([](bool) -> bool {
    FAIL("no agreement is needed");
    return true;
  }));
}
