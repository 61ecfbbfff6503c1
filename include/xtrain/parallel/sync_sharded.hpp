#pragma once
/// \file sync_sharded.hpp
/// ShardedSync: the optimizer step sharded over the ranks (ZeRO, Rajbhandari et al.,
/// arXiv:1910.02054). Each of N ranks steps one block of the flat parameters with its block of
/// the optimizer state and all-gathers the parameters after.
///  - Stage 1 (`shard_optimizer`): the gradients are reduce-scattered at the step (each rank
///    receives the sum of its block), clipped with the global norm, the block stepped.
///  - Stage 2 (`zero_stage(2)`): each gradient bucket is reduce-scattered as soon as backward
///    completes it (MPI: through shared memory within a node, at once; between nodes without
///    blocking backward, up to two in flight: ireduce_scatter_range), and a rank keeps only its block of the gradients:
///    the rest of the bucket's pages are given back (memory::PageBuffer, on huge pages where large), so gradients take
///    1/N of the memory, plus the buckets backward is writing or reducing.
///  - Stage 3 (`zero_stage(3)`): stage 2, and the parameters sharded too (FSDP): a rank keeps its
///    block of the parameters; the pages of the rest are given back. Each layers::ShardedUnit of
///    the model all-gathers its parameters before its forward and before its backward and gives
///    them back after (this class is its ParamShards), the next unit's gather in flight meanwhile
///    where the communicator has iallgather_range (prefetch); parameters outside every unit are
///    all-gathered after each step and stay whole. No all-gather of the whole arena.
/// With the deterministic reduction (one chunk per rank and micro-step), each bucket's blocks are
/// exchanged (all-to-all) and every rank sums its block's copies in the fixed tree of TreeSync:
/// the same bits as the unsharded deterministic run with that chunk, on any power-of-two ranks.
/// Each rank does 1/N of the optimizer's work and holds 1/N of its state; a checkpoint is each
/// rank's part in a shard file of its own (checkpoint/sharded.hpp), in a layout every rank count
/// reads.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xtrain/backend/executor.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/core/param_shards.hpp"
#include "xtrain/core/profiler.hpp"
#include "xtrain/optim/clip.hpp"
#include "xtrain/optim/param_groups.hpp"
#include "xtrain/parallel/buckets.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/gradient_sync.hpp"
#include "xtrain/parallel/sharded_state.hpp"
#include "xtrain/parallel/sync_base.hpp"

namespace xtrain::parallel {

/// What the parameter arena's size must be a multiple of when sharded over `ranks` ranks: equal
/// blocks, each starting on an alignment boundary and on a multiple of `granule` (the blocks an
/// optimizer quantizes its state in, optim::state_granule).
inline std::size_t shard_multiple(std::size_t ranks, std::size_t granule = 1) noexcept {
  return ranks * std::max(ParamArena::alignment, granule);
}

template <Communicator C>
class ShardedSync final : public detail::SyncBase<C>, public ParamShards {
  using clock = std::chrono::steady_clock;
  using detail::SyncBase<C>::comm_, detail::SyncBase<C>::arena_, detail::SyncBase<C>::buckets_;

