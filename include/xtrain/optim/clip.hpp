#pragma once
/// \file clip.hpp
/// Gradient clipping over the flat gradient buffer, as torch.nn.utils.clip_grad_norm_ and
/// clip_grad_value_. Applied after the cross-rank reduction, so every rank clips identically.

#include <algorithm>
#include <cmath>
#include <span>

namespace xtrain::optim {

/// Scales the gradients so their global L2 norm is at most max_norm (coefficient
/// max_norm / (norm + 1e-6), applied only when below 1). Returns the norm before clipping.
inline double clip_grad_norm(std::span<float> grads, double max_norm) {
  double sq = 0.0;
  for (float g : grads) sq += static_cast<double>(g) * g;
  const double norm = std::sqrt(sq);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (float& g : grads) g = static_cast<float>(g * coef);
  return norm;
}

/// Clamps every gradient to [-clip_value, clip_value].
inline void clip_grad_value(std::span<float> grads, float clip_value) {
  for (float& g : grads) g = std::clamp(g, -clip_value, clip_value);
}

}  // namespace xtrain::optim
