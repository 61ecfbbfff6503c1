#pragma once
/// \file layer_norm.hpp
/// LayerNorm(dim, eps, affine): each row of the last dimension normalised to mean 0 and variance 1
/// (biased), then scaled and shifted: PyTorch's nn.LayerNorm over one trailing dimension (weight
/// 1, bias 0 at start; both ParamKind::norm, so parameter groups exempt them from weight decay).
/// Statistics in fp32 whatever the activation type. Kernels: kernels/layer_norm.hpp.

#include <algorithm>
#include <cstddef>
#include <sstream>
#include <string>
#include <type_traits>

#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/saved_input.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/layer_norm.hpp"

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
    const std::size_t rows = x.rows();
    Tensor<T>& y = y_.get<T>();
    y.resize(x.shape());
    mean_.resize({rows});
    rstd_.resize({rows});
    // Rows are independent: split over the context's threads (the same values on any count).
    backend::parallel_for(ctx.executor, rows, std::max<std::size_t>(1, (std::size_t{1} << 14) / dim_), 1,
                          [&](std::size_t r0, std::size_t r1) {
                            if constexpr (kernels::layer_norm_direct<T>) {
                              kernels::layer_norm_forward(x.data() + r0 * dim_, r1 - r0, dim_, eps_, w(), b(),
                                                          y.data() + r0 * dim_, mean_.data() + r0, rstd_.data() + r0);
                            } else {
                              // bf16/fp16 without 16-lane registers: a few rows at a time widened into the thread's
                              // workspace, normalised, and rounded back while they are in cache.
                              const backend::WorkspaceFor ws(ctx.executor);
                              const std::size_t chunk = chunk_rows();
                              float* in = ws->get<float>(backend::Workspace::Slot::accumulate, 2 * chunk * dim_);
                              float* out = in + chunk * dim_;
                              for (std::size_t c0 = r0; c0 < r1; c0 += chunk) {
                                const std::size_t m = std::min(chunk, r1 - c0) * dim_;
                                kernels::to_float(x.data() + c0 * dim_, in, m);
                                kernels::layer_norm_forward(in, m / dim_, dim_, eps_, w(), b(), out, mean_.data() + c0,
                                                            rstd_.data() + c0);
                                kernels::from_float(out, y.data() + c0 * dim_, m);
                              }
                            }
                          });
    x_.save(x);
    return y;
  }

  /// dx; weight.grad and bias.grad are added into.
  template <ActivationType T>
  const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    const Tensor<T>& x = x_.get<T>(*this);
    XTRAIN_CHECK(dy.shape() == x.shape(), ShapeError, describe(), ": gradient has shape ", dy.shape().str(),
                 ", expected ", x.shape().str());
    const std::size_t rows = x.rows();
    Tensor<T>& dx = dx_.get<T>();
    dx.resize(x.shape());
    float* dw = affine() ? weight_.grad() : nullptr;
    float* db = affine() ? bias_.grad() : nullptr;
    if constexpr (kernels::layer_norm_direct<T>) {
      kernels::layer_norm_backward(x.data(), dy.data(), rows, dim_, w(), mean_.data(), rstd_.data(), dx.data(), dw, db);
    } else {
      // Without 16-lane registers: x and dy widened a few rows at a time (rows in order: dw and db sum as in fp32).
      const backend::WorkspaceFor ws(ctx.executor);
      const std::size_t chunk = chunk_rows();
      float* x32 = ws->get<float>(backend::Workspace::Slot::accumulate, 2 * chunk * dim_);
      float* d32 = x32 + chunk * dim_;
      for (std::size_t c0 = 0; c0 < rows; c0 += chunk) {
        const std::size_t m = std::min(chunk, rows - c0) * dim_;
        kernels::to_float(x.data() + c0 * dim_, x32, m);
        kernels::to_float(dy.data() + c0 * dim_, d32, m);
        kernels::layer_norm_backward(x32, d32, m / dim_, dim_, w(), mean_.data() + c0, rstd_.data() + c0, d32, dw, db);
        kernels::from_float(d32, dx.data() + c0 * dim_, m);
      }
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
  // Rows widened at a time in bf16/fp16 without 16-lane registers: about 8k floats (32 KiB) per buffer.
  std::size_t chunk_rows() const noexcept { return std::max<std::size_t>(1, (std::size_t{1} << 13) / dim_); }
  const float* b() const noexcept { return affine() ? bias_.data() : nullptr; }

  std::size_t dim_;
  float eps_;
  Param weight_, bias_;
  SavedInput x_;
  Tensor<float> mean_, rstd_;
  ActivationBuffers y_, dx_;
};

}  // namespace xtrain::layers