 public:
  /// The arena's size must be a multiple of shard_multiple(ranks): the blocks are equal and
  /// aligned. `stage`: 1, 2 or 3; `deterministic`: the tree reduction (the engine's micro-step is
  /// one chunk); `prefetch`: stage 3 gathers the next unit while one computes (where the
  /// communicator has iallgather_range). Buffers from `memory`. `comm`, `arena` and `memory` must outlive this object.
  /// Throws ValueError when stage 3 or the deterministic reduction asks for a collective the
  /// communicator lacks.
  ShardedSync(C& comm, ParamArena& arena, std::size_t bucket_bytes, memory::Resource& memory, int stage = 1,
              bool deterministic = false, bool prefetch = true)
      : detail::SyncBase<C>(comm, arena, bucket_bytes),
        block_(arena.size() / comm.size()),
        offset_(comm.rank() * block_),
        stage_(stage),
        stage2_(stage >= 2),
        deterministic_(deterministic),
        prefetch_(prefetch && IGathersRanges<C>),
        sum_(memory::Allocator<float>(&memory)),
        exchange_(memory::Allocator<float>(&memory)),
        state_(comm, memory) {
    XTRAIN_CHECK(stage >= 1 && stage <= 3, ValueError, "ShardedSync: ZeRO stage ", stage, " (1, 2 or 3)");
    XTRAIN_CHECK(GathersRanges<C> || (stage < 3 && !deterministic), ValueError,
                 stage == 3 ? "zero_stage(3)" : "zero_stage with the deterministic reduction",
                 " needs a communicator with allgather_range and exchange_range (MpiAllReduce, ThreadAllReduce)");
    XTRAIN_CHECK(!deterministic || block_ % optim::norm_segment == 0, ValueError,
                 "ShardedSync with the deterministic reduction: the arena's size must be a multiple of ranks x ",
                 optim::norm_segment, " (SyncChoice::arena_multiple)");
    if (deterministic_) sum_.assign(block_, 0.0f);
  }
  // Units hold a pointer to this object (their ParamShards) once attached.
  ShardedSync(const ShardedSync&) = delete;
  ShardedSync& operator=(const ShardedSync&) = delete;
  ShardedSync(ShardedSync&&) = delete;
  ShardedSync& operator=(ShardedSync&&) = delete;
  ~ShardedSync() = default;

  /// Stage 1: gradients and parameters written where a shared-memory communicator reduces and
  /// gathers them (MpiAllReduce's node segment). Stage 2: the gradients moved into pages of
  /// their own, all but this rank's block given back.
  template <class Model>
  void attach(Model& model) {
    if (stage2_) {
      if (memory::PageBuffer* pages = arena_->grad_pages()) {  // the engine made the arena so
        pages_ = pages;
      } else {
        own_grads_ = memory::PageBuffer(arena_->size());
        const std::span<const float> g = arena_->grads();
        const bool zero = std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; });
        arena_->move_gradients_to(model, own_grads_.span(), !zero);  // fresh pages are zeros: not touched
      }
      release_others(0, arena_->size());
      if (deterministic_) pages_->release(offset_, offset_ + block_);  // summed into sum_
      if (stage_ == 3) attach_units(model);
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
  /// Bytes of gradient memory this rank holds now (stage 2: its pages in use; stage 1: all; the
  /// deterministic reduction's sums of its block besides).
  std::size_t gradient_bytes() const {
    return (stage2_ ? pages_->resident_bytes() : arena_->size() * sizeof(float)) + sum_.size() * sizeof(float);
  }
  /// Bytes of parameter memory this rank holds now (stage 3: its pages in use; else all).
  std::size_t parameter_bytes() const {
    return stage_ == 3 ? values_->resident_bytes() : arena_->size() * sizeof(float);
  }
  /// Stage 3: the units' arena ranges (in the model's order) and their names.
  const std::vector<ArenaRange>& units() const noexcept { return units_; }
  const std::vector<std::string>& unit_names() const noexcept { return unit_names_; }
  /// Whether the parameters are sharded (stage 3): read them inside with_full_parameters().
  bool shards_parameters() const noexcept { return stage_ == 3; }

  /// Stage 3: makes every parameter whole on this rank until the matching release_all() (calls
  /// nest); units gather nothing meanwhile, and a step all-gathers every block. Collective. Other
  /// stages: nothing to do.
  void gather_all() {
    if (stage_ != 3) return;
    if (all_ == 0) {
      finish_prefetch();
      const auto scope = labels_.scope(3, profile::Category::reduction);
      comm_->allgather_blocks(values_->span(), "parameter all-gather (whole model)");
    }
    ++all_;
  }
  void release_all() {
    if (stage_ != 3 || --all_ > 0) return;
    for (std::size_t u = 0; u < units_.size(); ++u)
      if (held_[u] == 0) release_values(units_[u]);
  }

