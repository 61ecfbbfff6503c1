#pragma once
/// \file accelerator.hpp
/// The Accelerate-style API for users who keep their own training loop (HuggingFace
/// Accelerate's Accelerator): Accelerator<Precision, Communicator, Backend>, the Trainer's policy
/// order without the model, optimizer and loss, which `prepare` takes. `prepare` makes the model
/// and optimizer data-parallel (an Engine) and shards a data set; `backward` reduces gradients
/// over ranks; `accumulate` decides when to communicate. Options are the Trainer's
/// (TrainingOptions): the ones marked "All" apply.
///
///   xtrain::Accelerator acc{xtrain::parallel::MpiAllReduce{}, xtrain::TrainingOptions{}.accumulate(2)};
///   auto ddp = acc.prepare(std::move(model), xtrain::optim::Adam{});
///   auto loader = acc.prepare(train, 32);                 // 32 samples per process per step
///   for (std::size_t epoch = 0; epoch < 10; ++epoch) {
///     loader.set_epoch(epoch);
///     for (std::size_t k = 0; k < loader.batches(); ++k) {
///       const auto batch = loader.batch(k);
///       const bool sync = acc.accumulate(ddp, k + 1 == loader.batches());
///       const auto& logits = ddp.forward(batch.x, batch.global_offset);
///       loss.forward(logits, batch.y, acc.loss_normalizer(batch));
///       acc.backward(ddp, loss.backward(), sync);   // gradients summed over ranks when sync
///       if (sync) acc.clip_grad_norm(ddp, 1.0);
///       ddp.step(sync, batch.global_count);
///     }
///   }

#include <algorithm>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xtrain/backend/cuda.hpp"
#include "xtrain/data/loader.hpp"
#include "xtrain/parallel/agreement.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/single_process.hpp"
#include "xtrain/precision/policy.hpp"
#include "xtrain/train/engine.hpp"
#include "xtrain/train/options.hpp"
#include "xtrain/train/policies.hpp"
#include "xtrain/train/preemption.hpp"

namespace xtrain {

/// PrecisionPolicy: FullPrecision, MixedPrecision<bf16>, MixedPrecision<fp16> (Accelerate's
/// mixed_precision). Communicator: SingleProcess, parallel::ThreadAllReduce, parallel::MpiAllReduce
/// (deduced from the constructor's argument when no template argument is given: `Accelerator
/// acc{MpiAllReduce{}}`; naming the precision, name it too: `Accelerator<MixedPrecision<bf16>,
/// MpiAllReduce>`). Backend: backend::Cpu, backend::CpuThreads.
template <class PrecisionPolicy = FullPrecision, class Communicator = parallel::SingleProcess,
          class Backend = backend::Cpu>
class Accelerator {
  static_assert(!std::is_same_v<Backend, backend::Cuda>,
                "xtrain: the Accelerator does not run on backend::Cuda yet: use Trainer<..., backend::Cuda>");
  static_assert(check_policies<PrecisionPolicy, Communicator, Backend>());

 public:
  explicit Accelerator(Communicator communicator = {}, TrainingOptions options = {})
      : comm_(std::move(communicator)), options_(std::move(options)) {}

  std::size_t process_index() const { return comm_.rank(); }
  std::size_t num_processes() const { return comm_.size(); }
  bool is_main_process() const { return comm_.rank() == 0; }

