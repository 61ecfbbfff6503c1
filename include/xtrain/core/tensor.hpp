#pragma once
/// \file tensor.hpp
/// Shape and Tensor<T>: a contiguous, row-major, 64-byte aligned tensor of rank 0-6 over float,
/// bf16, fp16 or int32. Activations, gradients, buffers and data sets are Tensors; a layer that
/// works on the last dimension sees `[*, C]` as `rows() x cols()` rows. A Tensor's storage only
/// grows: resizing to a shape of fewer elements (the last, partial batch) never allocates, so a
/// training step allocates nothing once warm. `core/xtensor.hpp` adapts a Tensor as an xtensor
/// expression for user code that wants xtensor's algebra.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "xtrain/core/error.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/precision.hpp"

namespace xtrain {

/// The dimensions of a tensor: rank 0 (a scalar) to 6.
class Shape {
 public:
  static constexpr std::size_t max_rank = 6;

  constexpr Shape() = default;
  /// Shape{32, 784}. Requires at most max_rank dimensions.
  Shape(std::initializer_list<std::size_t> dims) { assign(dims.begin(), dims.end()); }
  /// From any sequence of sizes (a std::vector, another shape's dims).
  template <class Range>
  requires(!std::same_as<Range, Shape> &&
           requires(const Range& r) { r.begin(), r.end(); }) explicit Shape(const Range& dims) {
    assign(dims.begin(), dims.end());
  }

