#pragma once
/// \file adam.hpp
/// Adam (Kingma & Ba, arXiv:1412.6980) with L2 weight decay, and AdamW with decoupled weight decay
/// (Loshchilov & Hutter, arXiv:1711.05101), both with exactly PyTorch's update, vectorised over
/// the flat parameter buffer.

#include <cmath>
#include <cstddef>
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
    using B = simd::batch<float>;
    constexpr std::size_t w = B::size;
    const double t = static_cast<double>(info.step);
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1_), t);
    const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(static_cast<double>(beta2_), t));
    const float step_size = static_cast<float>(info.lr / bias_correction1);
    const float bc2_sqrt = static_cast<float>(bias_correction2_sqrt);
    const float b1 = beta1_, b2 = beta2_, c1 = 1.0f - beta1_, c2 = 1.0f - beta2_, eps = eps_;
    const float wd = weight_decay_ * info.weight_decay_scale, decay = 1.0f - info.lr * wd;
    float* p = params.data();
    const float* g = grads.data();
    float* m = state.exp_avg.data() + info.state_offset;
    float* v = state.exp_avg_sq.data() + info.state_offset;
    const std::size_t n = params.size();
    std::size_t i = 0;
    for (; i + w <= n; i += w) {
      B pi = B::load_unaligned(p + i), gi = B::load_unaligned(g + i);
      if constexpr (Decoupled) {
        if (wd != 0.0f) pi = pi * B(decay);
      } else {
        if (wd != 0.0f) gi = xsimd::fma(B(wd), pi, gi);
      }
      const B mi = xsimd::fma(B(c1), gi, B::load_unaligned(m + i) * B(b1));
      const B vi = xsimd::fma(B(c2), gi * gi, B::load_unaligned(v + i) * B(b2));
      mi.store_unaligned(m + i);
      vi.store_unaligned(v + i);
      const B denom = xsimd::sqrt(vi) / B(bc2_sqrt) + B(eps);
      (pi - B(step_size) * (mi / denom)).store_unaligned(p + i);
    }
    for (; i < n; ++i) {
      float pi = p[i], gi = g[i];
      if constexpr (Decoupled) {
        if (wd != 0.0f) pi *= decay;
      } else {
        if (wd != 0.0f) gi += wd * pi;
      }
      m[i] = b1 * m[i] + c1 * gi;
      v[i] = b2 * v[i] + c2 * gi * gi;
      p[i] = pi - step_size * (m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps));
    }
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