  /// The model and optimizer, data-parallel: parameters in one arena, rank 0's initial values on
  /// every rank (after a check that all ranks built the same model), gradient buckets.
  template <class Model, class Optimizer, class Loss = loss::CrossEntropyLoss>
  requires Module<Model>  // (else the data set's prepare: an optimizer and a batch size look alike)
      Engine<Model, Optimizer, PrecisionPolicy, Communicator, Backend, Loss> prepare(Model model, Optimizer optimizer,
                                                                                     Loss loss = {}) {
    static_assert(check_policies<Model, Optimizer, PrecisionPolicy, Communicator, Backend, Loss>());
    using parallel::describe_or, parallel::field_text;
    const TrainingOptions& o = options_;
    parallel::check_agreement(comm_, {{"the optimizer", describe_or(optimizer, Optimizer::name)},
                                      {"the precision", PrecisionPolicy::name},
                                      {"the loss", describe_or(loss, "(loss)")},
                                      {"accumulate", field_text(o.accumulate())},
                                      {"bucket_bytes", field_text(o.bucket_bytes())},
                                      {"the seed", field_text(o.seed())},
                                      {"the schedule", o.schedule().describe()},
                                      {"the parameter groups", group_names(o)},
                                      {"clip_grad_norm", field_text(o.clip_grad_norm())},
                                      {"clip_grad_value", field_text(o.clip_grad_value())},
                                      {"deterministic", field_text(o.deterministic())},
                                      {"zero_stage", field_text(o.zero_stage())},
                                      {"scale_lr", field_text(o.scale_lr())}});
    return Engine<Model, Optimizer, PrecisionPolicy, Communicator, Backend, Loss>(
        std::move(model), std::move(optimizer), duplicate(), o, std::move(loss));
  }

  /// A loader over the global permutation of `data`, this rank's shard of each global batch of
  /// batch_per_process x num_processes() samples.
  template <class D>
  data::Loader<D> prepare(const D& data, std::size_t batch_per_process, bool shuffle = true, bool drop_last = false) {
    static_assert(data::check_dataset<D>());
    using parallel::data_fingerprint, parallel::field_text;
    parallel::check_agreement(comm_, {{"the data set", data_fingerprint(data)},
                                      {"the batch per process", field_text(batch_per_process)},
                                      {"shuffle", field_text(shuffle)},
                                      {"drop_last", field_text(drop_last)}});
    return data::Loader<D>(data, batch_per_process * comm_.size(), options_.seed(), shuffle, drop_last, comm_.rank(),
                           comm_.size());
  }

  /// Whether this micro-step ends the accumulation window (then backward communicates and step
  /// applies the optimizer). The last batch of the data always syncs.
  template <class E>
  bool accumulate(const E& engine, bool last_batch = false) const {
    return last_batch || engine.sync_next();
  }

  /// What to divide the summed loss by: the terms (samples, tokens, elements, as the engine's loss
  /// counts them) of the global batch times the accumulation steps, so the reduced gradient is
  /// that of the mean over everything the optimizer step covers. Collective when the count
  /// depends on the data (an ignore index).
  template <class E, class Batch>
  double loss_normalizer(E& engine, const Batch& batch) const {
    return engine.loss_normalizer(batch.y, batch.global_count);
  }
  /// The same for a loss of one term per sample: the global batch times the accumulation steps.
  template <class Batch>
  double loss_normalizer(const Batch& batch) const {
    return static_cast<double>(batch.global_count) * static_cast<double>(options_.accumulate());
  }

  /// Backward from d(loss)/d(logits); when `sync`, the gradients are summed over ranks on return
  /// (under zero_stage 1 in the step; under zero_stage(2) in every backward, a rank keeping its block).
  template <class E>
  void backward(E& engine, const Tensor<float>& dlogits, bool sync) {
    engine.backward(dlogits, sync);
  }

  /// torch.nn.utils.clip_grad_norm_ on the (reduced, unscaled) gradients; returns the norm
  /// before clipping.
  template <class E>
  double clip_grad_norm(E& engine, double max_norm) {
    engine.unscale_gradients();
    return optim::clip_grad_norm(engine.params().grads(), max_norm);
  }
  /// torch.nn.utils.clip_grad_value_ on the (reduced, unscaled) gradients.
  template <class E>
  void clip_grad_value(E& engine, float clip_value) {
    engine.unscale_gradients();
    optim::clip_grad_value(engine.params().grads(), clip_value);
  }

