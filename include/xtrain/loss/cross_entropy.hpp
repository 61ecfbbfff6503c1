#pragma once
/// \file cross_entropy.hpp
/// Cross-entropy fused with log-softmax over the last dimension (PyTorch's CrossEntropyLoss with
/// class-index targets): logits `[B, C]` with labels `[B]`, or per token `[B, T, V]` with labels
/// `[B, T]`. Stable for logits of any magnitude: each row is shifted by its maximum. An optional
/// ignore index skips terms (padding tokens); unlike PyTorch (whose default is -100) it is off
/// unless set, so that the normaliser is known without communication.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "xtrain/core/error.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain::loss {

class CrossEntropyLoss {
 public:
  using target_type = Tensor<std::int32_t>;

  /// Labels equal to `index` add nothing to the loss, its gradient or the count (PyTorch's
  /// ignore_index, e.g. -100 for padding).
  CrossEntropyLoss& ignore_index(std::int32_t index) {
    ignore_ = index;
    return *this;
  }
  std::optional<std::int32_t> ignore_index() const noexcept { return ignore_; }

  /// Returns the sum of per-term losses / `normalizer` (0: the number of counted terms, i.e. the
  /// mean), and prepares backward(): d(returned loss)/d(logits). Requires labels of the logits'
  /// shape without its last dimension, each in [0, classes) or the ignore index. Also counts
  /// correct argmax predictions (correct()).
  float forward(const Tensor<float>& logits, const target_type& labels, double normalizer = 0.0) {
    XTRAIN_CHECK(logits.dimension() >= 2 && labels.dimension() == logits.dimension() - 1 &&
                     std::equal(labels.shape().begin(), labels.shape().end(), logits.shape().begin()),
                 ShapeError, "CrossEntropyLoss: logits of shape ", logits.shape().str(), " but labels of shape ",
                 labels.shape().str(), " (expected the logits' shape without its last dimension)");
    return forward(logits, std::span<const std::int32_t>(labels.data(), labels.size()), normalizer);
  }

  /// The same with one label per row of `logits` (`[*, C]` seen as rows).
  float forward(const Tensor<float>& logits, std::span<const std::int32_t> labels, double normalizer = 0.0) {
    XTRAIN_CHECK(logits.dimension() >= 1 && logits.rows() == labels.size(), ShapeError,
                 "CrossEntropyLoss: logits of shape ", logits.shape().str(), " but ", labels.size(), " labels");
    const std::size_t n = logits.rows(), c = logits.cols();
    if (normalizer == 0.0) normalizer = static_cast<double>(count(labels));
    const float scale = normalizer > 0.0 ? static_cast<float>(1.0 / normalizer) : 0.0f;
    grad_.resize(logits.shape());
    double total = 0.0;
    std::size_t correct = 0;
    const float* z = logits.data();
    float* g = grad_.data();
    for (std::size_t r = 0; r < n; ++r) {
      const std::int32_t y = labels[r];
      float* gr = g + r * c;
      if (ignore_ && y == *ignore_) {
        for (std::size_t j = 0; j < c; ++j) gr[j] = 0.0f;
        continue;
      }
      XTRAIN_CHECK(y >= 0 && static_cast<std::size_t>(y) < c, ValueError, "CrossEntropyLoss: label ", y, " of row ", r,
                   " is outside [0, ", c, ") for logits of shape ", logits.shape().str(),
                   ignore_ ? "" : " (to skip such labels, set ignore_index)");
      const float* row = z + r * c;
      std::size_t argmax = 0;
      for (std::size_t j = 1; j < c; ++j)
        if (row[j] > row[argmax]) argmax = j;
      const float m = row[argmax];
      float sum = 0.0f;
      for (std::size_t j = 0; j < c; ++j) {
        const float e = std::exp(row[j] - m);
        gr[j] = e;
        sum += e;
      }
      total += static_cast<double>(m) + std::log(static_cast<double>(sum)) - row[y];
      const float inv = scale / sum;
      for (std::size_t j = 0; j < c; ++j) gr[j] *= inv;
      gr[static_cast<std::size_t>(y)] -= scale;
      correct += argmax == static_cast<std::size_t>(y);
    }
    sum_ = total;
    correct_ = correct;
    return normalizer > 0.0 ? static_cast<float>(total / normalizer) : 0.0f;  // 0: every label ignored
  }

  /// Gradient of the last forward's result with respect to its logits.
  const Tensor<float>& backward() const noexcept { return grad_; }
  /// Sum of the per-term losses of the last forward.
  double sum() const noexcept { return sum_; }
  /// Correct argmax predictions in the last forward.
  std::size_t correct() const noexcept { return correct_; }
  /// Terms the labels add to the normaliser: every label, less the ignored ones.
  std::size_t count(std::span<const std::int32_t> labels) const noexcept {
    if (!ignore_) return labels.size();
    std::size_t n = 0;
    for (std::int32_t y : labels) n += y != *ignore_;
    return n;
  }
  std::size_t count(const target_type& labels) const noexcept {
    return count(std::span<const std::int32_t>(labels.data(), labels.size()));
  }
  /// Labels per sample (1 for [B], T for [B, T]); 0 with an ignore index (the count depends on
  /// the data).
  std::size_t terms_per_sample(const target_type& labels) const noexcept {
    if (ignore_) return 0;
    std::size_t n = 1;
    for (std::size_t i = 1; i < labels.dimension(); ++i) n *= labels.shape(i);
    return n;
  }
  std::string describe() const {
    return ignore_ ? "CrossEntropyLoss(ignore_index=" + std::to_string(*ignore_) + ")" : "CrossEntropyLoss()";
  }

 private:
  Tensor<float> grad_;
  double sum_ = 0.0;
  std::size_t correct_ = 0;
  std::optional<std::int32_t> ignore_;
};

}  // namespace xtrain::loss
