#pragma once
/// \file trainer.hpp
/// Trainer<Model, Optimizer, Precision, Communicator, Backend, Loss>: the training loop, on one
/// process or data-parallel over ranks (the policy order of train/policies.hpp). The loss is a
/// policy (CrossEntropyLoss by default; MSELoss for regression, or any type modelling
/// loss::Loss); the data sets' target type is the loss's. Policies are template parameters;
/// sizes, options and callbacks are run-time values.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xtrain/backend/cpu.hpp"
#include "xtrain/checkpoint/archive.hpp"
#include "xtrain/checkpoint/collective.hpp"
#include "xtrain/checkpoint/safetensors.hpp"
#include "xtrain/checkpoint/state.hpp"
#include "xtrain/core/concepts.hpp"
#include "xtrain/core/profiler.hpp"
#include "xtrain/data/dataset.hpp"
#include "xtrain/data/loader.hpp"
#include "xtrain/loss/loss.hpp"
#include "xtrain/parallel/agreement.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/single_process.hpp"
#include "xtrain/precision/policy.hpp"
#include "xtrain/train/callbacks.hpp"
#include "xtrain/train/engine.hpp"
#include "xtrain/train/metrics.hpp"
#include "xtrain/train/options.hpp"
#include "xtrain/train/policies.hpp"
#include "xtrain/train/preemption.hpp"
#include "xtrain/train/progress_bar.hpp"

namespace xtrain {

template <class Model, class Optimizer, class PrecisionPolicy = FullPrecision,
          class Communicator = parallel::SingleProcess, class Backend = backend::Cpu,
          class Loss = loss::CrossEntropyLoss>
class Trainer {
  static_assert(check_policies<Model, Optimizer, PrecisionPolicy, Communicator, Backend, Loss>());

 public:
  using model_type = Model;
  using optimizer_type = Optimizer;
  using loss_type = Loss;
  using target_type = typename Loss::target_type;

  /// Takes the model and moves its parameters into one flat arena. On several ranks this is a
  /// collective: every rank must construct its Trainer; rank 0's initial parameters win.
  Trainer(Model model, Optimizer optimizer, TrainingOptions options = {}, Communicator communicator = {},
          Loss loss = {})
      : options_(std::move(options)),
        world_(communicator.size()),
        engine_(std::move(model), std::move(optimizer), std::move(communicator), options_, std::move(loss)) {}

  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Samples per optimizer micro-step over all ranks.
  std::size_t global_batch_size() const noexcept { return engine_.global_batch(); }

