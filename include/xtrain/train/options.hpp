#pragma once
/// \file options.hpp
/// Trainer options, set by name and chained: `TrainerOptions{}.batch_size(32).epochs(10).seed(42)`.

#include <cstddef>
#include <cstdint>

#include "xtrain/core/error.hpp"
#include "xtrain/optim/schedule.hpp"

namespace xtrain {

class TrainerOptions {
 public:
  /// Samples per optimizer step on each process (DDP/Accelerate convention). Default 32.
  TrainerOptions& batch_size(std::size_t v) {
    XTRAIN_CHECK(v > 0, ValueError, "TrainerOptions: batch_size must be positive");
    batch_size_ = v;
    return *this;
  }
  /// Passes over the training set. Default 10.
  TrainerOptions& epochs(std::size_t v) {
    epochs_ = v;
    return *this;
  }
  /// Seed of the data order and dropout masks. Default 42.
  TrainerOptions& seed(std::uint64_t v) {
    seed_ = v;
    return *this;
  }
  /// Shuffle the training set each epoch. Default true.
  TrainerOptions& shuffle(bool v) {
    shuffle_ = v;
    return *this;
  }
  /// Drop the last partial batch of each epoch. Default false.
  TrainerOptions& drop_last(bool v) {
    drop_last_ = v;
    return *this;
  }
  /// Batch size for evaluation (results do not depend on it). Default 1024.
  TrainerOptions& eval_batch_size(std::size_t v) {
    XTRAIN_CHECK(v > 0, ValueError, "TrainerOptions: eval_batch_size must be positive");
    eval_batch_size_ = v;
    return *this;
  }
  /// Learning-rate schedule over optimizer steps. Default constant.
  TrainerOptions& schedule(const optim::LrSchedule& v) {
    schedule_ = v;
    return *this;
  }
  /// Print one line per epoch (and a progress bar on a terminal). Default true.
  TrainerOptions& verbose(bool v) {
    verbose_ = v;
    return *this;
  }

  std::size_t batch_size() const noexcept { return batch_size_; }
  std::size_t epochs() const noexcept { return epochs_; }
  std::uint64_t seed() const noexcept { return seed_; }
  bool shuffle() const noexcept { return shuffle_; }
  bool drop_last() const noexcept { return drop_last_; }
  std::size_t eval_batch_size() const noexcept { return eval_batch_size_; }
  const optim::LrSchedule& schedule() const noexcept { return schedule_; }
  bool verbose() const noexcept { return verbose_; }

 private:
  std::size_t batch_size_ = 32, epochs_ = 10, eval_batch_size_ = 1024;
  std::uint64_t seed_ = 42;
  bool shuffle_ = true, drop_last_ = false, verbose_ = true;
  optim::LrSchedule schedule_ = optim::LrSchedule::constant();
};

}  // namespace xtrain
