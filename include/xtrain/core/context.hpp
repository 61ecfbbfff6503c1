#pragma once
/// \file context.hpp
/// What a layer needs to know about the step it runs in.

#include <cstddef>
#include <cstdint>

namespace xtrain {

namespace parallel {
struct Collectives;
}

/// Passed to every forward and backward call.
struct Context {
  bool training = true;           ///< train mode (BatchNorm batch stats, Dropout active)
  bool input_grad = true;         ///< backward must produce dx (Sequential clears it for layer 0)
  std::uint64_t seed = 0;         ///< seed of the dropout streams
  std::uint64_t step = 0;         ///< global optimizer step (dropout masks differ per step)
  std::size_t layer = 0;          ///< index of the running layer in its Sequential
  std::size_t sample_offset = 0;  ///< global index of this batch's first row (rank-invariant masks)
  /// Called by Sequential::backward after layer `layer` has added its parameter gradients
  /// (the hook gradient buckets use to start communication early). May be null.
  void (*grads_ready)(void* user, std::size_t layer) = nullptr;
  void* grads_ready_user = nullptr;
  /// Cross-rank sums for layers that need them (SyncBatchNorm); null on one process.
  parallel::Collectives* collectives = nullptr;
};

}  // namespace xtrain