  /// Trains for options().epochs() epochs, evaluating on `test` after each; returns the metrics.
  /// A stop signal (options().stop_signals(): SIGTERM, SIGINT, SIGUSR1) on any rank ends it at the
  /// next step boundary on every rank: a checkpoint is saved in project_dir and Interrupted thrown.
  template <class Train, class Test, class... Callbacks>
  History fit(const Train& train, const Test& test, Callbacks&&... callbacks) {
    static_assert(data::check_dataset<Train>() && data::check_dataset<Test>());
    static_assert(std::is_same_v<typename Train::target_type, target_type>,
                  "xtrain: the training set's target_type is not the loss's target_type (CrossEntropyLoss takes "
                  "Tensor<std::int32_t> class ids, MSELoss Tensor<float>)");
    stop_requested_ = false;
    if (world_ > 1) parallel::check_agreement(communicator(), run_fields(train, test));
    StopSignals signals(options_.stop_signals());
    data::Loader<Train> loader(train, global_batch_size(), options_.seed(), options_.shuffle(), options_.drop_last(),
                               rank(), world_, options_.deterministic());
    loader.set_executor(engine_.backend().executor());
    History history;
    const auto fit_start = clock::now();
    (callbacks::on_train_begin(callbacks, *this), ...);
    const std::size_t epochs = options_.epochs();
    while (epoch_ < epochs && !stop_requested_) {
      const std::size_t epoch = epoch_ + 1;
      (callbacks::on_epoch_begin(callbacks, *this, epoch), ...);
      loader.set_epoch(epoch_);
      engine_.reset_comm_stats();
      train::ProgressBar bar(options_.verbose() && is_main_process());
      const std::string label = "Epoch [" + std::to_string(epoch) + "/" + std::to_string(epochs) + "]";
      double* sums = epoch_sums_;  // loss sum, correct, terms, samples (this rank; resumed ones on rank 0)
      const auto start = clock::now();
      const std::size_t batches = loader.batches();
      XTRAIN_CHECK(batch_in_epoch_ <= batches, ValueError, "resumed at batch ", batch_in_epoch_, " of an epoch of ",
                   batches, " (another data set than the checkpoint's?)");
      for (std::size_t k = batch_in_epoch_; k < batches; ++k) {  // a resumed epoch skips in O(1)
        auto step_scope = events_.scope(step_event, profile::Category::step);
        const auto batch = [&] {
          const auto scope = events_.scope(data_event, profile::Category::data);
          return loader.batch(k);
        }();
        const std::uint64_t before = engine_.step();
        [[maybe_unused]] StepResult r =
            engine_.micro_step(batch.x, batch.y, batch.global_offset, batch.global_count, k + 1 == batches);
        engine_.add_step_metrics(sums);  // (a GPU engine sums on the device: flushed below)
        sums[3] += static_cast<double>(batch.size());
        batch_in_epoch_ = k + 1;
        if (engine_.step() != before) {
          (callbacks::on_step_end(callbacks, *this, r), ...);
          const int sig = [&] {
            const auto scope = events_.scope(signals_event, profile::Category::reduction);
            return signals.poll(communicator());
          }();
          if (sig) {
            bar.clear();
            stop_on_signal(sig);
          }
        }
        if (bar.active()) {
          const double s = seconds_since(start);
          bar.update(label, k + 1, batches, static_cast<double>((k + 1) * global_batch_size()) / s, s);
        }
        if (engine_.step() != before && profiler()) {
          { [[maybe_unused]] const auto ended = std::move(step_scope); }
          profiler()->step();
        }
      }
      bar.clear();
      engine_.flush_step_metrics(sums);  // a GPU engine's waits for the device: the epoch's time includes it
      EpochMetrics m;
      m.seconds = seconds_since(start);
      const auto& stats = engine_.comm_stats();
      m.comm_wait_seconds = stats.waiting_seconds;
      m.comm_overlap_seconds = stats.overlap_seconds;
      communicator().allreduce_sum(std::span<double>(sums, 4), "epoch training metrics");
      m.epoch = epoch;
      m.epochs = epochs;
      m.train = metrics_from(sums);
      m.samples_per_second = sums[3] / m.seconds;
      m.test = evaluate(test);
      ++epoch_;
      batch_in_epoch_ = 0;
      std::fill(epoch_sums_, epoch_sums_ + 4, 0.0);
      if (options_.verbose()) print_epoch(m);
      history.epochs.push_back(m);
      (callbacks::on_epoch_end(callbacks, *this, m), ...);
    }
    history.seconds = seconds_since(fit_start);
    (callbacks::on_train_end(callbacks, *this, history), ...);
    return history;
  }

  /// Loss (and accuracy, for classification) over every sample of `data` (eval mode; each sample
  /// counted exactly once over all ranks; rank 0's BatchNorm statistics are used on every rank).
  template <class D>
  EvalResult evaluate(const D& data) {
    static_assert(data::check_dataset<D>());
    static_assert(std::is_same_v<typename D::target_type, target_type>,
                  "xtrain: the data set's target_type is not the loss's target_type");
    const auto scope = events_.scope(evaluation_event, profile::Category::evaluation);
    engine_.broadcast_buffers();
    data::Loader<D> loader(data, options_.eval_batch_size() * world_, 0, false, false, rank(), world_);
    loader.set_executor(engine_.backend().executor());
    loader.set_prefetch(false);  // an evaluation batch (1024 samples by default) is not held twice
    Context ctx = engine_.context(false);
    auto& loss = engine_.loss();
    double sums[4] = {0.0, 0.0, 0.0, 0.0};
    for (std::size_t k = 0; k < loader.batches(); ++k) {
      const auto batch = [&] {
        const auto data_scope = events_.scope(data_event, profile::Category::data);
        return loader.batch(k);
      }();
      if (batch.size() == 0) {  // (under zero_stage(3) a forward's gathers are collective: take part)
        engine_.skip_forward();
        continue;
      }
      engine_.loss_forward(engine_.predict(ctx, batch.x), batch.y, 1.0);
      sums[0] += loss.sum();
      if constexpr (loss::HasAccuracy<Loss>) sums[1] += static_cast<double>(loss.correct());
      sums[2] += static_cast<double>(loss.count(batch.y));
      sums[3] += static_cast<double>(batch.size());
    }
    communicator().allreduce_sum(std::span<double>(sums), "evaluation metrics");
    return metrics_from(sums);
  }

