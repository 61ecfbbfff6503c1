#pragma once
/// \file trainer.hpp
/// Trainer<Model, Optimizer, Precision, Communicator, Backend>: the training loop of a
/// classification model with cross-entropy loss. Policies are template parameters; everything
/// else (sizes, options, callbacks) is a run-time value.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <utility>

#include "xtrain/backend/cpu.hpp"
#include "xtrain/core/concepts.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/data/dataset.hpp"
#include "xtrain/data/loader.hpp"
#include "xtrain/loss/cross_entropy.hpp"
#include "xtrain/parallel/single_process.hpp"
#include "xtrain/precision/policy.hpp"
#include "xtrain/train/callbacks.hpp"
#include "xtrain/train/metrics.hpp"
#include "xtrain/train/options.hpp"
#include "xtrain/train/progress.hpp"

namespace xtrain {

template <class Model, class Optimizer, class PrecisionPolicy = FullPrecision,
          class Communicator = parallel::SingleProcess, class Backend = backend::Cpu>
class Trainer {
  static_assert(check_layer<Model>());
  static_assert(check_optimizer<Optimizer>());
  static_assert(Precision<PrecisionPolicy>,
                "xtrain: the third Trainer parameter is not a Precision policy (FullPrecision, ...)");

 public:
  using model_type = Model;
  using optimizer_type = Optimizer;

  /// Takes the model, moves its parameters into one flat arena and initialises the optimizer state.
  Trainer(Model model, Optimizer optimizer, TrainerOptions options = {}, Communicator communicator = {})
      : model_(std::move(model)),
        optimizer_(std::move(optimizer)),
        options_(std::move(options)),
        comm_(std::move(communicator)),
        arena_(model_),
        state_(optimizer_.init(arena_.size())) {}

  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Trains for options().epochs() epochs, evaluating on `test` after each; returns the metrics.
  template <data::Dataset Train, data::Dataset Test, class... Callbacks>
  History fit(const Train& train, const Test& test, Callbacks&&... callbacks) {
    stop_requested_ = false;
    const std::size_t global_batch = options_.batch_size() * comm_.size();
    data::Loader<Train> loader(train, global_batch, options_.seed(), options_.shuffle(), options_.drop_last(),
                               comm_.rank(), comm_.size());
    History history;
    const auto fit_start = clock::now();
    (callbacks::on_train_begin(callbacks, *this), ...);
    const std::size_t epochs = options_.epochs();
    while (epoch_ < epochs && !stop_requested_) {
      std::size_t epoch = epoch_ + 1;
      (callbacks::on_epoch_begin(callbacks, *this, epoch), ...);
      loader.set_epoch(epoch_);
      train::ProgressBar bar(options_.verbose() && is_main_process());
      const std::string label = "Epoch [" + std::to_string(epoch) + "/" + std::to_string(epochs) + "]";
      double sums[3] = {0.0, 0.0, 0.0};  // loss sum, correct, samples (this rank)
      const auto start = clock::now();
      const std::size_t batches = loader.batches();
      for (std::size_t k = 0; k < batches; ++k) {
        const data::Batch batch = loader.batch(k);
        [[maybe_unused]] StepResult r = train_step(batch.x, batch.y, batch.global_offset, batch.global_count);
        sums[0] += loss_.sum();
        sums[1] += static_cast<double>(loss_.correct());
        sums[2] += static_cast<double>(batch.y.size());
        (callbacks::on_step_end(callbacks, *this, r), ...);
        if (bar.active()) {
          const double s = seconds_since(start);
          bar.update(label, k + 1, batches, sums[2] * static_cast<double>(comm_.size()) / s, s);
        }
      }
      EpochMetrics m;
      m.seconds = seconds_since(start);
      bar.clear();
      comm_.allreduce_sum(std::span<double>(sums));
      m.epoch = epoch;
      m.epochs = epochs;
      m.train = {sums[0] / sums[2], 100.0 * sums[1] / sums[2], static_cast<std::size_t>(sums[2])};
      m.samples_per_second = sums[2] / m.seconds;
      m.test = evaluate(test);
      ++epoch_;
      if (options_.verbose()) print_epoch(m);
      history.epochs.push_back(m);
      (callbacks::on_epoch_end(callbacks, *this, m), ...);
    }
    history.seconds = seconds_since(fit_start);
    (callbacks::on_train_end(callbacks, *this, history), ...);
    return history;
  }