  std::size_t rank() const noexcept { return rank_; }
  std::size_t operator[](std::size_t i) const noexcept { return dims_[i]; }
  std::size_t& operator[](std::size_t i) noexcept { return dims_[i]; }
  const std::size_t* begin() const noexcept { return dims_.data(); }
  const std::size_t* end() const noexcept { return dims_.data() + rank_; }
  /// The last dimension (1 for a scalar).
  std::size_t back() const noexcept { return rank_ ? dims_[rank_ - 1] : 1; }
  /// Number of elements (1 for a scalar).
  std::size_t elements() const noexcept {
    std::size_t n = 1;
    for (std::size_t i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  /// This shape with its last dimension replaced by `n` ([B, T, in] -> [B, T, out]).
  Shape with_back(std::size_t n) const {
    Shape s = *this;
    if (s.rank_ == 0) s.rank_ = 1;
    s.dims_[s.rank_ - 1] = n;
    return s;
  }
  /// This shape with one more dimension `n` at the end ([B, T] -> [B, T, n]).
  Shape appended(std::size_t n) const {
    XTRAIN_CHECK(rank_ < max_rank, ShapeError, "a tensor has at most ", max_rank, " dimensions");
    Shape s = *this;
    s.dims_[s.rank_++] = n;
    return s;
  }
  std::vector<std::size_t> to_vector() const { return {begin(), end()}; }
  /// `[32, 784]`.
  std::string str() const { return shape_string(to_vector()); }

  friend bool operator==(const Shape& a, const Shape& b) noexcept {
    return a.rank_ == b.rank_ && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  template <class It>
  void assign(It first, It last) {
    for (; first != last; ++first) {
      XTRAIN_CHECK(rank_ < max_rank, ShapeError, "a tensor has at most ", max_rank, " dimensions");
      dims_[rank_++] = static_cast<std::size_t>(*first);
    }
  }

  std::array<std::size_t, max_rank> dims_{};
  std::size_t rank_ = 0;
};

/// The element types a Tensor holds.
template <class T>
concept TensorElement =
    std::same_as<T, float> || std::same_as<T, bf16> || std::same_as<T, fp16> || std::same_as<T, std::int32_t>;

/// The types activations may be stored in.
template <class T>
concept ActivationType = std::same_as<T, float> || std::same_as<T, bf16> || std::same_as<T, fp16>;

/// A dense, contiguous, row-major tensor that owns its storage (64-byte aligned, counted by
/// memory::counters()).
template <TensorElement T>
class Tensor {
 public:
  using value_type = T;

  /// An empty tensor of shape [0].
  Tensor() = default;
  /// A tensor of `shape`, zero-filled: `Tensor<float> x({32, 784})`.
  explicit Tensor(const Shape& shape) : shape_(shape), storage_(shape.elements(), T{}) {}
  /// A tensor of `shape` holding `values` (row-major). Requires values.size() == shape.elements().
  Tensor(const Shape& shape, std::vector<T> values) : shape_(shape), storage_(values.begin(), values.end()) {
    XTRAIN_CHECK(values.size() == shape.elements(), ShapeError, "Tensor of shape ", shape.str(), " given ",
                 values.size(), " values");
  }

  /// An empty tensor whose storage always comes from `memory` (not the calling thread's current
  /// resource): buffers a backend owns whoever fills them.
  explicit Tensor(memory::Resource& memory) : storage_(memory::Allocator<T>(&memory)) {}
  /// A copy of `other` whose storage always comes from `memory`.
  Tensor(const Tensor& other, memory::Resource& memory)
      : shape_(other.shape_), storage_(other.begin(), other.end(), memory::Allocator<T>(&memory)) {}

  /// Copies hold only the elements (not the spare capacity); a copy of a tensor made with a
  /// resource allocates there too, else from the current resource.
  Tensor(const Tensor& other)
      : shape_(other.shape_), storage_(other.begin(), other.end(), other.storage_.get_allocator()) {}
  Tensor& operator=(const Tensor& other) {
    if (this != &other) {
      resize(other.shape_);
      std::copy(other.begin(), other.end(), begin());
    }
    return *this;
  }
  /// Moving leaves the source empty (shape [0]).
  Tensor(Tensor&& other) noexcept
      : shape_(std::exchange(other.shape_, Shape{0})), storage_(std::move(other.storage_)) {}
  Tensor& operator=(Tensor&& other) noexcept {
    shape_ = std::exchange(other.shape_, Shape{0});
    storage_ = std::move(other.storage_);
    return *this;
  }

  /// Gives the tensor `shape`. Reallocates only when it needs more elements than it ever held;
  /// the contents are then unspecified (kept when the element count fits).
  void resize(const Shape& shape) {
    const std::size_t n = shape.elements();
    if (n > storage_.size()) storage_.resize(n);
    shape_ = shape;
  }
  /// Releases the storage (an empty tensor of shape [0]; its next storage comes from where this
  /// one came from).
  void clear() noexcept {
    decltype(storage_)(storage_.get_allocator()).swap(storage_);  // (`storage_ = {}` keeps the capacity)
    shape_ = Shape{0};
  }

  const Shape& shape() const noexcept { return shape_; }
  std::size_t shape(std::size_t i) const noexcept { return shape_[i]; }
  /// The rank.
  std::size_t dimension() const noexcept { return shape_.rank(); }
  /// Number of elements (1 for a rank-0 scalar; 0 for a default-constructed tensor, of shape [0]).
  std::size_t size() const noexcept { return shape_.elements(); }
  bool empty() const noexcept { return size() == 0; }
  /// The last dimension: the row length a last-dimension layer sees.
  std::size_t cols() const noexcept { return shape_.back(); }
  /// Number of rows of length cols() (the product of all but the last dimension).
  std::size_t rows() const noexcept { return cols() ? size() / cols() : 0; }

  T* data() noexcept { return storage_.data(); }
  const T* data() const noexcept { return storage_.data(); }
  T* begin() noexcept { return data(); }
  T* end() noexcept { return data() + size(); }
  const T* begin() const noexcept { return data(); }
  const T* end() const noexcept { return data() + size(); }

  /// Element `i` in row-major order.
  T& operator[](std::size_t i) noexcept { return storage_[i]; }
  const T& operator[](std::size_t i) const noexcept { return storage_[i]; }

  /// Element at a row-major multi-index: `x(i, j)`, `x(b, t, c)`.
  template <std::integral... I>
  T& operator()(I... index) noexcept {
    return storage_[offset(index...)];
  }
  template <std::integral... I>
  const T& operator()(I... index) const noexcept {
    return storage_[offset(index...)];
  }

  /// Every element set to `v`.
  void fill(T v) noexcept { std::fill(begin(), end(), v); }

  /// Same shape and elements (bitwise for floats: NaN != NaN, -0 == 0 as ==).
  friend bool operator==(const Tensor& a, const Tensor& b) noexcept {
    return a.shape_ == b.shape_ && std::equal(a.begin(), a.end(), b.begin());
  }

  /// Elements from `values` (same count): a convenience for tests and user code.
  void assign(std::initializer_list<T> values) {
    XTRAIN_CHECK(values.size() == size(), ShapeError, "Tensor of shape ", shape_.str(), " assigned ", values.size(),
                 " values");
    std::copy(values.begin(), values.end(), begin());
  }

 private:
  template <class... I>
  std::size_t offset(I... index) const noexcept {
    const std::size_t idx[] = {static_cast<std::size_t>(index)...};
    std::size_t o = 0;
    for (std::size_t i = 0; i < sizeof...(I); ++i) o = o * shape_[i] + idx[i];
    return o;
  }

  Shape shape_ = Shape{0};
  std::vector<T, memory::Allocator<T>> storage_;  // counted: memory::counters()
};

/// The shape of a tensor as a vector (for messages and file headers).
template <class T>
std::vector<std::size_t> shape_of(const Tensor<T>& t) {
  return t.shape().to_vector();
}

/// `to` resized to `from`'s shape with `rows` in the first dimension (a batch of `rows` samples
/// shaped as from's); nothing when from has rank 0.
template <class T>
void resize_rows_like(const Tensor<T>& from, std::size_t rows, Tensor<T>& to) {
  if (from.dimension() == 0) return;
  Shape shape = from.shape();
  shape[0] = rows;
  to.resize(shape);
}

/// Samples [begin, end) of `t` (its first dimension) copied into `out`; returns `out`.
template <class T>
const Tensor<T>& copy_rows(const Tensor<T>& t, std::size_t begin, std::size_t end, Tensor<T>& out) {
  const std::size_t per = t.shape(0) ? t.size() / t.shape(0) : 0;
  Shape s = t.shape();
  s[0] = end - begin;
  out.resize(s);
  std::copy_n(t.data() + begin * per, (end - begin) * per, out.data());
  return out;
}

/// Deprecated: `Tensor<float>` (the name was kept from when activations were [batch, features]
/// matrices; a tensor of any rank is not a matrix).
using Matrix [[deprecated("xtrain::Matrix is Tensor<float> of any rank: write xtrain::Tensor<float>")]] = Tensor<float>;

/// 0, 1, 2 for float, bf16, fp16 (a layer checks backward runs in the type of its forward).
template <ActivationType T>
inline constexpr int activation_type_index = std::same_as<T, float>  ? 0
                                             : std::same_as<T, bf16> ? 1
                                                                     : 2;

/// The name of an activation type ("fp32", "bf16", "fp16") by index.
constexpr const char* activation_type_name(int index) noexcept {
  return index == 0 ? "fp32" : index == 1 ? "bf16" : "fp16";
}

/// One tensor per activation type: a layer keeps its outputs in the one of the precision it runs
/// in (the others stay empty).
struct ActivationBuffers {
  Tensor<float> f32;
  Tensor<bf16> b16;
  Tensor<fp16> f16;
  template <ActivationType T>
  Tensor<T>& get() noexcept {
    if constexpr (std::same_as<T, float>)
      return f32;
    else if constexpr (std::same_as<T, bf16>)
      return b16;
    else
      return f16;
  }
};

/// The name a failed check gives: `who` itself (a string), or a module's `who.describe()`. Checks
/// take the module and call this only when they fail, so a check that passes builds no string
/// (a training step allocates nothing).
template <class Who>
std::string name_of(const Who& who) {
  if constexpr (requires { who.describe(); })
    return who.describe();
  else
    return std::string(who);
}

/// Throws ShapeError naming `who` (a string, or a module: name_of) unless `x` has at least one
/// dimension and its last is `cols` (a layer over the last dimension: `[*, cols]`).
template <class T, class Who>
void check_last_dim(const Tensor<T>& x, std::size_t cols, const Who& who, const char* what = "input") {
  XTRAIN_CHECK(x.dimension() >= 1 && x.shape().back() == cols, ShapeError, name_of(who), ": ", what, " has shape ",
               x.shape().str(), ", expected [*, ", cols, "]");
}

}  // namespace xtrain