  /// One optimizer step (or micro-step when accumulating) on this rank's inputs `x` and targets
  /// `y` of a global batch of `global_count` samples whose sample 0 is sample `global_offset` of it.
  /// With a profiler attached it is recorded as fit()'s steps are, and a profiler step ends after
  /// each optimizer step.
  template <class Input>
  StepResult train_step(const Input& x, const target_type& y, std::size_t global_offset, std::size_t global_count) {
    return profiled_step([&] { return engine_.micro_step(x, y, global_offset, global_count); });
  }
  /// The same with one class id per sample (CrossEntropyLoss).
  StepResult train_step(const Tensor<float>& x, std::span<const std::int32_t> labels, std::size_t global_offset,
                        std::size_t global_count) requires std::is_same_v<target_type, Tensor<std::int32_t>> {
    labels_.resize({labels.size()});
    std::copy(labels.begin(), labels.end(), labels_.data());
    return profiled_step([&] { return engine_.micro_step(x, labels_, global_offset, global_count); });
  }

  /// The model's output for `x` in eval mode (Dropout off, BatchNorm's running statistics), in
  /// fp32 whatever the precision policy stores in between: logits to sample from, predictions.
  /// Local to this rank (no communication), except under zero_stage(3) on several ranks, where
  /// each unit gathers its parameters collectively: call it on every rank then (with the same
  /// shapes), or inside with_full_parameters. The result lives in the Trainer until the next
  /// forward.
  template <class Input>
  const Tensor<float>& predict(const Input& x) {
    Context ctx = engine_.context(false);
    return engine_.predict(ctx, x);
  }

  /// For a loop of train_step() (a run counted in steps rather than epochs): asks every rank, as
  /// fit() does after each step, whether one received a stop signal; if so, saves a checkpoint in
  /// project_dir and throws Interrupted on every rank (MpiEnvironment::run exits with code 75).
  /// Collective: every rank calls it after the same steps.
  void stop_if_signalled(StopSignals& signals) {
    if (const int sig = signals.poll(communicator())) stop_on_signal(sig);
  }

  /// Saves the whole training state to `dir`/state.xtrain (atomically). Collective: every rank
  /// calls it; rank 0 writes (under zero_stage, every rank also writes its shard of the parameters
  /// and optimizer state beside it: `dir` must be on a filesystem every rank reaches). Rank 0's
  /// BatchNorm statistics are saved (broadcast first).
  void save_state(const std::string& dir) {
    engine_.flush_step_metrics(epoch_sums_);
    checkpoint::Position p;
    p.epoch = epoch_;
    p.samples_in_epoch = batch_in_epoch_ * global_batch_size();
    p.global_batch = global_batch_size();
    std::copy(epoch_sums_, epoch_sums_ + 4, p.epoch_sums);
    communicator().allreduce_sum(std::span<double>(p.epoch_sums, 4), "checkpoint metric sums");
    engine_.save_state(dir, p, registered_);
  }

  /// Restores the training state saved in `dir` (by save_state or save_checkpoint), on any number
  /// of ranks: fit() then continues where it stopped, mid-epoch included. Collective.
  void load_state(const std::string& dir) {
    const checkpoint::Position p = engine_.load_state(dir, registered_);
    XTRAIN_CHECK(p.samples_in_epoch % global_batch_size() == 0, checkpoint::CheckpointError, dir, "/",
                 checkpoint::state_file_name, ": saved after ", p.samples_in_epoch,
                 " samples of an epoch, not a multiple of this run's global batch ", global_batch_size(),
                 " (resume with a global batch that divides it)");
    options_.seed(p.data_seed).schedule(engine_.options().schedule());
    epoch_ = p.epoch;
    batch_in_epoch_ = p.samples_in_epoch / global_batch_size();
    std::fill(epoch_sums_, epoch_sums_ + 4, 0.0);
    if (is_main_process()) std::copy(p.epoch_sums, p.epoch_sums + 4, epoch_sums_);
  }

