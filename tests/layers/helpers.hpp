#pragma once
// Helpers of the layer and loss tests: a gradcheck that must pass, with its report on failure;
// a PyTorch fixture tensor with its shape.

#include <string>

#include <catch2/catch.hpp>

#include "xtrain/data/npy.hpp"
#include "xtrain/testing/gradcheck.hpp"

namespace xtrain::test {

inline void require_gradcheck(const testing::GradcheckResult& r) {
  INFO(r.report);
  REQUIRE(r.checked > 0);
  REQUIRE(r.ok);
}

/// The fixture tests/fixtures/<folder>/<name>.npy with its .npy shape (any rank).
inline Matrix fixture_tensor(const std::string& folder, const std::string& name) {
  return data::load_npy_tensor(std::string(XTRAIN_TEST_FIXTURES) + "/" + folder + "/" + name + ".npy");
}

}  // namespace xtrain::test
