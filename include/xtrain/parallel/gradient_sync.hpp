#pragma once
/// \file gradient_sync.hpp
/// The GradientSync concept: how the gradients of a step become the update every rank applies.
/// The engine asks a synchronisation mode to watch a backward ("these parameters are ready"),
/// to reduce ("give me the gradients I step, summed over ranks"), and to publish the result
/// ("every rank now needs the new parameters"); it does not know which mode it holds, only
/// whether the mode computes a micro-step in chunks (ChunkedSync). One mode per file:
///  - AllReduceSync (sync_allreduce.hpp): the default, DDP's buckets reduced during backward;
///  - TreeSync (sync_tree.hpp): rank-count invariant, gradients summed per chunk in a fixed tree;
///  - ShardedSync (sync_sharded.hpp): ZeRO stages 1 and 2, each rank steps its block of the
///    parameters (stage 2 keeps only its block of the gradients, reduced bucket by bucket).
/// sync_modes.hpp chooses one from the options. A new mode is one file that models the concept,
/// and one line in sync_modes.hpp.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "xtrain/backend/executor.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/profiler.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain::parallel {

/// Communication time of the gradient reductions, accumulated over steps.
struct CommStats {
  double waiting_seconds = 0.0;  ///< blocked in wait() after backward (exposed communication)
  double overlap_seconds = 0.0;  ///< from the first bucket's start to the end of backward
  std::size_t steps = 0;
  std::size_t collectives = 0;
  std::size_t units_prefetched = 0;  ///< ZeRO-3: unit gathers already in flight when the unit ran
};

/// Elements [begin, end) of the flat parameter arena.
struct ArenaRange {
  std::size_t begin = 0, end = 0;
  std::size_t size() const noexcept { return end - begin; }
};

/// A rank's piece of one vector of the training state (the parameter values, or a vector of the
/// optimizer state) as a sharded checkpoint saves and loads it: `count` elements of `elem` bytes
/// at `data`, elements [start, start + count) of the vector in the checkpoint's layout.
struct StatePiece {
  std::byte* data = nullptr;
  std::size_t start = 0, count = 0, elem = 0;
};

/// What a gradient synchronisation mode does, in the order the engine calls it:
///  - `zero_grads(executor)` at the start of an accumulation window (the gradients it keeps become
///    zero);
///  - `chunk()`: 0, or the samples of a micro-step whose gradient is computed alone (the mode is
///    then a ChunkedSync, below, and runs the micro-step chunk by chunk);
///  - `begin_backward(ctx, last)` before a backward (it wires parameter readiness into `ctx`;
///    `last`: the micro-step ends the accumulation window) and `end_backward(last)` after it
///    (every parameter use reported; reductions started during backward complete);
///  - `end_micro_step(last)` once a micro-step's gradients are complete;
///  - at the optimizer step: `reduce_for_step()` (the gradients this rank steps, summed over
///    ranks: all of them, or its block), `agree(found)` (an overflow on any rank: the answer
///    every rank shares), `clip_grad_norm(grads, max)` (clip to the global norm, returns it),
///    then `after_step(stepped)` (every rank gets the updated parameters);
///  - `owned()`: the arena elements this rank steps and keeps optimizer state for;
///  - statistics (`stats`, `reset_stats`, `bucket_count`) and profiling (`set_profiler`).
/// Besides, as member templates: `attach(model)` (once, after construction: move buffers where
/// the communicator wants them), `with_full_state<Optimizer>(state, make_full, f)` and
/// `take_state<Optimizer>(full, mine)` (the optimizer state in the rank-count-independent layout
/// of a checkpoint, and back; make_full() makes the state of the unpadded arena, `mine` is this
/// rank's state as made, giving the shape of its part); for sharded checkpoints,
/// `saves_shards()` (each rank saves its own part), `state_pieces<Optimizer>(state)` (this rank's
/// parts of the state's vectors, placed in that layout), `value_block()` (the parameter values
/// this rank saves and loads) and `share_values()` (after a load: every rank gets the values it
/// holds from the others).
template <class S>
concept GradientSync = requires(S& s, const S& cs, Context& ctx, bool flag, std::span<float> grads,
                                profile::Profiler* profiler, backend::Executor* executor) {
  s.zero_grads(executor);
  { cs.chunk() } -> std::convertible_to<std::size_t>;
  { cs.owned() } -> std::same_as<ArenaRange>;
  s.begin_backward(ctx, flag);
  s.end_backward(flag);
  s.end_micro_step(flag);
  { s.reduce_for_step() } -> std::same_as<std::span<float>>;
  { s.agree(flag) } -> std::same_as<bool>;
  { s.clip_grad_norm(grads, 1.0) } -> std::same_as<double>;
  s.after_step(flag);
  { cs.stats() } -> std::same_as<const CommStats&>;
  { cs.bucket_count() } -> std::convertible_to<std::size_t>;
  s.reset_stats();
  s.set_profiler(profiler);
};

/// A mode that computes each micro-step in chunks (TreeSync): `chunks_per_rank()` chunks of
/// `chunk()` samples, and `for_each_chunk(x, y, zero, run)`, which calls zero() (each chunk's
/// gradient starts from zero), then run(x_chunk, y_chunk, first_row) for a chunk that holds
/// samples, then hands the chunk's gradient to the mode. The engine runs micro_step through it
/// (and refuses the Accelerate-style forward/backward, which see a whole micro-batch).
namespace detail {
/// Stand for what for_each_chunk is given (for the ChunkedSync concept).
struct ZeroArchetype {
  void operator()() const {}
};
struct ChunkArchetype {
  void operator()(const Tensor<float>&, const Tensor<std::int32_t>&, std::size_t) const {}
};
}  // namespace detail

template <class S>
concept ChunkedSync = GradientSync<S> &&
    requires(S& s, const S& cs, const Tensor<float>& x, const Tensor<std::int32_t>& y, detail::ZeroArchetype zero,
             detail::ChunkArchetype run) {
  { cs.chunks_per_rank() } -> std::convertible_to<std::size_t>;
  s.for_each_chunk(x, y, zero, run);
};

}  // namespace xtrain::parallel
