#pragma once
/// \file batch_norm.hpp
/// The device implementation (lowering/device.hpp) of BatchNorm1d (over [N, C] rows) and
/// BatchNorm2d (over NCHW planes), each with the ReLU after it fused as on the CPU.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "xtrain/core/error.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/device_conv.hpp"
#include "xtrain/kernels/device_ops.hpp"
#include "xtrain/layers/batch_norm.hpp"
#include "xtrain/lowering/device.hpp"

namespace xtrain::lowering {

namespace ops = kernels::device;

// Copies a BatchNorm's buffers from the device into the host layer (as its visit names them).
template <class D>
struct BatchNormBuffers {
  D& dev;
  const float* running;  // [mean (c)] [var (c)]
  const std::int64_t* tracked;
  std::size_t c;
  void param(std::string_view, Param&, ParamKind = ParamKind::weight) {}
  void buffer(std::string_view name, Tensor<float>& t, bool = true) {
    if (name == "running_mean") dev.download(t.data(), running, c);
    if (name == "running_var") dev.download(t.data(), running + c, c);
  }
  void buffer(std::string_view, std::int64_t& n) { dev.download(&n, tracked, 1); }
  template <class M>
  void child(std::string_view, M&) {}
  void id(ModuleId&) {}
};

// BatchNorm1d: statistics per feature over the rows (one thread per feature), x-hat kept for
// backward. BatchNorm2d: statistics from per-plane sums (one thread per plane) added per channel
// over the images in order; x-hat recomputed from x in backward (as the CPU's planes): x is the
// caller's buffer, kept until backward as every layer's input.
template <std::size_t Dims, class D>
class Lowered<layers::BatchNorm<Dims>, D> {
 public:
  Lowered(layers::BatchNorm<Dims>& bn, Context<D>& c)
      : host_(&bn),
        c_(bn.features()),
        gamma_(c.value(bn.weight())),
        beta_(c.value(bn.bias())),
        ggamma_(c.grad(bn.weight())),
        gbeta_(c.grad(bn.bias())),
        running_(c.dev, 2 * c_),
        stats_(c.dev, 5 * c_),
        tracked_(c.dev, 1) {
    XTRAIN_CHECK(!bn.sync_stats(), ValueError, bn.describe(), ": SyncBatchNorm has no device implementation yet");
  }
  /// Set when the ReLU after it is applied here.
  bool fuse_relu = false;
  Shape out_shape(const Shape& in) const {
    if constexpr (Dims == 1)
      XTRAIN_CHECK(in.rank() == 1 && in[0] == c_, ShapeError, host_->describe(), " on the device: a sample of shape ",
                   in.str(), " (over [N, C] rows so far)");
    else
      XTRAIN_CHECK(in.rank() == 3 && in[0] == c_, ShapeError, host_->describe(), " on the device: a sample of shape ",
                   in.str(), ", expected [", c_, ", height, width]");
    return in;
  }
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    (void)out_shape(in);
    n_ = n;
    sp_ = Dims == 1 ? 1 : in[1] * in[2];
    training_ = c.training;
    XTRAIN_CHECK(!c.training || n * sp_ > 1, ValueError, host_->describe(),
                 ": expected more than 1 value per channel when training (use a batch of 2 or more, or drop_last)");
    const std::size_t total = n * c_ * sp_;
    y_.reserve(c.dev, total);
    float* rm = running_.data();
    if constexpr (Dims == 1) {
      xhat_.reserve(c.dev, total);
      c.dev.launch(ops::BatchNormStatistics{x, mean(), invstd(), rm, rm + c_, tracked_.data(), n, c_, host_->momentum(),
                                            host_->eps(), c.training});
      c.dev.launch(
          ops::BatchNormNormalize{x, mean(), invstd(), gamma_, beta_, xhat_.data(), y_.data(), n, c_, fuse_relu});
    } else {
      x_ = x;
      sums_.reserve(c.dev, 2 * n * c_);
      if (c.training) {
        c.dev.launch(ops::PlaneSums{x, nullptr, sums_.data(), n * c_, c_, sp_});
        c.dev.launch(ops::ChannelStatistics{sums_.data(), mean(), invstd(), rm, rm + c_, tracked_.data(), n, c_, sp_,
                                            host_->momentum(), host_->eps(), false});
        c.dev.launch(ops::PlaneSums{x, mean(), sums_.data(), n * c_, c_, sp_});
        c.dev.launch(ops::ChannelStatistics{sums_.data(), mean(), invstd(), rm, rm + c_, tracked_.data(), n, c_, sp_,
                                            host_->momentum(), host_->eps(), true});
      } else {
        c.dev.launch(ops::BatchNormStatistics{x, mean(), invstd(), rm, rm + c_, tracked_.data(), 0, c_,
                                              host_->momentum(), host_->eps(), false});
      }
      c.dev.launch(ops::NormalizePlanes{x, mean(), invstd(), gamma_, beta_, y_.data(), total, c_, sp_, fuse_relu});
    }
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    XTRAIN_CHECK(training_, ValueError, host_->describe(), " on the device: backward after an evaluation forward");
    float* s = stats_.data();
    if constexpr (Dims == 1) {
      const float* relu_out = fuse_relu ? y_.data() : nullptr;
      c.dev.launch(ops::BatchNormBackwardSums{dy, xhat_.data(), relu_out, gamma_, invstd(), ggamma_, gbeta_, s + 2 * c_,
                                              s + 3 * c_, s + 4 * c_, n_, c_});
      if (!need_dx) return nullptr;
      dx_.reserve(c.dev, n_ * c_);
      c.dev.launch(
          ops::BatchNormInputGrad{dy, xhat_.data(), relu_out, s + 2 * c_, s + 3 * c_, s + 4 * c_, dx_.data(), n_, c_});
    } else {
      c.dev.launch(
          ops::PlaneSumDotXhat{dy, x_, mean(), invstd(), gamma_, beta_, sums_.data(), n_ * c_, c_, sp_, fuse_relu});
      c.dev.launch(ops::ChannelBackwardSums{sums_.data(), gamma_, invstd(), ggamma_, gbeta_, s + 2 * c_, s + 3 * c_,
                                            s + 4 * c_, n_, c_, sp_});
      if (!need_dx) return nullptr;
      dx_.reserve(c.dev, n_ * c_ * sp_);
      c.dev.launch(ops::PlaneInputGrad{dy, x_, mean(), invstd(), gamma_, beta_, s + 2 * c_, s + 3 * c_, s + 4 * c_,
                                       dx_.data(), n_ * c_ * sp_, c_, sp_, fuse_relu});
    }
    return dx_.data();
  }
  /// The running statistics and the batch count, from the host layer / back to it.
  void upload(Context<D>& c) {
    c.dev.upload(running_.data(), host_->running_mean().data(), c_);
    c.dev.upload(running_.data() + c_, host_->running_var().data(), c_);
    tracked_host_ = host_->num_batches_tracked();
    c.dev.upload(tracked_.data(), &tracked_host_, 1);
    c.dev.synchronize();
  }
  void download(Context<D>& c) {
    BatchNormBuffers<D> v{c.dev, running_.data(), tracked_.data(), c_};
    host_->visit(v);
    c.dev.synchronize();
  }

 private:
  float* mean() const { return stats_.data(); }
  float* invstd() const { return stats_.data() + c_; }

  layers::BatchNorm<Dims>* host_;
  std::size_t c_, n_ = 0, sp_ = 1;
  bool training_ = true;
  const float* x_ = nullptr;  // BatchNorm2d: the input, for backward
  const float *gamma_, *beta_;
  float *ggamma_, *gbeta_;
  typename D::template Buffer<float> running_;  // [running_mean (c)] [running_var (c)]
  typename D::template Buffer<float> stats_;    // [mean] [invstd] [scale] [mean_dy] [mean_dy_xhat], c each
  typename D::template Buffer<std::int64_t> tracked_;
  std::int64_t tracked_host_ = 0;
  typename D::template Buffer<double> sums_;  // BatchNorm2d: per-plane sums
  typename D::template Buffer<float> xhat_;   // BatchNorm1d
  typename D::template Buffer<float> y_, dx_;
};

}  // namespace xtrain::lowering
