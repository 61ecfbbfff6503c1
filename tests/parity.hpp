#pragma once
// Comparison with PyTorch fixtures: max |ours - torch| <= 1e-5 * max |torch| (1e-5 relative to
// the tensor's scale); require_close with another tolerance (16-bit results, reference twins).

#include <algorithm>
#include <cmath>
#include <span>
#include <string>

#include <catch2/catch.hpp>

#include "xtrain/core/tensor.hpp"

namespace xtrain::test {

/// max |ours - expected| <= tolerance * max |expected| (and expected is not all zero).
inline void require_close(const std::string& name, std::span<const float> ours, const Tensor<float>& expected,
                          float tolerance) {
  REQUIRE(ours.size() == expected.size());
  float scale = 0, diff = 0;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    scale = std::max(scale, std::abs(expected.data()[i]));
    diff = std::max(diff, std::abs(ours[i] - expected.data()[i]));
  }
  INFO(name << ": max |diff| " << diff << ", max |expected| " << scale << ", tolerance " << tolerance);
  REQUIRE(scale > 0.0f);
  REQUIRE(diff <= tolerance * scale);
}

inline void require_parity(const std::string& name, std::span<const float> ours, const Tensor<float>& torch) {
  require_close(name, ours, torch, 1e-5f);
}

/// The same, and the shapes must be equal.
inline void require_parity(const std::string& name, const Tensor<float>& ours, const Tensor<float>& torch) {
  INFO(name << ": shape " << ours.shape().str() << ", torch " << torch.shape().str());
  REQUIRE(ours.shape() == torch.shape());
  require_parity(name, std::span<const float>(ours.data(), ours.size()), torch);
}

}  // namespace xtrain::test
