#pragma once
/// \file activations.hpp
/// Element-wise activation layers: ReLU, Tanh, Sigmoid, GELU (exact erf or tanh approximation), SiLU,
/// and Activation, the same layers chosen at run time by name (`--activation gelu`). They work
/// element-wise on tensors of any rank.

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/saved_input.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/elementwise.hpp"
#include "xtrain/layers/fusion.hpp"

namespace xtrain::layers {

/// Which function an Activation layer computes.
enum class ActivationKind { relu, tanh, sigmoid, gelu, gelu_tanh, silu };

/// Parses "relu", "tanh", "sigmoid", "gelu" (exact), "gelu_tanh" or "silu"; throws ValueError otherwise.
inline ActivationKind activation_kind(std::string_view name) {
  if (name == "relu") return ActivationKind::relu;
  if (name == "tanh") return ActivationKind::tanh;
  if (name == "sigmoid") return ActivationKind::sigmoid;
  if (name == "gelu") return ActivationKind::gelu;
  if (name == "gelu_tanh") return ActivationKind::gelu_tanh;
  if (name == "silu") return ActivationKind::silu;
  throw ValueError("unknown activation '" + std::string(name) +
                   "' (expected relu, tanh, sigmoid, gelu, gelu_tanh or silu)");
}

/// A parameter-free element-wise layer whose function is chosen at construction.
class Activation {
 public:
  explicit Activation(ActivationKind kind) : kind_(kind) {}
  explicit Activation(std::string_view name) : kind_(activation_kind(name)) {}

  /// y = f(x), stored as x's type (fp32, or bf16/fp16 computed in fp32 and rounded).
  template <ActivationType T>
  const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    Tensor<T>& y = y_.get<T>();
    y.resize(x.shape());
    dispatch([&]<class Op>() {
      for_runs(ctx, x.shape(),
               [&](std::size_t b, std::size_t n) { kernels::activation_forward<Op>(x.data() + b, y.data() + b, n); });
    });
    x_.save(x);
    return y;
  }

  template <ActivationType T>
  const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    const Tensor<T>& x = x_.get<T>(*this);
    const Tensor<T>& y = y_.get<T>();
    XTRAIN_CHECK(dy.shape() == y.shape(), ShapeError, describe(), ": gradient has shape ", dy.shape().str(),
                 ", expected ", y.shape().str());
    Tensor<T>& dx = dx_.get<T>();
    dx.resize(dy.shape());
    dispatch([&]<class Op>() {
      const T* saved = Op::saves_input ? x.data() : y.data();
      for_runs(ctx, dy.shape(), [&](std::size_t b, std::size_t n) {
        kernels::activation_backward<Op>(saved + b, dy.data() + b, dx.data() + b, n);
      });
    });
    return dx;
  }

  template <class V>
  void visit(V&) {}

  ActivationKind kind() const noexcept { return kind_; }
  /// Fusion (layers/fusion.hpp): a ReLU is an operation the modules around it may apply.
  fusion::Op fusion_op() const noexcept { return kind_ == ActivationKind::relu ? fusion::Op::relu : fusion::Op::none; }
  std::string describe() const {
    switch (kind_) {
      case ActivationKind::relu:
        return "ReLU()";
      case ActivationKind::tanh:
        return "Tanh()";
      case ActivationKind::sigmoid:
        return "Sigmoid()";
      case ActivationKind::gelu:
        return "GELU(approximate='none')";
      case ActivationKind::gelu_tanh:
        return "GELU(approximate='tanh')";
      case ActivationKind::silu:
        return "SiLU()";
    }
    return "Activation()";
  }

 private:
  static constexpr std::size_t parallel_grain = std::size_t{1} << 14;  // elements per part of a split map

  // f(offset, count) over runs of the elements, split over the context's threads. A wide last
  // dimension (a multiple of 64) is split by columns, as the Linear before it split its output,
  // so that each thread maps the values it wrote; else the flat range is split at multiples of
  // 64. Either way each element goes through the same SIMD lane arithmetic as on one thread.
  template <class F>
  static void for_runs(Context& ctx, const Shape& shape, F&& f) {
    const std::size_t size = shape.elements(), cols = shape.rank() ? shape[shape.rank() - 1] : size;
    const std::size_t rows = cols ? size / cols : 0;
    if (rows > 1 && cols % 64 == 0 && cols >= 64 * backend::threads_of(ctx.executor)) {
      backend::parallel_for(ctx.executor, cols, std::max<std::size_t>(64, parallel_grain / rows), 64,
                            [&](std::size_t c0, std::size_t c1) {
                              for (std::size_t r = 0; r < rows; ++r) f(r * cols + c0, c1 - c0);
                            });
      return;
    }
    backend::parallel_for(ctx.executor, size, parallel_grain, [&](std::size_t b, std::size_t e) { f(b, e - b); });
  }

  template <class F>
  void dispatch(F&& f) const {
    switch (kind_) {
      case ActivationKind::relu:
        return f.template operator()<kernels::ops::Relu>();
      case ActivationKind::tanh:
        return f.template operator()<kernels::ops::Tanh>();
      case ActivationKind::sigmoid:
        return f.template operator()<kernels::ops::Sigmoid>();
      case ActivationKind::gelu:
        return f.template operator()<kernels::ops::GeluErf>();
      case ActivationKind::gelu_tanh:
        return f.template operator()<kernels::ops::GeluTanh>();
      case ActivationKind::silu:
        return f.template operator()<kernels::ops::Silu>();
    }
  }

  ActivationKind kind_;
  SavedInput x_;
  ActivationBuffers y_, dx_;
};

/// max(x, 0).
struct ReLU : Activation {
  ReLU() : Activation(ActivationKind::relu) {}
};
/// tanh(x).
struct Tanh : Activation {
  Tanh() : Activation(ActivationKind::tanh) {}
};
/// 1 / (1 + exp(-x)).
struct Sigmoid : Activation {
  Sigmoid() : Activation(ActivationKind::sigmoid) {}
};

/// x * sigmoid(x) (swish).
struct SiLU : Activation {
  SiLU() : Activation(ActivationKind::silu) {}
};

/// GELU's two forms, as PyTorch's `approximate` argument.
enum class Approximate { none, tanh };

/// x * Phi(x) (exact, default) or its tanh approximation.
struct GELU : Activation {
  explicit GELU(Approximate approximate = Approximate::none)
      : Activation(approximate == Approximate::none ? ActivationKind::gelu : ActivationKind::gelu_tanh) {}
};

}  // namespace xtrain::layers
