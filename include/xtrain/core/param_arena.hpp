#pragma once
/// \file param_arena.hpp
/// The flat parameter/gradient arena: all parameters of a model in ONE fp32 buffer, all gradients
/// in another, each parameter 64-byte aligned. Layers keep views (Param). Optimizers, gradient
/// buckets, clipping and checkpoints work on the flat buffers.

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "xtrain/core/concepts.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain {

/// One parameter's place in the arena (a slot: tied parameters share one).
struct ParamEntry {
  std::string name;                    ///< PyTorch state_dict name of its first use, e.g. "0.weight"
  std::vector<std::size_t> shape;      ///< as PyTorch: Linear weight is [out, in]
  std::size_t offset = 0;              ///< first element in the flat buffers
  std::size_t size = 0;                ///< number of elements
  ParamKind kind = ParamKind::weight;  ///< as its module reported it
  std::vector<std::string> aliases;    ///< names of the other uses of a tied parameter
  std::size_t group = 0;               ///< parameter group (0: the default group)
  /// Uses of the slot: readiness expects this many reports per backward.
  std::size_t uses() const noexcept { return 1 + aliases.size(); }
};

class ParamArena {
 public:
  /// Elements per alignment unit: every parameter starts on a 64-byte boundary.
  static constexpr std::size_t alignment = 16;

  ParamArena() = default;

  /// Adopts every parameter of `model` (in visit order = layer order), its buffers from `memory`
  /// (null: the calling thread's current resource), or with `paged` in pages of their own
  /// (memory::PageBuffer: ranges of them can be given back, as sharded training does; the
  /// gradients take no memory until written).
  /// Ensures: values unchanged, gradients zero, each Param views its slice.
  template <class Model>
  explicit ParamArena(Model& model, std::size_t multiple = alignment, memory::Resource* memory = nullptr,
                      bool paged = false)
      : values_(memory::Allocator<float>(memory)), grads_(memory::Allocator<float>(memory)), paged_(paged) {
    adopt(model, multiple);
  }

  ParamArena(const ParamArena&) = delete;  // layers view this storage: copying would alias it
  ParamArena& operator=(const ParamArena&) = delete;
  ParamArena(ParamArena&&) noexcept = default;  // vector moves keep the heap buffers
  ParamArena& operator=(ParamArena&&) noexcept = default;

  /// `multiple` (a multiple of `alignment`): the buffers' length is rounded up to it (zero padding),
  /// e.g. ranks x alignment so that a sharded optimizer step splits them into equal blocks.
  template <class Model>
  void adopt(Model& model, std::size_t multiple = alignment) {
    static_assert(check_module<Model>());
    entries_.clear();
    std::size_t total = 0;
    std::vector<const void*> ties;           // each slot's tie token (null: not tied)
    std::vector<std::uint32_t> slot_of_use;  // each parameter use's slot, in visit order
    visit_parameters(model, [&](const std::string& name, Param& p, ParamKind kind) {
      XTRAIN_CHECK(!p.in_arena(), ValueError, "ParamArena: parameter '", name,
                   "' already lives in another arena (adopt each model once)");
      for (std::size_t i = 0; i < ties.size() && p.tie_token(); ++i)
        if (ties[i] == p.tie_token()) {  // tied to an earlier parameter
          entries_[i].aliases.push_back(name);
          slot_of_use.push_back(static_cast<std::uint32_t>(i));
          return;
        }
      slot_of_use.push_back(static_cast<std::uint32_t>(entries_.size()));
      ties.push_back(p.tie_token());
      entries_.push_back({name, p.shape(), total, p.size(), kind, {}, 0});
      total += (p.size() + alignment - 1) / alignment * alignment;
    });
    XTRAIN_CHECK(entries_.size() < Param::no_slot, ValueError, "ParamArena: too many parameters");
    natural_size_ = total;
    total = (total + multiple - 1) / multiple * multiple;
    if (paged_) {
      value_pages_ = memory::PageBuffer(total);
      grad_pages_ = memory::PageBuffer(total);
      value_view_ = value_pages_.span();
      grad_view_ = grad_pages_.span();
    } else {
      values_.assign(total, 0.0f);
      grads_.assign(total, 0.0f);
      value_view_ = {values_.data(), values_.size()};
      grad_view_ = {grads_.data(), grads_.size()};
    }
    rebind(model, slot_of_use);  // the values copied; the gradients are the buffer's zeros
  }

  /// Moves the gradients of `model` (adopted by this arena) into `storage` (at least size()
  /// floats, e.g. a communicator's shared-memory buffer that outlives the arena's use): values
  /// copied (unless `copy` is false: `storage` already holds them, e.g. fresh zero pages for
  /// zero gradients, which a copy would make resident), each Param's gradient view rebound, the
  /// arena's own gradient buffer released.
  template <class Model>
  void move_gradients_to(Model& model, std::span<float> storage, bool copy = true) {
    move_to(model, grad_view_, grads_, grad_pages_, storage, "gradient", copy);
  }
  /// The same for the parameter values (the sharded optimizer's all-gather reads them in place).
  template <class Model>
  void move_values_to(Model& model, std::span<float> storage) {
    move_to(model, value_view_, values_, value_pages_, storage, "parameter");
  }