  /// Stage 3: takes part in a forward this rank does not run (each unit gathered and released, in
  /// the model's order).
  void skip_forward() {
    for (std::size_t u = 0; u < units_.size(); ++u) {  // (the same gathers and prefetches as the others)
      gather(u, false);
      release(u);
    }
  }

  // ParamShards (stage 3): unit u's parameters gathered while held (counted also while every
  // parameter is whole, so that a release after release_all() gives them back). With prefetch,
  // the unit that runs next (in forward: u + 1; in backward: u - 1) is gathered without blocking
  // meanwhile: every rank makes the same calls, so the same collectives start in the same order.
  void gather(std::size_t u, bool backward) override {
    if (held_.at(u) == 0 && all_ == 0) {
      const auto start = clock::now();
      {
        const auto scope = labels_.scope(3, profile::Category::reduction);
        if (inflight_unit_ == u) {
          comm_->wait(unit_request_);
          inflight_unit_ = none;
          ++prefetched_;
        } else {
          finish_prefetch();
          if constexpr (GathersRanges<C>)
            comm_->allgather_range(values_->span(), units_[u].begin, units_[u].end, "parameter unit all-gather");
          ++collectives_;
        }
      }
      gathered_ += std::chrono::duration<double>(clock::now() - start).count();
      prefetch_after(u, backward);
    }
    ++held_[u];
  }
  void release(std::size_t u) override {
    if (--held_.at(u) > 0 || all_ > 0) return;
    release_values(units_[u]);
  }
  /// Stage 3 with prefetch: completes a gather in flight and gives its unit back (the parameters
  /// are about to change, or to be gathered whole). Collective (every rank calls it at the same
  /// point).
  void finish_prefetch() {
    if (inflight_unit_ == none) return;
    comm_->wait(unit_request_);
    if (held_[inflight_unit_] == 0) release_values(units_[inflight_unit_]);
    inflight_unit_ = none;
  }

  void begin_backward(Context& ctx, bool) {
    this->watch(ctx, false);  // readiness counted; stage 1 reduces in the step
    done_lo_ = done_hi_ = 0;
    if (stage2_) {
      ctx.grads_ready = &ShardedSync::on_ready;  // stages 2 and 3: each bucket as it completes
      ctx.grads_ready_user = this;
    }
  }
  /// Completes the buckets' reductions still in flight.
  void end_backward(bool) {
    while (!inflight_.empty()) finish_oldest();
    buckets_.check_complete();
    if (stage2_ && !deterministic_) release_others(0, arena_->size());  // (the buckets' ends discarded only)
  }
  /// Stage 1 with the deterministic reduction: the micro-step's gradients summed now.
  void end_micro_step(bool) {
    if (deterministic_ && !stage2_) {
      reduce_deterministic(0, arena_->size());
      optim::zero_grads(arena_->grads(), nullptr);
    }
  }
  /// Stage 2: zeroes this rank's block and gives back the rest (already zero after a backward).
  void zero_grads(backend::Executor* e) {
    std::fill(sum_.begin(), sum_.end(), 0.0f);
    if (!stage2_) return detail::SyncBase<C>::zero_grads(e);
    release_others(0, arena_->size());
    if (deterministic_)
      pages_->release(offset_, offset_ + block_);
    else
      optim::zero_grads(arena_->grads().subspan(offset_, block_), e);
  }

