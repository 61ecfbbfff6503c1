#pragma once
/// \file composite.hpp
/// The device implementations (lowering/device.hpp) of the layers made of layers: Sequential
/// (a BatchNorm followed by a ReLU fused as on the CPU), Residual and ResNet's BasicBlock (its
/// final sum and ReLU in one pass).

#include <array>
#include <cstddef>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "xtrain/core/error.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/device_ops.hpp"
#include "xtrain/layers/residual.hpp"
#include "xtrain/layers/resnet.hpp"
#include "xtrain/layers/sequential.hpp"
#include "xtrain/lowering/batch_norm.hpp"
#include "xtrain/lowering/conv.hpp"
#include "xtrain/lowering/dense.hpp"
#include "xtrain/lowering/device.hpp"

namespace xtrain::lowering {

namespace ops = kernels::device;

template <class... Layers, class D>
class Lowered<layers::Sequential<Layers...>, D> {
  using Children = std::tuple<Lowered<layers::unnamed_t<Layers>, D>...>;
  static constexpr std::size_t count = sizeof...(Layers);
  // Whether a child before child i has parameters (child i's input gradient is then needed).
  static constexpr std::array<bool, count> trains_before = [] {
    std::array<bool, count> a{};
    bool any = false;
    std::size_t i = 0;
    ((a[i++] = any, any = any || !lowering::parameter_free<Lowered<layers::unnamed_t<Layers>, D>>), ...);
    return a;
  }();

 public:
  static constexpr bool parameter_free = (lowering::parameter_free<Lowered<layers::unnamed_t<Layers>, D>> && ...);
  Lowered(layers::Sequential<Layers...>& s, Context<D>& c)
      : children_([&]<std::size_t... I>(std::index_sequence<I...>) {
          return Children{Lowered<layers::unnamed_t<Layers>, D>(s.template get<I>(), c)...};
        }(std::index_sequence_for<Layers...>{})) {
    // A BatchNorm followed by a ReLU applies it in its own pass (the CPU's fusion).
    [&]<std::size_t... I>(std::index_sequence<I...>) { (fuse<I>(), ...); }
    (std::make_index_sequence<count - 1>{});
  }
  Shape out_shape(Shape s) const {
    std::apply([&](const auto&... c) { ((s = c.out_shape(s)), ...); }, children_);
    return s;
  }
  const float* forward(Context<D>& c, const float* x, std::size_t n, Shape s) {
    std::apply([&](auto&... child) { ((x = child.forward(c, x, n, s), s = child.out_shape(s)), ...); }, children_);
    return x;
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      // Last child first; a child's input gradient only when asked for or a child before it has
      // parameters (a Linear after Flatten in front computes none).
      ((dy = std::get<count - 1 - I>(children_).backward(c, dy, need_dx || trains_before[count - 1 - I])), ...);
    }
    (std::index_sequence_for<Layers...>{});
    return dy;
  }
  void upload(Context<D>& c) {
    std::apply([&](auto&... child) { (child.upload(c), ...); }, children_);
  }
  void download(Context<D>& c) {
    std::apply([&](auto&... child) { (child.download(c), ...); }, children_);
  }

 private:
  template <std::size_t I>
  void fuse() {
    using A = std::tuple_element_t<I, Children>;
    using B = std::tuple_element_t<I + 1, Children>;
    constexpr bool batch_norm =
        std::is_same_v<A, Lowered<layers::BatchNorm1d, D>> || std::is_same_v<A, Lowered<layers::BatchNorm2d, D>>;
    if constexpr (batch_norm && std::is_base_of_v<Lowered<layers::Activation, D>, B>) {
      if (std::get<I + 1>(children_).is_relu()) {  // (an Activation chosen by name may be another)
        std::get<I>(children_).fuse_relu = true;
        std::get<I + 1>(children_).absorbed = true;
      }
    }
  }
  Children children_;
};

