#pragma once
/// \file engine.hpp
/// Engine<Model, Optimizer, Precision, Communicator, Backend, Loss>: the data-parallel training
/// step under the Trainer and the Accelerator. It holds the model (its parameters in one arena),
/// the optimizer state, the loss and the communicator, and runs one micro-step at a time:
/// forward, loss, backward watched by the gradient synchronisation mode, and on the last
/// micro-step of an accumulation window the optimizer step. How gradients are reduced is the
/// mode's (parallel/sync_modes.hpp), loss scaling the precision's (precision/loss_scaling.hpp),
/// saving and loading checkpoint/collective.hpp's.
///
/// Memory: the engine's own buffers (arena, casts, reduction buffers) are made in the backend's
/// memory; code it calls but does not own (modules, through Context::memory; the loss; the
/// optimizer's state) allocates there too, whichever thread calls the engine.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "xtrain/backend/cpu.hpp"
#include "xtrain/checkpoint/collective.hpp"
#include "xtrain/checkpoint/sharded.hpp"
#include "xtrain/core/concepts.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/core/profiler.hpp"
#include "xtrain/loss/cross_entropy.hpp"
#include "xtrain/loss/loss.hpp"
#include "xtrain/optim/clip.hpp"
#include "xtrain/optim/param_groups.hpp"
#include "xtrain/parallel/replicas.hpp"
#include "xtrain/parallel/single_process.hpp"
#include "xtrain/parallel/sync_modes.hpp"
#include "xtrain/precision/cast.hpp"
#include "xtrain/precision/loss_scaling.hpp"
#include "xtrain/train/metrics.hpp"
#include "xtrain/train/options.hpp"
#include "xtrain/train/policies.hpp"

namespace xtrain {

template <class Model, class Optimizer, class PrecisionPolicy = FullPrecision,
          class Communicator = parallel::SingleProcess, class Backend = backend::Cpu,
          class Loss = loss::CrossEntropyLoss>
class Engine {
  static_assert(check_policies<Model, Optimizer, PrecisionPolicy, Communicator, Backend, Loss>());
  using act_t = typename PrecisionPolicy::storage_type;  // activations between modules
  static_assert(check_module_for<Model, act_t>());

 public:
  using target_type = typename Loss::target_type;