  /// This rank's block of the gradients, summed over ranks: stage 1 reduce-scatters it now,
  /// stage 2 did during backward. (Completes a unit's gather in flight first: the step writes
  /// this rank's block, which that gather reads.)
  std::span<float> reduce_for_step() {
    finish_prefetch();
    if (deterministic_) {  // the window's sums, where the optimizer reads this rank's block
      std::copy(sum_.begin(), sum_.end(), arena_->grads().begin() + static_cast<std::ptrdiff_t>(offset_));
      return arena_->grads().subspan(offset_, block_);
    }
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
    double norm = 0.0;
    if (deterministic_) {  // every segment's sum on every rank (one non-zero term each), added in order
      segments_.assign(arena_->size() / optim::norm_segment, 0.0);
      optim::segment_sums_of_squares(
          block, std::span<double>(segments_).subspan(offset_ / optim::norm_segment, block_ / optim::norm_segment));
      comm_->allreduce_sum(std::span<double>(segments_), "gradient norm (segments)");
      norm = optim::norm_of_segments(segments_);
    } else {
      double sq = optim::sum_of_squares(block);
      comm_->allreduce_sum(std::span<double>(&sq, 1), "gradient norm");
      norm = std::sqrt(sq);
    }
    optim::scale_to_norm(block, norm, max_norm);
    return norm;
  }
  /// All-gathers the stepped blocks (nothing when the step was skipped; stage 3: only the
  /// parameters outside the units, which gather theirs when they run).
  void after_step(bool stepped) {
    finish_prefetch();
    if (stepped) {
      const auto start = clock::now();
      share_values();
      waited_ += std::chrono::duration<double>(clock::now() - start).count();
      ++collectives_;
    }
    buckets_.count_blocking(waited_ + gathered_, collectives_);
    buckets_.count_prefetched(prefetched_);
    waited_ = gathered_ = 0.0;
    collectives_ = prefetched_ = 0;
  }

  /// Gives every rank's block of the parameters to every rank (stage 3: of the parameters outside
  /// the units only; the units gather theirs when they run). Collective.
  void share_values() {
    finish_prefetch();
    const auto scope = labels_.scope(1, profile::Category::reduction);
    if (stage_ < 3 || all_ > 0)  // (every parameter whole: every block)
      comm_->allgather_blocks(arena_->values(), "parameter all-gather");
    else if constexpr (GathersRanges<C>)
      for (const ArenaRange& r : loose_)
        comm_->allgather_range(values_->span(), r.begin, r.end, "parameter all-gather (outside the units)");
  }

  /// Each rank saves its block of the parameters and its part of the optimizer state.
  bool saves_shards() const noexcept { return true; }
  /// This rank's parts of the optimizer state's vectors (`mine`), each placed where it starts in
  /// the checkpoint's layout (the ranks' parts one after the other). Collective.
  /// (Completes a unit's gather in flight first: a load writes this rank's block.)
  template <class Optimizer>
  std::vector<StatePiece> state_pieces(typename Optimizer::State& mine) {
    finish_prefetch();
    return state_.template pieces<Optimizer>(mine);
  }
  /// The parameter values this rank saves and loads: its block (share_values() after a load).
  ArenaRange value_block() const noexcept { return owned(); }

  /// Calls f(state) with the full optimizer state, gathered from every rank's part: each state
  /// vector of the full state (`make_full()`, the optimizer's state for the unpadded arena) is
  /// the ranks' vectors one after the other, cut to its length. Collective.
  template <class Optimizer, class MakeFull, class F>
  void with_full_state(typename Optimizer::State& mine, MakeFull&& make_full, F&& f) {
    state_.template with_full<Optimizer>(mine, std::forward<MakeFull>(make_full), std::forward<F>(f));
  }
  /// The state this rank keeps (shaped as `mine`: the optimizer's state for its block), cut from
  /// a full state in a checkpoint's layout (zeros where it is shorter). Collective.
  template <class Optimizer>
  typename Optimizer::State take_state(typename Optimizer::State full, typename Optimizer::State mine) {
    return state_.template take<Optimizer>(std::move(full), std::move(mine));
  }

  void set_profiler(profile::Profiler* p) { labels_.attach(p); }

