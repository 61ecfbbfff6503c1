#pragma once
/// \file sync_modes.hpp
/// The gradient synchronisation modes an engine can run, and the choice among them from the
/// options: `deterministic(chunk)` selects TreeSync, `zero_stage` 1 or 2 (`shard_optimizer`) on
/// several ranks ShardedSync, anything else AllReduceSync. A new mode models GradientSync in a file of its
/// own and is added to SyncModes and to make_sync here.

#include <cstddef>
#include <variant>

#include "xtrain/core/error.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/gradient_sync.hpp"
#include "xtrain/parallel/single_process.hpp"
#include "xtrain/parallel/sync_allreduce.hpp"
#include "xtrain/parallel/sync_sharded.hpp"
#include "xtrain/parallel/sync_tree.hpp"

namespace xtrain::parallel {

/// One of the modes (held by the engine; std::visit it).
template <Communicator C>
using SyncModes = std::variant<AllReduceSync<C>, TreeSync<C>, ShardedSync<C>>;

static_assert(GradientSync<AllReduceSync<SingleProcess>> && ChunkedSync<TreeSync<SingleProcess>> &&
              GradientSync<ShardedSync<SingleProcess>>);

/// What selects and sizes the mode.
struct SyncChoice {
  std::size_t bucket_bytes = 25u << 20;  ///< gradient bucket size
  std::size_t deterministic_chunk = 0;   ///< > 0: TreeSync with chunks of this many samples
  std::size_t global_batch = 0;          ///< samples per global step (TreeSync's chunks)
  bool shard_optimizer = false;          ///< ShardedSync (on more than one rank)
  std::size_t state_granule = 1;         ///< the optimizer's state blocks (optim::state_granule)
  bool shard_gradients = false;          ///< ShardedSync's stage 2 (implies shard_optimizer)

  /// Whether the optimizer step is sharded over `ranks` ranks.
  bool sharded(std::size_t ranks) const noexcept { return (shard_optimizer || shard_gradients) && ranks > 1; }
  /// What the parameter arena's size must be a multiple of (ShardedSync's equal blocks).
  std::size_t arena_multiple(std::size_t ranks) const noexcept {
    return shard_optimizer || shard_gradients ? shard_multiple(ranks, state_granule) : ParamArena::alignment;
  }
};

/// The mode `choice` selects, over `comm`'s ranks and `arena` (whose size must be a multiple of
/// choice.arena_multiple(comm.size())); its buffers from `memory`. All three must outlive it.
/// Throws ValueError for options that cannot be combined.
template <Communicator C>
SyncModes<C> make_sync(const SyncChoice& choice, C& comm, ParamArena& arena, memory::Resource& memory) {
  XTRAIN_CHECK(!(choice.sharded(comm.size()) && choice.deterministic_chunk), ValueError,
               "shard_optimizer and the deterministic reduction cannot be combined");
  if (choice.deterministic_chunk)
    return SyncModes<C>(std::in_place_index<1>, comm, arena, choice.bucket_bytes, choice.deterministic_chunk,
                        choice.global_batch, memory);
  if (choice.sharded(comm.size()))
    return SyncModes<C>(std::in_place_index<2>, comm, arena, choice.bucket_bytes, memory, choice.shard_gradients);
  return SyncModes<C>(std::in_place_index<0>, comm, arena, choice.bucket_bytes);
}

}  // namespace xtrain::parallel
