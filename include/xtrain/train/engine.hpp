#pragma once
/// \file engine.hpp
/// The data-parallel engine under both the Trainer and the Accelerate-style API: the model, its
/// flat parameter arena, the optimizer state, the communicator and the gradient buckets; one
/// micro-step at a time (forward, loss, backward with bucketed non-blocking allreduce, and on the
/// last micro-step of an accumulation window: wait, clip, optimizer step).

#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <zlib.h>

#include "xtrain/backend/cpu.hpp"
#include "xtrain/checkpoint/archive.hpp"
#include "xtrain/checkpoint/state.hpp"
#include "xtrain/core/concepts.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/core/profiler.hpp"
#include "xtrain/loss/cross_entropy.hpp"
#include "xtrain/loss/loss.hpp"
#include "xtrain/optim/clip.hpp"
#include "xtrain/optim/param_groups.hpp"
#include "xtrain/optim/schedule.hpp"
#include "xtrain/parallel/agreement.hpp"
#include "xtrain/parallel/buckets.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/model_check.hpp"
#include "xtrain/precision/cast.hpp"
#include "xtrain/precision/policy.hpp"
#include "xtrain/train/deterministic.hpp"
#include "xtrain/train/metrics.hpp"
#include "xtrain/train/sharded_step.hpp"

namespace xtrain {

/// How gradients are reduced and applied.
struct EngineOptions {
  std::size_t bucket_bytes = 25u << 20;  ///< gradient bucket size (DDP's default 25 MB)
  std::size_t accumulate = 1;            ///< micro-steps per optimizer step
  std::size_t deterministic_chunk = 0;   ///< > 0: rank-count-invariant reduction, chunks of this many samples
  bool shard_optimizer = false;          ///< ZeRO stage 1: each rank steps its block of the parameters
  std::size_t global_batch = 0;          ///< samples per global step (needed by the deterministic mode)
  double clip_norm = 0.0;                ///< > 0: clip the global gradient norm to this
  float clip_value = 0.0f;               ///< > 0: clamp every gradient to +-this
  std::uint64_t seed = 42;               ///< dropout streams
  float lr_factor = 1.0f;                ///< multiplies the optimizer's lr (linear scaling rule)
  optim::LrSchedule schedule = optim::LrSchedule::constant();
  float loss_scale = 65536.0f;                      ///< initial dynamic loss scale (fp16 only)
  std::uint64_t loss_scale_growth_interval = 2000;  ///< clean steps before the scale doubles (fp16 only)
  std::vector<optim::ParamGroup> param_groups;      ///< lr / weight-decay multipliers by rule (first match)
  std::size_t threads = 0;  ///< the Backend's threads per rank (0: its default; backend/cpu.hpp)
};

template <class Model, class Optimizer, parallel::Communicator Communicator, Precision PrecisionPolicy = FullPrecision,
          class Loss = loss::CrossEntropyLoss, backend::Backend Backend = backend::Cpu>
class Engine {
  /// The type activations are stored in between modules.
  using act_t = typename PrecisionPolicy::storage_type;
  static_assert(check_module_for<Model, act_t>());
  static_assert(loss::check_loss<Loss>());

 public:
  using target_type = typename Loss::target_type;

