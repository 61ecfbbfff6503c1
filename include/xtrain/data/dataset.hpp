#pragma once
/// \file dataset.hpp
/// In-memory data sets, the Dataset concept, and loaders for the two folder layouts the examples
/// accept: Fashion-MNIST/MNIST IDX files, and four NumPy files (train_x.npy, train_y.npy,
/// test_x.npy, test_y.npy).

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xtrain/backend/executor.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/data/idx.hpp"
#include "xtrain/data/npy.hpp"

namespace xtrain::data {

/// Dataset: nested `input_type` and `target_type` (Tensor<float>, Tensor<std::int32_t> for class
/// ids or token ids, ...), `size()`, and `gather(indices, x, y)` that fills a batch (x and y
/// resized to [indices.size(), sample shape...]) from global sample indices. The Loader may call
/// gather on a worker thread of the backend (the next batch, prefetched), one call at a time:
/// it must not depend on the calling thread (thread_local state such as default_generator(): draw
/// random augmentations from a generator seeded by the samples or the step instead), and the data
/// set must not change while a Loader runs. Loader::set_prefetch(false) keeps gather on the
/// calling thread.
template <class D>
concept Dataset = requires(const D& d, std::span<const std::uint32_t> idx, typename D::input_type& x,
                           typename D::target_type& y) {
  { d.size() } -> std::convertible_to<std::size_t>;
  d.gather(idx, x, y);
};

/// Fails compilation with a message naming the first missing Dataset member.
template <class D>
consteval bool check_dataset() {
  static_assert(
      requires {
        typename D::input_type;
        typename D::target_type;
      },
      "xtrain: this type is not a Dataset: it has no nested types `input_type` and `target_type` (e.g. "
      "Tensor<float> and Tensor<std::int32_t>)");
  static_assert(
      requires(const D& d) {
        { d.size() } -> std::convertible_to<std::size_t>;
      },
      "xtrain: this type is not a Dataset: it has no const member `std::size_t size() const`");
  static_assert(Dataset<D>,
                "xtrain: this type is not a Dataset: it has no const member `gather(std::span<const std::uint32_t> "
                "indices, input_type& x, target_type& y) const`");
  return Dataset<D>;
}

/// Inputs `[N, ...]` and targets `[N, ...]` held in memory: class ids (TensorDataset), float
/// targets for regression (RegressionDataset), token ids.
template <TensorElement Input, TensorElement Target>
class BasicTensorDataset {
 public:
  using input_type = Tensor<Input>;
  using target_type = Tensor<Target>;

  BasicTensorDataset() = default;
  /// Validates: as many targets as inputs, finite float values, integer targets in
  /// [0, num_classes) when num_classes > 0. `source` names the origin (a file or folder) in
  /// error messages.
  BasicTensorDataset(input_type inputs, target_type targets, std::size_t num_classes, std::string source)
      : x_(std::move(inputs)), y_(std::move(targets)), classes_(num_classes), source_(std::move(source)) {
    XTRAIN_CHECK(x_.dimension() >= 1 && y_.dimension() >= 1 && x_.shape(0) == y_.shape(0), DataError, source_, ": ",
                 x_.dimension() ? x_.shape(0) : 0, " samples but ", y_.dimension() ? y_.shape(0) : 0,
                 std::is_integral_v<Target> ? " labels (the image and label files do not match)"
                                            : " targets (the input and target files do not match)");
    if constexpr (std::is_integral_v<Target>) {
      if (classes_ > 0)
        for (std::size_t i = 0; i < y_.size(); ++i)
          XTRAIN_CHECK(y_[i] >= 0 && static_cast<std::size_t>(y_[i]) < classes_, DataError, source_, ": label ", y_[i],
                       " of sample ", i / (y_.size() / y_.shape(0)), " is outside [0, ", classes_, ")");
    } else {
      check_finite(y_, "target");
    }
    if constexpr (std::is_same_v<Input, float>) check_finite(x_, "feature");
  }
  /// Classification: features and one label per sample.
  BasicTensorDataset(input_type inputs, std::vector<Target> labels, std::size_t num_classes, std::string source)
      : BasicTensorDataset(std::move(inputs), as_tensor(std::move(labels)), num_classes, std::move(source)) {}