// y = x + m(x); dx = dy + m's input gradient.
template <class M, class D>
class Lowered<layers::Residual<M>, D> {
 public:
  static constexpr bool parameter_free = lowering::parameter_free<Lowered<M, D>>;
  Lowered(layers::Residual<M>& r, Context<D>& c) : host_(&r), inner_(r.module(), c) {}
  Shape out_shape(const Shape& in) const {
    const Shape out = inner_.out_shape(in);
    XTRAIN_CHECK(out == in, ShapeError, host_->describe(), " on the device: the wrapped module maps a sample of shape ",
                 in.str(), " to ", out.str(), "; a residual needs the same shape");
    return out;
  }
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    (void)out_shape(in);
    n_ = n * in.elements();
    const float* fx = inner_.forward(c, x, n, in);
    y_.reserve(c.dev, n_);
    c.dev.launch(ops::Add{x, fx, y_.data(), n_, false});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    const float* dfx = inner_.backward(c, dy, need_dx);
    if (!need_dx) return nullptr;
    dx_.reserve(c.dev, n_);
    c.dev.launch(ops::Add{dy, dfx, dx_.data(), n_, false});
    return dx_.data();
  }
  void upload(Context<D>& c) { inner_.upload(c); }
  void download(Context<D>& c) { inner_.download(c); }

 private:
  layers::Residual<M>* host_;
  Lowered<M, D> inner_;
  std::size_t n_ = 0;
  typename D::template Buffer<float> y_, dx_;
};

// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)): bn1 applies relu1 (as on the CPU); the
// sum and relu2 in one pass; backward takes the shortcut first (the CPU's order).
template <class D>
class Lowered<layers::BasicBlock, D> {
 public:
  Lowered(layers::BasicBlock& b, Context<D>& c)
      : host_(&b), conv1_(b.conv1(), c), bn1_(b.bn1(), c), conv2_(b.conv2(), c), bn2_(b.bn2(), c) {
    bn1_.fuse_relu = true;
    if (b.has_downsample()) downsample_.emplace(b.downsample(), c);
  }
  Shape out_shape(const Shape& in) const {
    const Shape body = bn2_.out_shape(conv2_.out_shape(bn1_.out_shape(conv1_.out_shape(in))));
    const Shape shortcut = downsample_ ? downsample_->out_shape(in) : in;
    XTRAIN_CHECK(body == shortcut, ShapeError, host_->describe(), " on the device: a sample of shape ", in.str(),
                 "; the block maps it to ", body.str(), " and the shortcut to ", shortcut.str());
    return body;
  }
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    const Shape out = out_shape(in);
    n_ = n * out.elements();
    in_n_ = n * in.elements();
    Shape s = in;
    const float* h = conv1_.forward(c, x, n, s);
    h = bn1_.forward(c, h, n, s = conv1_.out_shape(s));
    h = conv2_.forward(c, h, n, s);
    h = bn2_.forward(c, h, n, s = conv2_.out_shape(s));
    const float* shortcut = downsample_ ? downsample_->forward(c, x, n, in) : x;
    y_.reserve(c.dev, n_);
    c.dev.launch(ops::Add{h, shortcut, y_.data(), n_, true});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    dsum_.reserve(c.dev, n_);
    c.dev.launch(ops::ReluBackward{y_.data(), dy, dsum_.data(), n_});
    const float* dshort = downsample_ ? downsample_->backward(c, dsum_.data(), need_dx) : dsum_.data();
    const float* d = bn2_.backward(c, dsum_.data(), true);
    d = conv2_.backward(c, d, true);
    d = bn1_.backward(c, d, true);
    d = conv1_.backward(c, d, need_dx);
    if (!need_dx) return nullptr;
    dx_.reserve(c.dev, in_n_);
    c.dev.launch(ops::Add{d, dshort, dx_.data(), in_n_, false});
    return dx_.data();
  }
  void upload(Context<D>& c) {
    bn1_.upload(c);
    bn2_.upload(c);
    if (downsample_) downsample_->upload(c);
  }
  void download(Context<D>& c) {
    bn1_.download(c);
    bn2_.download(c);
    if (downsample_) downsample_->download(c);
  }

 private:
  layers::BasicBlock* host_;
  Lowered<layers::Conv2d, D> conv1_;
  Lowered<layers::BatchNorm2d, D> bn1_;
  Lowered<layers::Conv2d, D> conv2_;
  Lowered<layers::BatchNorm2d, D> bn2_;
  std::optional<Lowered<layers::BasicBlock::Downsample, D>> downsample_;
  std::size_t n_ = 0, in_n_ = 0;
  typename D::template Buffer<float> y_, dsum_, dx_;
};

}  // namespace xtrain::lowering
