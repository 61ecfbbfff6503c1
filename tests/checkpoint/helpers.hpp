#pragma once
// Helpers of the checkpoint tests: a fresh folder per test, slices of Fashion-MNIST, and a model
// with BatchNorm and Dropout (buffers and random state to restore) trained with Adam.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "support.hpp"
#include "xtrain/xtrain.hpp"

namespace xtrain::test {

inline std::filesystem::path fresh_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("xtrain_ckpt_" + name);
  std::filesystem::remove_all(dir);
  return dir;
}
inline const data::TensorDataset& train1600() { return fashion_head<1600>(); }
inline const data::TensorDataset& test300() { return fashion_head<300, true>(); }
inline auto bn_model(std::uint64_t seed = 5) {
  set_seed(seed);
  return layers::Sequential{layers::Linear{784, 16}, layers::BatchNorm1d{16}, layers::ReLU{}, layers::Dropout{0.1f},
                            layers::Linear{16, 10}};
}
using BnTrainer = Trainer<decltype(bn_model()), optim::Adam>;
inline TrainingOptions options(std::size_t epochs) {
  return TrainingOptions{}.epochs(epochs).batch_size(32).seed(3).verbose(false);
}

inline std::vector<float> values(BnTrainer& t) { return {t.params().values().begin(), t.params().values().end()}; }

}  // namespace xtrain::test