  /// Takes the model, moves its parameters into one arena, checks that every rank built the same
  /// model (names and shapes), and broadcasts rank 0's parameters and buffers.
  /// Every buffer of the training (arena, optimizer state, activations, workspaces) comes from
  /// the Backend's memory resource: each public member that may allocate runs under a
  /// memory::Use scope of it.
  Engine(Model model, Optimizer optimizer, Communicator communicator, EngineOptions options, Loss loss = {})
      : model_(std::move(model)),
        optimizer_(std::move(optimizer)),
        comm_(std::move(communicator)),
        options_(std::move(options)),
        backend_(options_.threads),
        arena_(adopt(model_, options_.shard_optimizer ? comm_.size() * ParamArena::alignment : ParamArena::alignment,
                     backend_memory())),
        shard_(options_.shard_optimizer && comm_.size() > 1),
        block_(arena_.size() / (shard_ ? comm_.size() : 1)),
        state_(in_backend_memory([&] { return optimizer_.init(block_); })),
        buckets_(arena_, options_.bucket_bytes),
        collectives_(comm_),
        loss_(std::move(loss)),
        scaler_(options_.loss_scale, 2.0f, 0.5f, options_.loss_scale_growth_interval) {
    XTRAIN_CHECK(options_.accumulate > 0, ValueError, "accumulate must be at least 1");
    if (const char* d = std::getenv("XTRAIN_DEBUG_COLLECTIVES"); d && std::string(d) != "0") {
      const char* every = std::getenv("XTRAIN_DEBUG_PARAMETERS_EVERY");
      check_every_ = every ? std::strtoull(every, nullptr, 10) : 100;
    }
    if (options_.deterministic_chunk)
      DeterministicReduction::check_layout(options_.deterministic_chunk, options_.global_batch, comm_.size());
    groups_ = optim::assign_param_groups(arena_, options_.param_groups);
    segments_ = optim::group_segments(arena_);
    XTRAIN_CHECK(!(shard_ && options_.deterministic_chunk), ValueError,
                 "shard_optimizer and the deterministic reduction cannot be combined");
    synchronize();
    // A communicator that sums through shared memory gets the gradients written where it reads
    // them (the bucketed and sharded paths; the deterministic one reduces chunk sums elsewhere),
    // and, sharded, the parameters the all-gather reads.
    if constexpr (parallel::ProvidesNodeStorage<Communicator>) {
      if (comm_.size() > 1 && !options_.deterministic_chunk) {
        const parallel::NodeStorage s = comm_.node_storage(arena_.size(), shard_);
        if (!s.gradients.empty()) arena_.move_gradients_to(model_, s.gradients);
        if (!s.parameters.empty()) arena_.move_values_to(model_, s.parameters);
      }
    }
  }

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// One micro-batch: this rank's inputs `x` and targets `y` of a global batch of `global_count`
  /// samples whose sample 0 is sample `global_offset` of it. The loss is normalised by the count
  /// of terms in the global batch (samples, tokens, elements) times the accumulation steps. On the
  /// last micro-step of the window (or when `force_sync`) the gradients are reduced and the
  /// optimizer steps.
  template <class Input>
  StepResult micro_step(const Input& x, const target_type& y, std::size_t global_offset, std::size_t global_count,
                        bool force_sync = false) {
    const memory::Use use(backend_memory());
    const bool sync = force_sync || micro_ + 1 == options_.accumulate;
    const double normalizer = loss_normalizer(y, global_count);
    float loss = 0.0f;
    if (options_.deterministic_chunk) {
      loss = deterministic_micro_step(x, y, micro_samples_ + global_offset, normalizer);
      if (sync) {
        const auto scope = record(deterministic_label_, profile::Category::reduction);
        deterministic_.reduce(comm_, arena_.grads());
      }
    } else {
      const Tensor<float>& out = forward(x, global_offset);
      {
        const auto scope = record(loss_label_, profile::Category::forward);
        loss = loss_.forward(out, y, normalizer);
      }
      record_metrics(y);
      backward(loss_.backward(), sync);
    }
    StepResult r{step_, loss, current_lr(), micro_samples_ + global_count};
    r.skipped = !step(sync, global_count) && sync;
    r.step = step_;
    return r;
  }

  /// What the loss of a micro-step with targets `y` is divided by: the terms (samples, tokens not
  /// ignored, elements) of the global batch of `global_count` samples, times the accumulation
  /// steps. A loss whose count depends on the data (an ignore index) has it all-reduced.
  double loss_normalizer(const target_type& y, std::size_t global_count) {
    const std::size_t per_sample = loss_.terms_per_sample(y);
    double terms = static_cast<double>(global_count) * static_cast<double>(per_sample);
    if (per_sample == 0) {
      terms = static_cast<double>(loss_.count(y));
      comm_.allreduce_sum(std::span<double>(&terms, 1), "loss normaliser");
    }
    return terms * static_cast<double>(options_.accumulate);
  }

