#pragma once
/// \file sync_tree.hpp
/// TreeSync: the rank-count-invariant gradient synchronisation. The global batch is cut into
/// chunks of a fixed number of samples; the engine computes each chunk's gradient alone, this
/// rank sums its chunks in a balanced binary tree (tree_sum.hpp), the ranks' subtree roots are
/// all-gathered and combined in the same tree, and the micro-steps of an accumulation window are
/// added in order. For power-of-two rank counts dividing the chunk count the tree is the same
/// whatever the rank count: bitwise identical parameters on 1, 2 or 4 ranks.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/core/profiler.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/optim/clip.hpp"
#include "xtrain/parallel/buckets.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/gradient_sync.hpp"
#include "xtrain/parallel/sync_base.hpp"
#include "xtrain/parallel/tree_sum.hpp"

namespace xtrain::parallel {

template <Communicator C>
class TreeSync : public detail::SyncBase<C> {
  using detail::SyncBase<C>::comm_, detail::SyncBase<C>::arena_, detail::SyncBase<C>::buckets_;

 public:
  /// Throws ValueError unless `global_batch` splits into power-of-two halves of `chunk` samples
  /// over `ranks` ranks.
  static void check_layout(std::size_t chunk, std::size_t global_batch, std::size_t ranks) {
    XTRAIN_CHECK(global_batch > 0 && global_batch % chunk == 0, ValueError,
                 "deterministic reduction: the global batch ", global_batch, " must be a multiple of the chunk size ",
                 chunk);
    const std::size_t chunks = global_batch / chunk;
    XTRAIN_CHECK(chunks % ranks == 0 && ((chunks / ranks) & (chunks / ranks - 1)) == 0 && (ranks & (ranks - 1)) == 0,
                 ValueError, "deterministic reduction: ", chunks, " chunks of ", chunk,
                 " samples cannot be split into equal power-of-two halves over ", ranks,
                 " ranks (use a power-of-two rank count and global batch / chunk)");
  }

  /// Chunks of `chunk` samples of a global batch of `global_batch`, over `comm`'s ranks; buffers
  /// from `memory`; readiness counted per bucket of `bucket_bytes` (nothing is reduced by
  /// bucket). `comm`, `arena` and `memory` must outlive this object.
  TreeSync(C& comm, ParamArena& arena, std::size_t bucket_bytes, std::size_t chunk, std::size_t global_batch,
           memory::Resource& memory)
      : detail::SyncBase<C>(comm, arena, bucket_bytes),
        chunk_(chunk),
        chunks_(global_batch / chunk / comm.size()),
        tree_(memory),
        pending_(memory::Allocator<float>(&memory)),
        gathered_(memory::Allocator<float>(&memory)),
        root_(memory::Allocator<float>(&memory)),
        x_f32_(memory),
        y_f32_(memory),
        x_i32_(memory),
        y_i32_(memory) {
    check_layout(chunk, global_batch, comm.size());
  }

  template <class Model>
  void attach(Model&) {}  // chunk sums are gathered from buffers of their own

  /// Samples per chunk; the engine computes chunks_per_rank() chunks per micro-step.
  std::size_t chunk() const noexcept { return chunk_; }
  std::size_t chunks_per_rank() const noexcept { return chunks_; }
  ArenaRange owned() const noexcept { return {0, arena_->size()}; }

  /// Runs a micro-step of this rank's micro-batch (x, y) chunk by chunk: for each of its
  /// chunks_per_rank() chunks, zero() (each chunk's gradient starts from zero), then
  /// run(x_chunk, y_chunk, first_row) when the chunk holds samples (a rank with fewer rows has
  /// empty chunks at the end); then the chunk's gradient joins this rank's tree.
  template <class X, class Y, class Zero, class Run>
  void for_each_chunk(const X& x, const Y& y, Zero&& zero, Run&& run) {
    const std::size_t rows = x.dimension() ? x.shape(0) : 0;
    for (std::size_t j = 0; j < chunks_; ++j) {
      zero();
      const std::size_t begin = std::min(j * chunk_, rows), end = std::min(begin + chunk_, rows);
      if (end > begin) {
        const Y& cy = copy_rows(y, begin, end, buffer<typename Y::value_type>(false));
        run(copy_rows(x, begin, end, buffer<typename X::value_type>(true)), cy, begin);
      }
      tree_.push(arena_->grads());  // the chunk's gradient (from zero) joins this rank's tree
    }
  }

  void begin_backward(Context& ctx, bool) {
    this->watch(ctx, false);  // readiness counted, nothing reduced
  }
  void end_backward(bool) { buckets_.check_complete(); }
  /// The micro-step's tree sum is kept; at the end of the window the ranks' sums are combined.
  void end_micro_step(bool last) {
    const std::size_t n = arena_->size(), micro = pending_.size() / n;
    pending_.resize((micro + 1) * n);
    tree_.result(std::span<float>(pending_).subspan(micro * n, n));
    if (!last) return;
    const auto scope = labels_.scope(0, profile::Category::reduction);
    reduce(arena_->grads());
  }

  std::span<float> reduce_for_step() { return arena_->grads(); }
  bool agree(bool found) { return found; }
  /// The norm summed segment by segment (as the sharded deterministic reduction sums it).
  double clip_grad_norm(std::span<float> grads, double max_norm) {
    return optim::clip_grad_norm_segmented(grads, max_norm);
  }
  void after_step(bool) {}

  void set_profiler(profile::Profiler* p) { labels_.attach(p); }

 private:
  // A chunk's copy of the inputs or of the targets.
  template <class T>
  Tensor<T>& buffer(bool input) {
    if constexpr (std::is_same_v<T, float>)
      return input ? x_f32_ : y_f32_;
    else
      return input ? x_i32_ : y_i32_;
  }

  // Writes into `grads` the sum over ranks (a tree) and micro-steps (in order). Collective.
  void reduce(std::span<float> grads) {
    const std::size_t n = grads.size(), micro = pending_.size() / n, w = comm_->size();
    gathered_.resize(pending_.size() * w);
    comm_->allgather(pending_, gathered_, "deterministic gradient gather");
    std::fill(grads.begin(), grads.end(), 0.0f);
    root_.resize(n);
    for (std::size_t m = 0; m < micro; ++m) {  // ranks in a balanced tree, then micro-steps in order
      for (std::size_t r = 0; r < w; ++r) tree_.push(std::span<const float>(gathered_).subspan((r * micro + m) * n, n));
      tree_.result(root_);
      for (std::size_t i = 0; i < n; ++i) grads[i] += root_[i];
    }
    pending_.clear();
  }

  std::size_t chunk_, chunks_;
  TreeSum tree_;
  AlignedVector pending_, gathered_, root_;
  Tensor<float> x_f32_, y_f32_;
  Tensor<std::int32_t> x_i32_, y_i32_;
  profile::EventLabels<1> labels_{{"gradient tree reduction"}};
};

}  // namespace xtrain::parallel
