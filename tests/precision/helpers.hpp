#pragma once
// Helpers of the mixed-precision tests: the homework's model and a slice of Fashion-MNIST.

#include "support.hpp"
#include "xtrain/xtrain.hpp"

namespace xtrain::test {

inline const data::TensorDataset& train6000() { return fashion_head<6000>(); }
inline auto homework_model() {
  set_seed(3);
  return layers::Sequential{layers::Linear{784, 32}, layers::BatchNorm1d{32}, layers::ReLU{}, layers::Linear{32, 10}};
}

}  // namespace xtrain::test
