#pragma once
/// \file mse.hpp
/// Mean squared error over all elements (PyTorch's MSELoss, reduction "mean").

#include <cstddef>

#include "xtrain/core/error.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain::loss {

class MSELoss {
 public:
  /// Returns sum((pred - target)^2) / normalizer (0: the element count). Requires equal shapes.
  float forward(const Matrix& pred, const Matrix& target, double normalizer = 0.0) {
    XTRAIN_CHECK(pred.shape() == target.shape(), ShapeError, "MSELoss: prediction of shape ",
                 shape_string(shape_of(pred)), " but target of shape ", shape_string(shape_of(target)));
    const std::size_t n = pred.size();
    if (normalizer == 0.0) normalizer = static_cast<double>(n);
    ensure_shape(grad_, pred.shape(0), pred.shape(1));
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

  const Matrix& backward() const noexcept { return grad_; }
  double sum() const noexcept { return sum_; }

 private:
  Matrix grad_;
  double sum_ = 0.0;
};

}  // namespace xtrain::loss
