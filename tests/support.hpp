#pragma once
// Shared test helpers: the real Fashion-MNIST (Debian's dataset-fashion-mnist) and slices of it,
// random inputs, and a callback that saves the training state and stops.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "xtrain/core/rng.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/data/dataset.hpp"
#include "xtrain/train/metrics.hpp"

namespace xtrain::test {

/// The directory of Fashion-MNIST for the tests (data::default_data_dir()); a test that needs it
/// when it is missing ends its process with code 77, which ctest reports as skipped, and says why.
inline std::string fashion_dir() {
  const std::string dir = data::default_data_dir();
  if (!data::file_exists(dir + "/train-images-idx3-ubyte.gz") && !data::file_exists(dir + "/train-images-idx3-ubyte")) {
    std::fprintf(stderr,
                 "SKIP: this test needs Fashion-MNIST, which is not in %s: install Debian's dataset-fashion-mnist "
                 "(scripts/setup does), or point the environment variable or CMake option XTRAIN_DATA_DIR at a "
                 "folder with the four IDX files\n",
                 dir.c_str());
    std::exit(77);
  }
  return dir;
}

/// Fashion-MNIST, loaded once per process.
inline const data::Split& fashion() {
  static const data::Split split = data::fashion_mnist(fashion_dir());
  return split;
}

/// The first n samples of a data set.
inline data::TensorDataset head(const data::TensorDataset& d, std::size_t n) {
  Tensor<float> x({n, d.feature_count()});
  std::copy_n(d.features().data(), n * d.feature_count(), x.data());
  return data::TensorDataset(
      std::move(x), std::vector<std::int32_t>(d.labels().begin(), d.labels().begin() + static_cast<std::ptrdiff_t>(n)),
      d.num_classes(), d.source());
}

/// The first n samples of Fashion-MNIST's training set (with test_set, of its test set), made once
/// per process.
template <std::size_t n, bool test_set = false>
const data::TensorDataset& fashion_head() {
  static const data::TensorDataset d = head(test_set ? fashion().test : fashion().train, n);
  return d;
}

/// A [rows, cols] matrix uniform in [-scale, scale].
inline Tensor<float> random_matrix(std::size_t rows, std::size_t cols, std::uint64_t seed, float scale = 1.0f) {
  Tensor<float> m({rows, cols});
  Generator g(seed, streams::user | 77);
  for (float& v : m) v = g.uniform(-scale, scale);
  return m;
}

/// A tensor of any shape uniform in [-1, 1].
inline Tensor<float> random_tensor(const Shape& shape, std::uint64_t seed) {
  Tensor<float> m(shape);
  Generator g(seed, streams::user);
  for (float& v : m) v = g.uniform(-1.0f, 1.0f);
  return m;
}

/// A callback that saves the training state after optimizer step `step` and then interrupts the
/// run by throwing std::runtime_error("interrupted").
struct SaveAndStop {
  std::string dir;
  std::uint64_t step;
  template <class Trainer>
  void on_step_end(Trainer& trainer, const StepResult& r) const {
    if (r.step != step) return;
    trainer.save_state(dir);
    throw std::runtime_error("interrupted");
  }
};

}  // namespace xtrain::test
