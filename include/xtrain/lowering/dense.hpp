#pragma once
/// \file dense.hpp
/// The device implementations (lowering/device.hpp) of Linear (one product, the bias in its
/// epilogue; under MixedPrecision its operands rounded to bf16 or fp16, fp32 accumulation), the activations (ReLU,
/// Tanh, Sigmoid, GELU in both forms, SiLU), Flatten and Dropout (the CPU layer's masks).

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "xtrain/core/error.hpp"
#include "xtrain/core/rng.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/device_ops.hpp"
#include "xtrain/kernels/device_sequence.hpp"
#include "xtrain/layers/activations.hpp"
#include "xtrain/layers/dropout.hpp"
#include "xtrain/layers/layer_norm.hpp"
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
        gb_(l.has_bias() ? c.grad(l.bias()) : nullptr),
        wl_(c.lowp_value(l.weight())) {}
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
    const ops::RowMajorGemm product{false, true, rows_, out_, in_, in_, in_, out_};
    if (wl_) {  // MixedPrecision: x rounded to bf16 or fp16 (kept for the weights' gradient)
      xl_ = xl_copy_.round(c.dev, x, rows_ * in_, c.products());
      gemm(c.dev, product, xl_, wl_, y_.data(), 1.0f, 0.0f, b_);
    } else {
      c.dev.gemm(product, x, w_, y_.data(), 1.0f, 0.0f, b_);
    }
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    const ops::RowMajorGemm weight_grad{true, false, out_, in_, rows_, out_, in_, in_},
        input_grad{false, false, rows_, in_, out_, out_, in_, in_};
    LowpOperand dyl;
    if (wl_) {
      dyl = dyl_copy_.round(c.dev, dy, rows_ * out_, c.products());
      gemm(c.dev, weight_grad, dyl, xl_, gw_, 1.0f, 1.0f);
    } else {
      c.dev.gemm(weight_grad, dy, x_, gw_, 1.0f, 1.0f);
    }
    if (gb_) c.dev.launch(ops::ColumnSums{dy, gb_, rows_, out_, true});
    if (!need_dx) return nullptr;
    dx_.reserve(c.dev, rows_ * in_);
    if (wl_)
      gemm(c.dev, input_grad, dyl, wl_, dx_.data(), 1.0f, 0.0f);
    else
      c.dev.gemm(input_grad, dy, w_, dx_.data(), 1.0f, 0.0f);
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
  LowpOperand wl_;  // the weights in bf16 or fp16 under MixedPrecision, else none
  const float* x_ = nullptr;
  LowpOperand xl_;  // x rounded (MixedPrecision)
  typename D::template Buffer<float> y_, dx_;
  LowpCopy<D> xl_copy_, dyl_copy_;  // the products' operands in bf16 or fp16
};

/// LayerNorm over the last dimension: statistics per row in fp32 (one thread per row), the
/// weight's and bias's gradients summed over the rows in order.
template <class D>
class Lowered<layers::LayerNorm, D> {
 public:
  Lowered(layers::LayerNorm& l, Context<D>& c)
      : host_(&l),
        w_(l.affine() ? c.value(l.weight()) : nullptr),
        b_(l.affine() ? c.value(l.bias()) : nullptr),
        gw_(l.affine() ? c.grad(l.weight()) : nullptr),
        gb_(l.affine() ? c.grad(l.bias()) : nullptr) {}
  /// [*, dim] -> [*, dim].
  Shape out_shape(const Shape& in) const {
    XTRAIN_CHECK(in.rank() >= 1 && in[in.rank() - 1] == host_->dim(), ShapeError, host_->describe(),
                 " on the device: a sample of shape ", in.str());
    return in;
  }
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    (void)out_shape(in);
    const std::size_t dim = host_->dim();
    rows_ = n * (in.elements() / dim);
    x_ = x;
    y_.reserve(c.dev, rows_ * dim);
    mean_.reserve(c.dev, rows_);
    rstd_.reserve(c.dev, rows_);
    c.dev.launch(ops::LayerNormForward{x, w_, b_, y_.data(), mean_.data(), rstd_.data(), rows_, dim, host_->eps()});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    const std::size_t dim = host_->dim();
    if (gw_) c.dev.launch(ops::LayerNormParamGrad{x_, dy, mean_.data(), rstd_.data(), gw_, gb_, rows_, dim});
    if (!need_dx) return nullptr;
    dx_.reserve(c.dev, rows_ * dim);
    c.dev.launch(ops::LayerNormInputGrad{x_, dy, w_, mean_.data(), rstd_.data(), dx_.data(), rows_, dim});
    return dx_.data();
  }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}

 private:
  layers::LayerNorm* host_;
  const float *w_, *b_;
  float *gw_, *gb_;
  std::size_t rows_ = 0;
  const float* x_ = nullptr;
  typename D::template Buffer<float> y_, dx_, mean_, rstd_;
};

