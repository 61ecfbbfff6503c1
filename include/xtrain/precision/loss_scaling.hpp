#pragma once
/// \file loss_scaling.hpp
/// LossScaling<Precision>: what a precision policy adds to a training step. Under
/// MixedPrecision<fp16> the loss gradient is multiplied by a dynamic scale, the reduced gradients
/// are divided by it and checked once per optimizer step, and a step with Inf or NaN gradients is
/// skipped (optimizer and schedule) while the scale halves (DynamicLossScaler). Under the other
/// policies every member does nothing and the scale is 1.
///
/// Order (design: "Mixed precision"): reduce -> unscale -> agree on overflow -> clip -> step.

#include <cstdint>
#include <span>

#include "xtrain/precision/policy.hpp"

namespace xtrain {

template <Precision P>
class LossScaling {
 public:
  /// Whether this policy scales the loss (fp16).
  static constexpr bool enabled = P::uses_loss_scaling;

  /// Initial scale and the clean steps after which it doubles (ignored when not enabled).
  LossScaling(float init_scale, std::uint64_t growth_interval) : scaler_(init_scale, 2.0f, 0.5f, growth_interval) {}

  /// What the loss gradient is multiplied by before backward (1 when not enabled).
  float factor() const noexcept { return enabled ? scaler_.scale() : 1.0f; }

  /// Divides the reduced gradients of this step by the scale and notes whether any is Inf or NaN.
  /// Once per step: later calls do nothing until end_step() (clipping before the step calls it
  /// first). Does nothing when not enabled.
  void unscale(std::span<float> grads) noexcept {
    if constexpr (enabled) {
      if (unscaled_) return;
      found_inf_ = scaler_.unscale_and_check(grads);
      unscaled_ = true;
    }
  }

  /// Ends the step's check: `agree(found)` turns this rank's finding into the one every rank
  /// shares (the identity when every rank unscaled the same reduced gradients; a sum over ranks
  /// when each unscaled its own block). Updates the scale and returns whether the optimizer may
  /// step (false: skip it). Always true when not enabled.
  template <class Agree>
  bool end_step(Agree&& agree) {
    if constexpr (!enabled) {
      return true;
    } else {
      const bool found = agree(found_inf_);
      unscaled_ = false;
      scaler_.update(found);
      return !found;
    }
  }

  /// The scale itself, its growth tracker and the steps skipped so far (checkpoints).
  DynamicLossScaler& scaler() noexcept { return scaler_; }
  const DynamicLossScaler& scaler() const noexcept { return scaler_; }

 private:
  DynamicLossScaler scaler_;
  bool unscaled_ = false, found_inf_ = false;
};

}  // namespace xtrain