 private:
  // Stage 2: a bucket of the gradients is complete on every rank: reduce-scatter it (each rank's
  // block summed), give back the rest. A communicator without reduce_scatter_range all-reduces.
  // A communicator with ireduce_scatter_range (MPI) reduces every bucket but the last without
  // blocking backward (between nodes; within one, through shared memory, it returns done): at
  // most max_inflight at a time (their pages are held until they complete), polled at each
  // parameter's readiness, completed by end_backward.
  static void on_ready(void* self, std::uint32_t slot) {
    auto* s = static_cast<ShardedSync*>(self);
    s->poll();
    s->buckets_.ready_in_order(
        slot, [s](const auto& b) { s->reduce_bucket(b.begin, b.end, &b == &s->buckets_.buckets().back()); });
  }
  static constexpr std::size_t max_inflight = 2;
  struct Inflight {
    typename C::Request request;
    std::size_t begin, end;
  };
  // (Also progresses a unit's prefetch: within a node the buckets' reductions are done at once,
  // and Open MPI advances a non-blocking collective only inside MPI calls.)
  void poll() {
    if constexpr (IReduceScattersRanges<C>)
      while (!inflight_.empty() && comm_->test(inflight_.front().request)) {
        complete(inflight_.front());
        inflight_.pop_front();
      }
    if constexpr (IGathersRanges<C>)
      if (inflight_unit_ != none) comm_->test(unit_request_);
  }
  // Waits for the oldest reduction in flight and completes it.
  void finish_oldest() {
    const auto start = clock::now();
    comm_->wait(inflight_.front().request);
    waited_ += std::chrono::duration<double>(clock::now() - start).count();
    complete(inflight_.front());
    inflight_.pop_front();
  }
  // A bucket's reduction is complete (this rank's sums in place): the rest of it given back.
  void complete(const Inflight& f) { reduced(f.begin, f.end); }
  void reduce_bucket(std::size_t begin, std::size_t end, bool last) {
    if constexpr (IReduceScattersRanges<C>) {
      if (!deterministic_ && !last) {
        while (inflight_.size() >= max_inflight) finish_oldest();
        const auto start = clock::now();  // (within a node the reduction is done in the call)
        {
          const auto scope = labels_.scope(2, profile::Category::reduction);
          inflight_.push_back(
              {comm_->ireduce_scatter_range(arena_->grads(), begin, end, "gradient bucket reduce-scatter"), begin,
               end});
        }
        waited_ += std::chrono::duration<double>(clock::now() - start).count();
        ++collectives_;
        return;
      }
    }
    const auto start = clock::now();
    if (deterministic_) {
      reduce_deterministic(begin, end);
      pages_->release(begin, end);  // this rank's part is in sum_
    } else {
      {
        const auto scope = labels_.scope(2, profile::Category::reduction);
        if constexpr (ReduceScattersRanges<C>)
          comm_->reduce_scatter_range(arena_->grads(), begin, end, "gradient bucket reduce-scatter");
        else
          comm_->allreduce_sum(arena_->grads().subspan(begin, end - begin), "gradient bucket");
      }
      reduced(begin, end);
    }
    waited_ += std::chrono::duration<double>(clock::now() - start).count();
    ++collectives_;
  }
  // The deterministic reduce-scatter of the gradients [begin, end): every rank's values in this
  // rank's block come here (all-to-all) and are summed in TreeSync's tree over the ranks (a
  // power of two: left += right, level by level), the result added to sum_ (micro-steps in order).
  // In pieces of at most exchange_piece elements: the buffer holds ranks x a piece.
  static constexpr std::size_t exchange_piece = std::size_t{1} << 18;
  void reduce_deterministic(std::size_t begin, std::size_t end) {
    for (std::size_t b = begin; b < end; b += exchange_piece) reduce_piece(b, std::min(end, b + exchange_piece));
  }
  void reduce_piece(std::size_t begin, std::size_t end) {
    const std::size_t lo = std::clamp(offset_, begin, end), hi = std::clamp(offset_ + block_, begin, end), m = hi - lo,
                      w = comm_->size();
    exchange_.resize(w * m);
    {
      const auto scope = labels_.scope(4, profile::Category::reduction);
      if constexpr (GathersRanges<C>)
        comm_->exchange_range(arena_->grads(), begin, end, exchange_, "deterministic gradient exchange");
    }
    for (std::size_t s = 1; s < w; s *= 2)
      for (std::size_t q = 0; q + s < w; q += 2 * s) {
        float* left = exchange_.data() + q * m;
        const float* right = exchange_.data() + (q + s) * m;
        for (std::size_t i = 0; i < m; ++i) left[i] += right[i];
      }
    if (m == 0) return;  // (the exchange is collective: this rank's part of the piece is empty)
    float* sum = sum_.data() + (lo - offset_);
    for (std::size_t i = 0; i < m; ++i) sum[i] += exchange_[i];
  }

