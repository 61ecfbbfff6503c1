#pragma once
/// \file buckets.hpp
/// Gradient buckets (as PyTorch DDP): contiguous slices of the flat gradient buffer, formed from
/// the last parameter backwards. Backward reports each parameter use whose gradient is final
/// (xtrain::backward does, per module); a bucket counts its pending uses (DDP's reducer does the
/// same) and, once none is left, starts its non-blocking allreduce, overlapping communication
/// with the rest of backward. A small model is one bucket: one collective per step.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "xtrain/core/error.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/core/profiler.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/gradient_sync.hpp"

namespace xtrain::parallel {

template <Communicator C>
class GradientBuckets {
 public:
  struct Bucket {
    std::size_t begin = 0, end = 0;             ///< slice of the flat gradient buffer
    std::size_t first_slot = 0, last_slot = 0;  ///< arena entries [first_slot, last_slot] in the bucket
    std::size_t uses = 0;                       ///< parameter uses to report before it can start
    bool started = false;
    typename C::Request request{};
    std::chrono::steady_clock::time_point start_time{};  // when its non-blocking allreduce started
  };

  GradientBuckets() = default;

  /// Requires bucket_bytes > 0. Buckets hold whole parameters: a bucket is closed before the
  /// next parameter would take it past bucket_bytes, so the last layers' gradients are not held
  /// back by a large first layer; a parameter larger than bucket_bytes gets a bucket of its own.
  GradientBuckets(const ParamArena& arena, std::size_t bucket_bytes) : arena_(&arena) {
    const auto& entries = arena.entries();
    const std::size_t limit = bucket_bytes / sizeof(float);
    slot_bucket_.assign(entries.size(), 0);
    reported_.assign(entries.size(), 0);
    Bucket current;
    current.begin = current.end = arena.size();
    current.last_slot = entries.empty() ? 0 : entries.size() - 1;
    for (std::size_t i = entries.size(); i-- > 0;) {
      const ParamEntry& e = entries[i];
      if (current.end > current.begin && current.end - e.offset > limit) {  // e would overflow it
        buckets_.push_back(current);
        current = Bucket{};
        current.begin = current.end = buckets_.back().begin;
        current.last_slot = i;
      }
      current.begin = i == 0 ? 0 : e.offset;
      current.first_slot = i;
      current.uses += e.uses();
      slot_bucket_[i] = buckets_.size();
    }
    buckets_.push_back(current);
    pending_.assign(buckets_.size(), 0);
  }

  const std::vector<Bucket>& buckets() const noexcept { return buckets_; }

  /// Records each bucket's reduction in `p` (null: none): a non-blocking one on the communication
  /// track from its start to its completion, a blocking one on the compute thread.
  void set_profiler(profile::Profiler* p) {
    profiler_ = p;
    labels_.clear();
    blocking_labels_.clear();
    if (!p) return;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      labels_.push_back(p->label("", "allreduce bucket " + std::to_string(b)));
      blocking_labels_.push_back(p->label("", "allreduce bucket " + std::to_string(b) + " (blocking)"));
    }
  }

