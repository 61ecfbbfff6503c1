#pragma once
/// \file mse.hpp
/// Mean squared error over all elements (PyTorch's MSELoss, reduction "mean"): predictions and
/// float targets of any equal shape. A regression loss: its metrics are the loss only.

#include <cstddef>
#include <string>

#include "xtrain/core/error.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain::loss {

class MSELoss {
 public:
  using target_type = Tensor<float>;

  /// Returns sum((pred - target)^2) / normalizer (0: the element count). Requires equal shapes.
  float forward(const Tensor<float>& pred, const target_type& target, double normalizer = 0.0) {
    XTRAIN_CHECK(pred.shape() == target.shape(), ShapeError, "MSELoss: prediction of shape ", pred.shape().str(),
                 " but target of shape ", target.shape().str());
    const std::size_t n = pred.size();
    if (normalizer == 0.0) normalizer = static_cast<double>(n);
    grad_.resize(pred.shape());
    const float scale = static_cast<float>(2.0 / normalizer);
    double total = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const float d = pred.data()[i] - target.data()[i];
      total += static_cast<double>(d) * d;
      grad_.data()[i] = scale * d;
    }
    sum_ = total;
    return static_cast<float>(total / normalizer);
  }

  const Tensor<float>& backward() const noexcept { return grad_; }
  double sum() const noexcept { return sum_; }
  /// Every element is a term.
  std::size_t count(const target_type& target) const noexcept { return target.size(); }
  /// Elements per sample.
  std::size_t terms_per_sample(const target_type& target) const noexcept {
    std::size_t n = 1;
    for (std::size_t i = 1; i < target.dimension(); ++i) n *= target.shape(i);
    return n;
  }
  std::string describe() const { return "MSELoss()"; }

 private:
  Tensor<float> grad_;
  double sum_ = 0.0;
};

}  // namespace xtrain::loss