  // Stage 3: adopts the parameters into pages of their own, finds the model's units, gives back
  // their pages outside this rank's block. The parameters outside the units stay whole.
  template <class Model>
  void attach_units(Model& model) {
    if (memory::PageBuffer* pages = arena_->value_pages()) {
      values_ = pages;
    } else {
      own_values_ = memory::PageBuffer(arena_->size());
      arena_->move_values_to(model, own_values_.span());
    }
    visit_units(model, [&](const std::string& name, auto& unit) { add_unit(unit, name); });
    XTRAIN_CHECK(!units_.empty(), ValueError,
                 "zero_stage(3): the model has no layers::ShardedUnit, so no parameter can stay sharded; wrap its "
                 "blocks in ShardedUnit (a GPT's blocks are) or use zero_stage(2)");
    std::size_t at = 0;
    for (const ArenaRange& u : units_) {  // (in arena order: units are visited in layer order)
      if (u.begin > at) loose_.push_back({at, u.begin});
      at = u.end;
    }
    if (at < arena_->size()) loose_.push_back({at, arena_->size()});
    held_.assign(units_.size(), 0);
    for (const ArenaRange& u : units_) release_values(u);
  }
  // Registers `unit` (named `name`): the arena range of its parameters, which must be its own.
  template <class U>
  void add_unit(U& unit, const std::string& name) {
    const std::vector<ParamEntry>& entries = arena_->entries();
    ArenaRange r{arena_->size(), 0};
    std::size_t slots = 0;
    visit_parameters(unit.module(), [&](const std::string& param, Param& p, ParamKind) {
      const ParamEntry& e = entries.at(p.slot());
      XTRAIN_CHECK(e.aliases.empty(), ValueError, "zero_stage(3): parameter '", param, "' of unit '", name,
                   "' is tied to another use ('", e.name,
                   "'); a unit's parameters must be its own (leave tied ones outside the units)");
      r.begin = std::min(r.begin, e.offset);
      r.end = std::max(r.end,
                       e.offset + (e.size + ParamArena::alignment - 1) / ParamArena::alignment * ParamArena::alignment);
      ++slots;
    });
    if (slots == 0) return;  // nothing to shard
    std::size_t inside = 0;
    for (const ParamEntry& e : entries) inside += e.offset >= r.begin && e.offset < r.end ? 1 : 0;
    XTRAIN_CHECK(inside == slots, ValueError, "zero_stage(3): the parameters of unit '", name,
                 "' are not contiguous in the arena (", inside - slots, " other parameter(s) lie between them)");
    for (const ArenaRange& u : units_)
      XTRAIN_CHECK(r.begin >= u.end || r.end <= u.begin, ValueError, "zero_stage(3): unit '", name,
                   "' overlaps another unit (ShardedUnits do not nest)");
    unit.attach_shards(this, units_.size());
    units_.push_back(r);
    unit_names_.push_back(name);
  }
  // Stage 3 with prefetch: after gathering unit u for its forward (backward), starts gathering
  // u + 1 (u - 1), the unit that runs next in a model that runs its units in order.
  void prefetch_after(std::size_t u, bool backward) {
    if constexpr (IGathersRanges<C>) {
      if (!prefetch_ || inflight_unit_ != none) return;
      const std::size_t next = backward ? u - 1 : u + 1;  // (0 - 1 wraps past the last unit: none)
      if (next >= units_.size() || held_[next] > 0) return;
      unit_request_ = comm_->iallgather_range(values_->span(), units_[next].begin, units_[next].end,
                                              "parameter unit all-gather (prefetch)");
      inflight_unit_ = next;
      ++collectives_;
    }
  }
  // Stage 3: gives back the pages of `r` outside this rank's block (zeros read there until the
  // next gather; partial pages at the ends are zeroed instead).
  void release_values(ArenaRange r) noexcept {
    values_->release(r.begin, std::min(r.end, offset_));
    values_->release(std::max(r.begin, offset_ + block_), r.end);
  }