  /// Saves to project_dir/checkpoints/checkpoint_N (N one more than the newest), written as
  /// checkpoint_N.tmp and renamed, so a crash never leaves a checkpoint that looks complete;
  /// then deletes the oldest beyond total_limit. Returns the folder. Collective.
  std::string save_checkpoint() {
    XTRAIN_CHECK(!options_.project_dir().empty(), ValueError,
                 "save_checkpoint: set TrainingOptions::project_dir (or call save_state(dir))");
    const auto scope = events_.scope(checkpoint_event, profile::Category::checkpoint);
    return checkpoint::save_numbered(communicator(), checkpoints_root(), options_.total_limit(),
                                     [&](const std::string& dir) { save_state(dir); });
  }

  /// Loads "latest" (the newest complete checkpoint under project_dir/checkpoints) or a folder.
  /// Returns the folder loaded. Collective.
  std::string resume(const std::string& which) {
    std::string dir = which == "latest" ? checkpoint::latest_checkpoint(checkpoints_root()) : which;
    load_state(dir);
    return dir;
  }

  /// Saves and restores `object` (anything with serialize(Archive&, unsigned)) with the training
  /// state, in registration order (Accelerate's register_for_checkpointing). It must outlive the
  /// Trainer's saves and loads.
  template <class T>
  void register_for_checkpointing(T& object) {
    registered_.push_back({[&object](boost::archive::binary_oarchive& ar) { ar << object; },
                           [&object](boost::archive::binary_iarchive& ar) { ar >> object; }});
  }

  /// Exports the model (parameters and buffers, rank 0's BatchNorm statistics) as safetensors
  /// with PyTorch's state_dict names; shards when larger than max_shard_bytes (0: never).
  /// Collective: rank 0 writes, streaming; under zero_stage(3) the units are gathered one at a
  /// time as their tensors are written (never the whole model on a rank). Returns the files.
  std::vector<std::string> save_model(const std::string& path, std::uint64_t max_shard_bytes = 0) {
    engine_.broadcast_buffers();
    std::vector<std::string> files;
    checkpoint::on_every_rank(communicator(), "save_model", [&] {
      engine_.with_parameters_by_unit([&](auto&& values) {
        files = checkpoint::save_model(model(), params(), path, max_shard_bytes, values, communicator().rank() == 0);
      });
    });
    return files;
  }

  /// Loads parameters and buffers from a safetensors file (or shards' .index.json), ours or
  /// PyTorch's, on rank 0, and broadcasts them. Collective.
  void load_model(const std::string& path) {
    engine_.with_full_parameters([&] {
      checkpoint::on_main_rank(communicator(), "load_model status",
                               [&] { checkpoint::load_model(model(), params(), path); });
      communicator().broadcast(params().values(), "load_model parameters");
    });
    engine_.broadcast_buffers();
  }

  /// Records training in `p` from now on (null: stop recording): each step, the data loading,
  /// every module's forward and backward, the loss, the optimizer, the gradient reductions,
  /// evaluation and checkpoint saves; fit() and train_step() end a profiler step after each
  /// optimizer step (the schedule counts them). Collective: the ranks start the profiler's clock together, so their
  /// traces share one timeline. `p` must outlive its use; one profiler per Trainer.
  void set_profiler(profile::Profiler* p) {
    engine_.set_profiler(p);
    events_.attach(p);
  }
  profile::Profiler* profiler() const noexcept { return engine_.profiler(); }

  /// Ends fit() after the current epoch (for callbacks).
  void request_stop() noexcept { stop_requested_ = true; }

