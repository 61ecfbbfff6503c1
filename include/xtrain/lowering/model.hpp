#pragma once
/// \file model.hpp
/// A model's training state on a device (`lowering::DeviceModel`): parameters, gradients, Adam's
/// moments, the lowered model, the loss, the metrics; the one header that brings in every
/// lowered layer type (lowering/device.hpp says what lowering is).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "xtrain/core/error.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/device_ops.hpp"
#include "xtrain/lowering/batch_norm.hpp"
#include "xtrain/lowering/composite.hpp"
#include "xtrain/lowering/conv.hpp"
#include "xtrain/lowering/dense.hpp"
#include "xtrain/lowering/device.hpp"
#include "xtrain/optim/adam.hpp"

namespace xtrain::lowering {

namespace ops = kernels::device;

/// The training state of a model on device D, bound to the host model and its ParamArena:
/// parameters, gradients and Adam's moments as four device arrays in the arena's order, the
/// lowered model, the loss's buffers, the metrics summed on the device, Adam's step counter and
/// learning rate there. enqueue_step() puts one training step on the device (capturable as a
/// graph); upload() and download() move the whole state between host and device.
template <class Model, class Optimizer, class D>
class DeviceModel {
  static_assert(std::is_same_v<Optimizer, optim::Adam> || std::is_same_v<Optimizer, optim::AdamW>,
                "xtrain: the device backends run optim::Adam and optim::AdamW so far");
  static constexpr bool decoupled = std::is_same_v<Optimizer, optim::AdamW>;
  template <class T>
  using Buffer = typename D::template Buffer<T>;

 public:
  /// `seed`: Dropout's (TrainingOptions::seed, as the CPU engine's).
  DeviceModel(D& dev, Model& model, ParamArena& arena, const Optimizer& optimizer, std::uint64_t seed = 0)
      : dev_(dev),
        optimizer_(optimizer),
        arena_(arena),
        values_(dev, arena.size()),
        grads_(dev, arena.size()),
        m_(dev, arena.size()),
        v_(dev, arena.size()),
        metrics_(dev, 1),
        scalars_(dev, 1),
        step_(dev, 1),
        lr_(dev, 1),
        ctx_{dev, arena.values().data(), values_.data(), grads_.data(), true, seed, step_.data()},
        lowered_(model, ctx_) {
    reset_metrics();
  }
  /// Dropout's seed from now on (a resumed run's).
  void set_seed(std::uint64_t seed) noexcept { ctx_.seed = seed; }
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  /// The learning rate of the steps enqueued from now on (copied to the device when it changes).
  void set_lr(float lr) {
    if (lr == lr_now_) return;
    dev_.set_scalar(lr_.data(), lr);
    lr_now_ = lr;
  }

  /// One training step on n samples of shape `sample` at x and their class labels (device
  /// memory): gradients zeroed, forward, cross-entropy / normaliser with its sums, backward,
  /// Adam. Enqueues only.
  void enqueue_step(const float* x, const std::int32_t* labels, std::size_t n, const Shape& sample, double normaliser) {
    dev_.zero(grads_.data(), arena_.size());
    const float* out = lowered_.forward(ctx_, x, n, sample);
    loss_sums(out, labels, n, sample, normaliser);
    lowered_.backward(ctx_, dlogits_.data(), false);
    dev_.launch(ops::AdamPrepare{lr_.data(), step_.data(), scalars_.data(), optimizer_.beta1(), optimizer_.beta2(),
                                 optimizer_.eps(), optimizer_.weight_decay()});
    dev_.launch(ops::AdamUpdate<decoupled>{values_.data(), m_.data(), v_.data(), grads_.data(), scalars_.data(),
                                           arena_.size()});
  }

  /// The model's output in evaluation mode for n samples at x, and the loss sums into the
  /// metrics when `labels` is given. Returns where the logits are.
  const float* enqueue_eval(const float* x, const std::int32_t* labels, std::size_t n, const Shape& sample,
                            double normaliser) {
    ctx_.training = false;
    const float* out = lowered_.forward(ctx_, x, n, sample);
    ctx_.training = true;
    if (labels) loss_sums(out, labels, n, sample, normaliser);
    return out;
  }