  // The bucket [begin, end) is reduced: gives back the whole grains (huge pages, or pages) of it
  // outside this rank's block, and where it adjoins the buckets reduced before it in this
  // backward (they complete in order, each next to the last), the grain it shares with them.
  // end_backward() releases the rest (zeros): a huge page given back in part would be split, and
  // its next use fault in 512 small pages.
  void reduced(std::size_t begin, std::size_t end) noexcept {
    const std::size_t grain = pages_->grain() / sizeof(float);
    std::size_t lo = begin, hi = end;
    if (done_lo_ == done_hi_) {
      done_lo_ = begin, done_hi_ = end;
    } else if (end == done_lo_) {
      hi = std::min(end + grain, done_hi_);
      done_lo_ = begin;
    } else if (begin == done_hi_) {
      lo = begin - std::min(begin - done_lo_, grain);
      done_hi_ = end;
    }
    discard_others(lo, hi);
  }
  // Gives back the whole grains of the gradients [begin, end) outside this rank's block.
  void discard_others(std::size_t begin, std::size_t end) noexcept {
    pages_->discard(begin, std::min(end, offset_));
    pages_->discard(std::max(begin, offset_ + block_), end);
  }
  // Zeroes the gradients [begin, end) outside this rank's block, giving their pages back.
  void release_others(std::size_t begin, std::size_t end) noexcept {
    pages_->release(begin, std::min(end, offset_));
    pages_->release(std::max(begin, offset_ + block_), end);
  }

  std::size_t block_, offset_;
  int stage_;
  bool stage2_, deterministic_, prefetch_;
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::size_t inflight_unit_ = none;  // stage 3: the unit being prefetched
  std::size_t prefetched_ = 0;        // this step's gathers that found their unit in flight
  typename C::Request unit_request_{};
  memory::PageBuffer own_grads_, own_values_;  // where the arena is not in pages of its own
  memory::PageBuffer* pages_ = &own_grads_;    // stage 2: the gradients' pages
  memory::PageBuffer* values_ = &own_values_;  // stage 3: the parameters' pages
  std::vector<ArenaRange> units_, loose_;      // stage 3: the units' ranges; those outside every unit
  std::vector<std::string> unit_names_;
  std::vector<std::size_t> held_;          // stage 3: gathers of each unit not yet released
  std::size_t all_ = 0;                    // stage 3: gather_all() calls not yet released
  AlignedVector sum_;                      // deterministic: this rank's block of the summed gradients
  AlignedVector exchange_;                 // deterministic: the ranks' copies of a bucket's part of the block
  std::vector<double> segments_;           // deterministic: the norm's segment sums
  std::deque<Inflight> inflight_;          // stages 2 and 3: bucket reductions started, oldest first
  std::size_t done_lo_ = 0, done_hi_ = 0;  // stages 2 and 3: the buckets reduced in this backward, next to each other
  double waited_ = 0.0, gathered_ = 0.0;   // this step's blocking communication, in seconds
  std::size_t collectives_ = 0;
  detail::ShardedState<C> state_;  // the optimizer state's parts in a checkpoint's layout
  profile::EventLabels<5> labels_{{"gradient reduce-scatter", "parameter all-gather", "gradient bucket reduce-scatter",
                                   "parameter unit all-gather", "deterministic gradient exchange"}};
};

}  // namespace xtrain::parallel
