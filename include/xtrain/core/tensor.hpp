#pragma once
/// \file tensor.hpp
/// Tensor aliases over xtensor. This is the ONLY header of the library that includes xtensor
/// (xtensor 0.26 moved every header; one place to change).

#include <cstddef>
#include <vector>

#include <xtensor/xadapt.hpp>
#include <xtensor/xtensor.hpp>

#include "xtrain/core/error.hpp"

namespace xtrain {

/// A dense row-major tensor of rank `Rank` over `T`.
template <class T, std::size_t Rank>
using Tensor = xt::xtensor<T, Rank>;

/// A batch of feature rows: `[samples, features]`, fp32. Activations flow between layers as this.
using Matrix = Tensor<float, 2>;

/// A dense fp32 vector.
using Vector = Tensor<float, 1>;

/// The shape of a tensor as a vector.
template <class T, std::size_t Rank>
std::vector<std::size_t> shape_of(const Tensor<T, Rank>& t) {
  return std::vector<std::size_t>(t.shape().begin(), t.shape().end());
}

/// Resizes `m` to `rows x cols`; reallocates only when the shape changes.
inline void ensure_shape(Matrix& m, std::size_t rows, std::size_t cols) {
  if (m.shape(0) != rows || m.shape(1) != cols) m.resize({rows, cols});
}

/// Adapts external memory as a non-owning 2-D view (no copy).
inline auto view_matrix(float* data, std::size_t rows, std::size_t cols) {
  return xt::adapt(data, rows * cols, xt::no_ownership(), std::vector<std::size_t>{rows, cols});
}

}  // namespace xtrain
