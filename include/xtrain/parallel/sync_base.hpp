#pragma once
/// \file sync_base.hpp
/// What every gradient synchronisation mode shares: the communicator and the arena it works on,
/// and the gradient buckets that count each parameter's readiness during backward (and, in the
/// all-reduce mode, reduce it). A mode derives from SyncBase and adds its own steps; a mode that
/// keeps the whole optimizer state on every rank uses its identity state layout.

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "xtrain/backend/executor.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/optim/param_groups.hpp"
#include "xtrain/parallel/buckets.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/gradient_sync.hpp"

namespace xtrain::parallel::detail {

template <Communicator C>
class SyncBase {
 public:
  /// Buckets of at most `bucket_bytes` over `arena`, on `comm`'s ranks. Both must outlive it.
  SyncBase(C& comm, ParamArena& arena, std::size_t bucket_bytes)
      : comm_(&comm), arena_(&arena), buckets_(arena, bucket_bytes) {}

  const CommStats& stats() const noexcept { return buckets_.stats(); }
  std::size_t bucket_count() const noexcept { return buckets_.buckets().size(); }
  void reset_stats() noexcept { buckets_.reset_stats(); }
  /// Bytes of gradient memory this rank holds (all of the arena's gradients).
  std::size_t gradient_bytes() const noexcept { return arena_->size() * sizeof(float); }
  /// Zeroes the gradients for a new accumulation window (over `e`'s threads).
  void zero_grads(backend::Executor* e) { optim::zero_grads(arena_->grads(), e); }

  /// The whole optimizer state on every rank: a checkpoint's layout is the state itself.
  template <class Optimizer, class MakeFull, class F>
  void with_full_state(typename Optimizer::State& state, MakeFull&&, F&& f) {
    f(state);
  }
  template <class Optimizer>
  typename Optimizer::State take_state(typename Optimizer::State full, typename Optimizer::State) {
    return full;
  }

  /// Every rank holds the whole state: a checkpoint is one file, written by rank 0.
  bool saves_shards() const noexcept { return false; }
  /// This rank's parts of the optimizer state's vectors in a checkpoint's layout: whole here.
  template <class Optimizer>
  std::vector<StatePiece> state_pieces(typename Optimizer::State& state) {
    std::vector<StatePiece> pieces;
    Optimizer::visit_state(state, [&](auto& v) {
      using T = typename std::remove_cvref_t<decltype(v)>::value_type;
      static_assert(std::is_trivially_copyable_v<T>);
      pieces.push_back({reinterpret_cast<std::byte*>(v.data()), 0, v.size(), sizeof(T)});
    });
    return pieces;
  }
  /// The parameter values this rank loads from a sharded checkpoint: all of them.
  ArenaRange value_block() const noexcept { return {0, arena_->size()}; }
  /// Nothing to share after a load: every rank loaded every value.
  void share_values() {}

 protected:
  /// Wires the readiness of every parameter use into `ctx` and starts counting: with `reduce`
  /// the buckets start their reductions as they complete (finish them with buckets_.finish),
  /// otherwise the uses are only counted (check with buckets_.check_complete).
  void watch(Context& ctx, bool reduce) {
    ctx.grads_ready = &SyncBase::on_ready;
    ctx.grads_ready_user = this;
    buckets_.begin_backward(reduce);
  }

  C* comm_;
  ParamArena* arena_;
  GradientBuckets<C> buckets_;

 private:
  static void on_ready(void* self, std::uint32_t slot) {
    auto* s = static_cast<SyncBase*>(self);
    s->buckets_.ready(*s->comm_, s->arena_->grads(), slot);
  }
};

}  // namespace xtrain::parallel::detail
