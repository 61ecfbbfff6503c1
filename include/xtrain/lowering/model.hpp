#pragma once
/// \file model.hpp
/// A model's training state on a device (`lowering::DeviceModel`): parameters, gradients, the
/// optimizer's state, the lowered model, the loss, the metrics; the one header that brings in every
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
#include "xtrain/lowering/attention.hpp"
#include "xtrain/lowering/batch_norm.hpp"
#include "xtrain/lowering/composite.hpp"
#include "xtrain/lowering/conv.hpp"
#include "xtrain/lowering/dense.hpp"
#include "xtrain/lowering/device.hpp"
#include "xtrain/lowering/loss.hpp"
#include "xtrain/lowering/optimizer.hpp"

namespace xtrain::lowering {

namespace ops = kernels::device;

/// The training state of a model on device D, bound to the host model and its ParamArena:
/// parameters, gradients and the optimizer's state as device arrays in the arena's order, the
/// lowered model, the loss (cross-entropy or MSE) and the metrics it sums on the device, the
/// optimizer's step counter and learning rate there. enqueue_step() puts one training step on the device
/// (capturable as a graph); upload() and download() move the whole state between host and device.
template <class Model, class Optimizer, class D, class Loss = loss::CrossEntropyLoss>
class DeviceModel {
  template <class T>
  using Buffer = typename D::template Buffer<T>;

 public:
  /// One element of a batch's targets in device memory: int32 class ids (cross-entropy) or floats
  /// of the output's shape (MSE).
  using target_type = typename DeviceLoss<Loss, D>::target_type;

  /// `seed`: Dropout's (TrainingOptions::seed, as the CPU engine's). `products`
  /// (products_of<Precision>()): under MixedPrecision<bf16> or <fp16> the products of Linear and
  /// Conv2d take bf16 or fp16 operands with fp32 accumulation (tensor cores on a GPU), from a copy
  /// of the parameters that each optimizer step refreshes; everything else stays fp32.
  DeviceModel(D& dev, Model& model, ParamArena& arena, const Optimizer& optimizer, std::uint64_t seed = 0,
              const Loss& loss = {}, Products products = Products::fp32)
      : dev_(dev),
        arena_(arena),
        values_(dev, arena.size()),
        grads_(dev, arena.size()),
        bf16_values_(dev, products == Products::bf16 ? arena.size() : 0),
        fp16_values_(dev, products == Products::fp16 ? arena.size() : 0),
        optimizer_state_(dev, optimizer, arena.size()),
        metrics_(dev, 1),
        step_(dev, 1),
        sample_offset_(dev, 1),
        lr_(dev, 1),
        ctx_{dev,
             arena.values().data(),
             values_.data(),
             grads_.data(),
             true,
             seed,
             step_.data(),
             {products == Products::bf16 ? bf16_values_.data() : nullptr,
              products == Products::fp16 ? fp16_values_.data() : nullptr},
             sample_offset_.data()},
        lowered_(model, ctx_),
        loss_(dev, loss) {
    reset_metrics();
    set_sample_offset(0);
  }
  /// Dropout's seed from now on (a resumed run's).
  void set_seed(std::uint64_t seed) noexcept { ctx_.seed = seed; }
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  /// Gradient clipping before each step (TrainingOptions::clip_grad_norm and clip_grad_value; 0:
  /// off): to the global norm `max_norm`, then to [-max_value, max_value]. The norm is the
  /// deterministic reduction's (segment by segment, bitwise); the CPU engine's default sums the
  /// buffer in one pass, so the two agree to double rounding.
  void set_clipping(double max_norm, float max_value) {
    clip_norm_ = max_norm;
    clip_value_ = max_value;
    if (max_norm > 0.0) {
      norm_sums_.reserve(dev_, ops::LaneSumsOfSquares{nullptr, nullptr, arena_.size()}.count());
      clip_scalars_.reserve(dev_, 2);
    }
  }