  /// Every rank's `values` concatenated in rank order (ranks may hold different counts, e.g. the
  /// uneven last batch); no sample is duplicated.
  std::vector<float> gather_for_metrics(std::span<const float> values) {
    std::vector<double> counts(comm_.size(), 0.0);
    counts[comm_.rank()] = static_cast<double>(values.size());
    comm_.allreduce_sum(std::span<double>(counts), "gather_for_metrics counts");
    const auto widest = static_cast<std::size_t>(*std::max_element(counts.begin(), counts.end()));
    std::vector<float> mine(widest, 0.0f), all(widest * comm_.size());
    std::copy(values.begin(), values.end(), mine.begin());
    comm_.allgather(mine, all, "gather_for_metrics");
    std::vector<float> out;
    for (std::size_t r = 0; r < comm_.size(); ++r)
      out.insert(out.end(), all.begin() + static_cast<std::ptrdiff_t>(r * widest),
                 all.begin() + static_cast<std::ptrdiff_t>(r * widest + static_cast<std::size_t>(counts[r])));
    return out;
  }

  /// printf on the main process only.
  template <class... Args>
  void print(const char* format, Args... args) const {
    if (!is_main_process()) return;
    std::printf(format, args...);
    std::fflush(stdout);
  }

  /// Saves the training state of `engine` to `dir`/state.xtrain, atomically (Accelerate's
  /// save_state): parameters, buffers, optimizer state, schedule, loss scaler, step, data seed,
  /// RNG, and the objects registered with register_for_checkpointing (your epoch and position, for
  /// example). Collective: every rank calls it, rank 0 writes (under zero_stage every rank writes
  /// its shard too: a filesystem every rank reaches).
  template <class E>
  void save_state(E& engine, const std::string& dir) {
    engine.save_state(dir, checkpoint::Position{}, registered_);
  }
  /// Restores what save_state saved, on any number of ranks. Collective.
  template <class E>
  void load_state(E& engine, const std::string& dir) {
    engine.load_state(dir, registered_);
  }
  /// Saves and restores `object` (anything with serialize(Archive&, unsigned)) with the state, in
  /// registration order. It must outlive the saves and loads.
  template <class T>
  void register_for_checkpointing(T& object) {
    registered_.push_back({[&object](boost::archive::binary_oarchive& ar) { ar << object; },
                           [&object](boost::archive::binary_iarchive& ar) { ar >> object; }});
  }

  /// Handles stop signals (SIGTERM, SIGINT, SIGUSR1 by default) from now until the Accelerator
  /// is destroyed: a signal is only recorded, and your loop asks stop_signal() at each step
  /// boundary. Without this call signals keep their usual effect.
  void handle_stop_signals(std::vector<int> signals = StopSignals::defaults()) {
    stop_signals_.reset();
    stop_signals_ = std::make_unique<StopSignals>(std::move(signals));
  }
  /// Call at every step boundary (after the optimizer step), on every rank: the stop signal that
  /// some rank received, the same answer on every rank (0: go on). Collective every few steps.
  /// On a signal, save and end the program with exit_code::interrupted:
  ///   if (const int sig = acc.stop_signal()) { acc.save_state(engine, dir); return xtrain::exit_code::interrupted; }
  int stop_signal() {
    XTRAIN_CHECK(stop_signals_ != nullptr, ValueError, "Accelerator::stop_signal: call handle_stop_signals() first");
    return stop_signals_->poll(comm_);
  }

  /// Barrier: every rank waits until all have arrived.
  void wait_for_everyone() { comm_.barrier("wait_for_everyone"); }

  Communicator& communicator() noexcept { return comm_; }

 private:
  Communicator duplicate() const { return comm_.duplicate(); }
  static std::string group_names(const TrainingOptions& o) {
    std::vector<optim::GroupScales> scales;
    for (const auto& g : o.param_groups()) scales.push_back(g.scales());
    return optim::describe(scales);
  }

  Communicator comm_;
  TrainingOptions options_;
  std::vector<checkpoint::Registered> registered_;
  std::unique_ptr<StopSignals> stop_signals_;
};

}  // namespace xtrain
