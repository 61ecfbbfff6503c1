#pragma once
/// \file tensor.hpp
/// Tensor aliases over xtensor. This is the ONLY header of the library that includes xtensor
/// (xtensor 0.26 moved every header; one place to change).

#include <concepts>
#include <cstddef>
#include <vector>

#include <xtensor/xadapt.hpp>
#include <xtensor/xtensor.hpp>

#include "xtrain/core/error.hpp"
#include "xtrain/core/precision.hpp"

namespace xtrain {

/// A dense row-major tensor of rank `Rank` over `T`.
template <class T, std::size_t Rank>
using Tensor = xt::xtensor<T, Rank>;

/// A batch of feature rows `[samples, features]` stored as T (float, bf16 or fp16): activations
/// flow between layers as this, in the storage type of the precision policy.
template <class T>
using Batch = Tensor<T, 2>;

/// A batch of fp32 feature rows.
using Matrix = Batch<float>;

/// The types activations may be stored in.
template <class T>
concept ActivationType = std::same_as<T, float> || std::same_as<T, bf16> || std::same_as<T, fp16>;

/// 0, 1, 2 for float, bf16, fp16 (a layer checks backward runs in the type of its forward).
template <ActivationType T>
inline constexpr int activation_type_index = std::same_as<T, float>  ? 0
                                             : std::same_as<T, bf16> ? 1
                                                                     : 2;

/// The name of an activation type ("fp32", "bf16", "fp16") by index.
constexpr const char* activation_type_name(int index) noexcept {
  return index == 0 ? "fp32" : index == 1 ? "bf16" : "fp16";
}

/// One batch buffer per activation type: a layer keeps its outputs in the one of the precision
/// it runs in (the others stay empty).
struct BatchBuffers {
  Batch<float> f32;
  Batch<bf16> b16;
  Batch<fp16> f16;
  template <ActivationType T>
  Batch<T>& get() noexcept {
    if constexpr (std::same_as<T, float>)
      return f32;
    else if constexpr (std::same_as<T, bf16>)
      return b16;
    else
      return f16;
  }
};

/// A dense fp32 vector.
using Vector = Tensor<float, 1>;

/// The shape of a tensor as a vector.
template <class T, std::size_t Rank>
std::vector<std::size_t> shape_of(const Tensor<T, Rank>& t) {
  return std::vector<std::size_t>(t.shape().begin(), t.shape().end());
}

/// Resizes `m` to `rows x cols`; reallocates only when the shape changes.
template <class T>
void ensure_shape(Batch<T>& m, std::size_t rows, std::size_t cols) {
  if (m.shape(0) != rows || m.shape(1) != cols) m.resize({rows, cols});
}

/// Adapts external memory as a non-owning 2-D view (no copy).
inline auto view_matrix(float* data, std::size_t rows, std::size_t cols) {
  return xt::adapt(data, rows * cols, xt::no_ownership(), std::vector<std::size_t>{rows, cols});
}

}  // namespace xtrain