template <class D>
class Lowered<layers::Activation, D> {
 public:
  static constexpr bool parameter_free = true;
  Lowered(layers::Activation& a, Context<D>&) : kind_(a.kind()) {}
  Shape out_shape(const Shape& in) const { return in; }
  bool is_relu() const { return kind_ == layers::ActivationKind::relu; }
  /// Set when the layer before it applies the ReLU itself (as the CPU's fusion; ReLU only).
  bool absorbed = false;
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    if (absorbed) return x;
    n_ = n * in.elements();
    x_ = x;
    y_.reserve(c.dev, n_);
    if (is_relu())
      c.dev.launch(ops::ReluForward{x, y_.data(), n_});
    else
      c.dev.launch(ops::FunctionForward{x, y_.data(), n_, function()});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    if (absorbed) return need_dx ? dy : nullptr;
    if (!need_dx) return nullptr;
    dx_.reserve(c.dev, n_);
    if (is_relu()) {
      c.dev.launch(ops::ReluBackward{y_.data(), dy, dx_.data(), n_});
    } else {
      const ops::Function f = function();
      c.dev.launch(ops::FunctionBackward{ops::reads_input(f) ? x_ : y_.data(), dy, dx_.data(), n_, f});
    }
    return dx_.data();
  }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}

 private:
  ops::Function function() const {
    switch (kind_) {
      case layers::ActivationKind::tanh:
        return ops::Function::tanh;
      case layers::ActivationKind::sigmoid:
        return ops::Function::sigmoid;
      case layers::ActivationKind::gelu:
        return ops::Function::gelu;
      case layers::ActivationKind::gelu_tanh:
        return ops::Function::gelu_tanh;
      case layers::ActivationKind::silu:
      case layers::ActivationKind::relu:  // (has its own bodies)
        break;
    }
    return ops::Function::silu;
  }
  layers::ActivationKind kind_;
  std::size_t n_ = 0;
  const float* x_ = nullptr;
  typename D::template Buffer<float> y_, dx_;
};
// The named activations (ReLU, Tanh, Sigmoid, SiLU, GELU) are Activations of one kind.
template <class L, class D>
requires(std::derived_from<L, layers::Activation> && !std::same_as<L, layers::Activation>) class Lowered<L, D>
    : public Lowered<layers::Activation, D> {
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
  // The CPU layer's masks: stream (dropout | id << 40 | step), element e of the window at word e % 4
  // of block e / 4 (one process: the batch's first sample is sample *sample_offset of the window).
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    active_ = c.training && host_->p() > 0.0f;
    if (!active_) return x;
    n_ = n * in.elements();
    y_.reserve(c.dev, n_);
    mask_.reserve(c.dev, n_);
    const float p = host_->p(), scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    const std::uint64_t stream = streams::dropout | (static_cast<std::uint64_t>(host_->id()) << 40);
    c.dev.launch(ops::DropoutForward{x, y_.data(), mask_.data(), n_, in.elements(), c.seed, stream, c.step,
                                     c.sample_offset, p, scale, c.loss_scale});
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
