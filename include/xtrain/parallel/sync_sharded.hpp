#pragma once
/// \file sync_sharded.hpp
/// ShardedSync: the optimizer step sharded over the ranks (ZeRO, Rajbhandari et al.,
/// arXiv:1910.02054). Each of N ranks steps one block of the flat parameters with its block of
/// the optimizer state and all-gathers the parameters after.
///  - Stage 1 (`shard_optimizer`): the gradients are reduce-scattered at the step (each rank
///    receives the sum of its block), clipped with the global norm, the block stepped.
///  - Stage 2 (`zero_stage(2)`): each gradient bucket is reduce-scattered as soon as backward
///    completes it, and a rank keeps only its block of the gradients: the rest of the bucket's
///    pages are given back (memory::PageBuffer), so gradients take 1/N of the memory, plus the
///    buckets backward is writing.
/// Each rank does 1/N of the optimizer's work and holds 1/N of its state; a checkpoint holds the
/// state gathered into the rank-count-independent layout.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "xtrain/backend/executor.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/core/profiler.hpp"
#include "xtrain/optim/clip.hpp"
#include "xtrain/optim/param_groups.hpp"
#include "xtrain/parallel/buckets.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/gradient_sync.hpp"
#include "xtrain/parallel/sync_base.hpp"

namespace xtrain::parallel {

/// What the parameter arena's size must be a multiple of when sharded over `ranks` ranks: equal
/// blocks, each starting on an alignment boundary and on a multiple of `granule` (the blocks an
/// optimizer quantizes its state in, optim::state_granule).
inline std::size_t shard_multiple(std::size_t ranks, std::size_t granule = 1) noexcept {
  return ranks * std::max(ParamArena::alignment, granule);
}

template <Communicator C>
class ShardedSync : public detail::SyncBase<C> {
  using clock = std::chrono::steady_clock;
  using detail::SyncBase<C>::comm_, detail::SyncBase<C>::arena_, detail::SyncBase<C>::buckets_;

 public:
  /// The arena's size must be a multiple of shard_multiple(ranks): the blocks are equal and
  /// aligned. `shard_gradients`: stage 2 (else 1). Buffers from `memory`. `comm`, `arena` and
  /// `memory` must outlive this object.
  ShardedSync(C& comm, ParamArena& arena, std::size_t bucket_bytes, memory::Resource& memory,
              bool shard_gradients = false)
      : detail::SyncBase<C>(comm, arena, bucket_bytes),
        memory_(&memory),
        block_(arena.size() / comm.size()),
        offset_(comm.rank() * block_),
        stage2_(shard_gradients) {}