  /// Forward of a training micro-step (train mode). `global_offset` is the position of sample 0
  /// in this micro-step's global batch; positions count across the accumulation window, so k
  /// micro-batches of B draw the dropout masks one batch of k * B would. Zeroes the gradients at
  /// the start of a window. Returns the output in fp32; it lives in the model or the engine until
  /// the next forward.
  template <class Input>
  const Tensor<float>& forward(const Input& x, std::size_t global_offset) {
    XTRAIN_CHECK(!options_.deterministic_chunk, ValueError,
                 "the deterministic reduction needs Engine::micro_step (it computes chunk by chunk)");
    const memory::Use use(backend_memory());
    if (micro_ == 0) {
      const auto scope = record(zero_grad_label_, profile::Category::optimizer);
      zero_grad();
    }
    ctx_ = context(true);
    ctx_.sample_offset = micro_samples_ + global_offset;
    return run_forward(ctx_, x);
  }

  /// Forward in `ctx`'s mode (evaluation, prediction): the output in fp32, whatever the precision
  /// policy stores in between. It lives in the engine or the model until the next forward.
  template <class Input>
  const Tensor<float>& predict(Context& ctx, const Input& x) {
    const memory::Use use(backend_memory());
    return run_forward(ctx, x);
  }

  /// Backward of the last forward from d(loss)/d(logits), adding into the gradients. When `sync`
  /// (last micro-step of the window) the buckets' allreduces start during backward and are
  /// complete on return: the gradients are then summed over ranks (clip them now if you wish).
  void backward(const Tensor<float>& dlogits, bool sync) {
    const memory::Use use(backend_memory());
    ctx_.input_grad = false;                                  // nothing needs the gradient of the data
    const bool reduce = sync && comm_.size() > 1 && !shard_;  // sharded: reduce-scattered in step()
    run_backward(ctx_, dlogits, reduce);
    if (reduce) {
      const auto scope = record(reduction_label_, profile::Category::reduction);
      buckets_.finish(comm_, arena_.grads());
    } else {
      buckets_.check_complete();
    }
  }

  /// Ends a micro-step of `global_count` samples: when `sync`, clips (per the options) and steps
  /// the optimizer; otherwise only counts the micro-step. Returns whether the optimizer stepped.
  bool step(bool sync, std::size_t global_count) {
    const memory::Use use(backend_memory());
    micro_samples_ += global_count;
    if (!sync) {
      ++micro_;
      return false;
    }
    const float lr = current_lr();
    ++step_;
    micro_ = 0;
    micro_samples_ = 0;
    const auto scope = record(optimizer_label_, profile::Category::optimizer);
    const bool stepped = shard_ ? sharded_step(lr) : full_step(lr);
    if (check_every_ && step_ % check_every_ == 0) check_parameters_agree();
    return stepped;
  }

  /// Under XTRAIN_DEBUG_COLLECTIVES=1 (the value of XTRAIN_DEBUG_PARAMETERS_EVERY, default 100):
  /// every this many steps the ranks compare a CRC-32 of their parameters. 0: never.
  void check_parameters_every(std::uint64_t steps) noexcept { check_every_ = steps; }

  /// Throws ValueError on a rank whose parameters differ from rank 0's (a CRC-32 of the flat
  /// buffer), naming the step: ranks that drift apart (a bug in a custom module, a bit flip)
  /// stop there instead of training on silently. Collective.
  void check_parameters_agree() {
    if (comm_.size() == 1) return;
    const auto v = arena_.values();
    std::string mine = field_text(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(v.data()),
                                        static_cast<uInt>(v.size() * sizeof(float))));
    std::string root = mine;
    comm_.broadcast(root, "parameter checksum");
    XTRAIN_CHECK(root == mine, ValueError, "parameters differ across ranks after step ", step_, ": CRC-32 ", mine,
                 " on rank ", comm_.rank(), " but ", root,
                 " on rank 0 (ranks must stay identical: a module that changes its parameters on one rank only?)");
  }

 private:
  // Mixed precision order: reduce (done) -> unscale -> check -> clip -> step, or skip.
  bool full_step(float lr) {
    if constexpr (PrecisionPolicy::uses_loss_scaling) {
      unscale_gradients();  // the reduced gradients: every rank finds the same
      unscaled_ = false;
      scaler_.update(found_inf_);
      if (found_inf_) return false;  // skipped: no optimizer step, the schedule does not advance
    }
    if (options_.clip_norm > 0) optim::clip_grad_norm(arena_.grads(), options_.clip_norm);
    if (options_.clip_value > 0) optim::clip_grad_value(arena_.grads(), options_.clip_value);
    optimizer_step(0, arena_.size(), lr);
    return true;
  }

