#pragma once
/// \file adam.hpp
/// Adam (Kingma & Ba, arXiv:1412.6980) with L2 weight decay, and AdamW with decoupled weight decay
/// (Loshchilov & Hutter, arXiv:1711.05101), both with exactly PyTorch's update, vectorised over
/// the flat parameter buffer.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>

#include "xtrain/core/concepts.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/kernels/simd.hpp"

namespace xtrain::optim {

namespace detail {

/// Hyper-parameters and the update shared by Adam and AdamW.
template <class Derived, bool Decoupled>
class AdamBase {
 public:
  /// First and second moments over the flat parameter buffer.
  struct State {
    AlignedVector exp_avg, exp_avg_sq;
    template <class Archive>
    void serialize(Archive& ar, unsigned /*version*/) {
      ar& exp_avg;
      ar& exp_avg_sq;
    }
  };

  Derived& lr(float v) { return set(lr_, v, "lr", v >= 0.0f); }
  Derived& betas(float beta1, float beta2) {
    set(beta1_, beta1, "beta1", beta1 >= 0.0f && beta1 < 1.0f);
    return set(beta2_, beta2, "beta2", beta2 >= 0.0f && beta2 < 1.0f);
  }
  Derived& eps(float v) { return set(eps_, v, "eps", v >= 0.0f); }
  Derived& weight_decay(float v) { return set(weight_decay_, v, "weight_decay", v >= 0.0f); }

  float learning_rate() const noexcept { return lr_; }
  /// "Adam(lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0)".
  std::string describe() const {
    std::ostringstream os;
    os << Derived::name << "(lr=" << lr_ << ", betas=(" << beta1_ << ", " << beta2_ << "), eps=" << eps_
       << ", weight_decay=" << weight_decay_ << ")";
    return os.str();
  }
  float beta1() const noexcept { return beta1_; }
  float beta2() const noexcept { return beta2_; }
  float eps() const noexcept { return eps_; }
  float weight_decay() const noexcept { return weight_decay_; }

  State init(std::size_t n) const {
    State s;
    s.exp_avg.assign(n, 0.0f);
    s.exp_avg_sq.assign(n, 0.0f);
    return s;
  }

  /// Calls f on each per-element state vector (for sharding and gathering the state).
  template <class F>
  static void visit_state(State& s, F&& f) {
    f(s.exp_avg);
    f(s.exp_avg_sq);
  }

  /// PyTorch 1.13 `_single_tensor_adam(w)`:
  ///   AdamW: p *= 1 - lr * wd;      Adam: g += wd * p
  ///   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
  ///   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
  void step(std::span<float> params, std::span<const float> grads, State& state, const StepInfo& info) const {
    const Coefficients k = coefficients(info.lr, info.step, info.weight_decay_scale);
    float* p = params.data();
    const float* g = grads.data();
    float* m = state.exp_avg.data() + info.state_offset;
    float* v = state.exp_avg_sq.data() + info.state_offset;
    const std::size_t n = params.size();
    const std::size_t whole = n - n % simd::batch<float>::size;  // SIMD batches, then the tail
    for (std::size_t i = 0; i < whole; i += simd::batch<float>::size) update(k, p + i, g + i, m + i, v + i);
    for (std::size_t i = whole; i < n; ++i) {
      float pi = p[i], gi = g[i];
      if constexpr (Decoupled) {
        if (k.wd != 0.0f) pi *= k.decay;
      } else {
        if (k.wd != 0.0f) gi += k.wd * pi;
      }
      m[i] = k.b1 * m[i] + k.c1 * gi;
      v[i] = k.b2 * v[i] + k.c2 * gi * gi;
      p[i] = pi - k.step_size * (m[i] / (std::sqrt(v[i]) / k.bc2_sqrt + k.eps));
    }
  }

  /// The numbers of one step's update (the learning rate after the schedule and the group's
  /// multiplier, the 1-based step count, the group's weight-decay multiplier).
  struct Coefficients {
    float step_size, bc2_sqrt, b1, b2, c1, c2, eps, wd, decay;
  };
  Coefficients coefficients(float lr, std::uint64_t step, float weight_decay_scale) const {
    const double t = static_cast<double>(step);
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1_), t);
    const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(static_cast<double>(beta2_), t));
    const float wd = weight_decay_ * weight_decay_scale;
    return {static_cast<float>(lr / bias_correction1),
            static_cast<float>(bias_correction2_sqrt),
            beta1_,
            beta2_,
            1.0f - beta1_,
            1.0f - beta2_,
            eps_,
            wd,
            1.0f - lr * wd};
  }
  /// The update of one SIMD batch of parameters `p`, gradients `g` and moments `m`, `v` (the
  /// loop body of step(); the 8-bit optimizers call it too, so that their fp32 parts update
  /// bitwise as Adam's).
  static void update(const Coefficients& k, float* p, const float* g, float* m, float* v) {
    using B = simd::batch<float>;
    B pi = B::load_unaligned(p), gi = B::load_unaligned(g);
    if constexpr (Decoupled) {
      if (k.wd != 0.0f) pi = pi * B(k.decay);
    } else {
      if (k.wd != 0.0f) gi = xsimd::fma(B(k.wd), pi, gi);
    }
    const B mi = xsimd::fma(B(k.c1), gi, B::load_unaligned(m) * B(k.b1));
    const B vi = xsimd::fma(B(k.c2), gi * gi, B::load_unaligned(v) * B(k.b2));
    mi.store_unaligned(m);
    vi.store_unaligned(v);
    const B denom = xsimd::sqrt(vi) / B(k.bc2_sqrt) + B(k.eps);
    (pi - B(k.step_size) * (mi / denom)).store_unaligned(p);
  }

 protected:
  AdamBase() = default;
  explicit AdamBase(float weight_decay) : weight_decay_(weight_decay) {}

 private:
  Derived& set(float& field, float v, const char* name, bool ok) {
    XTRAIN_CHECK(ok, ValueError, Decoupled ? "AdamW" : "Adam", ": invalid ", name, " ", v);
    field = v;
    return static_cast<Derived&>(*this);
  }
  float lr_ = 1e-3f, beta1_ = 0.9f, beta2_ = 0.999f, eps_ = 1e-8f, weight_decay_ = 0.0f;
};

}  // namespace detail

/// Adam: `Adam{}.lr(1e-3f).betas(0.9f, 0.999f).eps(1e-8f).weight_decay(0.0f)` (PyTorch defaults).
class Adam : public detail::AdamBase<Adam, false> {
 public:
  static constexpr const char* name = "Adam";
  Adam() = default;
};

/// AdamW: as Adam but the weight decay is decoupled; PyTorch's default weight_decay is 0.01.
class AdamW : public detail::AdamBase<AdamW, true> {
 public:
  static constexpr const char* name = "AdamW";
  AdamW() : AdamBase(0.01f) {}
};

}  // namespace xtrain::optim