  /// The metrics summed on the device since the last read (waits for the device), then zeroed.
  /// Throws DataError when a label was outside [0, classes).
  ops::Metrics read_metrics() {
    ops::Metrics m;
    dev_.download(&m, metrics_.data(), 1);
    dev_.synchronize();
    reset_metrics();
    XTRAIN_CHECK(m.bad_labels == 0, DataError, "the device's loss: ", m.bad_labels,
                 " labels were outside [0, classes) (their rows were left out of the loss)");
    return m;
  }

  /// Copies the host's parameters (the arena's values), the layers' buffers (BatchNorm's running
  /// statistics), Adam's moments (shorter spans than the arena: zeros) and its step count to the
  /// device.
  void upload(std::span<const float> exp_avg, std::span<const float> exp_avg_sq, std::uint64_t optimizer_steps) {
    dev_.upload(values_.data(), arena_.values().data(), arena_.size());
    lowered_.upload(ctx_);
    moment_upload(m_, exp_avg);
    moment_upload(v_, exp_avg_sq);
    step_host_ = optimizer_steps;
    dev_.upload(step_.data(), &step_host_, 1);
    dev_.synchronize();
  }
  /// Copies the device's parameters, buffers and (where the spans are not empty) Adam's moments
  /// back to the host (waits for the device).
  void download(std::span<float> exp_avg = {}, std::span<float> exp_avg_sq = {}) {
    dev_.download(arena_.values().data(), values_.data(), arena_.size());
    if (!exp_avg.empty()) dev_.download(exp_avg.data(), m_.data(), std::min(exp_avg.size(), arena_.size()));
    if (!exp_avg_sq.empty()) dev_.download(exp_avg_sq.data(), v_.data(), std::min(exp_avg_sq.size(), arena_.size()));
    dev_.synchronize();
    lowered_.download(ctx_);
  }

  /// The shape of the model's output for samples of shape `sample`.
  Shape out_shape(const Shape& sample) const { return lowered_.out_shape(sample); }
  D& device() noexcept { return dev_; }

 private:
  void reset_metrics() { dev_.zero(metrics_.data(), 1); }
  void moment_upload(Buffer<float>& dest, std::span<const float> host) {
    if (host.size() >= arena_.size())
      dev_.upload(dest.data(), host.data(), arena_.size());
    else
      dev_.zero(dest.data(), arena_.size());
  }

  // Softmax cross-entropy on n logits: the gradient (scaled by 1/normaliser) and the sums.
  void loss_sums(const float* logits, const std::int32_t* labels, std::size_t n, const Shape& sample,
                 double normaliser) {
    const Shape out = lowered_.out_shape(sample);
    XTRAIN_CHECK(out.rank() == 1, ShapeError, "the device's cross-entropy: the model's output per sample is ",
                 out.str(), ", expected [classes]");
    const std::size_t classes = out[0];
    dlogits_.reserve(dev_, n * classes);
    row_loss_.reserve(dev_, n);
    row_correct_.reserve(dev_, n);
    dev_.launch(ops::SoftmaxCrossEntropy{logits, labels, dlogits_.data(), row_loss_.data(), row_correct_.data(), n,
                                         classes, static_cast<float>(1.0 / normaliser)});
    dev_.launch(ops::SumLossRows{row_loss_.data(), row_correct_.data(), metrics_.data(), n, normaliser});
  }

  D& dev_;
  Optimizer optimizer_;
  ParamArena& arena_;
  Buffer<float> values_, grads_, m_, v_;
  Buffer<ops::Metrics> metrics_;
  Buffer<ops::AdamScalars> scalars_;
  Buffer<std::uint64_t> step_;
  Buffer<float> lr_;
  Context<D> ctx_;
  Lowered<Model, D> lowered_;
  float lr_now_ = -1.0f;
  std::uint64_t step_host_ = 0;
  Buffer<float> dlogits_;
  Buffer<double> row_loss_;
  Buffer<std::int32_t> row_correct_;
};

}  // namespace xtrain::lowering
