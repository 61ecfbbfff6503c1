#pragma once
// Inputs of the Google Benchmark programs: matrices of uniform values from a seeded stream.
#include <cstddef>
#include <cstdint>

#include <xtrain/xtrain.hpp>

namespace bench {

/// A [rows, cols] matrix uniform in [-1, 1].
inline xtrain::Tensor<float> random_matrix(std::size_t rows, std::size_t cols, std::uint64_t seed) {
  xtrain::Tensor<float> m({rows, cols});
  xtrain::Generator g(seed, xtrain::streams::user);
  for (float& v : m) v = g.uniform(-1.0f, 1.0f);
  return m;
}

}  // namespace bench
