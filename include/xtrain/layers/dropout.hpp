#pragma once
/// \file dropout.hpp
/// Inverted dropout (Srivastava et al., JMLR 2014): in training, zero each element with
/// probability p and scale the rest by 1/(1-p); identity in evaluation. The mask of element
/// (sample s, element j of the sample) at step t is a pure function of (seed, module id, t, s, j)
/// (counter-based), so it is the same on any number of ranks and after a resume, and two Dropouts
/// of a model draw different masks (their ids, given when the model is adopted, differ).

#include <algorithm>
#include <cstddef>
#include <string>
#include <type_traits>

#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/rng.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/convert.hpp"

namespace xtrain::layers {

class Dropout {
 public:
  /// Requires 0 <= p <= 1.
  explicit Dropout(float p = 0.5f) : p_(p) {
    XTRAIN_CHECK(p >= 0.0f && p <= 1.0f, ValueError, "Dropout(", p, "): p must be in [0, 1]");
  }

  /// y = x * mask (bf16/fp16: multiplied in fp32 and rounded).
  template <ActivationType T>
  const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    active_ = ctx.training && p_ > 0.0f;
    if (!active_) return x;
    const std::size_t n = x.size();
    const std::size_t per_sample = x.dimension() > 0 && x.shape(0) > 0 ? n / x.shape(0) : 0;
    mask_.resize(x.shape());
    Tensor<T>& y = y_.get<T>();
    y.resize(x.shape());
    const float scale = p_ < 1.0f ? 1.0f / (1.0f - p_) : 0.0f;
    const std::uint64_t stream = streams::dropout | (static_cast<std::uint64_t>(id_.value) << 40) | ctx.step;
    // Element e of the global batch (sample-major) uses word e % 4 of Philox block e / 4.
    const std::uint64_t first = static_cast<std::uint64_t>(ctx.sample_offset) * per_sample;
    float* m = mask_.data();
    for (std::size_t i = 0; i < n;) {
      const std::uint64_t e = first + i;
      const auto block = random_block(ctx.seed, stream, e / 4);
      for (std::size_t lane = e % 4; lane < 4 && i < n; ++lane, ++i)
        m[i] = bits_to_unit_float(block[lane]) >= p_ ? scale : 0.0f;
    }
    multiply(x.data(), m, y.data(), n);
    return y;
  }

  template <ActivationType T>
  const Tensor<T>& backward(Context&, const Tensor<T>& dy) {
    if (!active_) return dy;
    XTRAIN_CHECK(dy.shape() == mask_.shape(), ShapeError, describe(), ": gradient has shape ", dy.shape().str(),
                 ", expected ", mask_.shape().str());
    Tensor<T>& dx = dx_.get<T>();
    dx.resize(dy.shape());
    multiply(dy.data(), mask_.data(), dx.data(), dy.size());
    return dx;
  }

  /// No parameters; asks for its identity (the key of its random stream).
  template <class V>
  void visit(V& v) {
    v.id(id_);
  }
  /// The module id its masks are keyed on (assigned when an engine adopts the model; 0 before).
  std::uint32_t id() const noexcept { return id_.value; }

  float p() const noexcept { return p_; }
  std::string describe() const { return "Dropout(p=" + std::to_string(p_) + ")"; }

 private:
  // out[i] = in[i] * m[i], in fp32 (bf16/fp16 widened in chunks and rounded back).
  template <class T>
  static void multiply(const T* in, const float* m, T* out, std::size_t n) {
    if constexpr (std::is_same_v<T, float>) {
      for (std::size_t i = 0; i < n; ++i) out[i] = in[i] * m[i];
    } else {
      constexpr std::size_t chunk = 1024;
      float buf[chunk];
      for (std::size_t i = 0; i < n; i += chunk) {
        const std::size_t len = std::min(chunk, n - i);
        kernels::to_float(in + i, buf, len);
        for (std::size_t j = 0; j < len; ++j) buf[j] *= m[i + j];
        kernels::from_float(buf, out + i, len);
      }
    }
  }

  float p_;
  bool active_ = false;
  ModuleId id_;
  Tensor<float> mask_;
  ActivationBuffers y_, dx_;
};

}  // namespace xtrain::layers
