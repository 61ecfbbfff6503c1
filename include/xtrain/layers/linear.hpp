#pragma once
/// \file linear.hpp
/// Fully connected layer y = x W^T + b, PyTorch layout (weight [out, in]) and PyTorch's default
/// initialisation (kaiming_uniform with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in)) for W and b).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>

#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/rng.hpp"
#include "xtrain/core/saved_input.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/elementwise.hpp"
#include "xtrain/kernels/gemm.hpp"
#include "xtrain/kernels/gemm_lowp.hpp"

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

  /// y[*, out] = x[*, in] W^T + b over the rows of x (any rank: [B, in], [B, T, in], ...).
  /// Requires x's last dimension == in_features. Keeps a pointer to x for backward: x must stay
  /// alive and unchanged until then (Sequential guarantees this).
  /// With bf16/fp16 activations the GEMM rounds x and W to that type and accumulates in fp32
  /// (kernels/gemm_lowp.hpp); y is rounded to the activation type.
  template <ActivationType T>
  const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    check_last_dim(x, in_, *this);
    const std::size_t n = x.rows();
    Tensor<T>& y = y_.get<T>();
    y.resize(x.shape().with_back(out_));
    const backend::WorkspaceFor ws(ctx.executor);
    // The bias is added as the product's tiles are stored: no pass of its own over y.
    kernels::gemm_into<T>(kernels::Trans::no, kernels::Trans::yes, n, out_, in_, x.data(), in_, weight_.data(), in_,
                          y.data(), *ws, ctx.executor, has_bias() ? bias_.data() : nullptr);
    x_.save(x);
    return y;
  }

  /// dW += dy^T x, db += column sums of dy; dx = dy W when ctx.input_grad (else an empty matrix).
  template <ActivationType T>
  const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    const Tensor<T>& x = x_.get<T>(*this);
    const std::size_t n = x.rows();
    XTRAIN_CHECK(dy.shape() == x.shape().with_back(out_), ShapeError, describe(), ": gradient has shape ",
                 dy.shape().str(), ", expected ", x.shape().with_back(out_).str());
    kernels::gemm_as<T>(kernels::Trans::yes, kernels::Trans::no, out_, in_, n, dy.data(), out_, x.data(), in_, 1.0f,
                        weight_.grad(), in_, ctx.executor);
    if (has_bias()) {
      // Split over columns: each bias element sums its column in row order on one thread.
      backend::parallel_for(ctx.executor, out_, std::max<std::size_t>(64, (1u << 14) / std::max<std::size_t>(n, 1)),
                            [&](std::size_t c0, std::size_t c1) {
                              kernels::column_sums(dy.data() + c0, n, c1 - c0, bias_.grad() + c0, true, out_);
                            });
    }
    Tensor<T>& dx = dx_.get<T>();
    if (!ctx.input_grad) {
      dx.resize({0});
      return dx;
    }
    dx.resize(x.shape());
    const backend::WorkspaceFor ws(ctx.executor);
    kernels::gemm_into<T>(kernels::Trans::no, kernels::Trans::no, n, in_, out_, dy.data(), out_, weight_.data(), in_,
                          dx.data(), *ws, ctx.executor);
    return dx;
  }

  template <class V>
  void visit(V& v) {
    v.param("weight", weight_);
    if (has_bias()) v.param("bias", bias_, ParamKind::bias);
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
  SavedInput x_;
  ActivationBuffers y_, dx_;
};

}  // namespace xtrain::layers
