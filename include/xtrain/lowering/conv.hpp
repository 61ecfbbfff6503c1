#pragma once
/// \file conv.hpp
/// The device implementations (lowering/device.hpp) of the layers over NCHW images: Conv2d
/// (im2col and one product for the batch), MaxPool2d, AvgPool2d and AdaptiveAvgPool2d.

#include <cstddef>
#include <cstdint>
#include <string>

#include "xtrain/core/error.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/conv.hpp"
#include "xtrain/kernels/device_conv.hpp"
#include "xtrain/layers/conv2d.hpp"
#include "xtrain/layers/pooling.hpp"
#include "xtrain/lowering/device.hpp"

namespace xtrain::lowering {

namespace ops = kernels::device;

namespace detail {
// The window of `k` (kernel, stride, padding, dilation) over n images of sample shape [c, h, w].
inline ops::Window2 window_over(const kernels::Window& k, std::size_t n, const Shape& in, const std::string& who) {
  XTRAIN_CHECK(in.rank() == 3, ShapeError, who, " on the device: a sample of shape ", in.str(),
               ", expected [channels, height, width]");
  kernels::Window w = k;
  XTRAIN_CHECK(w.set_input(in[1], in[2]), ShapeError, who, ": a ", in[1], " x ", in[2],
               " input is smaller than its window");
  return {n,          in[0],       in[1],       in[2],        k.kernel.h,   k.kernel.w, k.stride.h,
          k.stride.w, k.padding.h, k.padding.w, k.dilation.h, k.dilation.w, w.oh,       w.ow};
}
}  // namespace detail

template <class D>
class Lowered<layers::Conv2d, D> {
 public:
  Lowered(layers::Conv2d& conv, Context<D>& c)
      : host_(&conv),
        w_(c.value(conv.weight())),
        gw_(c.grad(conv.weight())),
        b_(conv.has_bias() ? c.value(conv.bias()) : nullptr),
        gb_(conv.has_bias() ? c.grad(conv.bias()) : nullptr),
        wl_(c.lowp_value(conv.weight())) {
    XTRAIN_CHECK(conv.groups() == 1, ValueError, conv.describe(),
                 ": grouped convolutions have no device implementation yet");
    window_.kernel = conv.kernel_size();
    window_.stride = conv.stride();
    window_.padding = conv.padding();
    window_.dilation = conv.dilation();
  }
  Shape out_shape(const Shape& in) const {
    const ops::Window2 g = detail::window_over(window_, 1, in, host_->describe());
    XTRAIN_CHECK(in[0] == host_->in_channels(), ShapeError, host_->describe(), " on the device: a sample of shape ",
                 in.str());
    return Shape{host_->out_channels(), g.oh, g.ow};
  }
  // Forward: the input unfolded (Im2col), one product by the weights for every image at once, then
  // laid out as NCHW images with the bias added. Backward: the weights' gradient from the kept
  // unfolded input, the bias's from plane sums, the input's folded back (Col2im). Under
  // MixedPrecision the products' operands are rounded to bf16 or fp16 (the unfolded input and the
  // gradient by channel: copies of their own), fp32 accumulation.
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    (void)out_shape(in);
    g_ = detail::window_over(window_, n, in, host_->describe());
    const std::size_t ckk = g_.c * g_.kh * g_.kw, cols = n * g_.oh * g_.ow, o = host_->out_channels();
    cols_.reserve(c.dev, ckk * cols);
    yc_.reserve(c.dev, o * cols);
    y_.reserve(c.dev, o * cols);
    c.dev.launch(ops::Im2col{x, cols_.data(), g_});
    const ops::RowMajorGemm product{false, false, o, cols, ckk, ckk, cols, cols};
    if (wl_) {
      colsl_ = colsl_copy_.round(c.dev, cols_.data(), ckk * cols, c.products());
      gemm(c.dev, product, wl_, colsl_, yc_.data(), 1.0f, 0.0f);
    } else {
      c.dev.gemm(product, w_, cols_.data(), yc_.data(), 1.0f, 0.0f);
    }
    c.dev.launch(ops::ChannelsImages{yc_.data(), b_, y_.data(), n, o, g_.oh * g_.ow, false});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    const std::size_t ckk = g_.c * g_.kh * g_.kw, planes = g_.oh * g_.ow, cols = g_.n * planes,
                      o = host_->out_channels();
    c.dev.launch(ops::ChannelsImages{dy, nullptr, yc_.data(), g_.n, o, planes, true});  // dy by channel
    const ops::RowMajorGemm weight_grad{false, true, o, ckk, cols, cols, cols, ckk},
        input_grad{true, false, ckk, cols, o, ckk, cols, cols};
    LowpOperand ycl;
    if (wl_) {
      ycl = ycl_copy_.round(c.dev, yc_.data(), o * cols, c.products());
      gemm(c.dev, weight_grad, ycl, colsl_, gw_, 1.0f, 1.0f);
    } else {
      c.dev.gemm(weight_grad, yc_.data(), cols_.data(), gw_, 1.0f, 1.0f);
    }
    if (gb_) {
      partial_.reserve(c.dev, g_.n * o);
      c.dev.launch(ops::RowSums{dy, partial_.data(), g_.n * o, planes});   // per image and channel
      c.dev.launch(ops::ColumnSums{partial_.data(), gb_, g_.n, o, true});  // over the images, in order
    }
    if (!need_dx) return nullptr;
    if (wl_)  // dcols
      gemm(c.dev, input_grad, wl_, ycl, cols_.data(), 1.0f, 0.0f);
    else
      c.dev.gemm(input_grad, w_, yc_.data(), cols_.data(), 1.0f, 0.0f);
    dx_.reserve(c.dev, g_.n * g_.c * g_.h * g_.w);
    c.dev.launch(ops::Col2im{cols_.data(), dx_.data(), g_});
    return dx_.data();
  }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}

 private:
  layers::Conv2d* host_;
  kernels::Window window_;
  ops::Window2 g_{};
  const float* w_;
  float* gw_;
  const float* b_;
  float* gb_;
  LowpOperand wl_;     // the weights in bf16 or fp16 under MixedPrecision, else none
  LowpOperand colsl_;  // the unfolded input rounded (MixedPrecision)
  typename D::template Buffer<float> cols_, yc_, y_, dx_, partial_;
  LowpCopy<D> colsl_copy_, ycl_copy_;
};

