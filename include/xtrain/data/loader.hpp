#pragma once
/// \file loader.hpp
/// Batches from a Dataset in the order of the GlobalSampler, gathered into buffers that are
/// reused from step to step (no allocation once the first batch of each size is built). With an
/// executor that runs background work (backend::CpuThreads of 2 or more threads) and a training
/// step that leaves its workers idle (it ran no loop on several threads: a small model), batch
/// k + 1 is gathered on a worker while the caller trains on batch k, as a PyTorch DataLoader's
/// worker prefetches: the same samples, in the same order, off the step's critical path. A step
/// that keeps the workers busy gets its batch gathered on all threads at the call instead (a
/// worker gathering would hold up the step's first split loop longer than the gather takes split).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "xtrain/backend/executor.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/data/dataset.hpp"
#include "xtrain/parallel/sampler.hpp"

namespace xtrain::data {

/// One rank's batch: inputs, targets and where they sit in the global batch.
template <class Input = Tensor<float>, class Target = Tensor<std::int32_t>>
struct Batch {
  const Input& x;
  const Target& y;
  std::size_t global_offset;  ///< position of sample 0 in the global batch
  std::size_t global_count;   ///< samples in the global batch, all ranks together
  /// Samples in this rank's batch.
  std::size_t size() const noexcept { return x.dimension() ? x.shape(0) : 0; }
};

template <Dataset D>
class Loader {
 public:
  /// `global_batch` samples per step over all ranks; this rank gets its shard of each.
  Loader(const D& dataset, std::size_t global_batch, std::uint64_t seed, bool shuffle = true, bool drop_last = false,
         std::size_t rank = 0, std::size_t world = 1, std::size_t chunk = 0)
      : data_(&dataset),
        sampler_(dataset.size(), global_batch, seed, shuffle, drop_last, rank, world, chunk),
        buffers_(std::make_unique<Buffers>()) {}
  Loader(Loader&&) noexcept = default;  // the buffers (and a prefetch into them) stay where they are
  Loader& operator=(Loader&&) = delete;
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;
  ~Loader() {
    if (buffers_) drop_prefetch();  // (a moved-from Loader may only be destroyed)
  }

  /// Starts epoch `epoch`'s order (a batch prefetched for the previous order is dropped).
  void set_epoch(std::uint64_t epoch) {
    drop_prefetch();
    sampler_.set_epoch(epoch);
    buffers_->called = false;  // what ran between epochs (an evaluation) says nothing of a step
  }
  std::size_t batches() const noexcept { return sampler_.batches(); }

  using batch_type = Batch<typename D::input_type, typename D::target_type>;

  /// Gathers batch k of the current epoch (or takes it from the prefetch), then starts gathering
  /// batch k + 1 in the background where the executor can and the last step left its workers
  /// idle. The returned references stay valid until the next call.
  batch_type batch(std::size_t k) {
    const parallel::Shard s = sampler_.shard(k);
    Buffers& b = *buffers_;
    const bool prefetched = b.pending && b.pending_batch == k;
    if (prefetched)
      finish_prefetch();  // rethrows what the background gather threw
    else
      drop_prefetch();
    // Whether the step since the last call ran loops on several threads (its workers were busy);
    // before the first step nothing is known: no prefetch.
    const std::uint64_t loops = executor_ ? executor_->parallel_loops() : 0;
    const bool step_forked = !b.called || loops != b.loops_after_last_call;
    b.called = true;
    if (prefetched) {
      b.current ^= 1;
    } else {
      gather_now(s.indices, b.x[b.current], b.y[b.current]);
    }
    b.loops_after_last_call = executor_ ? executor_->parallel_loops() : 0;
    if (prefetch_ && !step_forked && executor_ && executor_->runs_background() && k + 1 < batches()) {
      const std::size_t next = b.current ^ 1;
      const std::span<const std::uint32_t> indices = sampler_.shard(k + 1).indices;
      // The next buffers are sized here, so the worker only writes: the batches stay this thread's memory.
      size_like(b.x[b.current], indices.size(), b.x[next]);
      size_like(b.y[b.current], indices.size(), b.y[next]);
      b.task = {data_, indices, &b.x[next], &b.y[next]};
      b.pending_batch = k + 1;
      b.ticket = executor_->start_background(b.task);
      b.pending = true;
    }
    return {b.x[b.current], b.y[b.current], s.global_offset, s.global_count};
  }

