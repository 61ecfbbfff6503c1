#pragma once
/// \file loss.hpp
/// The losses on a device (lowering/device.hpp): `lowering::DeviceLoss<Loss, D>` takes a lowered
/// model's output and the batch's targets in device memory, writes the output's gradient and
/// adds the step's sums to the metrics kept on the device (the loss's sum; the correct
/// predictions; the samples). Cross-entropy (int32 class ids) and the mean squared error (float
/// targets of the output's shape). Each has:
///   using target_type;                        (one element of a batch's targets)
///   DeviceLoss(D&, const Loss&)
///   const float* enqueue(D&, const float* out, const target_type* targets, std::size_t n,
///                        const Shape& out_sample, double normaliser, ops::Metrics* metrics,
///                        const ops::LossScaleState* loss_scale)
///                                             (returns the gradient of the loss / normaliser,
///                                              times the loss scale when one is given: fp16)

#include <cstddef>
#include <cstdint>
#include <optional>

#include "xtrain/core/error.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/device_ops.hpp"
#include "xtrain/loss/cross_entropy.hpp"
#include "xtrain/loss/mse.hpp"
#include "xtrain/lowering/device.hpp"

namespace xtrain::lowering {

namespace ops = kernels::device;

template <class Loss, class D>
class DeviceLoss {
  static_assert(no_lowering<Loss>,
                "xtrain: the device backends train with loss::CrossEntropyLoss and loss::MSELoss so far");
};

namespace detail {
// The per-row sums a loss writes and adds to the metrics in row order.
template <class D>
class LossRows {
 protected:
  void reserve(D& dev, std::size_t n, std::size_t elements) {
    grad_.reserve(dev, elements);
    row_loss_.reserve(dev, n);
    row_correct_.reserve(dev, n);
  }
  typename D::template Buffer<float> grad_;
  typename D::template Buffer<double> row_loss_;
  typename D::template Buffer<std::int32_t> row_correct_;
};
}  // namespace detail

/// Softmax cross-entropy over the last dimension of the output (a sample's [classes], or
/// [T, classes]: one label per row, per token), the hits counted; the ignore index (when set) adds
/// nothing; any other label outside [0, classes) adds nothing and is counted as bad (read_metrics
/// reports it).
template <class D>
class DeviceLoss<loss::CrossEntropyLoss, D> : detail::LossRows<D> {
 public:
  using target_type = std::int32_t;
  DeviceLoss(D&, const loss::CrossEntropyLoss& l) : ignore_(l.ignore_index()) {}
  const float* enqueue(D& dev, const float* logits, const std::int32_t* labels, std::size_t n, const Shape& out,
                       double normaliser, ops::Metrics* metrics, const ops::LossScaleState* loss_scale = nullptr) {
    XTRAIN_CHECK(out.rank() >= 1 && out[out.rank() - 1] > 0, ShapeError,
                 "the device's cross-entropy: the model's output per sample is ", out.str(),
                 ", expected [classes] or [..., classes]");
    const std::size_t classes = out[out.rank() - 1], rows = n * (out.elements() / classes);
    this->reserve(dev, rows, rows * classes);
    // (every label ignored: a normaliser of 0, and a loss and gradient of 0 as on the CPU)
    const float scale = normaliser > 0.0 ? static_cast<float>(1.0 / normaliser) : 0.0f;
    dev.launch(ops::SoftmaxCrossEntropy{logits, labels, this->grad_.data(), this->row_loss_.data(),
                                        this->row_correct_.data(), rows, classes, scale, loss_scale,
                                        ignore_.value_or(0), ignore_.has_value()});
    dev.launch(ops::SumLossRows{this->row_loss_.data(), this->row_correct_.data(), metrics, rows, normaliser});
    return this->grad_.data();
  }

 private:
  std::optional<std::int32_t> ignore_;
};

/// The squared error summed over every element (PyTorch's MSELoss: the normaliser is the
/// element count for "mean"); the targets have the output's shape.
template <class D>
class DeviceLoss<loss::MSELoss, D> : detail::LossRows<D> {
 public:
  using target_type = float;
  DeviceLoss(D&, const loss::MSELoss&) {}
  const float* enqueue(D& dev, const float* pred, const float* targets, std::size_t n, const Shape& out,
                       double normaliser, ops::Metrics* metrics, const ops::LossScaleState* loss_scale = nullptr) {
    const std::size_t cols = out.elements();
    if (normaliser == 0.0) normaliser = static_cast<double>(n * cols);
    this->reserve(dev, n, n * cols);
    dev.launch(ops::SquaredErrorRows{pred, targets, this->grad_.data(), this->row_loss_.data(),
                                     this->row_correct_.data(), n, cols, static_cast<float>(2.0 / normaliser),
                                     loss_scale});
    dev.launch(ops::SumLossRows{this->row_loss_.data(), this->row_correct_.data(), metrics, n, normaliser});
    return this->grad_.data();
  }
};

}  // namespace xtrain::lowering