template <class D>
class Lowered<layers::MaxPool2d, D> {
 public:
  static constexpr bool parameter_free = true;
  Lowered(layers::MaxPool2d& pool, Context<D>&) : host_(&pool) {}
  Shape out_shape(const Shape& in) const {
    const ops::Window2 g = detail::window_over(host_->window(), 1, in, host_->describe());
    return Shape{in[0], g.oh, g.ow};
  }
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    g_ = detail::window_over(host_->window(), n, in, host_->describe());
    const std::size_t out = n * g_.c * g_.oh * g_.ow;
    y_.reserve(c.dev, out);
    argmax_.reserve(c.dev, out);
    c.dev.launch(ops::MaxPoolForward{x, y_.data(), argmax_.data(), g_});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    if (!need_dx) return nullptr;
    dx_.reserve(c.dev, g_.n * g_.c * g_.h * g_.w);
    c.dev.launch(ops::MaxPoolBackward{dy, argmax_.data(), dx_.data(), g_});
    return dx_.data();
  }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}

 private:
  layers::MaxPool2d* host_;
  ops::Window2 g_{};
  typename D::template Buffer<float> y_, dx_;
  typename D::template Buffer<std::int32_t> argmax_;
};

// Average pooling, one thread per output (forward) or per input value (backward, gathered);
// Pool::window(n, in) gives its geometry over n images of sample shape `in`.
template <class Pool, class D>
class LoweredAvgPool {
 public:
  static constexpr bool parameter_free = true;
  Shape out_shape(const Shape& in) const {
    const ops::AvgWindow a = self().window(1, in);
    return Shape{in[0], a.g.oh, a.g.ow};
  }
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    a_ = self().window(n, in);
    y_.reserve(c.dev, n * a_.g.c * a_.g.oh * a_.g.ow);
    c.dev.launch(ops::AvgPoolForward{x, y_.data(), a_});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    if (!need_dx) return nullptr;
    dx_.reserve(c.dev, a_.g.n * a_.g.c * a_.g.h * a_.g.w);
    c.dev.launch(ops::AvgPoolBackward{dy, dx_.data(), a_});
    return dx_.data();
  }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}

 private:
  const Pool& self() const { return static_cast<const Pool&>(*this); }
  ops::AvgWindow a_{};
  typename D::template Buffer<float> y_, dx_;
};

template <class D>
class Lowered<layers::AvgPool2d, D> : public LoweredAvgPool<Lowered<layers::AvgPool2d, D>, D> {
 public:
  Lowered(layers::AvgPool2d& pool, Context<D>&) : host_(&pool) {}
  ops::AvgWindow window(std::size_t n, const Shape& in) const {
    return {detail::window_over(host_->window(), n, in, host_->describe()), false, host_->count_include_pad()};
  }

 private:
  layers::AvgPool2d* host_;
};

template <class D>
class Lowered<layers::AdaptiveAvgPool2d, D> : public LoweredAvgPool<Lowered<layers::AdaptiveAvgPool2d, D>, D> {
 public:
  Lowered(layers::AdaptiveAvgPool2d& pool, Context<D>&) : host_(&pool) {}
  ops::AvgWindow window(std::size_t n, const Shape& in) const {
    XTRAIN_CHECK(in.rank() == 3, ShapeError, host_->describe(), " on the device: a sample of shape ", in.str(),
                 ", expected [channels, height, width]");
    const layers::Size2 out = host_->output_size();
    ops::Window2 g{};
    g.n = n;
    g.c = in[0];
    g.h = in[1];
    g.w = in[2];
    g.oh = out.h;
    g.ow = out.w;
    return {g, true, true};
  }

 private:
  layers::AdaptiveAvgPool2d* host_;
};

}  // namespace xtrain::lowering
