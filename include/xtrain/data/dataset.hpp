#pragma once
/// \file dataset.hpp
/// In-memory classification data set, the Dataset concept, and loaders for the two folder layouts
/// the examples accept: Fashion-MNIST/MNIST IDX files and the homework's .npy files.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "xtrain/core/error.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/data/idx.hpp"
#include "xtrain/data/npy.hpp"

namespace xtrain::data {

/// Dataset: `size()`, `feature_count()`, `num_classes()`, and `gather(indices, x, y)` that fills a
/// batch (x resized to [indices.size(), feature_count()]) from global sample indices.
template <class D>
concept Dataset = requires(const D& d, std::span<const std::uint32_t> idx, Matrix& x, std::vector<std::int32_t>& y) {
  { d.size() } -> std::convertible_to<std::size_t>;
  { d.feature_count() } -> std::convertible_to<std::size_t>;
  { d.num_classes() } -> std::convertible_to<std::size_t>;
  d.gather(idx, x, y);
};

/// Features [samples, features] in fp32 and integer labels, held in memory.
class TensorDataset {
 public:
  TensorDataset() = default;
  /// Validates: one label per row, labels in [0, num_classes), finite features. `source` names the
  /// origin (a file or folder) in error messages.
  TensorDataset(Matrix features, std::vector<std::int32_t> labels, std::size_t num_classes, std::string source)
      : x_(std::move(features)), y_(std::move(labels)), classes_(num_classes), source_(std::move(source)) {
    XTRAIN_CHECK(x_.shape(0) == y_.size(), DataError, source_, ": ", x_.shape(0), " samples but ", y_.size(),
                 " labels (the image and label files do not match)");
    for (std::size_t i = 0; i < y_.size(); ++i)
      XTRAIN_CHECK(y_[i] >= 0 && static_cast<std::size_t>(y_[i]) < classes_, DataError, source_, ": label ", y_[i],
                   " of sample ", i, " is outside [0, ", classes_, ")");
    const std::size_t d = x_.shape(1);
    for (std::size_t i = 0; i < x_.size(); ++i)
      XTRAIN_CHECK(std::isfinite(x_.data()[i]), DataError, source_, ": sample ", i / d, ", feature ", i % d, " is ",
                   x_.data()[i], " (features must be finite)");
  }

  std::size_t size() const noexcept { return y_.size(); }
  std::size_t feature_count() const noexcept { return x_.shape(1); }
  std::size_t num_classes() const noexcept { return classes_; }
  const std::string& source() const noexcept { return source_; }
  const Matrix& features() const noexcept { return x_; }
  const std::vector<std::int32_t>& labels() const noexcept { return y_; }

  /// x[i] = features[indices[i]], y[i] = labels[indices[i]]. Reuses x's and y's storage.
  void gather(std::span<const std::uint32_t> indices, Matrix& x, std::vector<std::int32_t>& y) const {
    const std::size_t d = x_.shape(1);
    ensure_shape(x, indices.size(), d);
    y.resize(indices.size());
    for (std::size_t i = 0; i < indices.size(); ++i) {
      std::copy_n(x_.data() + static_cast<std::size_t>(indices[i]) * d, d, x.data() + i * d);
      y[i] = y_[indices[i]];
    }
  }

 private:
  Matrix x_;
  std::vector<std::int32_t> y_;
  std::size_t classes_ = 0;
  std::string source_;
};

/// A training and a test set.
struct Split {
  TensorDataset train, test;
};

namespace detail {
inline std::string existing(const std::string& dir, const std::string& name) {
  const std::string plain = dir + "/" + name;
  if (file_exists(plain + ".gz")) return plain + ".gz";
  if (file_exists(plain)) return plain;
  throw DataError(dir + ": missing " + name + " (or " + name + ".gz)");
}

inline TensorDataset idx_split(const std::string& images_path, const std::string& labels_path) {
  const IdxArray images = read_idx(images_path);
  const IdxArray labels = read_idx(labels_path);
  XTRAIN_CHECK(images.shape.size() >= 2, DataError, images_path, ": expected images [count, rows, cols], found shape ",
               shape_string(images.shape));
  XTRAIN_CHECK(labels.shape.size() == 1, DataError, labels_path, ": expected labels [count], found shape ",
               shape_string(labels.shape));
  XTRAIN_CHECK(images.shape[0] == labels.shape[0], DataError, images_path, " has ", images.shape[0], " images but ",
               labels_path, " has ", labels.shape[0], " labels");
  const std::size_t n = images.shape[0], d = images.data.size() / (n ? n : 1);
  Matrix x({n, d});
  for (std::size_t i = 0; i < n * d; ++i) x.data()[i] = static_cast<float>(images.data[i]) * (1.0f / 255.0f);
  std::vector<std::int32_t> y(labels.data.begin(), labels.data.end());
  return TensorDataset(std::move(x), std::move(y), 10, labels_path);
}
}  // namespace detail

/// Fashion-MNIST or MNIST from a folder of the four IDX files (".gz" or not), pixels scaled to [0, 1].
/// The Debian package `dataset-fashion-mnist` installs them in /usr/share/datasets/fashion-mnist.
inline Split fashion_mnist(const std::string& dir) {
  // One statement per file: errors name the first missing file in this order.
  const std::string train_images = detail::existing(dir, "train-images-idx3-ubyte");
  const std::string train_labels = detail::existing(dir, "train-labels-idx1-ubyte");
  const std::string test_images = detail::existing(dir, "t10k-images-idx3-ubyte");
  const std::string test_labels = detail::existing(dir, "t10k-labels-idx1-ubyte");
  return {detail::idx_split(train_images, train_labels), detail::idx_split(test_images, test_labels)};
}

/// The homework layout: `train_x.npy`, `train_y.npy`, `test_x.npy`, `test_y.npy`; features of any
/// dtype and trailing shape (flattened, cast to fp32, not rescaled); classes = 1 + largest label.
inline Split npy_folder(const std::string& dir) {
  auto train_x = load_npy_features(dir + "/train_x.npy");
  auto train_y = load_npy_labels(dir + "/train_y.npy");
  auto test_x = load_npy_features(dir + "/test_x.npy");
  auto test_y = load_npy_labels(dir + "/test_y.npy");
  XTRAIN_CHECK(train_x.shape(1) == test_x.shape(1), DataError, dir, "/test_x.npy has ", test_x.shape(1),
               " features per sample but train_x.npy has ", train_x.shape(1));
  std::int32_t top = 0;
  for (auto v : train_y) top = std::max(top, v);
  for (auto v : test_y) top = std::max(top, v);
  const auto classes = static_cast<std::size_t>(top) + 1;
  return {TensorDataset(std::move(train_x), std::move(train_y), classes, dir + "/train_{x,y}.npy"),
          TensorDataset(std::move(test_x), std::move(test_y), classes, dir + "/test_{x,y}.npy")};
}

/// Either layout, recognised by its file names. Throws DataError saying what was expected.
inline Split load_folder(const std::string& dir) {
  if (file_exists(dir + "/train_x.npy")) return npy_folder(dir);
  if (file_exists(dir + "/train-images-idx3-ubyte.gz") || file_exists(dir + "/train-images-idx3-ubyte"))
    return fashion_mnist(dir);
  throw DataError(dir +
                  ": no data set found (expected train_x.npy, train_y.npy, test_x.npy, test_y.npy, or the "
                  "Fashion-MNIST IDX files train-images-idx3-ubyte.gz ...; install Debian's dataset-fashion-mnist "
                  "for /usr/share/datasets/fashion-mnist)");
}

}  // namespace xtrain::data