  /// Adopts the model (parameters into one arena in the backend's memory), checks that every rank
  /// built the same model and gives every rank rank 0's parameters and buffers. Collective.
  Engine(Model model, Optimizer optimizer, Communicator communicator, TrainingOptions options = {}, Loss loss = {})
      : model_(std::move(model)),
        optimizer_(std::move(optimizer)),
        comm_(std::move(communicator)),
        options_(checked(std::move(options), comm_.size())),
        backend_(options_.threads()),
        memory_(&backend::memory_of(backend_)),
        arena_(adopt_model(model_, sync_choice().arena_multiple(comm_.size()), *memory_,
                           sync_choice().pages(comm_.size()))),
        sync_(parallel::make_sync(sync_choice(), comm_, arena_, *memory_)),
        state_(in_memory([&] { return optim::init_state(optimizer_, arena_, owned().begin, owned().end); })),
        groups_(arena_, options_.param_groups(), optimizer_),
        loss_(std::move(loss)),
        scaling_(options_.loss_scale(), options_.loss_scale_growth_interval()),
        cast_(*memory_),
        collectives_(comm_) {
    parallel::synchronize_replicas(comm_, arena_, model_);
    with_sync([&](auto& s) { s.attach(model_); });
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// One micro-batch: this rank's inputs `x` and targets `y` of a global batch of `global_count`
  /// samples whose sample 0 is sample `global_offset` of it. The loss is normalised by the terms
  /// of the global batch times the accumulation steps. On the last micro-step of the window (or
  /// when `force_sync`) the gradients are reduced and the optimizer steps.
  template <class Input>
  StepResult micro_step(const Input& x, const target_type& y, std::size_t global_offset, std::size_t global_count,
                        bool force_sync = false) {
    const bool last = force_sync || sync_next();
    const double normaliser = loss_normalizer(y, global_count);
    const float loss = with_sync([&](auto& s) -> float {
      if constexpr (parallel::ChunkedSync<std::remove_cvref_t<decltype(s)>>) {  // each chunk's gradient alone
        double sum = 0.0;
        LossMetrics m;
        s.for_each_chunk(
            x, y, [&] { zero_grad(); },
            [&](const Input& cx, const target_type& cy, std::size_t first) {
              Context ctx = context(true);
              ctx.sample_offset = micro_samples_ + global_offset + first;
              sum += training_loss(run_forward(ctx, cx), cy, normaliser);
              m += metrics_;
              ctx.input_grad = false;
              run_backward(ctx, loss_backward(), false);
            });
        metrics_ = m;
        return static_cast<float>(sum);
      } else {
        const float l = training_loss(forward(x, global_offset), y, normaliser);
        backward(loss_backward(), last);
        return l;
      }
    });
    StepResult r{step_, loss, current_lr(), micro_samples_ + global_count};
    r.skipped = !step(last, global_count) && last;
    r.step = step_;
    return r;
  }

  /// What the loss of a micro-step with targets `y` is divided by (loss::normaliser). Collective
  /// when the count depends on the data (an ignore index).
  double loss_normalizer(const target_type& y, std::size_t global_count) {
    return loss::normaliser(loss_, y, global_count, options_.accumulate(), comm_.size() > 1 ? &collectives_ : nullptr);
  }

  /// Forward of a training micro-step; zeroes the gradients at the start of a window. Sample
  /// positions count across the window, so k micro-batches of B draw the dropout masks one batch
  /// of k * B would. The output (fp32) lives in the model or the engine until the next forward.
  template <class Input>
  const Tensor<float>& forward(const Input& x, std::size_t global_offset) {
    XTRAIN_CHECK(with_sync([](auto& s) { return s.chunk(); }) == 0, ValueError,
                 "the deterministic reduction needs Engine::micro_step (it computes chunk by chunk)");
    if (micro_ == 0) zero_grad();
    ctx_ = context(true);
    ctx_.sample_offset = micro_samples_ + global_offset;
    return run_forward(ctx_, x);
  }
  /// Forward in `ctx`'s mode (evaluation, prediction); the output in fp32. The modules' buffers
  /// are the backend's, also with a Context that names no memory (one not made by context()).
  template <class Input>
  const Tensor<float>& predict(Context& ctx, const Input& x) {
    if (ctx.memory) return run_forward(ctx, x);
    return in_memory([&]() -> const Tensor<float>& { return run_forward(ctx, x); });
  }
  /// The engine's loss of `out` against `y` divided by `normaliser` (its buffers in the
  /// backend's memory), and its gradient d(loss)/d(out).
  float loss_forward(const Tensor<float>& out, const target_type& y, double normaliser) {
    return in_memory([&] { return loss_.forward(out, y, normaliser); });
  }
  const Tensor<float>& loss_backward() {
    return in_memory([&]() -> const Tensor<float>& { return loss_.backward(); });
  }

  /// Backward of the last forward from d(loss)/d(output), adding into the gradients. When `sync`
  /// (the last micro-step of the window) they are summed over ranks on return, unless the mode
  /// reduces them in the step (zero_stage 1); under zero_stage(2) every backward reduce-scatters
  /// them, and a rank's gradients outside its block then read as zeros.
  void backward(const Tensor<float>& dlogits, bool sync) {
    ctx_.input_grad = false;  // nothing needs the gradient of the data
    run_backward(ctx_, dlogits, sync);
  }

  /// Ends a micro-step of `global_count` samples: when `sync`, reduces what is left, unscales,
  /// agrees on overflow, clips (per the options) and steps. Returns whether the optimizer stepped.
  bool step(bool sync, std::size_t global_count) {
    micro_samples_ += global_count;
    with_sync([&](auto& s) { s.end_micro_step(sync); });
    if (!sync) {
      ++micro_;
      return false;
    }
    const float lr = current_lr();
    ++step_;
    micro_ = micro_samples_ = 0;
    const auto scope = events_.scope(optimizer_event, profile::Category::optimizer);
    const bool stepped = with_sync([&](auto& s) {
      const std::span<float> grads = s.reduce_for_step();  // all of them, or this rank's block
      scaling_.unscale(grads);
      const bool ok = scaling_.end_step([&](bool found) { return s.agree(found); });
      if (ok) {
        if (options_.clip_grad_norm() > 0) s.clip_grad_norm(grads, options_.clip_grad_norm());
        if (options_.clip_grad_value() > 0) optim::clip_grad_value(grads, options_.clip_grad_value());
        groups_.step(optimizer_, state_, arena_, s.owned().begin, s.owned().end, lr, optimizer_steps(),
                     backend_.executor());
      }
      s.after_step(ok);
      return ok;
    });
    if (!shards_parameters()) replica_check_.after_step(comm_, arena_.values(), step_);
    return stepped;
  }

  /// fp16: divides the reduced gradients by the loss scale and notes any Inf or NaN, once per
  /// step (the step does it when you have not: call it before clipping or reading the gradients
  /// yourself). Not under shard_optimizer/zero_stage, where a rank steps its block only.
  void unscale_gradients() {
    XTRAIN_CHECK(owned().size() == arena_.size(), ValueError,
                 "unscale_gradients/clip_grad_norm before the step: not with shard_optimizer (gradients are reduced "
                 "in the step; clip with TrainingOptions::clip_grad_norm)");
    scaling_.unscale(arena_.grads());
  }

  /// Saves the training state to `dir`/state.xtrain atomically: parameters, rank 0's buffers, the
  /// optimizer state, schedule, loss scaler, step, data seed, the `objects`, and the caller's part
  /// of `position` (epoch, samples, metric sums). Sharded (ZeRO on several ranks), each rank writes
  /// its block of the parameters and its part of the optimizer state to a shard file beside it
  /// (checkpoint/sharded.hpp): nothing is gathered. Collective.
  void save_state(const std::string& dir, checkpoint::Position position,
                  const std::vector<checkpoint::Registered>& objects) {
    XTRAIN_CHECK(!in_accumulation_window(), ValueError,
                 "save_state: called between the micro-steps of an accumulation window; save after an optimizer step");
    broadcast_buffers();
    position.step = step_;
    position.data_seed = options_.seed();
    position.record(loss_scaler(), uses_loss_scaling, groups_.scales(), arena_);
    if (with_sync([](const auto& s) { return s.saves_shards(); })) {
      const std::vector<parallel::StatePiece> pieces = state_pieces();
      in_memory([&] {
        checkpoint::save_sharded_training_state(comm_, dir, model_, arena_, optimizer_, pieces, options_.schedule(),
                                                position, objects);
      });
    } else {
      with_full_parameters([&] { save_full_state(dir, position, objects); });
    }
  }

  /// Restores what save_state saved (on any number of ranks, sharded or not); returns the position
  /// for the caller's part (epoch, samples). Collective.
  checkpoint::Position load_state(const std::string& dir, const std::vector<checkpoint::Registered>& objects) {
    const checkpoint::StateFile file = checkpoint::read_training_state(comm_, dir);
    if (file.shards.count == 0) return with_full_parameters([&] { return load_full_state(file, objects); });
    // Sharded: the shards this rank needs are checked before anything is restored, then read.
    const std::vector<parallel::StatePiece> pieces = state_pieces();
    checkpoint::check_shards(comm_, dir, file.shards, pieces);
    typename Optimizer::State none;  // (the state is in the shards)
    optim::LrSchedule schedule = options_.schedule();
    checkpoint::Position p = in_memory([&] {
      return checkpoint::load_training_state<Model, Optimizer>(file, model_, arena_, none, schedule, objects);
    });
    checkpoint::load_shards(comm_, dir, file.shards, pieces);
    with_sync([](auto& s) { s.share_values(); });
    return restored(p, schedule, file.path);
  }

  /// Restores the step count, the seed of data order and dropout, and the schedule (resume).
  void restore(std::uint64_t step, std::uint64_t seed, const optim::LrSchedule& schedule) {
    XTRAIN_CHECK(step >= loss_scaler().skipped_steps(), ValueError, "restore: step ", step, " is below the ",
                 loss_scaler().skipped_steps(), " skipped steps of the loss scaler");
    step_ = step;
    options_.seed(seed).schedule(schedule);
  }

  /// Context of a forward pass in train or eval mode.
  Context context(bool training) {
    Context ctx;
    ctx.training = training;
    ctx.seed = options_.seed();
    ctx.step = step_;
    ctx.collectives = comm_.size() > 1 ? &collectives_ : nullptr;
    ctx.profiler = profiler_;
    ctx.executor = backend_.executor();
    ctx.memory = memory_;
    return ctx;
  }

  /// Records the steps in `p` from now on (null: stop): every module's forward and backward,
  /// the loss, the optimizer step, the gradient reductions. Collective: the ranks start the
  /// profiler's clock together (after a barrier). `p` must outlive its use. (The Trainer ends a
  /// profiler step after each optimizer step; in your own loop call `p->step()`.)
  void set_profiler(profile::Profiler* p) {
    comm_.barrier("profiler start");
    profiler_ = p;
    with_sync([&](auto& s) { s.set_profiler(p); });
    if (p) {
      p->set_origin();
      p->attach(model_);
    }
    events_.set_kind(loss_event, profile::kind_of(loss_));
    events_.attach(p);
  }

  /// Copies rank 0's buffers (BatchNorm running statistics) to every rank. Collective.
  void broadcast_buffers() { parallel::broadcast_buffers(comm_, model_); }
  /// Under XTRAIN_DEBUG_COLLECTIVES the ranks compare a checksum of their parameters every this
  /// many steps (parallel/replicas.hpp). 0: never.
  void check_parameters_every(std::uint64_t steps) noexcept { replica_check_.set_every(steps); }

  /// Whether the next micro-step ends the accumulation window, and whether one is open.
  bool sync_next() const noexcept { return micro_ + 1 == options_.accumulate(); }
  bool in_accumulation_window() const noexcept { return micro_ != 0; }
  /// Learning rate of the next optimizer step (steps skipped for overflow do not advance it).
  float current_lr() const {
    const float factor = options_.scale_lr() ? static_cast<float>(comm_.size()) : 1.0f;  // linear scaling rule
    return options_.schedule().lr(optimizer_.learning_rate() * factor, optimizer_steps());
  }
  /// Global steps taken (skipped ones included) and optimizer steps actually applied.
  std::uint64_t step() const noexcept { return step_; }
  std::uint64_t optimizer_steps() const noexcept { return step_ - loss_scaler().skipped_steps(); }
  /// Samples per global step: global_batch_size(), else batch_size() per rank.
  std::size_t global_batch() const noexcept { return global_batch(options_, comm_.size()); }
  /// Whether this engine scales the loss (MixedPrecision<fp16>), and its scaler.
  static constexpr bool uses_loss_scaling = LossScaling<PrecisionPolicy>::enabled;
  DynamicLossScaler& loss_scaler() noexcept { return scaling_.scaler(); }
  const DynamicLossScaler& loss_scaler() const noexcept { return scaling_.scaler(); }

  Model& model() noexcept { return model_; }
  const Optimizer& optimizer() const noexcept { return optimizer_; }
  typename Optimizer::State& optimizer_state() noexcept { return state_; }
  ParamArena& params() noexcept { return arena_; }
  Communicator& communicator() noexcept { return comm_; }
  const TrainingOptions& options() const noexcept { return options_; }
  Loss& loss() noexcept { return loss_; }
  Backend& backend() noexcept { return backend_; }
  /// Where the backend's buffers live (its executor's memory resource).
  memory::Resource& memory() noexcept { return *memory_; }
  profile::Profiler* profiler() const noexcept { return profiler_; }
  /// Sum of per-term losses, correct predictions and terms of the last micro-step (this rank).
  double last_loss_sum() const noexcept { return metrics_.loss_sum; }
  std::size_t last_correct() const noexcept { return metrics_.correct; }
  std::size_t last_terms() const noexcept { return metrics_.terms; }
  /// Adds the last micro-step's loss sum, correct predictions and terms to sums[0..2] (the
  /// Trainer's epoch sums); flush_step_metrics has nothing to add here (a GPU engine sums on the
  /// device and adds its sums there).
  void add_step_metrics(double* sums) const noexcept {
    sums[0] += metrics_.loss_sum;
    sums[1] += static_cast<double>(metrics_.correct);
    sums[2] += static_cast<double>(metrics_.terms);
  }
  void flush_step_metrics(double* /*sums*/) noexcept {}
  /// The parameter groups (the default one first) with the multipliers in force.
  const std::vector<optim::GroupScales>& param_groups() const noexcept { return groups_.scales(); }
  /// The gradient synchronisation's time and gradient buckets.
  const parallel::CommStats& comm_stats() const {
    return with_sync([](const auto& s) -> const parallel::CommStats& { return s.stats(); });
  }
  void reset_comm_stats() {
    with_sync([](auto& s) { s.reset_stats(); });
  }
  std::size_t bucket_count() const {
    return with_sync([](const auto& s) { return s.bucket_count(); });
  }
  /// Bytes of gradient memory this rank holds now: the whole arena's, or under zero_stage(2) its
  /// pages in use (its block, and any bucket backward is writing).
  std::size_t gradient_bytes() const {
    return with_sync([](const auto& s) { return s.gradient_bytes(); });
  }
  /// Bytes of parameter memory this rank holds now: the whole arena's, or under zero_stage(3) its
  /// pages in use (its block, the parameters outside the units, any unit gathered now).
  std::size_t parameter_bytes() const {
    return with_sync([&](const auto& s) -> std::size_t {
      if constexpr (requires { s.parameter_bytes(); })
        return s.parameter_bytes();
      else
        return arena_.size() * sizeof(float);
    });
  }
  /// Whether the parameters live sharded over the ranks (zero_stage(3) on several ranks): then
  /// params().values() holds this rank's block and the parameters outside the units only; read
  /// them all inside with_full_parameters().
  bool shards_parameters() const {
    return with_sync([](const auto& s) {
      if constexpr (requires { s.shards_parameters(); })
        return s.shards_parameters();
      else
        return false;
    });
  }
  /// For a rank with nothing to compute while the others run a forward (an empty last evaluation
  /// batch): under zero_stage(3) it takes part in every unit's gather, in the model's order (a
  /// model whose forward runs each unit once, in that order); otherwise nothing.
  void skip_forward() {
    with_sync([](auto& s) {
      if constexpr (requires { s.skip_forward(); }) s.skip_forward();
    });
  }
  /// Runs f() with every parameter whole on this rank (zero_stage(3): all-gathered before, given
  /// back after; otherwise f() only). Collective; nests. Checkpoints and exports run so.
  template <class F>
  std::invoke_result_t<F&> with_full_parameters(F&& f) {
    using R = std::invoke_result_t<F&>;
    gather_parameters(true);
    try {
      if constexpr (std::is_void_v<R>) {
        f();
        gather_parameters(false);
      } else {
        R r = f();
        gather_parameters(false);
        return r;
      }
    } catch (...) {
      gather_parameters(false);  // (gives pages back: no collective)
      throw;
    }
  }
  /// Calls f(values), where values(entry) is a parameter's values (a span of floats) on this rank,
  /// to read the parameters one by one in arena order without holding the whole model: under
  /// zero_stage(3) the unit holding each parameter is gathered when it is first asked for and
  /// given back at the next unit (one unit at a time). Collective: every rank asks for the same
  /// parameters in the same order (safetensors export does).
  template <class F>
  void with_parameters_by_unit(F&& f) {
    with_sync([&](auto& s) {
      if constexpr (requires { s.units(); }) {
        if (s.shards_parameters()) {
          const std::vector<parallel::ArenaRange>& units = s.units();
          std::size_t held = units.size();  // none
          const auto values = [&](const ParamEntry& e) {
            const auto u = static_cast<std::size_t>(
                std::find_if(units.begin(), units.end(), [&](const auto& r) { return e.offset < r.end; }) -
                units.begin());
            const std::size_t in = u < units.size() && e.offset >= units[u].begin ? u : units.size();
            if (in != held) {
              if (held < units.size()) s.release(held);
              if (in < units.size()) s.gather(in, false);
              held = in;
            }
            return std::span<const float>(arena_.values(e));
          };
          try {
            f(values);
          } catch (...) {
            if (held < units.size()) s.release(held);
            throw;
          }
          if (held < units.size()) s.release(held);
          return;
        }
      }
      f([&](const ParamEntry& e) { return std::span<const float>(arena_.values(e)); });
    });
  }

 private:
  enum Event : std::size_t { loss_event, optimizer_event, zero_grad_event };

  // save_state and load_state with every parameter whole.
  void save_full_state(const std::string& dir, const checkpoint::Position& position,
                       const std::vector<checkpoint::Registered>& objects) {
    with_sync([&](auto& s) {
      const auto make_full = [&] { return optim::init_state(optimizer_, arena_, 0, arena_.natural_size()); };
      s.template with_full_state<Optimizer>(state_, make_full, [&](typename Optimizer::State& full) {
        in_memory([&] {  // (the registered objects' serialize is code the engine does not own)
          checkpoint::save_training_state(comm_, dir, model_, arena_, optimizer_, full, options_.schedule(), position,
                                          objects);
        });
      });
    });
  }

  checkpoint::Position load_full_state(const checkpoint::StateFile& file,
                                       const std::vector<checkpoint::Registered>& objects) {
    optim::LrSchedule schedule = options_.schedule();
    typename Optimizer::State full;
    checkpoint::Position p = in_memory([&] {
      return checkpoint::load_training_state<Model, Optimizer>(file, model_, arena_, full, schedule, objects);
    });
    state_ = with_sync([&](auto& s) { return s.template take_state<Optimizer>(std::move(full), std::move(state_)); });
    return restored(p, schedule, file.path);
  }
  // What a load restores besides the parameters and the optimizer state.
  checkpoint::Position restored(checkpoint::Position& p, const optim::LrSchedule& schedule, const std::string& path) {
    groups_.restore(arena_, p.groups, p.param_group, path);
    p.restore(loss_scaler(), uses_loss_scaling, options_.loss_scale());
    restore(p.step, p.data_seed, schedule);
    return p;
  }
  // What this rank saves in and loads from a sharded checkpoint: its block of the parameter values
  // (placed at its arena offset), then its parts of the optimizer state's vectors. Collective.
  std::vector<parallel::StatePiece> state_pieces() {
    return with_sync([&](auto& s) {
      const parallel::ArenaRange block = s.value_block();
      std::vector<parallel::StatePiece> pieces{{reinterpret_cast<std::byte*>(arena_.values().data() + block.begin),
                                                block.begin, block.size(), sizeof(float)}};
      for (const parallel::StatePiece& p : s.template state_pieces<Optimizer>(state_)) pieces.push_back(p);
      return pieces;
    });
  }

  static std::size_t global_batch(const TrainingOptions& o, std::size_t ranks) noexcept {
    return o.global_batch_size() ? o.global_batch_size() : o.batch_size() * ranks;
  }
  static TrainingOptions checked(TrainingOptions o, std::size_t ranks) {
    XTRAIN_CHECK(global_batch(o, ranks) >= ranks, ValueError, "global batch ", global_batch(o, ranks),
                 " is smaller than the ", ranks, " ranks: every rank needs at least one sample per step");
    return o;
  }
  parallel::SyncChoice sync_choice() const {
    return {options_.bucket_bytes(),    options_.deterministic(),          global_batch(),
            options_.shard_optimizer(), optim::state_granule<Optimizer>(), options_.zero_stage() >= 2,
            options_.zero_stage() >= 3, options_.prefetch_units()};
  }
  parallel::ArenaRange owned() const {
    return with_sync([](const auto& s) { return s.owned(); });
  }
  template <class F>
  decltype(auto) with_sync(F&& f) {
    return std::visit(std::forward<F>(f), sync_);
  }
  template <class F>
  decltype(auto) with_sync(F&& f) const {
    return std::visit(std::forward<F>(f), sync_);
  }
  // Code the engine does not own (the loss, the optimizer's state) allocates in the backend.
  template <class F>
  decltype(auto) in_memory(F&& f) {
    const memory::Use use(*memory_);
    return f();
  }

  void gather_parameters(bool on) {
    with_sync([&](auto& s) {
      if constexpr (requires { s.gather_all(); }) {
        if (on)
          s.gather_all();
        else
          s.release_all();
      }
    });
  }

  void zero_grad() {
    const auto scope = events_.scope(zero_grad_event, profile::Category::optimizer);
    with_sync([&](auto& s) { s.zero_grads(backend_.executor()); });
  }

  // The loss of a training micro-step (its event), and the step's metrics.
  float training_loss(const Tensor<float>& out, const target_type& y, double normaliser) {
    const float loss = [&] {
      const auto scope = events_.scope(loss_event, profile::Category::forward);
      return loss_forward(out, y, normaliser);
    }();
    metrics_ = {loss_.sum(), 0, loss_.count(y)};
    if constexpr (loss::HasAccuracy<Loss>) metrics_.correct = loss_.correct();
    return loss;
  }

  // The model's input in the policy's storage type, its output in fp32.
  template <class Input>
  const Tensor<float>& run_forward(Context& ctx, const Input& x) {
    if constexpr (std::is_same_v<Input, Tensor<std::int32_t>> && TokenModuleFor<Model, act_t>)
      return cast_.output(xtrain::forward_tokens<act_t>(ctx, model_, x));
    else
      return cast_.output(xtrain::forward(ctx, model_, cast_.input(x)));
  }

  // Backward from d(loss)/d(output) (fp32; times the loss scale under fp16, rounded to the
  // storage type), watched by the synchronisation mode (readiness, reductions).
  void run_backward(Context& ctx, const Tensor<float>& dlogits, bool last) {
    with_sync([&](auto& s) { s.begin_backward(ctx, last); });
    xtrain::backward(ctx, model_, cast_.gradient(dlogits, scaling_.factor()));
    with_sync([&](auto& s) { s.end_backward(last); });
  }

  Model model_;
  Optimizer optimizer_;
  Communicator comm_;
  TrainingOptions options_;
  Backend backend_;
  memory::Resource* memory_;
  ParamArena arena_;
  parallel::SyncModes<Communicator> sync_;
  typename Optimizer::State state_;  // of the arena range this rank steps (owned())
  optim::ArenaGroups groups_;
  Loss loss_;
  LossScaling<PrecisionPolicy> scaling_;
  PrecisionCast<PrecisionPolicy> cast_;
  parallel::CollectivesOf<Communicator> collectives_;
  parallel::ReplicaCheck replica_check_;
  LossMetrics metrics_;
  std::uint64_t step_ = 0;
  std::size_t micro_ = 0, micro_samples_ = 0;
  Context ctx_;  // of the micro-step in flight (forward to backward)
  profile::Profiler* profiler_ = nullptr;
  profile::EventLabels<3> events_{{"loss", Optimizer::name, profile::zero_grad_kind}};
};

}  // namespace xtrain

#if defined(__CUDACC__)
#include "xtrain/train/engine_cuda.hpp"  // Engine on backend::Cuda
#endif
