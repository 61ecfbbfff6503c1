#pragma once
/// \file cross_entropy.hpp
/// Cross-entropy fused with log-softmax over class logits (PyTorch's CrossEntropyLoss with integer
/// targets). Stable for logits of any magnitude: each row is shifted by its maximum.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "xtrain/core/error.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain::loss {

class CrossEntropyLoss {
 public:
  /// Returns sum of per-sample losses / `normalizer` (0: the batch size, i.e. the mean), and
  /// prepares backward(): d(returned loss)/d(logits). Requires labels.size() == rows and
  /// 0 <= label < classes. Also counts correct argmax predictions (correct()).
  float forward(const Matrix& logits, std::span<const std::int32_t> labels, double normalizer = 0.0) {
    XTRAIN_CHECK(logits.dimension() == 2 && logits.shape(0) == labels.size(), ShapeError,
                 "CrossEntropyLoss: logits of shape ", shape_string(shape_of(logits)), " but ", labels.size(),
                 " labels");
    const std::size_t n = logits.shape(0), c = logits.shape(1);
    if (normalizer == 0.0) normalizer = static_cast<double>(n);
    const float scale = static_cast<float>(1.0 / normalizer);
    ensure_shape(grad_, n, c);
    double total = 0.0;
    std::size_t correct = 0;
    const float* z = logits.data();
    float* g = grad_.data();
    for (std::size_t r = 0; r < n; ++r) {
      const std::int32_t y = labels[r];
      XTRAIN_CHECK(y >= 0 && static_cast<std::size_t>(y) < c, ValueError, "CrossEntropyLoss: label ", y, " of sample ",
                   r, " is outside [0, ", c, ") for logits of shape ", shape_string(shape_of(logits)));
      const float* row = z + r * c;
      std::size_t argmax = 0;
      for (std::size_t j = 1; j < c; ++j)
        if (row[j] > row[argmax]) argmax = j;
      const float m = row[argmax];
      float sum = 0.0f;
      for (std::size_t j = 0; j < c; ++j) {
        const float e = std::exp(row[j] - m);
        g[r * c + j] = e;
        sum += e;
      }
      total += static_cast<double>(m) + std::log(static_cast<double>(sum)) - row[y];
      const float inv = scale / sum;
      for (std::size_t j = 0; j < c; ++j) g[r * c + j] *= inv;
      g[r * c + static_cast<std::size_t>(y)] -= scale;
      correct += argmax == static_cast<std::size_t>(y);
    }
    sum_ = total;
    correct_ = correct;
    return static_cast<float>(total / normalizer);
  }

  /// Gradient of the last forward's result with respect to its logits.
  const Matrix& backward() const noexcept { return grad_; }
  /// Sum of the per-sample losses of the last forward.
  double sum() const noexcept { return sum_; }
  /// Correct argmax predictions in the last forward.
  std::size_t correct() const noexcept { return correct_; }

 private:
  Matrix grad_;
  double sum_ = 0.0;
  std::size_t correct_ = 0;
};

}  // namespace xtrain::loss
