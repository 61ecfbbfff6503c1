#pragma once
/// \file options.hpp
/// TrainingOptions: the one options type of the Trainer, the Engine and the Accelerator, set by
/// name and chained: `TrainingOptions{}.batch_size(32).epochs(10).seed(42)`. Each option says
/// which of them reads it; the loop options (epochs, batch sizes, shuffling, checkpoint folders,
/// signals, printing) are the Trainer's, whose loop it is; with the Accelerator your loop and
/// `prepare(data, batch)` decide those.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "xtrain/core/error.hpp"
#include "xtrain/optim/param_groups.hpp"
#include "xtrain/optim/schedule.hpp"
#include "xtrain/train/preemption.hpp"

namespace xtrain {

class TrainingOptions {
 public:
  /// Samples per optimizer step on each process (DDP/Accelerate convention). Default 32. Trainer.
  TrainingOptions& batch_size(std::size_t v) {
    XTRAIN_CHECK(v > 0, ValueError, "TrainingOptions: batch_size must be positive");
    batch_size_ = v;
    return *this;
  }
  /// Passes over the training set. Default 10. Trainer.
  TrainingOptions& epochs(std::size_t v) {
    epochs_ = v;
    return *this;
  }
  /// Seed of the data order and dropout masks. Default 42. All.
  TrainingOptions& seed(std::uint64_t v) {
    seed_ = v;
    return *this;
  }
  /// Shuffle the training set each epoch. Default true. Trainer.
  TrainingOptions& shuffle(bool v) {
    shuffle_ = v;
    return *this;
  }
  /// Drop the last partial batch of each epoch. Default false. Trainer.
  TrainingOptions& drop_last(bool v) {
    drop_last_ = v;
    return *this;
  }
  /// Batch size for evaluation (results do not depend on it). Default 1024. Trainer.
  TrainingOptions& eval_batch_size(std::size_t v) {
    XTRAIN_CHECK(v > 0, ValueError, "TrainingOptions: eval_batch_size must be positive");
    eval_batch_size_ = v;
    return *this;
  }
  /// Learning-rate schedule over optimizer steps. Default constant. All.
  TrainingOptions& schedule(const optim::LrSchedule& v) {
    schedule_ = v;
    return *this;
  }
  /// Samples per optimizer step over ALL processes; overrides batch_size: training is then the
  /// same on any number of ranks (each takes global / ranks). 0 (default): batch_size per process.
  /// Trainer (and the Engine's deterministic reduction, whose chunks it counts).
  TrainingOptions& global_batch_size(std::size_t v) {
    global_batch_size_ = v;
    return *this;
  }
  /// Multiply the learning rate by the number of processes (the linear scaling rule). Default
  /// false. All.
  TrainingOptions& scale_lr(bool v) {
    scale_lr_ = v;
    return *this;
  }
  /// Micro-batches per optimizer step; no communication on the first k-1 (Accelerate's
  /// gradient_accumulation_steps), except under zero_stage 2 and 3 and with the deterministic
  /// reduction under any stage, which reduce every micro-step. Default 1. All.
  TrainingOptions& accumulate(std::size_t k) {
    XTRAIN_CHECK(k > 0, ValueError, "TrainingOptions: accumulate must be at least 1");
    accumulate_ = k;
    return *this;
  }
  /// Clip the global gradient norm (after the reduction) to this in every optimizer step. 0
  /// (default): off. All (the Accelerator's clip_grad_norm() clips once more when you call it).
  TrainingOptions& clip_grad_norm(double v) {
    XTRAIN_CHECK(v >= 0.0, ValueError, "TrainingOptions: clip_grad_norm ", v, " must be >= 0");
    clip_norm_ = v;
    return *this;
  }
  /// Clamp every gradient (after the reduction) to +-this in every optimizer step. 0 (default):
  /// off. All.
  TrainingOptions& clip_grad_value(float v) {
    XTRAIN_CHECK(v >= 0.0f, ValueError, "TrainingOptions: clip_grad_value ", v, " must be >= 0");
    clip_value_ = v;
    return *this;
  }
  /// Threads per rank of a CpuThreads backend. 0 (default): XTRAIN_NUM_THREADS, else
  /// OMP_NUM_THREADS, else the rank's share of the cores it may run on. Results are bitwise the
  /// same for every count. All.
  TrainingOptions& threads(std::size_t v) {
    XTRAIN_CHECK(v <= 1024, ValueError, "TrainingOptions: threads ", v, " is more than 1024");
    threads_ = v;
    return *this;
  }
  /// Gradient bucket size in bytes (DDP's bucket_cap_mb). Default 25 MiB. All.
  TrainingOptions& bucket_bytes(std::size_t v) {
    XTRAIN_CHECK(v > 0, ValueError, "TrainingOptions: bucket_bytes must be positive");
    bucket_bytes_ = v;
    return *this;
  }
  /// Rank-count-invariant reduction: gradients are summed per `chunk` samples of the global batch
  /// and combined in a fixed tree, so 1, 2 or 4 ranks give bitwise identical parameters. Requires
  /// a power-of-two rank count and global batch / chunk. 0 (default): off. Trainer and
  /// Engine::micro_step (it computes chunk by chunk; the Accelerator's forward/backward cannot).
  TrainingOptions& deterministic(std::size_t chunk) {
    deterministic_chunk_ = chunk;
    return *this;
  }
  /// Shard the optimizer step over the ranks (ZeRO stage 1): gradients are reduce-scattered, each
  /// rank updates 1/N of the parameters with 1/N of the optimizer state, parameters are
  /// all-gathered. Same results; less optimizer work and memory per rank. Default false. All
  /// (clip with clip_grad_norm here: before the step a rank holds unreduced gradients).
  TrainingOptions& shard_optimizer(bool v) {
    zero_stage_ = v ? std::max(zero_stage_, 1) : 0;
    return *this;
  }
  /// ZeRO stage (DeepSpeed's and Accelerate's `zero_stage`), on more than one rank: 0 (default)
  /// keeps everything on every rank; 1 shards the optimizer state and step (shard_optimizer);
  /// 2 also the gradients: each bucket is reduce-scattered as backward completes it and a rank
  /// keeps only its 1/N of the gradients' memory between steps (during backward, also the bucket
  /// being written); 3 also the parameters (FSDP): a rank keeps its 1/N of them, and each
  /// layers::ShardedUnit of the model (a GPT's blocks) all-gathers its parameters for its forward
  /// and its backward only (parameters outside the units stay whole). The same training as 0
  /// (bitwise on thread ranks without clipping or accumulation; with accumulation stages 2 and 3
  /// reduce every micro-step). With deterministic(global batch / ranks) the sums are TreeSync's:
  /// bitwise the unsharded deterministic run with that chunk. Stage 3 and the deterministic
  /// reduction need MpiAllReduce or ThreadAllReduce. Throws ValueError for any other stage. All.
  TrainingOptions& zero_stage(int stage) {
    XTRAIN_CHECK(stage >= 0 && stage <= 3, ValueError, "TrainingOptions: zero_stage ", stage,
                 " is not available: 0 (replicated), 1 (sharded optimizer state), 2 (and sharded gradients) or 3 "
                 "(and sharded parameters)");
    zero_stage_ = stage;
    return *this;
  }
  /// zero_stage(3): while a unit computes, gather the next one (FSDP's forward and backward
  /// prefetch: the next unit in the model's order in forward, the previous one in backward), where
  /// the communicator gathers without blocking (MpiAllReduce). Holds two units' parameters at a
  /// time instead of one. Default true. All.
  TrainingOptions& prefetch_units(bool v) {
    prefetch_units_ = v;
    return *this;
  }
  /// Folder of automatically named checkpoints: project_dir/checkpoints/checkpoint_N
  /// (Accelerate's ProjectConfiguration). Default "" (save_checkpoint() then refuses). Trainer.
  TrainingOptions& project_dir(std::string dir) {
    project_dir_ = std::move(dir);
    return *this;
  }
  /// Keep at most this many automatic checkpoints, deleting the oldest. 0 (default): keep all.
  /// Trainer.
  TrainingOptions& total_limit(std::size_t n) {
    total_limit_ = n;
    return *this;
  }
  /// Initial loss scale of MixedPrecision<fp16> (ignored by other precisions); it then halves on
  /// every overflow and doubles after `growth_interval` clean steps. Default 65536, 2000. All.
  TrainingOptions& loss_scale(float init, std::uint64_t growth_interval = 2000) {
    XTRAIN_CHECK(init > 0.0f && growth_interval > 0, ValueError,
                 "TrainingOptions: loss_scale needs a positive scale and growth interval");
    loss_scale_ = init;
    loss_scale_growth_interval_ = growth_interval;
    return *this;
  }
  /// Parameter groups: learning-rate and weight-decay multipliers for the parameters each rule
  /// selects (first match; the rest are the default group), e.g.
  /// `{optim::ParamGroup::no_weight_decay()}` for AdamW without decay on biases and norms. All.
  TrainingOptions& param_groups(std::vector<optim::ParamGroup> groups) {
    param_groups_ = std::move(groups);
    return *this;
  }
  /// Signals that make fit() stop at the next step boundary on every rank, save a checkpoint in
  /// project_dir and throw Interrupted (handled only while fit() runs). Default SIGTERM, SIGINT,
  /// SIGUSR1; an empty list keeps the process's own handling (a signal then kills the run).
  /// Trainer (the Accelerator's handle_stop_signals() takes its own list).
  TrainingOptions& stop_signals(std::vector<int> signals) {
    stop_signals_ = std::move(signals);
    return *this;
  }
  /// Print one line per epoch (and a progress bar on a terminal). Default true. Trainer.
  TrainingOptions& verbose(bool v) {
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
  std::size_t global_batch_size() const noexcept { return global_batch_size_; }
  bool scale_lr() const noexcept { return scale_lr_; }
  std::size_t accumulate() const noexcept { return accumulate_; }
  double clip_grad_norm() const noexcept { return clip_norm_; }
  float clip_grad_value() const noexcept { return clip_value_; }
  std::size_t bucket_bytes() const noexcept { return bucket_bytes_; }
  std::size_t threads() const noexcept { return threads_; }
  std::size_t deterministic() const noexcept { return deterministic_chunk_; }
  const std::string& project_dir() const noexcept { return project_dir_; }
  bool shard_optimizer() const noexcept { return zero_stage_ >= 1; }
  int zero_stage() const noexcept { return zero_stage_; }
  bool prefetch_units() const noexcept { return prefetch_units_; }
  std::size_t total_limit() const noexcept { return total_limit_; }
  float loss_scale() const noexcept { return loss_scale_; }
  std::uint64_t loss_scale_growth_interval() const noexcept { return loss_scale_growth_interval_; }
  const std::vector<optim::ParamGroup>& param_groups() const noexcept { return param_groups_; }
  const std::vector<int>& stop_signals() const noexcept { return stop_signals_; }

 private:
  std::size_t batch_size_ = 32, epochs_ = 10, eval_batch_size_ = 1024;
  std::size_t global_batch_size_ = 0, accumulate_ = 1, bucket_bytes_ = 25u << 20, deterministic_chunk_ = 0;
  bool scale_lr_ = false;
  int zero_stage_ = 0;
  bool prefetch_units_ = true;
  std::string project_dir_;
  std::size_t total_limit_ = 0, threads_ = 0;
  double clip_norm_ = 0.0;
  float clip_value_ = 0.0f;
  float loss_scale_ = 65536.0f;
  std::uint64_t loss_scale_growth_interval_ = 2000;
  std::uint64_t seed_ = 42;
  bool shuffle_ = true, drop_last_ = false, verbose_ = true;
  optim::LrSchedule schedule_ = optim::LrSchedule::constant();
  std::vector<optim::ParamGroup> param_groups_;
  std::vector<int> stop_signals_ = StopSignals::defaults();
};

}  // namespace xtrain
