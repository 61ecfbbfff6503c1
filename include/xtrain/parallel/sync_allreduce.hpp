#pragma once
/// \file sync_allreduce.hpp
/// AllReduceSync: the default gradient synchronisation, PyTorch DDP's. Gradient buckets
/// (buckets.hpp) start their non-blocking all-reduce as soon as backward has made their
/// gradients final, overlapping communication with the rest of backward; after backward the
/// last buckets are reduced and every rank holds the sum, so every rank steps every parameter.
/// On one rank, or between the micro-steps of an accumulation window, nothing is reduced: the
/// readiness of every parameter is only counted, so a model that breaks it fails on a laptop as
/// it would on a cluster.

#include <cstddef>
#include <cstdint>
#include <span>

#include "xtrain/core/context.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/core/profiler.hpp"
#include "xtrain/optim/clip.hpp"
#include "xtrain/parallel/buckets.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/gradient_sync.hpp"
#include "xtrain/parallel/sync_base.hpp"

namespace xtrain::parallel {

template <Communicator C>
class AllReduceSync : public detail::SyncBase<C> {
  using detail::SyncBase<C>::comm_, detail::SyncBase<C>::arena_, detail::SyncBase<C>::buckets_;

 public:
  /// Buckets of at most `bucket_bytes` over `arena`, reduced over `comm`'s ranks. Both must
  /// outlive this object.
  AllReduceSync(C& comm, ParamArena& arena, std::size_t bucket_bytes)
      : detail::SyncBase<C>(comm, arena, bucket_bytes) {}

  /// Gradients written where a shared-memory communicator sums them (MpiAllReduce's node segment).
  template <class Model>
  void attach(Model& model) {
    if constexpr (ProvidesNodeStorage<C>) {
      if (comm_->size() == 1) return;
      const NodeStorage s = comm_->node_storage(arena_->size(), false);
      if (!s.gradients.empty()) arena_->move_gradients_to(model, s.gradients);
    }
  }

  std::size_t chunk() const noexcept { return 0; }
  ArenaRange owned() const noexcept { return {0, arena_->size()}; }

  void begin_backward(Context& ctx, bool last) {
    reduce_ = last && comm_->size() > 1;
    this->watch(ctx, reduce_);
  }
  /// With a reduction in flight: starts what has not started and waits for all of it.
  void end_backward(bool) {
    if (!reduce_) return buckets_.check_complete();
    const auto scope = labels_.scope(0, profile::Category::reduction);
    buckets_.finish(*comm_, arena_->grads());
  }
  void end_micro_step(bool) {}

  std::span<float> reduce_for_step() { return arena_->grads(); }
  bool agree(bool found) { return found; }  // every rank checked the same reduced gradients
  double clip_grad_norm(std::span<float> grads, double max_norm) { return optim::clip_grad_norm(grads, max_norm); }
  void after_step(bool) {}

  void set_profiler(profile::Profiler* p) {
    buckets_.set_profiler(p);
    labels_.attach(p);
  }
  /// The buckets (their count, their slices).
  const GradientBuckets<C>& buckets() const noexcept { return buckets_; }

 private:
  bool reduce_ = false;
  profile::EventLabels<1> labels_{{"gradient allreduce wait"}};
};

}  // namespace xtrain::parallel