  // Not noexcept: on backend::Cuda they copy the device's state back first (and a GPU fault throws).
  Model& model() { return engine_.model(); }
  const Optimizer& optimizer() const noexcept { return engine_.optimizer(); }
  typename Optimizer::State& optimizer_state() { return engine_.optimizer_state(); }
  /// The flat parameters and gradients. Under zero_stage(3) on several ranks a rank holds its
  /// block and the parameters outside the units only: read the rest inside with_full_parameters.
  ParamArena& params() { return engine_.params(); }
  /// Runs f() with every parameter whole on this rank (zero_stage(3): all-gathered before and
  /// given back after; otherwise just f()). Collective: call it on every rank (then, e.g., sample
  /// on rank 0 only). save_model, load_model and checkpoints do this themselves.
  template <class F>
  decltype(auto) with_full_parameters(F&& f) {
    return engine_.with_full_parameters(std::forward<F>(f));
  }
  /// Calls f(values), where values(entry) gives a parameter's values (std::span<const float>), to
  /// read the parameters one by one in arena order (params().entries()) without the whole model on
  /// a rank: under zero_stage(3) each unit is gathered when first asked for and given back at the
  /// next. Collective: every rank asks for the same entries in the same order. save_model uses it.
  template <class F>
  void with_parameters_by_unit(F&& f) {
    engine_.with_parameters_by_unit(std::forward<F>(f));
  }
  /// Bytes of parameter memory this rank holds now (zero_stage(3): its pages in use).
  std::size_t parameter_bytes() const { return engine_.parameter_bytes(); }
  const TrainingOptions& options() const noexcept { return options_; }
  Communicator& communicator() noexcept { return engine_.communicator(); }
  /// The device backend (its threads: backend().threads(); backend::describe(backend()) for a log line).
  Backend& backend() noexcept { return engine_.backend(); }
  std::size_t rank() { return engine_.communicator().rank(); }
  std::size_t world_size() const noexcept { return world_; }
  bool is_main_process() { return rank() == 0; }
  /// Global steps taken (under fp16, steps skipped for overflow included).
  std::uint64_t step() const noexcept { return engine_.step(); }
  /// Optimizer steps actually applied (step() minus the steps skipped for overflow).
  std::uint64_t optimizer_steps() const noexcept { return engine_.optimizer_steps(); }
  /// Learning rate of the next optimizer step.
  float current_lr() const { return engine_.current_lr(); }
  /// The dynamic loss scaler (in use under MixedPrecision<fp16> only).
  const DynamicLossScaler& loss_scaler() const noexcept { return engine_.loss_scaler(); }
  /// The loss policy (its settings, its last forward).
  Loss& loss() noexcept { return engine_.loss(); }
  /// The parameter groups with the multipliers in force (the default group first).
  const std::vector<optim::GroupScales>& param_groups() const noexcept { return engine_.param_groups(); }
  /// Completed epochs.
  std::uint64_t epoch() const noexcept { return epoch_; }
  /// Time spent on gradient reductions since the start of the epoch (or the last reset).
  const parallel::CommStats& comm_stats() const { return engine_.comm_stats(); }
  void reset_comm_stats() { engine_.reset_comm_stats(); }
  /// Gradient buckets (1 for a model smaller than the bucket size).
  std::size_t bucket_count() const { return engine_.bucket_count(); }
  /// Bytes of gradient memory this rank holds now (1/N of them under zero_stage(2)).
  std::size_t gradient_bytes() const { return engine_.gradient_bytes(); }

 private:
  using clock = std::chrono::steady_clock;
  static double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

  // A train_step(): a step event, and a profiler step ended after an optimizer step (as in fit()).
  template <class F>
  StepResult profiled_step(F&& micro_step) {
    const std::uint64_t before = engine_.step();
    StepResult r;
    {
      const auto scope = events_.scope(step_event, profile::Category::step);
      r = micro_step();
    }
    if (profiler() && engine_.step() != before) profiler()->step();
    return r;
  }

  std::filesystem::path checkpoints_root() const {
    return std::filesystem::path(options_.project_dir()) / "checkpoints";
  }

  // Every rank agreed to stop on `sig` at this step boundary: save if there is a project
  // folder, tell the user (rank 0), throw Interrupted on every rank.
  [[noreturn]] void stop_on_signal(int sig) {
    StopSignals::latch();  // from now on a signal is only recorded, until the process ends
    const std::string where = "[xtrain] received " + signal_name(sig) + " at epoch " + std::to_string(epoch_ + 1) +
                              " step " + std::to_string(engine_.step());
    std::string dir, message;
    if (options_.project_dir().empty()) {
      message = where +
                ": nothing saved (no project directory: set TrainingOptions::project_dir, --project-dir in the "
                "examples, to save a checkpoint on a signal)";
    } else {
      try {
        dir = save_checkpoint();
        message = where + ": checkpoint saved to " + dir + ", resume with --resume latest";
      } catch (const checkpoint::CheckpointError& e) {
        const auto existing = checkpoint::numbered_checkpoints(checkpoints_root());
        message = where + ": saving a checkpoint failed: " + e.what() + "; the latest complete checkpoint is " +
                  (existing.empty() ? std::string("none")
                                    : "still checkpoint_" + std::to_string(existing.back()) + " (--resume latest)");
      }
    }
    if (is_main_process()) {
      std::fflush(stdout);
      std::fprintf(stderr, "%s\n", message.c_str());
      std::fflush(stderr);
    }
    throw Interrupted(sig, dir, message);
  }

