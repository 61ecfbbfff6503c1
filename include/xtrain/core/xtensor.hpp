#pragma once
/// \file xtensor.hpp
/// xtensor interop: a Tensor seen as an xtensor expression (no copy), for user code that wants
/// xtensor's algebra (`xt::amax(xtrain::as_xtensor(t))`). The only header of the library that
/// includes xtensor (0.26 moved every header: one place to change).

#include <vector>

#include <xtensor/xadapt.hpp>

#include "xtrain/core/tensor.hpp"

namespace xtrain {

/// A non-owning xtensor view of `t` with its shape (valid while `t` is neither resized nor destroyed).
template <class T>
auto as_xtensor(Tensor<T>& t) {
  return xt::adapt(t.data(), t.size(), xt::no_ownership(), t.shape().to_vector());
}
template <class T>
auto as_xtensor(const Tensor<T>& t) {
  return xt::adapt(t.data(), t.size(), xt::no_ownership(), t.shape().to_vector());
}

}  // namespace xtrain
