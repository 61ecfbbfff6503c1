#pragma once
/// \file policy.hpp
/// Precision policies (the third template parameter of the Trainer) and the dynamic loss scaler.
/// Master weights, optimizer state and gradient reductions are always fp32; a policy chooses the
/// type activations are stored in between layers and the type GEMM operands are rounded to
/// (products accumulated in fp32). Loss, softmax and metrics are computed in fp32.

#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>

#include "xtrain/core/error.hpp"
#include "xtrain/core/precision.hpp"

namespace xtrain {

/// Everything in fp32.
struct FullPrecision {
  using storage_type = float;  ///< type activations are stored in between layers
  using compute_type = float;  ///< type GEMM operands are rounded to (accumulation is always fp32)
  static constexpr bool uses_loss_scaling = false;
  static constexpr const char* name = "fp32";
};

/// Activations stored as T (bf16 or fp16) between layers, GEMM operands rounded to T (weights
/// rounded once per GEMM while packing, never stored twice), fp32 accumulation. fp16's narrow
/// exponent range needs dynamic loss scaling; bf16 has fp32's range and does not.
template <class T>
struct MixedPrecision {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, fp16>,
                "xtrain: MixedPrecision<T> takes xtrain::bf16 or xtrain::fp16");
  using storage_type = T;
  using compute_type = T;
  static constexpr bool uses_loss_scaling = std::is_same_v<T, fp16>;
  static constexpr const char* name = T::name;
};

/// Precision: `storage_type`, `compute_type`, `uses_loss_scaling`, `name`.
template <class P>
concept Precision = requires {
  typename P::storage_type;
  typename P::compute_type;
  { P::uses_loss_scaling } -> std::convertible_to<bool>;
  { P::name } -> std::convertible_to<const char*>;
};

/// Fails compilation with one message when `P` is not a Precision policy.
template <class P>
consteval bool check_precision() {
  static_assert(Precision<P>,
                "xtrain: the Precision policy is not a Precision (FullPrecision, MixedPrecision<bf16>, "
                "MixedPrecision<fp16>): it needs `storage_type`, `compute_type`, `uses_loss_scaling` and `name` "
                "(the order: Trainer<Model, Optimizer, Precision, Communicator, Backend, Loss>, "
                "Accelerator<Precision, Communicator, Backend>)");
  return Precision<P>;
}

/// Dynamic loss scaling for fp16 (Micikevicius et al., "Mixed Precision Training", ICLR 2018;
/// PyTorch's GradScaler defaults): the loss gradient is multiplied by scale() so that small
/// gradients survive fp16; after the reduction the gradients are multiplied by 1/scale and checked.
/// A step whose reduced gradients hold Inf or NaN is skipped (optimizer AND LR schedule) and the
/// scale halves; after `growth_interval` clean steps in a row it doubles.
class DynamicLossScaler {
 public:
  /// Requires init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval > 0.
  explicit DynamicLossScaler(float init_scale = 65536.0f, float growth_factor = 2.0f, float backoff_factor = 0.5f,
                             std::uint64_t growth_interval = 2000)
      : scale_(init_scale), growth_(growth_factor), backoff_(backoff_factor), interval_(growth_interval) {
    XTRAIN_CHECK(init_scale > 0.0f && std::isfinite(init_scale), ValueError, "loss scale ", init_scale,
                 " must be positive and finite");
    XTRAIN_CHECK(growth_factor > 1.0f && backoff_factor > 0.0f && backoff_factor < 1.0f && growth_interval > 0,
                 ValueError, "loss scaler: needs growth_factor > 1, 0 < backoff_factor < 1, growth_interval > 0");
  }

  /// The factor the loss gradient is multiplied by.
  float scale() const noexcept { return scale_; }
  /// Clean steps since the last change of scale.
  std::uint64_t growth_tracker() const noexcept { return tracker_; }
  /// Steps skipped because of Inf/NaN gradients, in total.
  std::uint64_t skipped_steps() const noexcept { return skipped_; }

  /// grads *= 1 / scale(); returns true when any of them is Inf or NaN afterwards (call it on the
  /// REDUCED gradients, so every rank finds the same).
  bool unscale_and_check(std::span<float> grads) const noexcept {
    const float inv = 1.0f / scale_;
    bool bad = false;
    for (float& g : grads) {
      g *= inv;
      bad |= !std::isfinite(g);
    }
    return bad;
  }

  /// Records the outcome of a step: an overflow halves the scale (the step was skipped), a run of
  /// growth_interval clean steps doubles it.
  void update(bool found_inf) noexcept {
    if (found_inf) {
      scale_ *= backoff_;
      tracker_ = 0;
      ++skipped_;
      return;
    }
    if (++tracker_ == interval_) {
      scale_ *= growth_;
      tracker_ = 0;
    }
  }

  /// Restores a saved state (scale, growth tracker, skipped steps).
  void restore(float scale, std::uint64_t tracker, std::uint64_t skipped) {
    XTRAIN_CHECK(scale > 0.0f && std::isfinite(scale), ValueError, "restored loss scale ", scale, " is invalid");
    scale_ = scale;
    tracker_ = tracker;
    skipped_ = skipped;
  }

 private:
  float scale_, growth_, backoff_;
  std::uint64_t interval_;
  std::uint64_t tracker_ = 0, skipped_ = 0;
};

}  // namespace xtrain
