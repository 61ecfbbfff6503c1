#pragma once
/// \file deterministic.hpp
/// The rank-count-invariant gradient reduction: the gradient of every chunk of the global batch
/// is computed alone (by the engine), this rank's chunks are summed in a balanced binary tree, the
/// ranks' subtree roots are all-gathered and combined in the same tree, then accumulated
/// micro-steps are added in order. For power-of-two rank counts dividing the chunk count the tree
/// is the same whatever the rank count: bitwise identical parameters on 1, 2 or 4 ranks.

#include <algorithm>
#include <cstddef>
#include <span>

#include "xtrain/core/error.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/parallel/tree_sum.hpp"

namespace xtrain {

class DeterministicReduction {
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

  /// Adds one chunk's gradient (in chunk order).
  void push(std::span<const float> grads) { tree_.push(grads); }

  /// Ends micro-step `micro` of the accumulation window: its chunks' tree sum is kept.
  void end_micro_step(std::size_t micro, std::size_t n) {
    pending_.resize((micro + 1) * n);
    tree_.result(std::span<float>(pending_).subspan(micro * n, n));
  }

  /// Writes into `grads` the sum over ranks (a tree) and micro-steps (in order). Collective.
  template <class Communicator>
  void reduce(Communicator& comm, std::span<float> grads) {
    const std::size_t n = grads.size(), micro = pending_.size() / n, w = comm.size();
    gathered_.resize(pending_.size() * w);
    comm.allgather(pending_, gathered_, "deterministic gradient gather");
    std::fill(grads.begin(), grads.end(), 0.0f);
    root_.resize(n);
    for (std::size_t m = 0; m < micro; ++m) {  // ranks in a balanced tree, then micro-steps in order
      for (std::size_t r = 0; r < w; ++r) tree_.push(std::span<const float>(gathered_).subspan((r * micro + m) * n, n));
      tree_.result(root_);
      for (std::size_t i = 0; i < n; ++i) grads[i] += root_[i];
    }
    pending_.clear();
  }

 private:
  parallel::TreeSum tree_;
  AlignedVector pending_, gathered_, root_;
};

}  // namespace xtrain