  /// Dynamic loss scaling (MixedPrecision<fp16>; DynamicLossScaler's rules, on the device): the
  /// loss gradient multiplied by the scale, the gradients divided by it after backward and
  /// checked, a step with Inf or NaN gradients skipped (the optimizer's step counter stays, so
  /// its bias correction and the learning rate's schedule count applied steps only), the scale
  /// halved then, doubled after `growth_interval` clean steps (Dropout's masks still follow every
  /// step, as the CPU's). The state starts at `state`. Before the first step is enqueued.
  void set_loss_scaling(const ops::LossScaleState& state, std::uint64_t growth_interval) {
    XTRAIN_CHECK(growth_interval > 0 && state.scale > 0.0f, ValueError,
                 "loss scaling: needs a positive scale and growth interval");
    scaling_.reserve(dev_, 1);
    ctx_.loss_scale = scaling_.data();  // Dropout's masks count the skipped steps too
    growth_interval_ = growth_interval;
    upload_loss_scale(state);
  }
  /// The loss scale's state on the device (waits for it): scale, clean steps in a row, steps
  /// skipped so far, and whether the last step's gradients overflowed.
  ops::LossScaleState read_loss_scale() {
    XTRAIN_CHECK(growth_interval_ > 0, ValueError, "read_loss_scale: loss scaling is off (set_loss_scaling)");
    ops::LossScaleState s;
    dev_.download(&s, scaling_.data(), 1);
    dev_.synchronize();
    return s;
  }
  /// Sets the loss scale's state on the device (a resumed run's).
  void upload_loss_scale(const ops::LossScaleState& state) {
    XTRAIN_CHECK(growth_interval_ > 0, ValueError, "upload_loss_scale: loss scaling is off (set_loss_scaling)");
    dev_.upload(scaling_.data(), &state, 1);
  }

  /// The learning rate of the steps enqueued from now on (copied to the device when it changes).
  void set_lr(float lr) {
    if (lr == lr_now_) return;
    dev_.set_scalar(lr_.data(), lr);
    lr_now_ = lr;
  }

  /// One training step on n samples of shape `sample` at x and their targets (device memory):
  /// gradients zeroed, forward, the loss / normaliser with its sums, backward,
  /// clipping (when set), the optimizer. Enqueues only.
  void enqueue_step(const float* x, const target_type* targets, std::size_t n, const Shape& sample, double normaliser) {
    enqueue_micro_step(x, targets, n, sample, normaliser, true, true);
  }

  /// One micro-step of gradient accumulation (TrainingOptions::accumulate): the gradients zeroed
  /// when `first` (the window's first), forward, loss and backward adding into them, and when
  /// `last` clipping and the optimizer. `normaliser` counts the whole window's terms (as the CPU
  /// engine's); set_sample_offset() before it places its samples in the window (Dropout).
  void enqueue_micro_step(const float* x, const target_type* targets, std::size_t n, const Shape& sample,
                          double normaliser, bool first, bool last) {
    if (first) dev_.zero(grads_.data(), arena_.size());
    const float* out = lowered_.forward(ctx_, x, n, sample);
    const float* dout =
        loss_.enqueue(dev_, out, targets, n, lowered_.out_shape(sample), normaliser, metrics_.data(), loss_scale());
    lowered_.backward(ctx_, dout, false);
    if (last) enqueue_optimizer();
  }

  /// The samples of the accumulation window before the next micro-step's (copied to the device;
  /// 0 without accumulation).
  void set_sample_offset(std::uint64_t samples) { dev_.set_scalar(sample_offset_.data(), samples); }

 private:
  ops::LossScaleState* loss_scale() const noexcept { return growth_interval_ ? scaling_.data() : nullptr; }

  // Unscaling and the overflow check (fp16), clipping (when set), the optimizer, the low-precision
  // copy of the parameters.
  void enqueue_optimizer() {
    const std::size_t size = arena_.size();
    ops::LossScaleState* scaling = loss_scale();
    if (scaling) {
      dev_.launch(ops::LossScaleBegin{scaling});
      dev_.launch(ops::UnscaleGradients{grads_.data(), scaling, size});
      dev_.launch(ops::UpdateLossScale{scaling, 2.0f, 0.5f, growth_interval_});  // keeps `found` for the step
    }
    if (clip_norm_ > 0.0) {
      const ops::LaneSumsOfSquares sums{grads_.data(), norm_sums_.data(), size};
      dev_.launch(sums);
      dev_.launch(ops::ClipCoefficient{norm_sums_.data(), sums.segments(), clip_norm_, clip_scalars_.data(),
                                       clip_scalars_.data() + 1});
    }
    if (clip_norm_ > 0.0 || clip_value_ > 0.0f)
      dev_.launch(
          ops::ClipGradients{grads_.data(), clip_norm_ > 0.0 ? clip_scalars_.data() + 1 : nullptr, size, clip_value_});
    optimizer_state_.enqueue(dev_, values_.data(), grads_.data(), lr_.data(), step_.data(), scaling);
    round_parameters();
  }

