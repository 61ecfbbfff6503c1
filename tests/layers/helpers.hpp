#pragma once
// Helpers of the layer and loss tests: a gradcheck that must pass, with its report on failure.

#include <catch2/catch.hpp>

#include "xtrain/testing/gradcheck.hpp"

namespace xtrain::test {

inline void require_gradcheck(const testing::GradcheckResult& r) {
  INFO(r.report);
  REQUIRE(r.checked > 0);
  REQUIRE(r.ok);
}

}  // namespace xtrain::test
