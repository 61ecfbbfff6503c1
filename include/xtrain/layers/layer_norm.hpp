#pragma once
/// \file layer_norm.hpp
/// LayerNorm(dim, eps, affine): each row of the last dimension normalised to mean 0 and variance 1
/// (biased), then scaled and shifted: PyTorch's nn.LayerNorm over one trailing dimension (weight
/// 1, bias 0 at start; both ParamKind::norm, so parameter groups exempt them from weight decay).
/// Statistics in fp32 whatever the activation type. Kernels: kernels/attention.hpp.

#include <algorithm>
#include <cstddef>
#include <sstream>
#include <string>
#include <type_traits>

#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/attention.hpp"
#include "xtrain/kernels/convert.hpp"

namespace xtrain::layers {

class LayerNorm {
 public:
  /// Requires dim > 0 and eps > 0.
  explicit LayerNorm(std::size_t dim, float eps = 1e-5f, bool elementwise_affine = true) : dim_(dim), eps_(eps) {
    XTRAIN_CHECK(dim > 0, ValueError, "LayerNorm(", dim, "): the dimension must be positive");
    XTRAIN_CHECK(eps > 0.0f, ValueError, "LayerNorm(", dim, ", eps=", eps, "): eps must be positive");
    if (elementwise_affine) {
      weight_ = Param({dim});
      bias_ = Param({dim});
      for (float& w : weight_.values()) w = 1.0f;
    }
  }

  /// y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimension of x ([*, dim]).
  /// Keeps a pointer to x for backward.
  template <ActivationType T>
  const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    check_last_dim(x, dim_, *this);
    const std::size_t rows = x.rows(), n = rows * dim_;
    Tensor<T>& y = y_.get<T>();
    y.resize(x.shape());
    mean_.resize({rows});
    rstd_.resize({rows});
    // Rows are independent: split over the context's threads (the same values on any count).
    auto rows_of = [&](const float* in, float* out) {
      backend::parallel_for(ctx.executor, rows, std::max<std::size_t>(1, (std::size_t{1} << 14) / dim_), 1,
                            [&](std::size_t r0, std::size_t r1) {
                              kernels::layer_norm_forward(in + r0 * dim_, r1 - r0, dim_, eps_, w(), b(),
                                                          out + r0 * dim_, mean_.data() + r0, rstd_.data() + r0);
                            });
    };
    if constexpr (std::is_same_v<T, float>) {
      rows_of(x.data(), y.data());
    } else {
      x32_.resize({n});
      y32_.resize({n});
      kernels::to_float(x.data(), x32_.data(), n, ctx.executor);
      rows_of(x32_.data(), y32_.data());
      kernels::from_float(y32_.data(), y.data(), n, ctx.executor);
    }
    x_ = &x;
    type_ = activation_type_index<T>;
    return y;
  }

  /// dx; weight.grad and bias.grad are added into.
  template <ActivationType T>
  const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    XTRAIN_CHECK(x_ != nullptr, ValueError, describe(), ": backward called before forward");
    XTRAIN_CHECK(type_ == activation_type_index<T>, ValueError, describe(), ": backward in ",
                 activation_type_name(activation_type_index<T>), " after a forward in ", activation_type_name(type_));
    const Tensor<T>& x = *static_cast<const Tensor<T>*>(x_);
    XTRAIN_CHECK(dy.shape() == x.shape(), ShapeError, describe(), ": gradient has shape ", dy.shape().str(),
                 ", expected ", x.shape().str());
    const std::size_t rows = x.rows(), n = rows * dim_;
    Tensor<T>& dx = dx_.get<T>();
    dx.resize(x.shape());
    float* dw = affine() ? weight_.grad() : nullptr;
    float* db = affine() ? bias_.grad() : nullptr;
    if constexpr (std::is_same_v<T, float>) {
      kernels::layer_norm_backward(x.data(), dy.data(), rows, dim_, w(), mean_.data(), rstd_.data(), dx.data(), dw, db);
    } else {
      y32_.resize({n});  // dy widened (the forward's fp32 output is not needed any more)
      kernels::to_float(dy.data(), y32_.data(), n, ctx.executor);
      dx32_.resize({n});
      kernels::layer_norm_backward(x32_.data(), y32_.data(), rows, dim_, w(), mean_.data(), rstd_.data(), dx32_.data(),
                                   dw, db);
      kernels::from_float(dx32_.data(), dx.data(), n, ctx.executor);
    }
    return dx;
  }

  template <class V>
  void visit(V& v) {
    if (!affine()) return;
    v.param("weight", weight_, ParamKind::norm);
    v.param("bias", bias_, ParamKind::norm);
  }

  bool affine() const noexcept { return weight_.size() > 0; }
  Param& weight() noexcept { return weight_; }
  Param& bias() noexcept { return bias_; }
  std::size_t dim() const noexcept { return dim_; }
  float eps() const noexcept { return eps_; }
  /// "LayerNorm((128,), eps=1e-05, elementwise_affine=True)", as PyTorch prints it.
  std::string describe() const {
    std::ostringstream s;
    s << "LayerNorm((" << dim_ << ",), eps=" << eps_ << ", elementwise_affine=" << (affine() ? "True" : "False") << ")";
    return s.str();
  }

 private:
  const float* w() const noexcept { return affine() ? weight_.data() : nullptr; }
  const float* b() const noexcept { return affine() ? bias_.data() : nullptr; }

  std::size_t dim_;
  float eps_;
  Param weight_, bias_;
  const void* x_ = nullptr;
  int type_ = 0;
  Tensor<float> mean_, rstd_, x32_, y32_, dx32_;  // x32_ .. dx32_: bf16/fp16 only
  ActivationBuffers y_, dx_;
};

}  // namespace xtrain::layers
