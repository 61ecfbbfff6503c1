#pragma once
/// \file context.hpp
/// What a module needs to know about the step it runs in, and the cross-rank sums a module may ask
/// for (SyncBatchNorm) without depending on the communicator's type.

#include <cstddef>
#include <cstdint>
#include <span>

#include "xtrain/core/memory.hpp"

namespace xtrain {

namespace profile {
class Profiler;
}
namespace backend {
class Executor;
}

/// What a module may ask of the communicator during forward/backward (type-erased: modules are
/// not templates on the communicator). Null in Context when running on one process.
struct Collectives {
  virtual ~Collectives() = default;
  virtual std::size_t size() const = 0;
  /// In-place sum over ranks.
  virtual void allreduce_sum(std::span<double> values, const char* name) = 0;
};

/// Passed to every forward and backward call.
struct Context {
  bool training = true;           ///< train mode (BatchNorm batch stats, Dropout active)
  bool input_grad = true;         ///< backward must produce dx (Sequential clears it for its first module)
  std::uint64_t seed = 0;         ///< seed of the dropout streams
  std::uint64_t step = 0;         ///< global optimizer step (dropout masks differ per step)
  std::size_t sample_offset = 0;  ///< global index of this batch's first sample (rank-invariant masks)
  /// Called once per use of a parameter when its gradient is final for this backward, with the
  /// parameter's arena slot (xtrain::backward reports a module's own parameters after its
  /// backward; gradient buckets start their reductions from it). May be null.
  void (*grads_ready)(void* user, std::uint32_t slot) = nullptr;
  void* grads_ready_user = nullptr;
  /// Cross-rank sums for modules that need them (SyncBatchNorm); null on one process.
  Collectives* collectives = nullptr;
  /// Records each module's forward and backward when set and recording (core/profiler.hpp);
  /// null when no profiler is attached.
  profile::Profiler* profiler = nullptr;
  /// Where kernels run their loops and keep their scratch (the Backend's executor,
  /// backend/cpu.hpp). Null: on the calling thread, with scratch allocated per kernel call (set a
  /// backend::Serial to reuse it when calling modules yourself).
  backend::Executor* executor = nullptr;
  /// Where the modules' buffers (outputs, saved activations, gradients of inputs) are allocated:
  /// xtrain::forward and xtrain::backward make it the current resource for the call (the
  /// Backend's memory; the engine sets both). Null: the calling thread's current resource.
  memory::Resource* memory = nullptr;
};

}  // namespace xtrain
