#pragma once
// Helpers of the kernel tests: random operands.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "xtrain/core/rng.hpp"

namespace xtrain::test {

/// n floats uniform in [-1, 1].
inline std::vector<float> random_vector(std::size_t n, std::uint64_t seed) {
  Generator g(seed, streams::user);
  std::vector<float> v(n);
  for (float& x : v) x = g.uniform(-1.0f, 1.0f);
  return v;
}

}  // namespace xtrain::test