  /// The backend's executor: the batch is allocated from its memory resource, and gathered on its
  /// threads (when the data set has a gather taking an executor), the next one in the background
  /// when the executor runs background work. Null: the calling thread's current memory, one
  /// thread. Another memory than before drops the batch buffers (a batch returned before no longer
  /// holds data). The executor must outlive this Loader (or be replaced before it dies): a pending
  /// prefetch is waited for.
  void set_executor(backend::Executor* e) {
    drop_prefetch();
    executor_ = e;
    memory::Resource* memory = e ? &e->memory() : nullptr;
    if (memory == bound_) return;
    bound_ = memory;  // the batch buffers are made in that memory from now on (null: the current)
    Buffers& b = *buffers_;
    for (int i = 0; i < 2; ++i) {
      if constexpr (std::is_constructible_v<Input, memory::Resource&>) b.x[i] = memory ? Input(*memory) : Input();
      if constexpr (std::is_constructible_v<Target, memory::Resource&>) b.y[i] = memory ? Target(*memory) : Target();
    }
  }
  /// Whether to gather the next batch in the background (on by default; it needs an executor
  /// that runs background work, and a Dataset whose gather may run on another thread).
  void set_prefetch(bool on) {
    if (!on) drop_prefetch();
    prefetch_ = on;
  }

  const parallel::GlobalSampler& sampler() const noexcept { return sampler_; }

 private:
  using Input = typename D::input_type;
  using Target = typename D::target_type;

  // The background gather of one batch: its samples and where they go.
  struct Gather {
    const D* data = nullptr;
    std::span<const std::uint32_t> indices;
    Input* x = nullptr;
    Target* y = nullptr;
    void operator()(std::size_t) const { data->gather(indices, *x, *y); }
  };
  // Two batches: the one handed out (current) and the one being prefetched. On the heap, so that a
  // moved Loader's running prefetch still writes into them.
  struct Buffers {
    Input x[2];
    Target y[2];
    unsigned current = 0;
    Gather task;
    bool pending = false;
    std::size_t pending_batch = 0;
    std::uint64_t ticket = 0;
    std::uint64_t loops_after_last_call = 0;  // the executor's parallel_loops() when batch() returned
    bool called = false;                      // batch() was called since the last set_epoch
  };

  // `to` resized to `from`'s shape with `rows` rows (what the gather will give it).
  template <class T>
  static void size_like(const T& from, std::size_t rows, T& to) {
    if constexpr (requires { resize_rows_like(from, rows, to); }) resize_rows_like(from, rows, to);
  }

  // The data set's code allocates in the backend's memory too (what is not one of our buffers).
  void gather_now(std::span<const std::uint32_t> indices, Input& x, Target& y) {
    const memory::Use use(executor_ ? &executor_->memory() : nullptr);
    if constexpr (requires { data_->gather(indices, x, y, executor_); })
      data_->gather(indices, x, y, executor_);  // rows split over the backend's threads
    else
      data_->gather(indices, x, y);
  }

  // Waits for the pending prefetch (the batch about to be handed out): rethrows what it threw.
  void finish_prefetch() {
    Buffers& b = *buffers_;
    if (!b.pending) return;
    b.pending = false;
    executor_->wait_background(b.ticket);
  }
  // Waits for a pending prefetch nobody will take: its error, if any, goes with it.
  void drop_prefetch() noexcept {
    try {
      finish_prefetch();
    } catch (...) {  // a batch nobody asked for failed: nothing to report it to
    }
  }

  const D* data_;
  parallel::GlobalSampler sampler_;
  backend::Executor* executor_ = nullptr;
  bool prefetch_ = true;
  memory::Resource* bound_ = nullptr;  // the memory the batch buffers are made in (set_executor)
  std::unique_ptr<Buffers> buffers_;
};

}  // namespace xtrain::data