  std::size_t size() const noexcept { return x_.dimension() ? x_.shape(0) : 0; }
  /// The shape of one input sample ([784], or [1, 28, 28] after with_sample_shape).
  Shape sample_shape() const { return drop_first(x_.shape()); }
  /// Elements per input sample.
  std::size_t feature_count() const noexcept { return size() ? x_.size() / size() : 0; }
  /// Classes of a classification set (0 otherwise).
  std::size_t num_classes() const noexcept { return classes_; }
  const std::string& source() const noexcept { return source_; }
  const input_type& features() const noexcept { return x_; }
  const target_type& targets() const noexcept { return y_; }
  std::span<const Target> labels() const noexcept { return {y_.data(), y_.size()}; }

  /// Views each input sample with `shape` (same element count): Fashion-MNIST's [784] rows as
  /// [1, 28, 28] images for a convolutional model.
  BasicTensorDataset& with_sample_shape(const Shape& shape) {
    XTRAIN_CHECK(shape.elements() == feature_count(), ShapeError, source_, ": samples of ", feature_count(),
                 " elements cannot be viewed as ", shape.str());
    std::vector<std::size_t> full{size()};
    full.insert(full.end(), shape.begin(), shape.end());
    x_.resize(Shape(full));
    return *this;
  }

  /// Keeps the first n samples (all when n >= size()): a quick run on part of a data set.
  BasicTensorDataset& truncate(std::size_t n) {
    if (n >= size()) return *this;
    Shape xs = x_.shape(), ys = y_.shape();
    xs[0] = ys[0] = n;
    x_.resize(xs);
    y_.resize(ys);
    return *this;
  }

  /// x[i] = inputs[indices[i]], y[i] = targets[indices[i]]. Reuses x's and y's storage.
  void gather(std::span<const std::uint32_t> indices, input_type& x, target_type& y) const {
    gather_rows(x_, indices, x);
    gather_rows(y_, indices, y);
  }
  /// gather with the rows split over the executor's threads (the same values).
  void gather(std::span<const std::uint32_t> indices, input_type& x, target_type& y, backend::Executor* e) const {
    resize_rows_like(x_, indices.size(), x);
    resize_rows_like(y_, indices.size(), y);
    const std::size_t dx = x_.shape(0) ? x_.size() / x_.shape(0) : 0, dy = y_.shape(0) ? y_.size() / y_.shape(0) : 0;
    const std::size_t row_bytes = std::max<std::size_t>(1, dx * sizeof(Input));
    backend::parallel_for(e, indices.size(), std::max<std::size_t>(8, (std::size_t{1} << 16) / row_bytes), 1,
                          [&](std::size_t b, std::size_t end) {
                            copy_rows(x_, indices.subspan(b, end - b), x.data() + b * dx);
                            copy_rows(y_, indices.subspan(b, end - b), y.data() + b * dy);
                          });
  }

 private:
  static target_type as_tensor(std::vector<Target> labels) {
    const Shape shape{labels.size()};
    return target_type(shape, std::move(labels));
  }
  static Shape drop_first(const Shape& s) { return Shape(std::vector<std::size_t>(s.begin() + 1, s.end())); }