  /// Starts counting a backward: every bucket waits for all the uses of its parameters. With
  /// `reduce` the buckets start their reductions as they complete (then call finish()); without,
  /// the uses are only counted (then call check_complete()), so that a model whose parameters do
  /// not all report fails on one rank as it would on several.
  void begin_backward(bool reduce = true) {
    for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].uses;
    std::fill(reported_.begin(), reported_.end(), 0);
    next_ = 0;
    complete_ = 0;
    reduce_ = reduce;
  }

  /// Throws ValueError naming a parameter whose gradient was not reported ready in this backward.
  void check_complete() const {
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      if (pending_[b] != 0) missing(b);
  }

  /// The gradient of one use of arena slot `slot` is final. A bucket with no pending use left
  /// starts (buckets start in order, as every rank must start its collectives in the same order),
  /// unless it is the last to complete: backward is then over, and finish() takes the faster
  /// blocking path. Throws ValueError naming the parameter when a slot is reported more often
  /// than it is used.
  void ready(C& comm, std::span<float> grads, std::uint32_t slot) {
    const std::size_t b = count_use(slot);
    if (pending_[b] != 0) return;
    if (++complete_ == buckets_.size() || !reduce_ || compressed(comm))
      return;  // compressed reductions: all in finish()
    for (auto& bucket : buckets_)
      if (bucket.started) comm.test(bucket.request);
    while (next_ < buckets_.size() && pending_[next_] == 0 && complete_ < buckets_.size())
      start(comm, grads, buckets_[next_++]);
  }

  /// As ready(), for a mode that reduces each bucket itself (ZeRO-2): counts the use of `slot`,
  /// then calls f(bucket) for each bucket, in order, whose uses are all reported (every rank hands
  /// the buckets out in the same order; f may run a blocking collective).
  template <class F>
  void ready_in_order(std::uint32_t slot, F&& f) {
    if (pending_[count_use(slot)] != 0) return;
    while (next_ < buckets_.size() && pending_[next_] == 0) f(buckets_[next_++]);
  }

  /// Starts what has not started and waits for everything: the gradients are then summed.
  /// Throws ValueError naming a parameter whose gradient was never reported ready (its bucket
  /// would otherwise be reduced before or without it).
  void finish(C& comm, std::span<float> grads) {
    check_complete();
    const auto now = std::chrono::steady_clock::now();
    if (any_started_) stats_.overlap_seconds += std::chrono::duration<double>(now - first_start_).count();
    // Buckets not started yet have nothing left to overlap with: reduce them with the blocking
    // collective (faster than the non-blocking one in Open MPI), then complete the others.
    for (std::size_t i = 0; i < buckets_.size(); ++i)
      if (auto& b = buckets_[i]; !b.started) {
        const auto scope = profiler_ ? profiler_->scope(blocking_labels_[i], profile::Category::reduction)
                                     : profile::Profiler::Scope{};
        const auto slice = grads.subspan(b.begin, b.end - b.begin);
        if constexpr (CompressesGradients<C>)
          comm.allreduce_gradients(slice, "gradient bucket");
        else
          comm.allreduce_sum(slice, "gradient bucket");
        ++stats_.collectives;
      }
    for (std::size_t i = 0; i < buckets_.size(); ++i) {
      auto& b = buckets_[i];
      if (b.started) {
        comm.wait(b.request);
        if (profiler_)
          profiler_->span(labels_[i], profile::Category::communication, 1, b.start_time,
                          std::chrono::steady_clock::now());
      }
      b.started = false;
    }
    stats_.waiting_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - now).count();
    ++stats_.steps;
    any_started_ = false;
  }

  const CommStats& stats() const noexcept { return stats_; }
  void reset_stats() noexcept { stats_ = {}; }
  /// Counts `collectives` blocking reductions made outside the buckets (the sharded step's
  /// reduce-scatter and all-gather) that took `seconds`, as waiting time of one step.
  void count_blocking(double seconds, std::size_t collectives) noexcept {
    stats_.waiting_seconds += seconds;
    stats_.collectives += collectives;
    ++stats_.steps;
  }
  /// Counts ZeRO-3 unit gathers that were in flight when their unit ran.
  void count_prefetched(std::size_t units) noexcept { stats_.units_prefetched += units; }

 private:
  static bool compressed(C& comm) {
    if constexpr (CompressesGradients<C>)
      return comm.gradient_compression() != Compression::none;
    else
      return false;
  }

  // Counts one use of `slot` (throws when reported more often than used); returns its bucket.
  std::size_t count_use(std::uint32_t slot) {
    const ParamEntry& e = arena_->entries().at(slot);
    XTRAIN_CHECK(++reported_[slot] <= e.uses(), ValueError, "parameter '", e.name, "' was reported ready ",
                 reported_[slot], " times in one backward but is used ", e.uses(),
                 " time(s) (does a container run a child's backward twice?)");
    const std::size_t b = slot_bucket_[slot];
    --pending_[b];
    return b;
  }

  [[noreturn]] void missing(std::size_t b) const {
    const auto& entries = arena_->entries();
    for (std::size_t i = buckets_[b].first_slot; i <= buckets_[b].last_slot; ++i)
      if (reported_[i] < entries[i].uses())
        throw ValueError("gradient bucket " + std::to_string(b) + " never completed: parameter '" + entries[i].name +
                         "' was reported ready " + std::to_string(reported_[i]) + " of " +
                         std::to_string(entries[i].uses()) +
                         " time(s) in this backward (a container must run its children's backward through "
                         "xtrain::backward, and every parameter must take part in the step)");
    throw ValueError("gradient bucket " + std::to_string(b) + " never completed");
  }

  void start(C& comm, std::span<float> grads, Bucket& b) {
    if (!any_started_) first_start_ = std::chrono::steady_clock::now();
    if (profiler_) b.start_time = std::chrono::steady_clock::now();
    any_started_ = true;
    b.request = comm.iallreduce_sum(grads.subspan(b.begin, b.end - b.begin), "gradient bucket");
    b.started = true;
    ++stats_.collectives;
  }

  const ParamArena* arena_ = nullptr;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> slot_bucket_, reported_, pending_;
  std::size_t next_ = 0, complete_ = 0;
  bool reduce_ = true;
  CommStats stats_;
  bool any_started_ = false;
  std::chrono::steady_clock::time_point first_start_{};
  profile::Profiler* profiler_ = nullptr;
  std::vector<std::uint32_t> labels_, blocking_labels_;
};

}  // namespace xtrain::parallel
