#pragma once
/// \file dense.hpp
/// The device implementations (lowering/device.hpp) of Linear (one product, the bias in its
/// epilogue), the activations (ReLU so far), Flatten and Dropout (the CPU layer's masks).

#include <cstddef>
#include <cstdint>

#include "xtrain/core/error.hpp"
#include "xtrain/core/rng.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/device_ops.hpp"
#include "xtrain/layers/activations.hpp"
#include "xtrain/layers/dropout.hpp"
#include "xtrain/layers/linear.hpp"
#include "xtrain/layers/pooling.hpp"
#include "xtrain/lowering/device.hpp"

namespace xtrain::lowering {

namespace ops = kernels::device;

template <class D>
class Lowered<layers::Linear, D> {
 public:
  Lowered(layers::Linear& l, Context<D>& c)
      : in_(l.in_features()),
        out_(l.out_features()),
        w_(c.value(l.weight())),
        gw_(c.grad(l.weight())),
        b_(l.has_bias() ? c.value(l.bias()) : nullptr),
        gb_(l.has_bias() ? c.grad(l.bias()) : nullptr) {}
  /// [*, in] -> [*, out].
  Shape out_shape(const Shape& in) const {
    XTRAIN_CHECK(in.rank() >= 1 && in[in.rank() - 1] == in_, ShapeError, "Linear(", in_, ", ", out_,
                 ") on the device: a sample of shape ", in.str());
    return in.with_back(out_);
  }
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    (void)out_shape(in);
    rows_ = n * (in.elements() / in_);
    x_ = x;
    y_.reserve(c.dev, rows_ * out_);
    c.dev.gemm({false, true, rows_, out_, in_, in_, in_, out_}, x, w_, y_.data(), 1.0f, 0.0f, b_);
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    c.dev.gemm({true, false, out_, in_, rows_, out_, in_, in_}, dy, x_, gw_, 1.0f, 1.0f);
    if (gb_) c.dev.launch(ops::ColumnSums{dy, gb_, rows_, out_, true});
    if (!need_dx) return nullptr;
    dx_.reserve(c.dev, rows_ * in_);
    c.dev.gemm({false, false, rows_, in_, out_, out_, in_, in_}, dy, w_, dx_.data(), 1.0f, 0.0f);
    return dx_.data();
  }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}

 private:
  std::size_t in_, out_, rows_ = 0;
  const float* w_;
  float* gw_;
  const float* b_;
  float* gb_;
  const float* x_ = nullptr;
  typename D::template Buffer<float> y_, dx_;
};

template <class D>
class Lowered<layers::Activation, D> {
 public:
  static constexpr bool parameter_free = true;
  Lowered(layers::Activation& a, Context<D>&) {
    XTRAIN_CHECK(a.kind() == layers::ActivationKind::relu, ValueError, a.describe(),
                 " has no device implementation yet (lowered so far: ReLU)");
  }
  Shape out_shape(const Shape& in) const { return in; }
  /// Set when the layer before it applies the ReLU itself (as the CPU's fusion).
  bool absorbed = false;
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    if (absorbed) return x;
    n_ = n * in.elements();
    y_.reserve(c.dev, n_);
    c.dev.launch(ops::ReluForward{x, y_.data(), n_});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    if (absorbed) return need_dx ? dy : nullptr;
    if (!need_dx) return nullptr;
    dx_.reserve(c.dev, n_);
    c.dev.launch(ops::ReluBackward{y_.data(), dy, dx_.data(), n_});
    return dx_.data();
  }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}

 private:
  std::size_t n_ = 0;
  typename D::template Buffer<float> y_, dx_;
};
template <class D>
class Lowered<layers::ReLU, D> : public Lowered<layers::Activation, D> {
  using Lowered<layers::Activation, D>::Lowered;
};

template <class D>
class Lowered<layers::Flatten, D> {
 public:
  static constexpr bool parameter_free = true;
  Lowered(layers::Flatten&, Context<D>&) {}
  Shape out_shape(const Shape& in) const { return Shape{in.elements()}; }
  const float* forward(Context<D>&, const float* x, std::size_t, const Shape&) { return x; }
  const float* backward(Context<D>&, const float* dy, bool need_dx) { return need_dx ? dy : nullptr; }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}
};

template <class D>
class Lowered<layers::Dropout, D> {
 public:
  static constexpr bool parameter_free = true;
  Lowered(layers::Dropout& d, Context<D>&) : host_(&d) {}
  Shape out_shape(const Shape& in) const { return in; }
  // The CPU layer's masks: stream (dropout | id << 40 | step), element e of the batch at word e % 4
  // of block e / 4 (one process: the batch's first sample is sample 0 of the global batch).
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    active_ = c.training && host_->p() > 0.0f;
    if (!active_) return x;
    n_ = n * in.elements();
    y_.reserve(c.dev, n_);
    mask_.reserve(c.dev, n_);
    const float p = host_->p(), scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    const std::uint64_t stream = streams::dropout | (static_cast<std::uint64_t>(host_->id()) << 40);
    c.dev.launch(ops::DropoutForward{x, y_.data(), mask_.data(), n_, c.seed, stream, c.step, p, scale});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    if (!need_dx) return nullptr;
    if (!active_) return dy;
    dx_.reserve(c.dev, n_);
    c.dev.launch(ops::Multiply{dy, mask_.data(), dx_.data(), n_});
    return dx_.data();
  }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}

 private:
  layers::Dropout* host_;
  bool active_ = false;
  std::size_t n_ = 0;
  typename D::template Buffer<float> y_, mask_, dx_;
};

}  // namespace xtrain::lowering
