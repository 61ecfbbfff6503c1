#pragma once
/// \file sync_sharded.hpp
/// ShardedSync: the optimizer step sharded over the ranks (ZeRO stage 1, Rajbhandari et al.,
/// arXiv:1910.02054). Each of N ranks steps one block of the flat parameters with its block of
/// the optimizer state: the gradients are reduce-scattered (each rank receives the sum of its
/// block), clipped with the global norm, the block stepped, and the parameters all-gathered.
/// Each rank does 1/N of the optimizer's work and holds 1/N of its state; a checkpoint holds the
/// state gathered into the rank-count-independent layout.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "xtrain/core/context.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/core/profiler.hpp"
#include "xtrain/optim/clip.hpp"
#include "xtrain/parallel/buckets.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/gradient_sync.hpp"
#include "xtrain/parallel/sync_base.hpp"

namespace xtrain::parallel {

/// What the parameter arena's size must be a multiple of when sharded over `ranks` ranks: equal
/// blocks, each starting on an alignment boundary.
inline std::size_t shard_multiple(std::size_t ranks) noexcept { return ranks * ParamArena::alignment; }

template <Communicator C>
class ShardedSync : public detail::SyncBase<C> {
  using clock = std::chrono::steady_clock;
  using detail::SyncBase<C>::comm_, detail::SyncBase<C>::arena_, detail::SyncBase<C>::buckets_;

 public:
  /// The arena's size must be a multiple of shard_multiple(ranks): the blocks are equal and
  /// aligned. Buffers from `memory`. `comm`, `arena` and `memory` must outlive this object.
  ShardedSync(C& comm, ParamArena& arena, std::size_t bucket_bytes, memory::Resource& memory)
      : detail::SyncBase<C>(comm, arena, bucket_bytes),
        memory_(&memory),
        block_(arena.size() / comm.size()),
        offset_(comm.rank() * block_) {}

  /// Gradients and parameters written where a shared-memory communicator reduces and gathers them
  /// (MpiAllReduce's node segment).
  template <class Model>
  void attach(Model& model) {
    if constexpr (ProvidesNodeStorage<C>) {
      const NodeStorage s = comm_->node_storage(arena_->size(), true);
      if (!s.gradients.empty()) arena_->move_gradients_to(model, s.gradients);
      if (!s.parameters.empty()) arena_->move_values_to(model, s.parameters);
    }
  }

  std::size_t chunk() const noexcept { return 0; }
  ArenaRange owned() const noexcept { return {offset_, offset_ + block_}; }

  void begin_backward(Context& ctx, bool) {
    this->watch(ctx, false);  // readiness counted; the reduction is the step's
  }
  void end_backward(bool) { buckets_.check_complete(); }
  void end_micro_step(bool) {}

  /// Reduce-scatters the gradients: this rank's block, summed over ranks.
  std::span<float> reduce_for_step() {
    const auto start = clock::now();
    {
      const auto scope = labels_.scope(0, profile::Category::reduction);
      comm_->reduce_scatter_sum(arena_->grads(), "gradient reduce-scatter");
    }
    waited_ = std::chrono::duration<double>(clock::now() - start).count();
    return arena_->grads().subspan(offset_, block_);
  }
  /// Each rank checked its own block: an overflow anywhere skips the step everywhere.
  bool agree(bool found) {
    double bad = found ? 1.0 : 0.0;
    comm_->allreduce_sum(std::span<double>(&bad, 1), "gradient overflow check");
    return bad > 0.0;
  }
  /// Scales this rank's block so that the norm over all ranks' blocks is at most `max_norm` (one
  /// scalar all-reduce). Returns the global norm.
  double clip_grad_norm(std::span<float> block, double max_norm) {
    double sq = optim::sum_of_squares(block);
    comm_->allreduce_sum(std::span<double>(&sq, 1), "gradient norm");
    const double norm = std::sqrt(sq), coef = max_norm / (norm + 1e-6);
    if (coef < 1.0)
      for (float& g : block) g = static_cast<float>(g * coef);
    return norm;
  }
  /// All-gathers the stepped blocks (nothing when the step was skipped).
  void after_step(bool stepped) {
    if (stepped) {
      const auto start = clock::now();
      {
        const auto scope = labels_.scope(1, profile::Category::reduction);
        comm_->allgather_blocks(arena_->values(), "parameter all-gather");
      }
      waited_ += std::chrono::duration<double>(clock::now() - start).count();
    }
    buckets_.count_blocking(waited_, stepped ? 2 : 1);
  }

  /// Calls f(state) with the full optimizer state (each vector the arena's natural size),
  /// gathered from every rank's block. Collective.
  template <class Optimizer, class F>
  void with_full_state(typename Optimizer::State& mine, F&& f) {
    const memory::Use use(*memory_);  // the copy of the state the optimizer's type makes
    typename Optimizer::State full = mine;
    std::vector<AlignedVector*> blocks, fulls;
    Optimizer::visit_state(mine, [&](AlignedVector& v) { blocks.push_back(&v); });
    Optimizer::visit_state(full, [&](AlignedVector& v) { fulls.push_back(&v); });
    AlignedVector gathered(arena_->size(), 0.0f, memory::Allocator<float>(memory_));
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      std::copy(blocks[i]->begin(), blocks[i]->end(), gathered.begin() + static_cast<std::ptrdiff_t>(offset_));
      comm_->allgather_blocks(gathered, "gather optimizer state");
      fulls[i]->assign(gathered.begin(), gathered.begin() + static_cast<std::ptrdiff_t>(arena_->natural_size()));
    }
    f(full);
  }

  /// This rank's block of a full state in the natural layout (a checkpoint's).
  template <class Optimizer>
  typename Optimizer::State take_state(typename Optimizer::State full) {
    const memory::Use use(*memory_);
    typename Optimizer::State mine = full;
    std::vector<AlignedVector*> fulls, blocks;
    Optimizer::visit_state(full, [&](AlignedVector& v) { fulls.push_back(&v); });
    Optimizer::visit_state(mine, [&](AlignedVector& v) { blocks.push_back(&v); });
    for (std::size_t i = 0; i < fulls.size(); ++i) {
      fulls[i]->resize(arena_->size(), 0.0f);  // natural -> padded
      blocks[i]->assign(fulls[i]->begin() + static_cast<std::ptrdiff_t>(offset_),
                        fulls[i]->begin() + static_cast<std::ptrdiff_t>(offset_ + block_));
    }
    return mine;
  }

  void set_profiler(profile::Profiler* p) { labels_.attach(p); }

 private:
  memory::Resource* memory_;
  std::size_t block_, offset_;
  double waited_ = 0.0;  // this step's blocking communication, in seconds
  profile::EventLabels<2> labels_{{"gradient reduce-scatter", "parameter all-gather"}};
};

}  // namespace xtrain::parallel