 public:
  /// Restores the step count, the seed of data order and dropout, and the schedule (resume).
  /// Requires: no accumulation window open.
  void restore(std::uint64_t step, std::uint64_t seed, const optim::LrSchedule& schedule) {
    XTRAIN_CHECK(step >= scaler_.skipped_steps(), ValueError, "restore: step ", step, " is below the ",
                 scaler_.skipped_steps(), " skipped steps of the loss scaler");
    step_ = step;
    options_.seed = seed;
    options_.schedule = schedule;
  }
  /// True between the micro-steps of an accumulation window (a checkpoint must not be taken then).
  bool in_accumulation_window() const noexcept { return micro_ != 0; }

  /// Saves the training state to `dir`/state.xtrain atomically: parameters, buffers (rank 0's),
  /// optimizer state (gathered when sharded), schedule, loss scaler, step, data seed, RNG, the
  /// `objects`, and the caller's part of `progress` (epoch, position, metric sums). Collective:
  /// every rank calls it, rank 0 writes, every rank throws CheckpointError if the write failed.
  void save_state(const std::string& dir, checkpoint::Progress progress,
                  const std::vector<checkpoint::Registered>& objects) {
    XTRAIN_CHECK(!in_accumulation_window(), ValueError,
                 "save_state: called between the micro-steps of an accumulation window; save after an optimizer step");
    const memory::Use use(backend_memory());
    broadcast_buffers();
    progress.step = step_;
    progress.data_seed = options_.seed;
    progress.loss_scale = PrecisionPolicy::uses_loss_scaling ? scaler_.scale() : 0.0f;
    progress.loss_scale_tracker = scaler_.growth_tracker();
    progress.skipped_steps = scaler_.skipped_steps();
    progress.groups = groups_;
    progress.param_group.clear();
    for (const auto& e : arena_.entries()) progress.param_group.push_back(e.group);
    std::string error;
    with_full_optimizer_state([&](typename Optimizer::State& state) {
      if (comm_.rank() == 0) try {
          std::filesystem::create_directories(dir);
          checkpoint::write_atomic(
              dir + "/" + checkpoint::state_file_name,
              checkpoint::encode(model_, arena_, optimizer_, state, options_.schedule, progress, objects));
        } catch (const std::exception& e) {
          error = e.what();
        }
    });
    comm_.broadcast(error, "checkpoint save status");
    if (!error.empty()) throw checkpoint::CheckpointError(error);
  }

  /// Restores what save_state saved (on any number of ranks): parameters, buffers, optimizer
  /// state, schedule, loss scaler, step, data seed, RNG, the `objects`. Returns the progress
  /// record for the caller's part (epoch, position). Collective.
  checkpoint::Progress load_state(const std::string& dir, const std::vector<checkpoint::Registered>& objects) {
    const memory::Use use(backend_memory());
    const std::string path = dir + "/" + checkpoint::state_file_name;
    std::string payload;
    if (comm_.rank() == 0) try {
        payload = "ok" + checkpoint::read_verified(path);
      } catch (const std::exception& e) {
        payload = std::string("error") + e.what();
      }
    comm_.broadcast(payload, "checkpoint load");
    if (payload.rfind("error", 0) == 0) throw checkpoint::CheckpointError(payload.substr(5));
    optim::LrSchedule schedule = options_.schedule;
    typename Optimizer::State state;
    checkpoint::Progress p =
        checkpoint::decode<Model, Optimizer>(payload.substr(2), path, model_, arena_, state, schedule, objects);
    set_full_optimizer_state(std::move(state));
    optim::restore_param_groups(groups_, arena_, p.groups, p.param_group, path);
    // The loss scaler continues where it was (fp16 to fp16); a run that did not scale starts at
    // the configured scale. Skipped steps count either way: the schedule position depends on them.
    scaler_.restore(p.loss_scale > 0.0f && PrecisionPolicy::uses_loss_scaling ? p.loss_scale : options_.loss_scale,
                    p.loss_scale > 0.0f ? p.loss_scale_tracker : 0, p.skipped_steps);
    restore(p.step, p.data_seed, schedule);
    return p;
  }