  // What every rank must share before the first step (check_agreement).
  template <class Train, class Test>
  std::vector<parallel::RunField> run_fields(const Train& train, const Test& test) {
    using parallel::data_fingerprint, parallel::describe_or, parallel::field_text;
    const TrainingOptions& o = options_;
    return {{"the training set", data_fingerprint(train, &engine_.memory())},
            {"the test set", data_fingerprint(test, &engine_.memory())},
            {"epochs", field_text(o.epochs())},
            {"the global batch size", field_text(global_batch_size())},
            {"the seed", field_text(o.seed())},
            {"shuffle", field_text(o.shuffle())},
            {"drop_last", field_text(o.drop_last())},
            {"the evaluation batch size", field_text(o.eval_batch_size())},
            {"accumulate", field_text(o.accumulate())},
            {"clip_grad_norm", field_text(o.clip_grad_norm())},
            {"clip_grad_value", field_text(o.clip_grad_value())},
            {"deterministic", field_text(o.deterministic())},
            {"zero_stage", field_text(o.zero_stage())},
            {"scale_lr", field_text(o.scale_lr())},
            {"bucket_bytes", field_text(o.bucket_bytes())},
            {"the schedule", o.schedule().describe()},
            {"the optimizer", describe_or(optimizer(), Optimizer::name)},
            {"the precision", PrecisionPolicy::name},
            {"the loss", describe_or(engine_.loss(), "(loss)")},
            {"the parameter groups", optim::describe(engine_.param_groups())},
            {"the position (epoch, batch, step)",
             field_text(epoch_) + ", " + field_text(batch_in_epoch_) + ", " + field_text(engine_.step())}};
  }

  // [loss sum, correct, terms, samples] -> mean loss per term, accuracy, samples.
  static EvalResult metrics_from(const double* sums) {
    if (sums[3] == 0.0) return {0.0, 0.0, 0, loss::HasAccuracy<Loss>};
    const double terms = sums[2] > 0.0 ? sums[2] : 1.0;
    return {sums[0] / terms, 100.0 * sums[1] / terms, static_cast<std::size_t>(sums[3]), loss::HasAccuracy<Loss>};
  }

  void print_epoch(const EpochMetrics& m) {
    if (!is_main_process()) return;
    if constexpr (!loss::HasAccuracy<Loss>) {
      std::printf("Epoch [%zu/%zu], Train Loss: %.6f, Test Loss: %.6f, Time: %.2fs, %.0f samples/s\n", m.epoch,
                  m.epochs, m.train.loss, m.test.loss, m.seconds, m.samples_per_second);
      std::fflush(stdout);
      return;
    }
    std::printf(
        "Epoch [%zu/%zu], Train Loss: %.4f, Train Accuracy: %.2f%%, Test Loss: %.4f, Test Accuracy: %.2f%%, "
        "Time: %.2fs, %.0f samples/s\n",
        m.epoch, m.epochs, m.train.loss, m.train.accuracy, m.test.loss, m.test.accuracy, m.seconds,
        m.samples_per_second);
    std::fflush(stdout);
  }

  // The trainer's events; the engine records the rest.
  enum Event : std::size_t { step_event, data_event, evaluation_event, checkpoint_event, signals_event };

  TrainingOptions options_;
  std::size_t world_;
  Engine<Model, Optimizer, PrecisionPolicy, Communicator, Backend, Loss> engine_;
  std::uint64_t epoch_ = 0;
  std::size_t batch_in_epoch_ = 0;                 // next batch of the current epoch
  double epoch_sums_[4] = {0, 0, 0, 0};            // this rank's running loss sum, correct, terms, samples
  Tensor<std::int32_t> labels_{engine_.memory()};  // train_step's labels given as a span
  std::vector<checkpoint::Registered> registered_;
  bool stop_requested_ = false;
  profile::EventLabels<5> events_{{"step", "data", "evaluation", "checkpoint save", "stop-signal poll"}};
};

}  // namespace xtrain
