#pragma once
/// \file sgd.hpp
/// Stochastic gradient descent with momentum, dampening, Nesterov momentum (Sutskever et al.,
/// ICML 2013) and L2 weight decay, with exactly PyTorch's update (torch.optim.SGD).

#include <cstddef>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "xtrain/core/concepts.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/param_arena.hpp"

namespace xtrain::optim {

class SGD {
 public:
  static constexpr const char* name = "SGD";
  /// Momentum buffer over the flat parameter buffer; empty until the first step (PyTorch's None).
  struct State {
    AlignedVector momentum_buffer;  // read as PyTorch's None before the first step (StepInfo::step == 1)
    template <class Archive>
    void serialize(Archive& ar, unsigned /*version*/) {
      ar& momentum_buffer;
    }
  };

  SGD() = default;
  SGD& lr(float v) { return set(lr_, v, "lr", v >= 0.0f); }
  SGD& momentum(float v) { return set(momentum_, v, "momentum", v >= 0.0f); }
  SGD& dampening(float v) { return set(dampening_, v, "dampening", v >= 0.0f && v <= 1.0f); }
  SGD& weight_decay(float v) { return set(weight_decay_, v, "weight_decay", v >= 0.0f); }
  SGD& nesterov(bool v) {
    nesterov_ = v;
    return *this;
  }

  float learning_rate() const noexcept { return lr_; }
  float momentum() const noexcept { return momentum_; }
  float dampening() const noexcept { return dampening_; }
  float weight_decay() const noexcept { return weight_decay_; }
  bool nesterov() const noexcept { return nesterov_; }
  /// "SGD(lr=0.1, momentum=0.9, dampening=0, weight_decay=0, nesterov=false)".
  std::string describe() const {
    std::ostringstream os;
    os << "SGD(lr=" << lr_ << ", momentum=" << momentum_ << ", dampening=" << dampening_
       << ", weight_decay=" << weight_decay_ << ", nesterov=" << (nesterov_ ? "true" : "false") << ")";
    return os.str();
  }

  /// Requires: nesterov only with momentum > 0 and dampening == 0 (as PyTorch).
  State init(std::size_t n) const {
    XTRAIN_CHECK(!nesterov_ || (momentum_ > 0.0f && dampening_ == 0.0f), ValueError,
                 "SGD: nesterov momentum requires momentum > 0 and dampening == 0 (got momentum ", momentum_,
                 ", dampening ", dampening_, ")");
    State s;
    if (momentum_ != 0.0f) s.momentum_buffer.assign(n, 0.0f);
    return s;
  }

  /// Calls f on each per-element state vector (for sharding and gathering the state).
  template <class F>
  static void visit_state(State& s, F&& f) {
    if (!s.momentum_buffer.empty()) f(s.momentum_buffer);
  }

  /// d = g + wd * p; buf = d (first step) or momentum * buf + (1 - dampening) * d;
  /// d = nesterov ? d + momentum * buf : buf; p -= lr * d.
  void step(std::span<float> params, std::span<const float> grads, State& state, const StepInfo& info) const {
    const std::size_t n = params.size();
    float* p = params.data();
    const float* g = grads.data();
    float* buf = state.momentum_buffer.data() + info.state_offset;
    const bool started = info.step > 1;  // PyTorch: the buffer is None before the first step
    const float lr = info.lr, wd = weight_decay_ * info.weight_decay_scale, mom = momentum_, damp = 1.0f - dampening_;
    for (std::size_t i = 0; i < n; ++i) {
      float d = wd != 0.0f ? g[i] + wd * p[i] : g[i];
      if (mom != 0.0f) {
        buf[i] = started ? buf[i] * mom + damp * d : d;
        d = nesterov_ ? d + mom * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
  }

 private:
  SGD& set(float& field, float v, const char* what, bool ok) {
    XTRAIN_CHECK(ok, ValueError, "SGD: invalid ", what, " ", v);
    field = v;
    return *this;
  }
  float lr_ = 1e-3f, momentum_ = 0.0f, dampening_ = 0.0f, weight_decay_ = 0.0f;
  bool nesterov_ = false;
};

}  // namespace xtrain::optim
