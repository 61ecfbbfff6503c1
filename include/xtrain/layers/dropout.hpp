#pragma once
/// \file dropout.hpp
/// Inverted dropout (Srivastava et al., JMLR 2014): in training, zero each element with
/// probability p and scale the rest by 1/(1-p); identity in evaluation. The mask of element
/// (sample s, feature j) at step t is a pure function of (seed, layer, t, s, j) (counter-based),
/// so it is the same on any number of ranks and after a resume.

#include <cstddef>
#include <string>

#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/rng.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain::layers {

class Dropout {
 public:
  /// Requires 0 <= p <= 1.
  explicit Dropout(float p = 0.5f) : p_(p) {
    XTRAIN_CHECK(p >= 0.0f && p <= 1.0f, ValueError, "Dropout(", p, "): p must be in [0, 1]");
  }

  const Matrix& forward(Context& ctx, const Matrix& x) {
    active_ = ctx.training && p_ > 0.0f;
    if (!active_) return x;
    const std::size_t rows = x.shape(0), cols = x.shape(1);
    ensure_shape(mask_, rows, cols);
    ensure_shape(y_, rows, cols);
    const float scale = p_ < 1.0f ? 1.0f / (1.0f - p_) : 0.0f;
    const std::uint64_t stream = streams::dropout | (static_cast<std::uint64_t>(ctx.layer) << 40) | ctx.step;
    // Element e of the global batch uses word e % 4 of Philox block e / 4.
    const std::uint64_t first = static_cast<std::uint64_t>(ctx.sample_offset) * cols;
    const std::size_t n = rows * cols;
    float* m = mask_.data();
    for (std::size_t i = 0; i < n;) {
      const std::uint64_t e = first + i;
      const auto block = random_block(ctx.seed, stream, e / 4);
      for (std::size_t lane = e % 4; lane < 4 && i < n; ++lane, ++i)
        m[i] = bits_to_unit_float(block[lane]) >= p_ ? scale : 0.0f;
    }
    const float* px = x.data();
    float* py = y_.data();
    for (std::size_t i = 0; i < n; ++i) py[i] = px[i] * m[i];
    return y_;
  }

  const Matrix& backward(Context&, const Matrix& dy) {
    if (!active_) return dy;
    XTRAIN_CHECK(dy.shape() == mask_.shape(), ShapeError, describe(), ": gradient has shape ",
                 shape_string(shape_of(dy)), ", expected ", shape_string(shape_of(mask_)));
    ensure_shape(dx_, dy.shape(0), dy.shape(1));
    for (std::size_t i = 0; i < dy.size(); ++i) dx_.data()[i] = dy.data()[i] * mask_.data()[i];
    return dx_;
  }

  template <class F>
  void visit_params(const std::string&, F&&) {}

  float p() const noexcept { return p_; }
  std::string describe() const { return "Dropout(p=" + std::to_string(p_) + ")"; }

 private:
  float p_;
  bool active_ = false;
  Matrix mask_, y_, dx_;
};

}  // namespace xtrain::layers
