#pragma once
/// \file param.hpp
/// A trainable parameter: a shape plus views of its values and its gradient. Before a ParamArena
/// adopts it, a Param owns its storage; afterwards it views a slot of the arena's flat buffers, so
/// the whole model is one fp32 value buffer and one fp32 gradient buffer. Two Params may share one
/// storage (`tie`): weight tying, one arena slot whose gradient is the sum of both uses.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <numeric>
#include <span>
#include <vector>

#include "xtrain/core/error.hpp"
#include "xtrain/core/memory.hpp"

namespace xtrain {

/// What a parameter is, as its module reports it: parameter groups select by it (AdamW without
/// weight decay on biases, norms and embeddings).
enum class ParamKind : std::uint8_t { weight, bias, norm, embedding };

/// "weight", "bias", "norm", "embedding".
constexpr const char* param_kind_name(ParamKind k) noexcept {
  return k == ParamKind::weight ? "weight"
         : k == ParamKind::bias ? "bias"
         : k == ParamKind::norm ? "norm"
                                : "embedding";
}

class Param {
 public:
  /// The slot of a Param no arena has adopted.
  static constexpr std::uint32_t no_slot = 0xFFFFFFFFu;

  Param() = default;
  /// Zero-initialised parameter of the given shape.
  explicit Param(std::vector<std::size_t> shape)
      : shape_(std::move(shape)),
        size_(std::accumulate(shape_.begin(), shape_.end(), std::size_t{1}, std::multiplies<>{})),
        own_(std::make_shared<Storage>(size_)),
        values_(own_->values.get()),
        grads_(own_->grads.get()) {}

  /// A copy owns a copy of the values and gradients (it never aliases the source's arena). A copy
  /// of a tied parameter keeps its tie token: the two uses in a copied model hold separate copies
  /// until an arena adopts the model, which ties them into one slot again.
  Param(const Param& other) : shape_(other.shape_), size_(other.size_), tie_(other.tie_) {
    if (size_ == 0) return;
    own_ = std::make_shared<Storage>(size_);
    std::copy_n(other.values_, size_, own_->values.get());
    if (std::any_of(other.grads_, other.grads_ + size_, [](float g) { return g != 0.0f; }))  // (zeros: untouched)
      std::copy_n(other.grads_, size_, own_->grads.get());
    values_ = own_->values.get();
    grads_ = own_->grads.get();
  }
  Param& operator=(const Param& other) {
    if (this != &other) *this = Param(other);
    return *this;
  }
  // Moving keeps the views: the storage is on the heap (or in an arena), it does not move.
  Param(Param&&) noexcept = default;
  Param& operator=(Param&&) noexcept = default;

  /// Weight tying: from now on this parameter IS `source` (same values; in an arena, one slot
  /// whose gradient sums both uses), as `b.weight = a.weight` in PyTorch. Requires: neither is in
  /// an arena yet, and the shapes are equal.
  void tie(Param& source) {
    XTRAIN_CHECK(!in_arena() && !source.in_arena(), ValueError,
                 "Param::tie: tie parameters before a Trainer, Engine or ParamArena adopts the model");
    XTRAIN_CHECK(shape_ == source.shape_, ShapeError, "Param::tie: shapes ", shape_string(shape_), " and ",
                 shape_string(source.shape_), " differ");
    if (!source.tie_) source.tie_ = std::make_shared<const char>('t');
    tie_ = source.tie_;
    own_ = source.own_;
    values_ = source.values_;
    grads_ = source.grads_;
  }
  /// Whether this parameter views the same storage as `other` (tied, or the same object).
  bool shares_storage_with(const Param& other) const noexcept { return values_ != nullptr && values_ == other.values_; }
  /// The identity tied uses share (copies keep it); null for a parameter never tied.
  const void* tie_token() const noexcept { return tie_.get(); }

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
  bool in_arena() const noexcept { return !own_ && size_ > 0; }
  /// The arena slot (index of its ParamArena entry), or no_slot before adoption.
  std::uint32_t slot() const noexcept { return slot_; }

  /// What rebind() copies into the new storage.
  enum class Copy { both, values, none };
  /// Moves the values and gradients into external storage and views it from now on (an arena
  /// does this at adoption). `copy`: what to copy there (an arena adopting a model copies the
  /// values only: its gradients start at zero; one that moved its buffer whole, nothing).
  /// Requires: `values` and `grads` hold `size()` floats and outlive this Param's use.
  void rebind(float* values, float* grads, std::uint32_t slot, Copy copy = Copy::both) noexcept {
    if (values != values_ && copy != Copy::none) std::copy_n(values_, size_, values);
    if (grads != grads_ && copy == Copy::both) std::copy_n(grads_, size_, grads);
    values_ = values;
    grads_ = grads;
    slot_ = slot;
    own_.reset();
  }

 private:
  // n zeros: 16 pages or more are pages of their own (given back to the system when freed, and
  // taking no memory until written: the gradients of a model an arena adopts never are), fewer
  // come from calloc.
  class Zeros {
   public:
    explicit Zeros(std::size_t n) {
      if (n * sizeof(float) >= 16 * memory::page_size()) {
        pages_ = memory::PageBuffer(n);
      } else {
        small_.reset(static_cast<float*>(std::calloc(n ? n : 1, sizeof(float))));
        if (!small_) throw std::bad_alloc();
      }
    }
    float* get() noexcept { return small_ ? small_.get() : pages_.span().data(); }

   private:
    struct Free {
      void operator()(float* p) const noexcept { std::free(p); }
    };
    std::unique_ptr<float[], Free> small_;
    memory::PageBuffer pages_;
  };
  struct Storage {
    explicit Storage(std::size_t n) : values(n), grads(n) {}
    Zeros values, grads;
  };

  std::vector<std::size_t> shape_;
  std::size_t size_ = 0;
  std::shared_ptr<Storage> own_;     // before adoption (shared by tied parameters)
  std::shared_ptr<const char> tie_;  // the tie token (shared by tied uses and their copies)
  float* values_ = nullptr;
  float* grads_ = nullptr;
  std::uint32_t slot_ = no_slot;
};

}  // namespace xtrain