  /// Calls f(state) with the optimizer state in the rank-count-independent layout (the arena's
  /// natural size): the state itself, or, when sharded, the ranks' blocks gathered. Collective.
  template <class F>
  void with_full_optimizer_state(F&& f) {
    if (!shard_) return f(state_);
    const memory::Use use(backend_memory());
    typename Optimizer::State full =
        sharding::gather_state<Optimizer>(comm_, state_, offset(), arena_.size(), arena_.natural_size());
    f(full);
  }

  /// Installs an optimizer state in the natural layout (from a checkpoint); each rank keeps its
  /// block when sharded.
  void set_full_optimizer_state(typename Optimizer::State full) {
    const memory::Use use(backend_memory());
    state_ =
        shard_ ? sharding::take_block<Optimizer>(std::move(full), offset(), block_, arena_.size()) : std::move(full);
  }

  /// Whether the next micro-step ends the accumulation window.
  bool sync_next() const noexcept { return micro_ + 1 == options_.accumulate; }

  /// Learning rate of the next optimizer step (the schedule counts the steps the optimizer took:
  /// steps skipped for overflow do not advance it).
  float current_lr() const {
    return options_.schedule.lr(optimizer_.learning_rate() * options_.lr_factor, step_ - scaler_.skipped_steps());
  }
  /// Optimizer steps actually taken (global steps minus those skipped for overflow).
  std::uint64_t optimizer_steps() const noexcept { return step_ - scaler_.skipped_steps(); }
  /// The dynamic loss scaler (used only when the precision policy scales: fp16).
  DynamicLossScaler& loss_scaler() noexcept { return scaler_; }
  const DynamicLossScaler& loss_scaler() const noexcept { return scaler_; }
  /// fp16: divides the reduced gradients by the loss scale and notes whether any is Inf or NaN,
  /// once per optimizer step (step() does it when you have not; call it before clipping or
  /// reading the gradients yourself). Other precisions: does nothing.
  void unscale_gradients() {
    if constexpr (PrecisionPolicy::uses_loss_scaling) {
      if (unscaled_) return;
      found_inf_ = scaler_.unscale_and_check(arena_.grads());
      unscaled_ = true;
    }
  }
  /// Whether this engine scales the loss (MixedPrecision<fp16>).
  static constexpr bool uses_loss_scaling = PrecisionPolicy::uses_loss_scaling;