  /// The pages of the values and of the gradients of an arena made `paged` (null otherwise, or
  /// once moved elsewhere).
  memory::PageBuffer* value_pages() noexcept { return value_pages_.size() ? &value_pages_ : nullptr; }
  memory::PageBuffer* grad_pages() noexcept { return grad_pages_.size() ? &grad_pages_ : nullptr; }

  std::span<float> values() noexcept { return value_view_; }
  std::span<const float> values() const noexcept { return value_view_; }
  std::span<float> grads() noexcept { return grad_view_; }
  std::span<const float> grads() const noexcept { return grad_view_; }
  /// Length of the flat buffers (parameters plus alignment padding, which stays zero).
  std::size_t size() const noexcept { return value_view_.size(); }
  /// The length without the `multiple` rounding of adopt(): the layout checkpoints use, the same
  /// on any number of ranks.
  std::size_t natural_size() const noexcept { return natural_size_; }
  /// Number of trainable scalars (no padding).
  std::size_t parameter_count() const noexcept {
    std::size_t n = 0;
    for (const auto& e : entries_) n += e.size;
    return n;
  }
  const std::vector<ParamEntry>& entries() const noexcept { return entries_; }

  /// Sets the parameter group of slot `i` (the engine does, from its options' rules).
  void set_group(std::size_t i, std::size_t group) { entries_.at(i).group = group; }

  /// The entry named `name` (or one of its aliases); throws ValueError naming it when absent.
  const ParamEntry& entry(const std::string& name) const {
    auto it = std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) {
      return e.name == name || std::find(e.aliases.begin(), e.aliases.end(), name) != e.aliases.end();
    });
    XTRAIN_CHECK(it != entries_.end(), ValueError, "ParamArena: no parameter named '", name, "'");
    return *it;
  }
  std::span<float> values(const ParamEntry& e) noexcept { return value_view_.subspan(e.offset, e.size); }
  std::span<float> grads(const ParamEntry& e) noexcept { return grad_view_.subspan(e.offset, e.size); }

  void zero_grad() noexcept { std::fill(grad_view_.begin(), grad_view_.end(), 0.0f); }

 private:
  // Points every parameter use (in visit order) at its slot.
  template <class Model>
  void rebind(Model& model, const std::vector<std::uint32_t>& slot_of_use) {
    std::size_t use = 0;
    visit_parameters(model, [&](const std::string&, Param& p, ParamKind) {
      const std::uint32_t i = slot_of_use[use++];
      p.rebind(value_view_.data() + entries_[i].offset, grad_view_.data() + entries_[i].offset, i, Param::Copy::values);
    });
  }
  // After adoption (every use knows its slot): views only, the buffers already hold the values.
  template <class Model>
  void rebind(Model& model) {
    visit_parameters(model, [&](const std::string&, Param& p, ParamKind) {
      const std::uint32_t i = p.slot();
      p.rebind(value_view_.data() + entries_[i].offset, grad_view_.data() + entries_[i].offset, i, Param::Copy::none);
    });
  }
  // Copies `view` into `storage` (zero padding after it), points `view` and every Param there,
  // releases `own` (or `pages`).
  template <class Model>
  void move_to(Model& model, std::span<float>& view, AlignedVector& own, memory::PageBuffer& pages,
               std::span<float> storage, const char* what, bool copy = true) {
    XTRAIN_CHECK(storage.size() >= size(), ValueError, "ParamArena: ", what, " storage of ", storage.size(),
                 " floats for ", size(), " values");
    if (copy) {
      std::copy(view.begin(), view.end(), storage.begin());
      std::fill(storage.begin() + static_cast<std::ptrdiff_t>(size()), storage.end(), 0.0f);
    }
    view = storage.first(size());
    rebind(model);
    AlignedVector(own.get_allocator()).swap(own);
    pages = memory::PageBuffer();
  }

  AlignedVector values_, grads_;
  bool paged_ = false;
  memory::PageBuffer value_pages_, grad_pages_;  // paged: instead of values_, grads_
  std::span<float> value_view_, grad_view_;      // values_, grads_, the pages, or storage given to move_*_to
  std::size_t natural_size_ = 0;
  std::vector<ParamEntry> entries_;
};

/// What an engine does when it takes a model: gives every module its identity (assign_module_ids),
/// moves the model's buffers (BatchNorm's running statistics, made with the model) into `memory`,
/// and returns the arena of its parameters there (`paged`: in pages of their own), its length a
/// multiple of `multiple`.
template <class Model>
ParamArena adopt_model(Model& model, std::size_t multiple, memory::Resource& memory, bool paged = false) {
  assign_module_ids(model);
  visit_buffers(
      model,
      [&](const std::string&, auto& buffer) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(buffer)>, Tensor<float>>)
          buffer = Tensor<float>(buffer, memory);
      },
      true);
  return ParamArena(model, multiple, &memory, paged);
}

}  // namespace xtrain
