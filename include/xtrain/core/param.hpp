#pragma once
/// \file param.hpp
/// A named trainable parameter: a shape plus views of its values and its gradient. Before a
/// ParamArena adopts it, a Param owns its storage; afterwards it views slices of the arena's
/// flat buffers, so the whole model is one fp32 value buffer and one fp32 gradient buffer.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <numeric>
#include <span>
#include <vector>

namespace xtrain {

class Param {
 public:
  Param() = default;
  /// Zero-initialised parameter of the given shape.
  explicit Param(std::vector<std::size_t> shape)
      : shape_(std::move(shape)),
        size_(std::accumulate(shape_.begin(), shape_.end(), std::size_t{1}, std::multiplies<>{})),
        own_values_(size_, 0.0f),
        own_grads_(size_, 0.0f),
        values_(own_values_.data()),
        grads_(own_grads_.data()) {}

  /// A copy owns its storage (it never aliases the source's arena).
  Param(const Param& other) : shape_(other.shape_), size_(other.size_) {
    own_values_.assign(other.values_, other.values_ + size_);
    own_grads_.assign(other.grads_, other.grads_ + size_);
    values_ = own_values_.data();
    grads_ = own_grads_.data();
  }
  Param& operator=(const Param& other) {
    if (this != &other) *this = Param(other);
    return *this;
  }
  // Moving keeps the views: std::vector's move keeps its heap buffer, arena views stay valid.
  Param(Param&&) noexcept = default;
  Param& operator=(Param&&) noexcept = default;

  std::span<float> values() noexcept { return {values_, size_}; }
  std::span<const float> values() const noexcept { return {values_, size_}; }
  std::span<float> grads() noexcept { return {grads_, size_}; }
  std::span<const float> grads() const noexcept { return {grads_, size_}; }
  float* data() noexcept { return values_; }
  const float* data() const noexcept { return values_; }
  float* grad() noexcept { return grads_; }
  const float* grad() const noexcept { return grads_; }
  std::size_t size() const noexcept { return size_; }
  const std::vector<std::size_t>& shape() const noexcept { return shape_; }
  /// True once a ParamArena holds the storage.
  bool in_arena() const noexcept { return own_values_.empty() && size_ > 0; }

  /// Moves the values and gradients into external storage and views it from now on.
  /// Requires: `values` and `grads` hold `size()` floats and outlive this Param's use.
  void rebind(float* values, float* grads) noexcept {
    std::copy_n(values_, size_, values);
    std::copy_n(grads_, size_, grads);
    values_ = values;
    grads_ = grads;
    own_values_ = {};
    own_grads_ = {};
  }

 private:
  std::vector<std::size_t> shape_;
  std::size_t size_ = 0;
  std::vector<float> own_values_, own_grads_;
  float* values_ = nullptr;
  float* grads_ = nullptr;
};

}  // namespace xtrain
