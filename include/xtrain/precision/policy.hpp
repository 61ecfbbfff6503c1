#pragma once
/// \file policy.hpp
/// Precision policies: which type the forward/backward computes in. Master weights, optimizer
/// state and reductions are always fp32.

#include <concepts>

namespace xtrain {

/// Everything in fp32.
struct FullPrecision {
  using storage_type = float;  ///< type activations are stored in between layers
  using compute_type = float;  ///< type GEMMs accumulate in
  static constexpr bool uses_loss_scaling = false;
  static constexpr const char* name = "fp32";
};

/// Precision: `storage_type`, `compute_type`, `uses_loss_scaling`, `name`.
template <class P>
concept Precision = requires {
  typename P::storage_type;
  typename P::compute_type;
  { P::uses_loss_scaling } -> std::convertible_to<bool>;
  { P::name } -> std::convertible_to<const char*>;
};

}  // namespace xtrain