  /// Loss and accuracy over every sample of `data` (eval mode; each sample counted once).
  template <data::Dataset D>
  EvalResult evaluate(const D& data) {
    data::Loader<D> loader(data, options_.eval_batch_size() * comm_.size(), 0, false, false, comm_.rank(),
                           comm_.size());
    Context ctx = context(false);
    double sums[3] = {0.0, 0.0, 0.0};
    for (std::size_t k = 0; k < loader.batches(); ++k) {
      const data::Batch batch = loader.batch(k);
      loss_.forward(model_.forward(ctx, batch.x), batch.y);
      sums[0] += loss_.sum();
      sums[1] += static_cast<double>(loss_.correct());
      sums[2] += static_cast<double>(batch.y.size());
    }
    comm_.allreduce_sum(std::span<double>(sums));
    if (sums[2] == 0.0) return {};
    return {sums[0] / sums[2], 100.0 * sums[1] / sums[2], static_cast<std::size_t>(sums[2])};
  }

  /// One optimizer step on this rank's rows `x`, `y` of a global batch of `global_count` samples
  /// whose row 0 is sample `global_offset` of it. The loss is normalised by global_count.
  StepResult train_step(const Matrix& x, std::span<const std::int32_t> y, std::size_t global_offset,
                        std::size_t global_count) {
    Context ctx = context(true);
    ctx.sample_offset = global_offset;
    arena_.zero_grad();
    const float loss = loss_.forward(model_.forward(ctx, x), y, static_cast<double>(global_count));
    ctx.input_grad = false;  // nothing needs the gradient of the data
    model_.backward(ctx, loss_.backward());
    comm_.allreduce_sum(arena_.grads());
    const float lr = options_.schedule().lr(optimizer_.learning_rate(), step_);
    ++step_;
    optimizer_.step(arena_.values(), arena_.grads(), state_, StepInfo{lr, step_});
    return {step_, loss, lr, global_count};
  }

  /// Ends fit() after the current epoch (for callbacks).
  void request_stop() noexcept { stop_requested_ = true; }

  Model& model() noexcept { return model_; }
  const Optimizer& optimizer() const noexcept { return optimizer_; }
  typename Optimizer::State& optimizer_state() noexcept { return state_; }
  ParamArena& params() noexcept { return arena_; }
  const TrainerOptions& options() const noexcept { return options_; }
  Communicator& communicator() noexcept { return comm_; }
  bool is_main_process() const noexcept { return comm_.rank() == 0; }
  /// Optimizer steps taken.
  std::uint64_t step() const noexcept { return step_; }
  /// Completed epochs.
  std::uint64_t epoch() const noexcept { return epoch_; }

 private:
  using clock = std::chrono::steady_clock;
  static double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

  Context context(bool training) const {
    Context ctx;
    ctx.training = training;
    ctx.seed = options_.seed();
    ctx.step = step_;
    return ctx;
  }

  void print_epoch(const EpochMetrics& m) const {
    if (!is_main_process()) return;
    std::printf(
        "Epoch [%zu/%zu], Train Loss: %.4f, Train Accuracy: %.2f%%, Test Loss: %.4f, Test Accuracy: %.2f%%, "
        "Time: %.2fs, %.0f samples/s\n",
        m.epoch, m.epochs, m.train.loss, m.train.accuracy, m.test.loss, m.test.accuracy, m.seconds,
        m.samples_per_second);
    std::fflush(stdout);
  }

  Model model_;
  Optimizer optimizer_;
  TrainerOptions options_;
  Communicator comm_;
  ParamArena arena_;
  typename Optimizer::State state_;
  loss::CrossEntropyLoss loss_;
  std::uint64_t step_ = 0, epoch_ = 0;
  bool stop_requested_ = false;
};

}  // namespace xtrain
