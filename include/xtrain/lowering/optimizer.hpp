#pragma once
/// \file optimizer.hpp
/// The optimizers on a device (lowering/device.hpp): `lowering::DeviceOptimizer<Optimizer, D>`
/// keeps an optimizer's per-element state in device memory, in the host ParamArena's order, and
/// enqueues one step as a pass over the whole arena (the step's scalars computed on the device
/// from the step counter and learning rate there, so that a replayed graph advances them).
/// Adam and AdamW (optim::Adam's update), SGD (momentum, dampening, Nesterov, weight decay).
/// Each has:
///   DeviceOptimizer(D&, const Optimizer&, std::size_t n)
///   void enqueue(D&, float* values, const float* grads, const float* lr, std::uint64_t* step,
///                const ops::LossScaleState* scaling)   (fp16: skips a step whose gradients overflowed)
///   void upload(D&, const Optimizer::State&)   (vectors shorter than n: zeros, a fresh state)
///   void download(D&, Optimizer::State&)       (into the vectors that are not empty)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "xtrain/core/param_arena.hpp"
#include "xtrain/kernels/device_ops.hpp"
#include "xtrain/lowering/device.hpp"
#include "xtrain/optim/adam.hpp"
#include "xtrain/optim/sgd.hpp"

namespace xtrain::lowering {

namespace ops = kernels::device;

template <class Optimizer, class D>
class DeviceOptimizer {
  static_assert(no_lowering<Optimizer>,
                "xtrain: the device backends run optim::Adam, optim::AdamW and optim::SGD so far");
};

namespace detail {
// A state vector of n elements on the device from the host's (zeros when it is shorter: a fresh
// state), and back into the host's when that has room.
template <class D, class V>
void state_upload(D& dev, float* device, const V& host, std::size_t n) {
  if (host.size() >= n)
    dev.upload(device, host.data(), n);
  else
    dev.zero(device, n);
}
template <class D, class V>
void state_download(D& dev, V& host, const float* device, std::size_t n) {
  if (!host.empty()) dev.download(host.data(), device, std::min(host.size(), n));
}

template <class Optimizer, class D>
class DeviceAdam {
  static constexpr bool decoupled = std::is_same_v<Optimizer, optim::AdamW>;

 public:
  DeviceAdam(D& dev, const Optimizer& o, std::size_t n) : o_(o), n_(n), m_(dev, n), v_(dev, n), scalars_(dev, 1) {}
  void enqueue(D& dev, float* values, const float* grads, const float* lr, std::uint64_t* step,
               const ops::LossScaleState* scaling = nullptr) {
    dev.launch(
        ops::AdamPrepare{lr, step, scalars_.data(), o_.beta1(), o_.beta2(), o_.eps(), o_.weight_decay(), scaling});
    dev.launch(ops::AdamUpdate<decoupled>{values, m_.data(), v_.data(), grads, scalars_.data(), n_});
  }
  void upload(D& dev, const typename Optimizer::State& s) {
    state_upload(dev, m_.data(), s.exp_avg, n_);
    state_upload(dev, v_.data(), s.exp_avg_sq, n_);
  }
  void download(D& dev, typename Optimizer::State& s) {
    state_download(dev, s.exp_avg, m_.data(), n_);
    state_download(dev, s.exp_avg_sq, v_.data(), n_);
  }

 private:
  Optimizer o_;
  std::size_t n_;
  typename D::template Buffer<float> m_, v_;
  typename D::template Buffer<ops::AdamScalars> scalars_;
};
}  // namespace detail

template <class D>
class DeviceOptimizer<optim::Adam, D> : public detail::DeviceAdam<optim::Adam, D> {
  using detail::DeviceAdam<optim::Adam, D>::DeviceAdam;
};
template <class D>
class DeviceOptimizer<optim::AdamW, D> : public detail::DeviceAdam<optim::AdamW, D> {
  using detail::DeviceAdam<optim::AdamW, D>::DeviceAdam;
};

template <class D>
class DeviceOptimizer<optim::SGD, D> {
 public:
  DeviceOptimizer(D& dev, const optim::SGD& o, std::size_t n)
      : o_(o), n_(n), buf_(dev, o.momentum() != 0.0f ? n : 0), scalars_(dev, 1) {
    (void)o.init(0);  // its checks (Nesterov needs momentum and no dampening)
  }
  void enqueue(D& dev, float* values, const float* grads, const float* lr, std::uint64_t* step,
               const ops::LossScaleState* scaling = nullptr) {
    dev.launch(ops::SgdPrepare{lr, step, scalars_.data(), scaling});
    dev.launch(ops::SgdUpdate{values, buf_.data(), grads, scalars_.data(), n_, o_.momentum(), 1.0f - o_.dampening(),
                              o_.weight_decay(), o_.nesterov()});
  }
  void upload(D& dev, const optim::SGD::State& s) {
    if (o_.momentum() != 0.0f) detail::state_upload(dev, buf_.data(), s.momentum_buffer, n_);
  }
  void download(D& dev, optim::SGD::State& s) {
    if (o_.momentum() != 0.0f) detail::state_download(dev, s.momentum_buffer, buf_.data(), n_);
  }

 private:
  optim::SGD o_;
  std::size_t n_;
  typename D::template Buffer<float> buf_;
  typename D::template Buffer<ops::SgdScalars> scalars_;
};

}  // namespace xtrain::lowering
