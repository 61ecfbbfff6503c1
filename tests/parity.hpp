#pragma once
// Comparison with PyTorch fixtures: max |ours - torch| <= 1e-5 * max |torch| (1e-5 relative to
// the tensor's scale).

#include <algorithm>
#include <cmath>
#include <span>
#include <string>

#include <catch2/catch.hpp>

#include "xtrain/core/tensor.hpp"

namespace xtrain::test {

inline void require_parity(const std::string& name, std::span<const float> ours, const Matrix& torch) {
  REQUIRE(ours.size() == torch.size());
  float scale = 0, diff = 0;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    scale = std::max(scale, std::abs(torch.data()[i]));
    diff = std::max(diff, std::abs(ours[i] - torch.data()[i]));
  }
  INFO(name << ": max |diff| " << diff << ", max |torch| " << scale);
  REQUIRE(scale > 0.0f);
  REQUIRE(diff <= 1e-5f * scale);
}

/// The same, and the shapes must be equal.
inline void require_parity(const std::string& name, const Matrix& ours, const Matrix& torch) {
  INFO(name << ": shape " << ours.shape().str() << ", torch " << torch.shape().str());
  REQUIRE(ours.shape() == torch.shape());
  require_parity(name, std::span<const float>(ours.data(), ours.size()), torch);
}

}  // namespace xtrain::test
