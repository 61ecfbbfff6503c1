#pragma once
/// \file sync_modes.hpp
/// The gradient synchronisation modes an engine can run, and the choice among them from the
/// options: `zero_stage` 1, 2 or 3 (`shard_optimizer`) on several ranks selects ShardedSync (with
/// the deterministic reduction: its tree over the ranks), `deterministic(chunk)` otherwise
/// TreeSync, anything else AllReduceSync. A new mode models GradientSync in a file of its
/// own and is added to SyncModes and to make_sync here.

#include <algorithm>
#include <cstddef>
#include <variant>

#include "xtrain/core/error.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/optim/clip.hpp"
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
  bool shard_parameters = false;         ///< ShardedSync's stage 3 (implies shard_gradients)
  bool prefetch_units = true;            ///< stage 3: gather the next unit while one computes

  /// Whether the optimizer step is sharded over `ranks` ranks.
  bool sharded(std::size_t ranks) const noexcept {
    return (shard_optimizer || shard_gradients || shard_parameters) && ranks > 1;
  }
  /// Whether the arena lives in pages whose ranges ShardedSync gives back (stages 2 and 3).
  bool pages(std::size_t ranks) const noexcept { return sharded(ranks) && stage() >= 2; }
  /// ShardedSync's stage: 3, 2 or 1.
  int stage() const noexcept { return shard_parameters ? 3 : shard_gradients ? 2 : 1; }
  /// What the parameter arena's size must be a multiple of (ShardedSync's equal blocks).
  /// (Sharded with the deterministic reduction: blocks of whole segments of the clipping norm.)
  std::size_t arena_multiple(std::size_t ranks) const noexcept {
    if (!(shard_optimizer || shard_gradients || shard_parameters)) return ParamArena::alignment;
    return shard_multiple(ranks, deterministic_chunk ? std::max(state_granule, optim::norm_segment) : state_granule);
  }
};

/// The mode `choice` selects, over `comm`'s ranks and `arena` (whose size must be a multiple of
/// choice.arena_multiple(comm.size())); its buffers from `memory`. All three must outlive it.
/// Throws ValueError for options that cannot be combined.
template <Communicator C>
SyncModes<C> make_sync(const SyncChoice& choice, C& comm, ParamArena& arena, memory::Resource& memory) {
  if (choice.sharded(comm.size())) {
    if (const std::size_t chunk = choice.deterministic_chunk) {
      TreeSync<C>::check_layout(chunk, choice.global_batch, comm.size());
      XTRAIN_CHECK(choice.global_batch == chunk * comm.size(), ValueError,
                   "zero_stage with the deterministic reduction computes one chunk per rank and micro-step: use "
                   "deterministic(",
                   choice.global_batch / comm.size(), ") for a global batch of ", choice.global_batch, " on ",
                   comm.size(), " ranks (it gives the bits of the unsharded deterministic run with that chunk)");
    }
    return SyncModes<C>(std::in_place_index<2>, comm, arena, choice.bucket_bytes, memory, choice.stage(),
                        choice.deterministic_chunk > 0, choice.prefetch_units);
  }
  if (choice.deterministic_chunk)
    return SyncModes<C>(std::in_place_index<1>, comm, arena, choice.bucket_bytes, choice.deterministic_chunk,
                        choice.global_batch, memory);
  return SyncModes<C>(std::in_place_index<0>, comm, arena, choice.bucket_bytes);
}

}  // namespace xtrain::parallel