  /// Stage 1: gradients and parameters written where a shared-memory communicator reduces and
  /// gathers them (MpiAllReduce's node segment). Stage 2: the gradients moved into pages of
  /// their own, all but this rank's block given back.
  template <class Model>
  void attach(Model& model) {
    if (stage2_) {
      pages_ = memory::PageBuffer(arena_->size());
      const std::span<const float> g = arena_->grads();
      const bool zero = std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; });
      arena_->move_gradients_to(model, pages_.span(), !zero);  // fresh pages are zeros: not touched
      release_others(0, arena_->size());
      return;  // (a node segment would hold every rank's gradients: not for stage 2)
    }
    if constexpr (ProvidesNodeStorage<C>) {
      const NodeStorage s = comm_->node_storage(arena_->size(), true);
      if (!s.gradients.empty()) arena_->move_gradients_to(model, s.gradients);
      if (!s.parameters.empty()) arena_->move_values_to(model, s.parameters);
    }
  }

  std::size_t chunk() const noexcept { return 0; }
  ArenaRange owned() const noexcept { return {offset_, offset_ + block_}; }
  /// Bytes of gradient memory this rank holds now (stage 2: its pages in use; stage 1: all).
  std::size_t gradient_bytes() const { return stage2_ ? pages_.resident_bytes() : arena_->size() * sizeof(float); }

  void begin_backward(Context& ctx, bool) {
    this->watch(ctx, false);  // readiness counted; stage 1 reduces in the step
    if (stage2_) {
      ctx.grads_ready = &ShardedSync::on_ready;  // stage 2: each bucket as it completes
      ctx.grads_ready_user = this;
    }
  }
  void end_backward(bool) { buckets_.check_complete(); }
  void end_micro_step(bool) {}
  /// Stage 2: zeroes this rank's block and gives back the rest (already zero after a backward).
  void zero_grads(backend::Executor* e) {
    if (!stage2_) return detail::SyncBase<C>::zero_grads(e);
    release_others(0, arena_->size());
    optim::zero_grads(arena_->grads().subspan(offset_, block_), e);
  }

  /// This rank's block of the gradients, summed over ranks: stage 1 reduce-scatters it now,
  /// stage 2 did during backward.
  std::span<float> reduce_for_step() {
    if (!stage2_) {
      const auto start = clock::now();
      const auto scope = labels_.scope(0, profile::Category::reduction);
      comm_->reduce_scatter_sum(arena_->grads(), "gradient reduce-scatter");
      waited_ += std::chrono::duration<double>(clock::now() - start).count();
      ++collectives_;
    }
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
      ++collectives_;
    }
    buckets_.count_blocking(waited_, collectives_);
    waited_ = 0.0;
    collectives_ = 0;
  }

  /// Calls f(state) with the full optimizer state, gathered from every rank's part: each state
  /// vector of the full state (`make_full()`, the optimizer's state for the unpadded arena) is
  /// the ranks' vectors one after the other, cut to its length. Collective.
  template <class Optimizer, class MakeFull, class F>
  void with_full_state(typename Optimizer::State& mine, MakeFull&& make_full, F&& f) {
    const memory::Use use(*memory_);  // the state's copy and the buffers
    typename Optimizer::State full = make_full();
    const std::vector<Part> parts = parts_of<Optimizer>(mine), wholes = parts_of<Optimizer>(full);
    for (std::size_t i = 0; i < parts.size(); ++i) gather(parts[i], wholes[i]);
    f(full);
  }

  /// The state this rank keeps (shaped as `mine`: the optimizer's state for its block), cut from
  /// a full state in a checkpoint's layout (zeros where it is shorter). Collective.
  template <class Optimizer>
  typename Optimizer::State take_state(typename Optimizer::State full, typename Optimizer::State mine) {
    const std::vector<Part> parts = parts_of<Optimizer>(mine), wholes = parts_of<Optimizer>(full);
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const Part& p = parts[i];
      const std::size_t bytes = p.count * p.elem, from = offsets(p)[comm_->rank()] * p.elem,
                        whole = wholes[i].count * p.elem, n = from < whole ? std::min(bytes, whole - from) : 0;
      if (n) std::memcpy(p.data, wholes[i].data + from, n);
      if (bytes > n) std::memset(p.data + n, 0, bytes - n);  // (an empty vector's data() may be null)
    }
    return mine;
  }

  void set_profiler(profile::Profiler* p) { labels_.attach(p); }

 private:
  // A state vector as bytes: its elements, their count and size, whether they are floats.
  struct Part {
    std::byte* data;
    std::size_t count, elem;
    bool floats;
  };
  template <class Optimizer>
  static std::vector<Part> parts_of(typename Optimizer::State& s) {
    std::vector<Part> parts;
    Optimizer::visit_state(s, [&](auto& v) {
      using T = typename std::remove_cvref_t<decltype(v)>::value_type;
      static_assert(std::is_trivially_copyable_v<T>);
      parts.push_back({reinterpret_cast<std::byte*>(v.data()), v.size(), sizeof(T), std::is_same_v<T, float>});
    });
    return parts;
  }
  // Where each rank's part starts in the full vector (in elements), the total last.
  std::vector<std::size_t> offsets(const Part& p) {
    std::vector<double> counts(comm_->size(), 0.0);
    counts[comm_->rank()] = static_cast<double>(p.count);
    comm_->allreduce_sum(std::span<double>(counts), "optimizer state sizes");
    std::vector<std::size_t> at(counts.size() + 1, 0);
    for (std::size_t r = 0; r < counts.size(); ++r) at[r + 1] = at[r] + static_cast<std::size_t>(counts[r]);
    return at;
  }
  // Fills `whole` with the ranks' parts in rank order: equal parts are all-gathered as raw bits
  // (allgather_blocks copies), unequal ones (fp32 only) summed into zeros.
  void gather(const Part& mine, const Part& whole) {
    const std::vector<std::size_t> at = offsets(mine);
    const std::size_t ranks = comm_->size(), total = at.back() * mine.elem, want = whole.count * mine.elem;
    bool equal = true;
    for (std::size_t r = 0; r < ranks; ++r) equal = equal && at[r + 1] - at[r] == mine.count;
    if (equal) {
      const std::size_t bytes = mine.count * mine.elem, floats = (bytes + sizeof(float) - 1) / sizeof(float);
      AlignedVector buffer(floats * ranks, 0.0f, memory::Allocator<float>(memory_));
      auto* b = reinterpret_cast<std::byte*>(buffer.data());
      if (bytes) std::memcpy(b + comm_->rank() * floats * sizeof(float), mine.data, bytes);
      comm_->allgather_blocks(buffer, "gather optimizer state");
      for (std::size_t r = 0, done = 0; bytes && r < ranks && done < want; ++r, done += bytes)
        std::memcpy(whole.data + done, b + r * floats * sizeof(float), std::min(bytes, want - done));
    } else {
      XTRAIN_CHECK(mine.floats, ValueError,
                   "ShardedSync: optimizer state vectors of other than float must have "
                   "the same length on every rank");
      AlignedVector buffer(at.back(), 0.0f, memory::Allocator<float>(memory_));
      if (mine.count) std::memcpy(buffer.data() + at[comm_->rank()], mine.data, mine.count * sizeof(float));
      comm_->allreduce_sum(std::span<float>(buffer), "gather optimizer state");
      if (std::min(total, want)) std::memcpy(whole.data, buffer.data(), std::min(total, want));
    }
    if (want > total) std::memset(whole.data + total, 0, want - total);
  }

  // Stage 2: a bucket of the gradients is complete on every rank: reduce-scatter it (each rank's
  // block summed), give back the rest. A communicator without reduce_scatter_range all-reduces.
  static void on_ready(void* self, std::uint32_t slot) {
    auto* s = static_cast<ShardedSync*>(self);
    s->buckets_.ready_in_order(slot, [s](const auto& b) { s->reduce_bucket(b.begin, b.end); });
  }
  void reduce_bucket(std::size_t begin, std::size_t end) {
    const auto start = clock::now();
    {
      const auto scope = labels_.scope(2, profile::Category::reduction);
      if constexpr (ReduceScattersRanges<C>)
        comm_->reduce_scatter_range(arena_->grads(), begin, end, "gradient bucket reduce-scatter");
      else
        comm_->allreduce_sum(arena_->grads().subspan(begin, end - begin), "gradient bucket");
    }
    release_others(begin, end);
    waited_ += std::chrono::duration<double>(clock::now() - start).count();
    ++collectives_;
  }
  // Zeroes the gradients [begin, end) outside this rank's block, giving their pages back.
  void release_others(std::size_t begin, std::size_t end) noexcept {
    pages_.release(begin, std::min(end, offset_));
    pages_.release(std::max(begin, offset_ + block_), end);
  }

  memory::Resource* memory_;
  std::size_t block_, offset_;
  bool stage2_;
  memory::PageBuffer pages_;  // stage 2: the gradients
  double waited_ = 0.0;       // this step's blocking communication, in seconds
  std::size_t collectives_ = 0;
  profile::EventLabels<3> labels_{
      {"gradient reduce-scatter", "parameter all-gather", "gradient bucket reduce-scatter"}};
};

}  // namespace xtrain::parallel