  // Copies the rows `indices` of `from` to `out`, one after another.
  template <class T>
  static void copy_rows(const Tensor<T>& from, std::span<const std::uint32_t> indices, T* out) {
    const std::size_t d = from.shape(0) ? from.size() / from.shape(0) : 0;
    constexpr std::size_t ahead = 2;  // rows prefetched ahead: random rows miss the caches and the TLB
    for (std::size_t i = 0; i < indices.size(); ++i) {
      if (i + ahead < indices.size()) {
        const char* next =
            reinterpret_cast<const char*>(from.data() + static_cast<std::size_t>(indices[i + ahead]) * d);
        for (std::size_t b = 0; b < d * sizeof(T); b += 64) __builtin_prefetch(next + b);
      }
      std::copy_n(from.data() + static_cast<std::size_t>(indices[i]) * d, d, out + i * d);
    }
  }
  template <class T>
  static void gather_rows(const Tensor<T>& from, std::span<const std::uint32_t> indices, Tensor<T>& to) {
    resize_rows_like(from, indices.size(), to);
    copy_rows(from, indices, to.data());
  }

  template <class T>
  void check_finite(const Tensor<T>& t, const char* what) const {
    const std::size_t d = t.shape(0) ? t.size() / t.shape(0) : 1;
    for (std::size_t i = 0; i < t.size(); ++i)
      XTRAIN_CHECK(std::isfinite(t.data()[i]), DataError, source_, ": sample ", i / d, ", ", what, " ", i % d, " is ",
                   t.data()[i], " (", what, "s must be finite)");
  }

  input_type x_;
  target_type y_;
  std::size_t classes_ = 0;
  std::string source_;
};

/// Classification: fp32 features of any shape, int32 class ids.
using TensorDataset = BasicTensorDataset<float, std::int32_t>;
/// Regression: fp32 features and fp32 targets of any shape.
using RegressionDataset = BasicTensorDataset<float, float>;

/// A training and a test set.
struct Split {
  TensorDataset train, test;
};

namespace detail {
inline std::string existing(const std::string& dir, const std::string& name) {
  std::string plain = dir + "/" + name;
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
  Tensor<float> x({n, d});
  for (std::size_t i = 0; i < n * d; ++i) x.data()[i] = static_cast<float>(images.data[i]) * (1.0f / 255.0f);
  std::vector<std::int32_t> y(labels.data.begin(), labels.data.end());
  return TensorDataset(std::move(x), std::move(y), 10, labels_path);
}
}  // namespace detail

/// Where Fashion-MNIST is looked for when no folder is given: the environment variable
/// XTRAIN_DATA_DIR, else the build's XTRAIN_DEFAULT_DATA_DIR (this project's CMake option
/// XTRAIN_DATA_DIR), else Debian's /usr/share/datasets/fashion-mnist (dataset-fashion-mnist).
inline std::string default_data_dir() {
  if (const char* env = std::getenv("XTRAIN_DATA_DIR"); env != nullptr && *env != '\0') return env;
#ifdef XTRAIN_DEFAULT_DATA_DIR
  return XTRAIN_DEFAULT_DATA_DIR;
#else
  return "/usr/share/datasets/fashion-mnist";
#endif
}

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

/// Four NumPy files: `train_x.npy`, `train_y.npy`, `test_x.npy`, `test_y.npy`; samples of any
/// dtype and shape (kept: `[N, 784]` rows, `[N, 1, 28, 28]` images; cast to fp32, not rescaled;
/// `with_sample_shape` views them otherwise); classes = 1 + largest label.
inline Split npy_folder(const std::string& dir) {
  auto train_x = load_npy_tensor(dir + "/train_x.npy");
  auto train_y = load_npy_labels(dir + "/train_y.npy");
  auto test_x = load_npy_tensor(dir + "/test_x.npy");
  auto test_y = load_npy_labels(dir + "/test_y.npy");
  auto sample = [](const Tensor<float>& x) {
    return Shape(std::vector<std::size_t>(x.shape().begin() + 1, x.shape().end()));
  };
  XTRAIN_CHECK(sample(train_x) == sample(test_x), DataError, dir, "/test_x.npy has samples of shape ",
               sample(test_x).str(), " but train_x.npy has ", sample(train_x).str());
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
