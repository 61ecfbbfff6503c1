#pragma once
/// \file cast.hpp
/// The casts a precision policy puts around the model: fp32 inputs narrowed once to the storage
/// type, the model's output widened to fp32 for the loss, and d(loss)/d(output) multiplied by the
/// loss scale (fp16) and narrowed. Under FullPrecision every cast is the identity (no copy).
/// Integer inputs (token ids) pass through unchanged.

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "xtrain/core/memory.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/convert.hpp"

namespace xtrain {

template <class Policy>
class PrecisionCast {
 public:
  /// The type activations are stored in between modules.
  using act_t = typename Policy::storage_type;

  /// Buffers from the calling thread's current resource at each allocation.
  PrecisionCast() = default;
  /// Buffers from `memory` (an engine's backend), whoever calls.
  explicit PrecisionCast(memory::Resource& memory)
      : x_lp_(memory), grad_lp_(memory), out_(memory), scaled_(memory::Allocator<float>(&memory)) {}

  /// x as the model's input: fp32 narrowed to act_t; other inputs (int32 ids) unchanged.
  template <class T>
  const auto& input(const Tensor<T>& x) {
    if constexpr (std::is_same_v<T, float> && !std::is_same_v<act_t, float>) {
      x_lp_.resize(x.shape());
      kernels::from_float(x.data(), x_lp_.data(), x.size());
      return static_cast<const Tensor<act_t>&>(x_lp_);
    } else {
      return x;
    }
  }

  /// The model's output in fp32 (lives here until the next call, or is `y` itself).
  const Tensor<float>& output(const Tensor<act_t>& y) {
    if constexpr (std::is_same_v<act_t, float>) {
      return y;
    } else {
      out_.resize(y.shape());
      kernels::to_float(y.data(), out_.data(), y.size());
      return out_;
    }
  }

  /// d(loss)/d(output) times `scale` (1 unless fp16 loss scaling), in act_t.
  const Tensor<act_t>& gradient(const Tensor<float>& d, float scale) {
    if constexpr (std::is_same_v<act_t, float>) {
      return d;
    } else {
      grad_lp_.resize(d.shape());
      if (scale != 1.0f) {
        scaled_.resize(d.size());
        for (std::size_t i = 0; i < d.size(); ++i) scaled_[i] = d.data()[i] * scale;
        kernels::from_float(scaled_.data(), grad_lp_.data(), d.size());
      } else {
        kernels::from_float(d.data(), grad_lp_.data(), d.size());
      }
      return grad_lp_;
    }
  }

 private:
  static constexpr bool narrowing = !std::is_same_v<act_t, float>;
  std::conditional_t<narrowing, Tensor<act_t>, Tensor<float>> x_lp_, grad_lp_;
  Tensor<float> out_;
  std::vector<float, memory::Allocator<float>> scaled_;
};

}  // namespace xtrain
