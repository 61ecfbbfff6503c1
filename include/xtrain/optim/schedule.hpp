#pragma once
/// \file schedule.hpp
/// Learning-rate schedules over optimizer steps: constant, step decay, cosine annealing
/// (Loshchilov & Hutter, arXiv:1608.03983), each optionally after a linear warmup.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "xtrain/core/error.hpp"

namespace xtrain::optim {

/// A value type: `LrSchedule::cosine(total_steps).warmup(500)`. Its state is the Trainer's step
/// count, so it serializes as its settings only.
class LrSchedule {
 public:
  enum class Kind : int { constant, step, cosine };

  /// lr = base_lr throughout.
  static LrSchedule constant() { return LrSchedule{}; }
  /// lr = base_lr * gamma^floor(t / step_size) (PyTorch's StepLR, counted in optimizer steps).
  static LrSchedule step(std::uint64_t step_size, float gamma = 0.1f) {
    XTRAIN_CHECK(step_size > 0, ValueError, "LrSchedule::step: step_size must be positive");
    XTRAIN_CHECK(gamma > 0.0f, ValueError, "LrSchedule::step: gamma ", gamma, " must be positive");
    LrSchedule s;
    s.kind_ = Kind::step;
    s.period_ = step_size;
    s.gamma_ = gamma;
    return s;
  }
  /// lr = min_lr + (base_lr - min_lr) * (1 + cos(pi * t / total_steps)) / 2, then min_lr
  /// (PyTorch's CosineAnnealingLR for one half period).
  static LrSchedule cosine(std::uint64_t total_steps, float min_lr = 0.0f) {
    XTRAIN_CHECK(total_steps > 0, ValueError, "LrSchedule::cosine: total_steps must be positive");
    LrSchedule s;
    s.kind_ = Kind::cosine;
    s.period_ = total_steps;
    s.min_lr_ = min_lr;
    return s;
  }
  /// First `steps` steps ramp linearly from start_factor * lr to lr (PyTorch's LinearLR); the
  /// schedule then runs with t counted from the end of the warmup.
  LrSchedule& warmup(std::uint64_t steps, float start_factor = 0.0f) {
    XTRAIN_CHECK(start_factor >= 0.0f && start_factor <= 1.0f, ValueError, "LrSchedule::warmup: start_factor ",
                 start_factor, " is outside [0, 1]");
    warmup_ = steps;
    start_factor_ = start_factor;
    return *this;
  }

  /// The learning rate of the step taken after `t` completed optimizer steps (t = 0: first step).
  float lr(float base_lr, std::uint64_t t) const {
    if (t < warmup_)
      return base_lr * (start_factor_ + (1.0f - start_factor_) * static_cast<float>(t) / static_cast<float>(warmup_));
    t -= warmup_;
    switch (kind_) {
      case Kind::constant:
        return base_lr;
      case Kind::step:
        return base_lr *
               std::pow(gamma_, static_cast<float>(t / period_));  // NOLINT(bugprone-integer-division): StepLR's floor
      case Kind::cosine: {
        if (t >= period_) return min_lr_;
        const double c = std::cos(3.14159265358979323846 * static_cast<double>(t) / static_cast<double>(period_));
        return static_cast<float>(min_lr_ + (base_lr - min_lr_) * (1.0 + c) / 2.0);
      }
    }
    return base_lr;
  }

  Kind kind() const noexcept { return kind_; }
  /// Whether the rate depends on the step (a warmup, or a kind other than constant).
  bool varies() const noexcept { return kind_ != Kind::constant || warmup_ != 0; }

  /// "constant", "step(100, gamma=0.1)", "cosine(1000, min_lr=0)", with ", warmup(10, 0)".
  std::string describe() const {
    auto num = [](double v) {
      std::ostringstream os;
      os << v;
      return os.str();
    };
    std::string s = kind_ == Kind::constant ? "constant"
                    : kind_ == Kind::step   ? "step(" + std::to_string(period_) + ", gamma=" + num(gamma_) + ")"
                                            : "cosine(" + std::to_string(period_) + ", min_lr=" + num(min_lr_) + ")";
    if (warmup_) s += ", warmup(" + std::to_string(warmup_) + ", " + num(start_factor_) + ")";
    return s;
  }

  template <class Archive>
  void serialize(Archive& ar, unsigned /*version*/) {
    ar& kind_;
    ar& period_;
    ar& gamma_;
    ar& min_lr_;
    ar& warmup_;
    ar& start_factor_;
  }

 private:
  Kind kind_ = Kind::constant;
  std::uint64_t period_ = 1;
  float gamma_ = 0.1f, min_lr_ = 0.0f;
  std::uint64_t warmup_ = 0;
  float start_factor_ = 0.0f;
};

}  // namespace xtrain::optim
