#pragma once
/// \file loader.hpp
/// Batches from a Dataset in the order of the GlobalSampler, gathered into buffers that are
/// reused from step to step (no allocation once the first batch of each size is built).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "xtrain/backend/executor.hpp"
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
      : data_(&dataset), sampler_(dataset.size(), global_batch, seed, shuffle, drop_last, rank, world, chunk) {}

  void set_epoch(std::uint64_t epoch) { sampler_.set_epoch(epoch); }
  std::size_t batches() const noexcept { return sampler_.batches(); }

  using batch_type = Batch<typename D::input_type, typename D::target_type>;

  /// Gathers batch k of the current epoch. The returned references stay valid until the next call.
  batch_type batch(std::size_t k) {
    const parallel::Shard s = sampler_.shard(k);
    const backend::UseMemoryOf use(executor_);  // the batch lives in the backend's memory
    if constexpr (requires { data_->gather(s.indices, x_, y_, executor_); })
      data_->gather(s.indices, x_, y_, executor_);  // rows split over the backend's threads
    else
      data_->gather(s.indices, x_, y_);
    return {x_, y_, s.global_offset, s.global_count};
  }

  /// The backend's executor: the batch is allocated from its memory resource, and gathered on its
  /// threads (when the data set has a gather taking an executor). Null: host memory, one thread.
  void set_executor(backend::Executor* e) noexcept { executor_ = e; }

  const parallel::GlobalSampler& sampler() const noexcept { return sampler_; }

 private:
  const D* data_;
  parallel::GlobalSampler sampler_;
  backend::Executor* executor_ = nullptr;
  typename D::input_type x_;
  typename D::target_type y_;
};

}  // namespace xtrain::data
