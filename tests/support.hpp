#pragma once
// Shared test helpers: the real Fashion-MNIST (Debian's dataset-fashion-mnist) and slices of it.

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "xtrain/data/dataset.hpp"
#include "xtrain/train/metrics.hpp"

namespace xtrain::test {

/// Fashion-MNIST from /usr/share/datasets/fashion-mnist, loaded once per process.
inline const data::Split& fashion() {
  static const data::Split split = data::fashion_mnist("/usr/share/datasets/fashion-mnist");
  return split;
}

/// The first n samples of a data set.
inline data::TensorDataset head(const data::TensorDataset& d, std::size_t n) {
  Matrix x({n, d.feature_count()});
  std::copy_n(d.features().data(), n * d.feature_count(), x.data());
  return data::TensorDataset(std::move(x), std::vector<std::int32_t>(d.labels().begin(), d.labels().begin() + n),
                             d.num_classes(), d.source());
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
