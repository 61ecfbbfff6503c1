#pragma once
/// \file reference/convert.hpp
/// Scalar twin of kernels/convert.hpp: one element at a time through core/precision.hpp.

#include <cstddef>

#include "xtrain/core/precision.hpp"

namespace xtrain::kernels::reference {

template <class T>
void to_float(const T* in, float* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

template <class T>
void from_float(const float* in, T* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = T(in[i]);
}

}  // namespace xtrain::kernels::reference
