#pragma once
/// \file sharded_unit.hpp
/// ShardedUnit{m}: a unit of ZeRO-3 (PyTorch FSDP2's `fully_shard(m)`). Under
/// `TrainingOptions::zero_stage(3)` the parameters of the model live sharded over the ranks: each
/// rank holds its block of the flat arena, and the pages of the rest are given back. A unit's
/// parameters are all-gathered before its forward and again before its backward, and given back
/// after each; parameters outside every unit (a GPT's embeddings and final LayerNorm) stay whole on
/// every rank. A rank then holds its shard, the parameters outside the units, the unit that runs
/// and, over MPI, the next one (gathered meanwhile: TrainingOptions::prefetch_units), instead of
/// the whole model.
///
/// Transparent otherwise: m's names, buffers, module identities and results are those of m
/// unwrapped, and without zero_stage(3) (or on one rank) it calls m directly. The engine finds the
/// units when it takes the model; a unit's parameters must be contiguous in the arena (no parameter
/// tied to one outside the unit), and units do not nest. GPT wraps each block in one.
///
/// A copy of the model is not registered: under zero_stage(3) copy it inside
/// Trainer::with_full_parameters (every parameter whole then).

#include <cstddef>
#include <string>
#include <utility>

#include "xtrain/core/concepts.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/param_shards.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain::layers {

template <class M>
class ShardedUnit {
  static_assert(check_module<M>());

 public:
  explicit ShardedUnit(M module) : module_(std::move(module)) {}
  /// A copy is a plain module (not registered with any shards).
  ShardedUnit(const ShardedUnit& other) : module_(other.module_) {}
  ShardedUnit& operator=(const ShardedUnit& other) {
    if (this != &other) module_ = other.module_;
    return *this;
  }
  ShardedUnit(ShardedUnit&&) noexcept = default;
  ShardedUnit& operator=(ShardedUnit&&) noexcept = default;

  /// m's forward with its parameters gathered.
  template <ActivationType T>
  requires ModuleFor<M, T>
  const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    const Gathered g(shards_, index_, false);
    return module_.forward(ctx, x);
  }
  /// m's backward with its parameters gathered (they are given back before the readiness of m's
  /// own parameters is reported; their gradients are the engine's).
  template <ActivationType T>
  requires ModuleFor<M, T>
  const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    const Gathered g(shards_, index_, true);
    return module_.backward(ctx, dy);
  }

  /// Reports itself to a visitor that looks for units (`v.shard_unit(*this)`), then m's
  /// parameters, buffers and children as m reports them (ShardedUnit adds no name).
  template <class V>
  void visit(V& v) {
    if constexpr (requires { v.shard_unit(*this); }) v.shard_unit(*this);
    module_.visit(v);
  }

  /// Registers the unit as unit `index` of `shards` (the engine does; null: unregistered).
  void attach_shards(ParamShards* shards, std::size_t index) noexcept {
    shards_ = shards;
    index_ = index;
  }
  bool registered() const noexcept { return shards_ != nullptr; }

  M& module() noexcept { return module_; }
  const M& module() const noexcept { return module_; }

  /// m's own description.
  std::string describe() const {
    if constexpr (requires { module_.describe(); })
      return module_.describe();
    else
      return "(module)";
  }

 private:
  struct Gathered {
    Gathered(ParamShards* s, std::size_t i, bool backward) : shards(s), index(i) {
      if (shards) shards->gather(index, backward);
    }
    Gathered(const Gathered&) = delete;
    Gathered& operator=(const Gathered&) = delete;
    ~Gathered() {
      if (shards) shards->release(index);
    }
    ParamShards* shards;
    std::size_t index;
  };

  M module_;
  ParamShards* shards_ = nullptr;
  std::size_t index_ = 0;
};

}  // namespace xtrain::layers
