#pragma once
/// \file resnet.hpp
/// BasicBlock: the residual block of ResNet-18/34 and of the CIFAR ResNet-20 family (He et al.,
/// arXiv:1512.03385), with torchvision's names and layout:
///   y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)),
/// conv1 3x3 with the block's stride, conv2 3x3, both without bias; the shortcut is x itself, or
/// `downsample` = Sequential{Conv2d 1x1 with the stride, BatchNorm2d} when the stride is not 1 or
/// the channel count changes. State_dict names: conv1.weight, bn1.{weight,bias,running_mean,...},
/// conv2.weight, bn2.*, downsample.0.weight, downsample.1.* (as torchvision.models.resnet).

#include <cstddef>
#include <optional>
#include <string>
#include <tuple>

#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/layers/activations.hpp"
#include "xtrain/layers/batch_norm.hpp"
#include "xtrain/layers/conv2d.hpp"
#include "xtrain/layers/fusion.hpp"
#include "xtrain/layers/residual.hpp"
#include "xtrain/layers/sequential.hpp"

namespace xtrain::layers {

class BasicBlock {
 public:
  using Downsample = Sequential<Conv2d, BatchNorm2d>;

  /// Requires positive channel counts and stride. Draws conv1, conv2, then downsample's weights
  /// from `default_generator()` (torchvision's construction order).
  BasicBlock(std::size_t in_channels, std::size_t out_channels, std::size_t stride = 1)
      : in_(in_channels),
        out_(out_channels),
        stride_(stride),
        conv1_(in_channels, out_channels, 3, stride, 1, 1, 1, false),
        bn1_(out_channels),
        conv2_(out_channels, out_channels, 3, 1, 1, 1, 1, false),
        bn2_(out_channels) {
    if (stride != 1 || in_channels != out_channels)
      downsample_.emplace(Conv2d{in_channels, out_channels, 1, stride, 0, 1, 1, false}, BatchNorm2d{out_channels});
  }

  /// Batch statistics of every BatchNorm2d of the block over all ranks (SyncBatchNorm).
  BasicBlock& sync_stats(bool on) {
    bn1_.sync_stats(on);
    bn2_.sync_stats(on);
    if (downsample_) downsample_->get<1>().sync_stats(on);
    return *this;
  }

  template <ActivationType T>
  const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    const Tensor<T>& h2 = body_.forward(ctx, body(), x);  // bn1 takes relu1 (layers/fusion.hpp)
    const Tensor<T>& s = downsample_ ? xtrain::forward(ctx, *downsample_, x) : x;
    XTRAIN_CHECK(s.shape() == h2.shape(), ShapeError, describe(), ": input has shape ", x.shape().str(),
                 "; the block maps it to ", h2.shape().str(), " and the shortcut to ", s.shape().str(),
                 " (expected [batch, ", in_, ", height, width])");
    Tensor<T>& sum = sum_.get<T>();
    sum.resize(h2.shape());
    detail::add(ctx, h2.data(), s.data(), sum.data(), sum.size());
    return relu2_.forward(ctx, sum);
  }

  /// Gradients of both branches; dx = the body's input gradient + the shortcut's.
  template <ActivationType T>
  const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    const bool want_input_grad = ctx.input_grad;
    const Tensor<T>& dsum = relu2_.backward(ctx, dy);
    // The shortcut first: reverse visit order, so that gradient buckets fill in order.
    const Tensor<T>* dshort = &dsum;
    if (downsample_) dshort = &xtrain::backward(ctx, *downsample_, dsum);
    const Tensor<T>& dbody = body_.backward(ctx, body(), dsum);
    Tensor<T>& dx = dx_.get<T>();
    if (!want_input_grad) {
      dx.resize({0});
      return dx;
    }
    dx.resize(dbody.shape());
    detail::add(ctx, dbody.data(), dshort->data(), dx.data(), dx.size());
    return dx;
  }

  template <class V>
  void visit(V& v) {
    v.child("conv1", conv1_);
    v.child("bn1", bn1_);
    v.child("conv2", conv2_);
    v.child("bn2", bn2_);
    if (downsample_) v.child("downsample", *downsample_);
  }

  Conv2d& conv1() noexcept { return conv1_; }
  Conv2d& conv2() noexcept { return conv2_; }
  BatchNorm2d& bn1() noexcept { return bn1_; }
  BatchNorm2d& bn2() noexcept { return bn2_; }
  bool has_downsample() const noexcept { return downsample_.has_value(); }
  /// The shortcut's convolution and BatchNorm; requires has_downsample().
  Downsample& downsample() {
    XTRAIN_CHECK(downsample_.has_value(), ValueError, describe(), ": the shortcut is the identity");
    return *downsample_;
  }
  std::string describe() const {
    return "BasicBlock(" + std::to_string(in_) + ", " + std::to_string(out_) + ", stride=" + std::to_string(stride_) +
           (downsample_ ? ", downsample)" : ")");
  }

 private:
  // conv1, bn1, relu1, conv2, bn2: run as one chain, so that fusion is resolved as in Sequential.
  std::tuple<Conv2d&, BatchNorm2d&, ReLU&, Conv2d&, BatchNorm2d&> body() noexcept {
    return std::tie(conv1_, bn1_, relu1_, conv2_, bn2_);
  }

  std::size_t in_, out_, stride_;
  Conv2d conv1_;
  BatchNorm2d bn1_;
  ReLU relu1_;
  Conv2d conv2_;
  BatchNorm2d bn2_;
  ReLU relu2_;
  std::optional<Downsample> downsample_;
  fusion::Chain<5> body_;
  ActivationBuffers sum_, dx_;
};

}  // namespace xtrain::layers
