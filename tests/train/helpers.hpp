#pragma once
// Helpers of the Trainer tests: the homework's SimpleModel.

#include <cstddef>

#include "xtrain/xtrain.hpp"

namespace xtrain::test {

inline auto simple_model(std::size_t hidden = 32) {
  return layers::Sequential{layers::Linear{784, hidden}, layers::BatchNorm1d{hidden}, layers::ReLU{},
                            layers::Linear{hidden, 10}};
}

}  // namespace xtrain::test
