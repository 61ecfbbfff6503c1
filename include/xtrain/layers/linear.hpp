#pragma once
/// \file linear.hpp
/// Fully connected layer y = x W^T + b, PyTorch layout (weight [out, in]) and PyTorch's default
/// initialisation (kaiming_uniform with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in)) for W and b).

#include <cmath>
#include <cstddef>
#include <string>

#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/rng.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/elementwise.hpp"
#include "xtrain/kernels/gemm.hpp"

namespace xtrain::layers {

class Linear {
 public:
  /// Requires in_features > 0, out_features > 0. Draws W then b from `default_generator()`.
  Linear(std::size_t in_features, std::size_t out_features, bool bias = true)
      : in_(in_features), out_(out_features), weight_({out_features, in_features}) {
    XTRAIN_CHECK(in_features > 0 && out_features > 0, ValueError, "Linear(", in_features, ", ", out_features,
                 "): both sizes must be positive");
    if (bias) bias_ = Param({out_features});
    reset_parameters(default_generator());
  }

  /// Re-draws W and b as PyTorch's `reset_parameters` does, from `gen`.
  void reset_parameters(Generator& gen) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
    for (float& w : weight_.values()) w = gen.uniform(-bound, bound);
    for (float& b : bias_.values()) b = gen.uniform(-bound, bound);
  }

  /// y[N, out] = x[N, in] W^T + b. Requires x.shape(1) == in_features. Keeps a pointer to x for
  /// backward: x must stay alive and unchanged until then (Sequential guarantees this).
  const Matrix& forward(Context&, const Matrix& x) {
    XTRAIN_CHECK(x.dimension() == 2 && x.shape(1) == in_, ShapeError, describe(), ": input has shape ",
                 shape_string(shape_of(x)), ", expected [batch, ", in_, "]");
    const std::size_t n = x.shape(0);
    ensure_shape(y_, n, out_);
    float beta = 0.0f;
    if (has_bias()) {
      kernels::broadcast_rows(bias_.data(), n, out_, y_.data());
      beta = 1.0f;
    }
    kernels::gemm(kernels::Trans::no, kernels::Trans::yes, n, out_, in_, 1.0f, x.data(), in_, weight_.data(), in_, beta,
                  y_.data(), out_);
    x_ = &x;
    return y_;
  }

  /// dW += dy^T x, db += column sums of dy; dx = dy W when ctx.input_grad (else an empty matrix).
  const Matrix& backward(Context& ctx, const Matrix& dy) {
    XTRAIN_CHECK(x_ != nullptr, ValueError, describe(), ": backward called before forward");
    const std::size_t n = x_->shape(0);
    XTRAIN_CHECK(dy.dimension() == 2 && dy.shape(0) == n && dy.shape(1) == out_, ShapeError, describe(),
                 ": gradient has shape ", shape_string(shape_of(dy)), ", expected [", n, ", ", out_, "]");
    kernels::gemm(kernels::Trans::yes, kernels::Trans::no, out_, in_, n, 1.0f, dy.data(), out_, x_->data(), in_, 1.0f,
                  weight_.grad(), in_);
    if (has_bias()) kernels::column_sums(dy.data(), n, out_, bias_.grad(), true);
    if (!ctx.input_grad) {
      ensure_shape(dx_, 0, 0);
      return dx_;
    }
    ensure_shape(dx_, n, in_);
    kernels::gemm(kernels::Trans::no, kernels::Trans::no, n, in_, out_, 1.0f, dy.data(), out_, weight_.data(), in_,
                  0.0f, dx_.data(), in_);
    return dx_;
  }

  template <class F>
  void visit_params(const std::string& prefix, F&& f) {
    f(prefix + "weight", weight_);
    if (has_bias()) f(prefix + "bias", bias_);
  }

  Param& weight() noexcept { return weight_; }
  Param& bias() noexcept { return bias_; }
  bool has_bias() const noexcept { return bias_.size() > 0; }
  std::size_t in_features() const noexcept { return in_; }
  std::size_t out_features() const noexcept { return out_; }
  std::string describe() const {
    return "Linear(" + std::to_string(in_) + ", " + std::to_string(out_) + (has_bias() ? ")" : ", bias=false)");
  }

 private:
  std::size_t in_, out_;
  Param weight_, bias_;
  const Matrix* x_ = nullptr;
  Matrix y_, dx_;
};

}  // namespace xtrain::layers