  /// Copies rank 0's buffers (BatchNorm running statistics) to every rank, as DDP does before
  /// evaluation and saving (ranks' per-rank statistics differ otherwise).
  void broadcast_buffers() {
    if (comm_.size() == 1) return;
    xtrain::visit_buffers(model_, [&](const std::string&, auto&& buffer) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(buffer)>, Tensor<float>>) {
        comm_.broadcast(std::span<float>(buffer.data(), buffer.size()), "broadcast buffers");
      } else {
        double v = static_cast<double>(buffer);
        comm_.broadcast(std::span<double>(&v, 1), "broadcast buffers");
        buffer = static_cast<std::int64_t>(v);
      }
    });
  }

  /// Context for a forward pass in train or eval mode.
  Context context(bool training) {
    Context ctx;
    ctx.training = training;
    ctx.seed = options_.seed;
    ctx.step = step_;
    ctx.collectives = comm_.size() > 1 ? &collectives_ : nullptr;
    ctx.profiler = profiler_;
    ctx.executor = backend_.executor();
    ctx.memory = &backend_memory();
    return ctx;
  }

  /// Records the steps in `p` from now on (null: stop): every module's forward and backward
  /// (named as in state_dict), the loss, the optimizer step, the gradient reductions. Collective:
  /// the ranks start the profiler's clock together (after a barrier), so that their traces share
  /// one timeline. `p` must outlive its use; one profiler per engine. (The Trainer calls it and
  /// ends a profiler step after each optimizer step; in your own loop call `p->step()`.)
  void set_profiler(profile::Profiler* p) {
    comm_.barrier("profiler start");
    profiler_ = p;
    buckets_.set_profiler(p);
    if (!p) return;
    p->set_origin();
    p->attach(model_);
    loss_label_ = p->label("", profile::kind_of(loss_));
    optimizer_label_ = p->label("", Optimizer::name);
    zero_grad_label_ = p->label("", profile::zero_grad_kind);
    reduction_label_ = p->label("", "gradient allreduce wait");
    deterministic_label_ = p->label("", "gradient tree reduction");
    scatter_label_ = p->label("", "gradient reduce-scatter");
    gather_label_ = p->label("", "parameter all-gather");
  }
  profile::Profiler* profiler() const noexcept { return profiler_; }

  Model& model() noexcept { return model_; }
  const Optimizer& optimizer() const noexcept { return optimizer_; }
  typename Optimizer::State& optimizer_state() noexcept { return state_; }
  ParamArena& params() noexcept { return arena_; }
  Communicator& communicator() noexcept { return comm_; }
  const EngineOptions& options() const noexcept { return options_; }
  Loss& loss() noexcept { return loss_; }
  Backend& backend() noexcept { return backend_; }
  /// Where the backend's buffers live (its executor's memory resource).
  memory::Resource& backend_memory() {
    backend::Executor* e = backend_.executor();
    XTRAIN_CHECK(e != nullptr, ValueError, "backend '", Backend::name,
                 "' has no executor: Backend::executor() must not be null (backend::Serial runs kernels on the "
                 "calling thread)");
    return e->memory();
  }
  /// f() with the backend's memory resource current (what it allocates is the backend's).
  template <class F>
  decltype(auto) in_backend_memory(F&& f) {
    const memory::Use use(backend_memory());
    return f();
  }
  /// Sum of per-term losses, correct predictions (classification) and terms of the last
  /// micro-step (this rank).
  double last_loss_sum() const noexcept { return loss_sum_; }
  std::size_t last_correct() const noexcept { return correct_; }
  std::size_t last_terms() const noexcept { return terms_; }
  /// The parameter groups: the default one (index 0) and those of the options, with the
  /// multipliers in force (a checkpoint's, after load_state).
  const std::vector<optim::GroupScales>& param_groups() const noexcept { return groups_; }
  std::uint64_t step() const noexcept { return step_; }
  const parallel::CommStats& comm_stats() const noexcept { return buckets_.stats(); }
  void reset_comm_stats() noexcept { buckets_.reset_stats(); }
  std::size_t bucket_count() const noexcept { return buckets_.buckets().size(); }

 private:
  std::size_t offset() const noexcept { return shard_ ? comm_.rank() * block_ : 0; }

  // An event of the attached profiler (nothing without one).
  profile::Profiler::Scope record(std::uint32_t label, profile::Category category) {
    return profiler_ ? profiler_->scope(label, category) : profile::Profiler::Scope{};
  }

  // Module ids, then the arena in `memory`, where the model's buffers (BatchNorm's running
  // statistics, made with the model) move too.
  static ParamArena adopt(Model& model, std::size_t multiple, memory::Resource& memory) {
    assign_module_ids(model);
    const memory::Use use(memory);
    xtrain::visit_buffers(
        model,
        [](const std::string&, auto& buffer) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(buffer)>, Tensor<float>>) {
            Tensor<float> copy(buffer);  // from `memory`
            buffer = std::move(copy);
          }
        },
        true);
    return ParamArena(model, multiple);
  }

  // ZeRO stage 1 (sharded_step.hpp): reduce-scatter the gradients, clip with the global norm,
  // step this rank's block of parameters with its block of optimizer state, all-gather the
  // parameters. Each rank does 1/N of the optimizer's work and holds 1/N of its state.
  bool sharded_step(float lr) {
    auto start = std::chrono::steady_clock::now();
    {
      const auto scope = record(scatter_label_, profile::Category::reduction);
      comm_.reduce_scatter_sum(arena_.grads(), "gradient reduce-scatter");
    }
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    auto grads = arena_.grads().subspan(offset(), block_);
    if constexpr (PrecisionPolicy::uses_loss_scaling) {  // each rank checks its block; all must agree
      double bad = scaler_.unscale_and_check(grads) ? 1.0 : 0.0;
      comm_.allreduce_sum(std::span<double>(&bad, 1), "gradient overflow check");
      scaler_.update(bad > 0.0);
      if (bad > 0.0) {
        buckets_.count_blocking(waited, 1);
        return false;
      }
    }
    if (options_.clip_norm > 0) sharding::clip_grad_norm(comm_, grads, options_.clip_norm);
    if (options_.clip_value > 0) optim::clip_grad_value(grads, options_.clip_value);
    optimizer_step(offset(), offset() + block_, lr);
    start = std::chrono::steady_clock::now();
    {
      const auto scope = record(gather_label_, profile::Category::reduction);
      comm_.allgather_blocks(arena_.values(), "parameter all-gather");
    }
    waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    buckets_.count_blocking(waited, 2);
    return true;
  }

  // Zeroes the gradients split over the threads (the optimizer pass's grain; the same boundaries
  // for a model of one parameter group), rather than on the driving thread alone.
  void zero_grad() {
    const std::span<float> g = arena_.grads();
    backend::parallel_for(backend_.executor(), g.size(), optimizer_grain,
                          [&](std::size_t b, std::size_t e) { std::fill_n(g.data() + b, e - b, 0.0f); });
  }

  // Elements per part of the optimizer's pass and of zero_grad.
  static constexpr std::size_t optimizer_grain = std::size_t{1} << 15;

  // One fused optimizer pass per group segment over the arena range [begin, end) (this rank's
  // block when sharded: its optimizer state starts at `begin`).
  void optimizer_step(std::size_t begin, std::size_t end, float lr) {
    for (const optim::GroupSegment& seg : segments_) {
      const std::size_t b = std::max(seg.begin, begin), e = std::min(seg.end, end);
      if (b >= e) continue;
      const optim::GroupScales& g = groups_[seg.group];
      // Elementwise: split at multiples of 64 from the segment's start (the same SIMD/tail split
      // of every element as on one thread).
      backend::parallel_for(backend_.executor(), e - b, optimizer_grain, [&](std::size_t p0, std::size_t p1) {
        optimizer_.step(arena_.values().subspan(b + p0, p1 - p0), arena_.grads().subspan(b + p0, p1 - p0), state_,
                        StepInfo{lr * g.lr_scale, optimizer_steps(), b + p0 - begin, g.weight_decay_scale});
      });
    }
  }

  // The model's input in the policy's storage type, its output in fp32.
  template <class Input>
  const Tensor<float>& run_forward(Context& ctx, const Input& x) {
    if constexpr (std::is_same_v<Input, Tensor<std::int32_t>> && TokenModuleFor<Model, act_t>)
      return cast_.output(xtrain::forward_tokens<act_t>(ctx, model_, x));
    else
      return cast_.output(xtrain::forward(ctx, model_, cast_.input(x)));
  }

  // d(loss)/d(output) in fp32; multiplied by the loss scale (fp16) and rounded to the storage
  // type. The root's own parameters (a model that is one module) are reported after it.
  // Every parameter use reports its gradient final (readiness): with `reduce` the buckets start
  // their reductions as they complete, otherwise the uses are only counted.
  void run_backward(Context& ctx, const Tensor<float>& dlogits, bool reduce) {
    const float scale = PrecisionPolicy::uses_loss_scaling ? scaler_.scale() : 1.0f;
    ctx.grads_ready = &Engine::on_param_ready;
    ctx.grads_ready_user = this;
    buckets_.begin_backward(reduce);
    xtrain::backward(ctx, model_, cast_.gradient(dlogits, scale));
  }

  void record_metrics(const target_type& y) {
    loss_sum_ = loss_.sum();
    if constexpr (loss::HasAccuracy<Loss>) correct_ = loss_.correct();
    terms_ = loss_.count(y);
  }

  static void on_param_ready(void* self, std::uint32_t slot) {
    auto* e = static_cast<Engine*>(self);
    e->buckets_.ready(e->comm_, e->arena_.grads(), slot);
  }

  // Deterministic mode: the gradient of every chunk of `chunk` samples of the global batch is
  // computed alone and pushed into the tree sum (deterministic.hpp).
  template <class Input>
  float deterministic_micro_step(const Input& x, const target_type& y, std::size_t offset, double normalizer) {
    const std::size_t chunk = options_.deterministic_chunk, rows = x.dimension() ? x.shape(0) : 0;
    const std::size_t chunks = options_.global_batch / chunk / comm_.size();
    double loss = 0.0;
    loss_sum_ = 0.0;
    correct_ = 0;
    terms_ = 0;
    for (std::size_t j = 0; j < chunks; ++j) {
      {
        const auto scope = record(zero_grad_label_, profile::Category::optimizer);
        zero_grad();
      }
      const std::size_t begin = std::min(j * chunk, rows), end = std::min(begin + chunk, rows);
      if (end > begin) {
        Context ctx = context(true);
        ctx.sample_offset = offset + begin;
        const target_type& cy = rows_of(y, begin, end, chunk_y_);
        const Tensor<float>& out = run_forward(ctx, rows_of(x, begin, end, chunk_input<typename Input::value_type>()));
        {
          const auto scope = record(loss_label_, profile::Category::forward);
          loss += loss_.forward(out, cy, normalizer);
        }
        loss_sum_ += loss_.sum();
        if constexpr (loss::HasAccuracy<Loss>) correct_ += loss_.correct();
        terms_ += loss_.count(cy);
        ctx.input_grad = false;
        run_backward(ctx, loss_.backward(), false);
        buckets_.check_complete();
      }
      deterministic_.push(arena_.grads());
    }
    deterministic_.end_micro_step(micro_, arena_.size());
    return static_cast<float>(loss);
  }

  template <class T>
  Tensor<T>& chunk_input() {
    if constexpr (std::is_same_v<T, float>)
      return chunk_x_f32_;
    else
      return chunk_x_i32_;
  }

  // Samples [begin, end) of `t` copied into `out`.
  template <class T>
  static const Tensor<T>& rows_of(const Tensor<T>& t, std::size_t begin, std::size_t end, Tensor<T>& out) {
    const std::size_t per = t.shape(0) ? t.size() / t.shape(0) : 0;
    Shape s = t.shape();
    s[0] = end - begin;
    out.resize(s);
    std::copy_n(t.data() + begin * per, (end - begin) * per, out.data());
    return out;
  }

  /// Every rank must have built the same model; then rank 0's parameters and buffers win.
  void synchronize() {
    if (comm_.size() == 1) return;
    const std::string mine = parallel::model_structure(arena_);
    std::string root = mine;
    comm_.broadcast(root, "model structure check");
    if (root != mine) throw ValueError(parallel::structure_mismatch(root, mine, comm_.rank()));
    comm_.broadcast(arena_.values(), "broadcast initial parameters");
    broadcast_buffers();
  }

  Model model_;
  Optimizer optimizer_;
  Communicator comm_;
  EngineOptions options_;
  Backend backend_;
  ParamArena arena_;
  bool shard_;
  std::size_t block_;  // optimizer-state elements on this rank
  typename Optimizer::State state_;
  parallel::GradientBuckets<Communicator> buckets_;
  parallel::CollectivesOf<Communicator> collectives_;
  Loss loss_;
  double loss_sum_ = 0.0;
  std::size_t correct_ = 0, terms_ = 0;
  std::uint64_t step_ = 0;
  std::size_t micro_ = 0, micro_samples_ = 0;
  std::vector<optim::GroupScales> groups_;
  std::vector<optim::GroupSegment> segments_;
  DeterministicReduction deterministic_;
  Tensor<float> chunk_x_f32_;
  Tensor<std::int32_t> chunk_x_i32_;
  typename Loss::target_type chunk_y_;
  Context ctx_;  // of the micro-step in flight (forward to backward)
  DynamicLossScaler scaler_;
  PrecisionCast<PrecisionPolicy> cast_;
  bool unscaled_ = false, found_inf_ = false;
  std::uint64_t check_every_ = 0;  // parameter checksum period (XTRAIN_DEBUG_COLLECTIVES)
  profile::Profiler* profiler_ = nullptr;
  std::uint32_t loss_label_ = 0, optimizer_label_ = 0, zero_grad_label_ = 0, reduction_label_ = 0,
                deterministic_label_ = 0, scatter_label_ = 0, gather_label_ = 0;
};

}  // namespace xtrain