 public:
  /// The model's output in evaluation mode for n samples at x, and the loss sums into the
  /// metrics when `targets` is given. Returns where the output is.
  const float* enqueue_eval(const float* x, const target_type* targets, std::size_t n, const Shape& sample,
                            double normaliser) {
    struct Training {  // training mode again however the forward ends
      Context<D>& c;
      ~Training() { c.training = true; }
    } restore{ctx_};
    ctx_.training = false;
    const float* out = lowered_.forward(ctx_, x, n, sample);
    if (targets) loss_.enqueue(dev_, out, targets, n, lowered_.out_shape(sample), normaliser, metrics_.data());
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
  /// statistics), the optimizer's state (vectors shorter than the arena: zeros, a fresh state)
  /// and its step count to the device.
  void upload(const typename Optimizer::State& state, std::uint64_t optimizer_steps) {
    dev_.upload(values_.data(), arena_.values().data(), arena_.size());
    round_parameters();
    lowered_.upload(ctx_);
    optimizer_state_.upload(dev_, state);
    step_host_ = optimizer_steps;
    dev_.upload(step_.data(), &step_host_, 1);
    dev_.synchronize();
  }
  /// Copies the device's parameters, buffers and, given `state`, the optimizer's state (into its
  /// vectors that are not empty) back to the host (waits for the device).
  void download(typename Optimizer::State* state = nullptr) {
    dev_.download(arena_.values().data(), values_.data(), arena_.size());
    if (state) optimizer_state_.download(dev_, *state);
    dev_.synchronize();
    lowered_.download(ctx_);
  }

  /// The bf16 or fp16 copy of the parameters the products read under MixedPrecision<bf16> or
  /// <fp16> (device memory; null otherwise): each optimizer step and upload() rounds the
  /// parameters into it.
  const bf16* bf16_parameters() const noexcept { return ctx_.lowp_values.b; }
  const fp16* fp16_parameters() const noexcept { return ctx_.lowp_values.h; }

  /// The shape of the model's output for samples of shape `sample`.
  Shape out_shape(const Shape& sample) const { return lowered_.out_shape(sample); }
  D& device() noexcept { return dev_; }

 private:
  void reset_metrics() { dev_.zero(metrics_.data(), 1); }
  // The low-precision copy of the parameters the products read (MixedPrecision).
  void round_parameters() {
    if (ctx_.lowp_values.b) dev_.launch(ops::ToBf16{values_.data(), bf16_values_.data(), arena_.size()});
    if (ctx_.lowp_values.h) dev_.launch(ops::ToFp16{values_.data(), fp16_values_.data(), arena_.size()});
  }

  D& dev_;
  ParamArena& arena_;
  Buffer<float> values_, grads_;
  Buffer<bf16> bf16_values_;
  Buffer<fp16> fp16_values_;
  DeviceOptimizer<Optimizer, D> optimizer_state_;
  Buffer<ops::Metrics> metrics_;
  Buffer<std::uint64_t> step_, sample_offset_;
  Buffer<float> lr_;
  Context<D> ctx_;
  Lowered<Model, D> lowered_;
  DeviceLoss<Loss, D> loss_;
  float lr_now_ = -1.0f;
  double clip_norm_ = 0.0;
  float clip_value_ = 0.0f;
  Buffer<double> norm_sums_, clip_scalars_;  // the segments' sums of squares; [norm, coefficient]
  Buffer<ops::LossScaleState> scaling_;      // fp16's loss scale
  std::uint64_t growth_interval_ = 0;        // 0: no loss scaling
  std::uint64_t step_host_ = 0;
};

}  // namespace xtrain::lowering
