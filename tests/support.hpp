#pragma once
// Shared test helpers: the real Fashion-MNIST (Debian's dataset-fashion-mnist) and slices of it.

#include <algorithm>
#include <vector>

#include "xtrain/data/dataset.hpp"

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

}  // namespace xtrain::test
