#pragma once
/// \file buckets.hpp
/// Gradient buckets (as PyTorch DDP): contiguous slices of the flat gradient buffer, formed in
/// reverse layer order. Backward reports each finished layer; a bucket whose layers are all done
/// starts its non-blocking allreduce at once, overlapping communication with the rest of
/// backward. A small model is one bucket: one collective per step.

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "xtrain/core/param_arena.hpp"
#include "xtrain/parallel/communicator.hpp"

namespace xtrain::parallel {

/// The layer index a parameter belongs to: the first component of its name ("3.weight" -> 3);
/// 0 when the name does not start with a number (a model that is a single layer).
inline std::size_t layer_of(const std::string& name) {
  char* end = nullptr;
  const unsigned long v = std::strtoul(name.c_str(), &end, 10);
  return end != name.c_str() && *end == '.' ? v : 0;
}

/// Communication time of the gradient reductions, accumulated over steps.
struct CommStats {
  double waiting_seconds = 0.0;  ///< blocked in wait() after backward (exposed communication)
  double overlap_seconds = 0.0;  ///< from the first bucket's start to the end of backward
  std::size_t steps = 0;
  std::size_t collectives = 0;
};

template <Communicator C>
class GradientBuckets {
 public:
  struct Bucket {
    std::size_t begin = 0, end = 0;  ///< slice of the flat gradient buffer
    std::size_t first_layer = 0;     ///< lowest layer index with parameters in the bucket
    bool started = false;
    typename C::Request request{};
  };

  GradientBuckets() = default;

  /// Requires bucket_bytes > 0. Buckets hold whole parameters: a bucket is closed before the
  /// next parameter would take it past bucket_bytes, so the last layers' gradients are not held
  /// back by a large first layer; a parameter larger than bucket_bytes gets a bucket of its own.
  GradientBuckets(const ParamArena& arena, std::size_t bucket_bytes) {
    const auto& entries = arena.entries();
    const std::size_t limit = bucket_bytes / sizeof(float);
    Bucket current;
    current.begin = current.end = arena.size();
    for (std::size_t i = entries.size(); i-- > 0;) {
      const ParamEntry& e = entries[i];
      if (current.end > current.begin && current.end - e.offset > limit) {  // e would overflow it
        buckets_.push_back(current);
        current = Bucket{};
        current.begin = current.end = buckets_.back().begin;
      }
      current.begin = i == 0 ? 0 : e.offset;
      current.first_layer = layer_of(e.name);
    }
    buckets_.push_back(current);
  }

  const std::vector<Bucket>& buckets() const noexcept { return buckets_; }

  /// Layer `layer` has finished backward: start every bucket whose layers are all done, and
  /// progress the ones in flight. After layer 0 nothing is left to overlap with: finish() takes
  /// the remaining buckets on the faster blocking path.
  void layer_done(C& comm, std::span<float> grads, std::size_t layer) {
    if (layer == 0 || compressed(comm)) return;  // compressed reductions are blocking: all in finish()
    for (auto& b : buckets_) {
      if (b.started) {
        comm.test(b.request);
        continue;
      }
      if (b.first_layer < layer) break;  // buckets start in order
      start(comm, grads, b);
    }
  }

  /// Starts what has not started and waits for everything: the gradients are then summed.
  void finish(C& comm, std::span<float> grads) {
    const auto now = std::chrono::steady_clock::now();
    if (any_started_) stats_.overlap_seconds += std::chrono::duration<double>(now - first_start_).count();
    // Buckets not started yet have nothing left to overlap with: reduce them with the blocking
    // collective (faster than the non-blocking one in Open MPI), then complete the others.
    for (auto& b : buckets_)
      if (!b.started) {
        const auto slice = grads.subspan(b.begin, b.end - b.begin);
        if constexpr (CompressesGradients<C>)
          comm.allreduce_gradients(slice, "gradient bucket");
        else
          comm.allreduce_sum(slice, "gradient bucket");
        ++stats_.collectives;
      }
    for (auto& b : buckets_) {
      if (b.started) comm.wait(b.request);
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

 private:
  static bool compressed(C& comm) {
    if constexpr (CompressesGradients<C>)
      return comm.gradient_compression() != Compression::none;
    else
      return false;
  }

  void start(C& comm, std::span<float> grads, Bucket& b) {
    if (!any_started_) first_start_ = std::chrono::steady_clock::now();
    any_started_ = true;
    b.request = comm.iallreduce_sum(grads.subspan(b.begin, b.end - b.begin), "gradient bucket");
    b.started = true;
    ++stats_.collectives;
  }

  std::vector<Bucket> buckets_;
  CommStats stats_;
  bool any_started_ = false;
  std::chrono::steady_clock::time_point first_start_{};
};

}  // namespace xtrain::parallel
