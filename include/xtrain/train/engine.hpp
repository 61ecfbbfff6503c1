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
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "xtrain/checkpoint/archive.hpp"
#include "xtrain/checkpoint/state.hpp"
#include "xtrain/core/concepts.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/loss/cross_entropy.hpp"
#include "xtrain/optim/clip.hpp"
#include "xtrain/optim/schedule.hpp"
#include "xtrain/parallel/buckets.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/tree_sum.hpp"
#include "xtrain/precision/policy.hpp"
#include "xtrain/train/metrics.hpp"

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
};

template <class Model, class Optimizer, parallel::Communicator Communicator, Precision PrecisionPolicy = FullPrecision>
class Engine {
  /// The type activations are stored in between layers.
  using act_t = typename PrecisionPolicy::storage_type;
  static_assert(check_layer_for<Model, act_t>());

 public:
  /// Takes the model, moves its parameters into one arena, checks that every rank built the same
  /// model (names and shapes), and broadcasts rank 0's parameters and buffers.
  Engine(Model model, Optimizer optimizer, Communicator communicator, EngineOptions options)
      : model_(std::move(model)),
        optimizer_(std::move(optimizer)),
        comm_(std::move(communicator)),
        options_(std::move(options)),
        arena_(model_, options_.shard_optimizer ? comm_.size() * ParamArena::alignment : ParamArena::alignment),
        shard_(options_.shard_optimizer && comm_.size() > 1),
        block_(arena_.size() / (shard_ ? comm_.size() : 1)),
        state_(optimizer_.init(block_)),
        buckets_(arena_, options_.bucket_bytes),
        collectives_(comm_),
        scaler_(options_.loss_scale, 2.0f, 0.5f, options_.loss_scale_growth_interval) {
    XTRAIN_CHECK(options_.accumulate > 0, ValueError, "accumulate must be at least 1");
    if (options_.deterministic_chunk) check_deterministic_layout();
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

  /// One micro-batch: this rank's rows `x`, `y` of a global batch of `global_count` samples whose
  /// row 0 is sample `global_offset` of it. The loss is normalised by global_count * accumulate.
  /// On the last micro-step of the window (or when `force_sync`) the gradients are reduced and
  /// the optimizer steps.
  StepResult micro_step(const Matrix& x, std::span<const std::int32_t> y, std::size_t global_offset,
                        std::size_t global_count, bool force_sync = false) {
    const bool sync = force_sync || micro_ + 1 == options_.accumulate;
    const double normalizer = static_cast<double>(global_count) * static_cast<double>(options_.accumulate);
    float loss = 0.0f;
    if (options_.deterministic_chunk) {
      loss = deterministic_micro_step(x, y, micro_samples_ + global_offset, normalizer);
      if (sync) deterministic_reduce();
    } else {
      loss = loss_.forward(forward(x, global_offset), y, normalizer);
      loss_sum_ = loss_.sum();
      correct_ = loss_.correct();
      backward(loss_.backward(), sync);
    }
    StepResult r{step_, loss, current_lr(), micro_samples_ + global_count};
    r.skipped = !step(sync, global_count) && sync;
    r.step = step_;
    return r;
  }

  /// Forward of a training micro-step (train mode). `global_offset` is the position of row 0 in
  /// this micro-step's global batch; positions count across the accumulation window, so k
  /// micro-batches of B draw the dropout masks one batch of k * B would. Zeroes the gradients at
  /// the start of a window. The result lives in the model until its next forward.
  const Matrix& forward(const Matrix& x, std::size_t global_offset) {
    XTRAIN_CHECK(!options_.deterministic_chunk, ValueError,
                 "the deterministic reduction needs Engine::micro_step (it computes chunk by chunk)");
    if (micro_ == 0) arena_.zero_grad();
    ctx_ = context(true);
    ctx_.sample_offset = micro_samples_ + global_offset;
    return run_forward(ctx_, x);
  }

  /// Forward in `ctx`'s mode (evaluation, prediction): fp32 rows in, fp32 logits out, whatever
  /// the precision policy stores in between. The result lives in the engine or the model until
  /// the next forward.
  const Matrix& predict(Context& ctx, const Matrix& x) { return run_forward(ctx, x); }

  /// Backward of the last forward from d(loss)/d(logits), adding into the gradients. When `sync`
  /// (last micro-step of the window) the buckets' allreduces start during backward and are
  /// complete on return: the gradients are then summed over ranks (clip them now if you wish).
  void backward(const Matrix& dlogits, bool sync) {
    ctx_.input_grad = false;                                  // nothing needs the gradient of the data
    const bool reduce = sync && comm_.size() > 1 && !shard_;  // sharded: reduce-scattered in step()
    if (reduce) {
      ctx_.grads_ready = &Engine::on_layer_done;
      ctx_.grads_ready_user = this;
    }
    run_backward(ctx_, dlogits);
    if (reduce) buckets_.finish(comm_, arena_.grads());
  }

  /// Ends a micro-step of `global_count` samples: when `sync`, clips (per the options) and steps
  /// the optimizer; otherwise only counts the micro-step. Returns whether the optimizer stepped.
  bool step(bool sync, std::size_t global_count) {
    micro_samples_ += global_count;
    if (!sync) {
      ++micro_;
      return false;
    }
    const float lr = current_lr();
    ++step_;
    micro_ = 0;
    micro_samples_ = 0;
    if (shard_) return sharded_step(lr);
    // Mixed precision order: reduce (done) -> unscale -> check -> clip -> step, or skip.
    if constexpr (PrecisionPolicy::uses_loss_scaling) {
      unscale_gradients();  // the reduced gradients: every rank finds the same
      unscaled_ = false;
      scaler_.update(found_inf_);
      if (found_inf_) return false;  // skipped: no optimizer step, the schedule does not advance
    }
    if (options_.clip_norm > 0) optim::clip_grad_norm(arena_.grads(), options_.clip_norm);
    if (options_.clip_value > 0) optim::clip_grad_value(arena_.grads(), options_.clip_value);
    optimizer_.step(arena_.values(), arena_.grads(), state_, StepInfo{lr, optimizer_steps()});
    return true;
  }

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
    broadcast_buffers();
    progress.step = step_;
    progress.data_seed = options_.seed;
    progress.loss_scale = PrecisionPolicy::uses_loss_scaling ? scaler_.scale() : 0.0f;
    progress.loss_scale_tracker = scaler_.growth_tracker();
    progress.skipped_steps = scaler_.skipped_steps();
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
    const checkpoint::Progress p =
        checkpoint::decode<Model, Optimizer>(payload.substr(2), path, model_, arena_, state, schedule, objects);
    set_full_optimizer_state(std::move(state));
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
    typename Optimizer::State full = state_;
    std::vector<AlignedVector*> blocks, fulls;
    Optimizer::visit_state(state_, [&](AlignedVector& v) { blocks.push_back(&v); });
    Optimizer::visit_state(full, [&](AlignedVector& v) { fulls.push_back(&v); });
    AlignedVector gathered(arena_.size());
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      std::copy(blocks[i]->begin(), blocks[i]->end(), gathered.begin() + static_cast<std::ptrdiff_t>(offset()));
      comm_.allgather_blocks(gathered, "gather optimizer state");
      fulls[i]->assign(gathered.begin(), gathered.begin() + static_cast<std::ptrdiff_t>(arena_.natural_size()));
    }
    f(full);
  }

  /// Installs an optimizer state in the natural layout (from a checkpoint); each rank keeps its
  /// block when sharded.
  void set_full_optimizer_state(typename Optimizer::State full) {
    if (!shard_) {
      state_ = std::move(full);
      return;
    }
    typename Optimizer::State mine = full;
    std::vector<AlignedVector*> fulls, blocks;
    Optimizer::visit_state(full, [&](AlignedVector& v) { fulls.push_back(&v); });
    Optimizer::visit_state(mine, [&](AlignedVector& v) { blocks.push_back(&v); });
    for (std::size_t i = 0; i < fulls.size(); ++i) {
      fulls[i]->resize(arena_.size(), 0.0f);  // natural -> padded
      blocks[i]->assign(fulls[i]->begin() + static_cast<std::ptrdiff_t>(offset()),
                        fulls[i]->begin() + static_cast<std::ptrdiff_t>(offset() + block_));
    }
    state_ = std::move(mine);
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
    model_visit_buffers([&](const std::string&, auto&& buffer) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(buffer)>, std::span<float>>) {
        comm_.broadcast(buffer, "broadcast buffers");
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
    return ctx;
  }

  Model& model() noexcept { return model_; }
  const Optimizer& optimizer() const noexcept { return optimizer_; }
  typename Optimizer::State& optimizer_state() noexcept { return state_; }
  ParamArena& params() noexcept { return arena_; }
  Communicator& communicator() noexcept { return comm_; }
  const EngineOptions& options() const noexcept { return options_; }
  loss::CrossEntropyLoss& loss() noexcept { return loss_; }
  /// Sum of per-sample losses and correct predictions of the last micro-step (this rank).
  double last_loss_sum() const noexcept { return loss_sum_; }
  std::size_t last_correct() const noexcept { return correct_; }
  std::uint64_t step() const noexcept { return step_; }
  const parallel::CommStats& comm_stats() const noexcept { return buckets_.stats(); }
  void reset_comm_stats() noexcept { buckets_.reset_stats(); }
  std::size_t bucket_count() const noexcept { return buckets_.buckets().size(); }

 private:
  template <class F>
  void model_visit_buffers(F&& f) {
    if constexpr (HasBuffers<Model>) model_.visit_buffers(std::string{}, f);
  }

  std::size_t offset() const noexcept { return shard_ ? comm_.rank() * block_ : 0; }

  // ZeRO stage 1 (Rajbhandari et al., arXiv:1910.02054): reduce-scatter the gradients, clip with
  // the global norm, step this rank's block of parameters with its block of optimizer state,
  // all-gather the parameters. Each rank does 1/N of the optimizer's work and holds 1/N of its state.
  bool sharded_step(float lr) {
    auto start = std::chrono::steady_clock::now();
    comm_.reduce_scatter_sum(arena_.grads(), "gradient reduce-scatter");
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
    if (options_.clip_norm > 0) {
      double sq = 0.0;
      for (float g : grads) sq += static_cast<double>(g) * g;
      comm_.allreduce_sum(std::span<double>(&sq, 1), "gradient norm");
      const double coef = options_.clip_norm / (std::sqrt(sq) + 1e-6);
      if (coef < 1.0)
        for (float& g : grads) g = static_cast<float>(g * coef);
    }
    if (options_.clip_value > 0) optim::clip_grad_value(grads, options_.clip_value);
    optimizer_.step(arena_.values().subspan(offset(), block_), grads, state_, StepInfo{lr, optimizer_steps()});
    start = std::chrono::steady_clock::now();
    comm_.allgather_blocks(arena_.values(), "parameter all-gather");
    waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    buckets_.count_blocking(waited, 2);
    return true;
  }

  // fp32 rows in, fp32 logits out; activations in between as the policy's storage type.
  const Matrix& run_forward(Context& ctx, const Matrix& x) {
    if constexpr (std::is_same_v<act_t, float>) {
      return model_.forward(ctx, x);
    } else {
      ensure_shape(x_lp_, x.shape(0), x.shape(1));
      kernels::from_float(x.data(), x_lp_.data(), x.size());
      const Batch<act_t>& out = model_.forward(ctx, x_lp_);
      ensure_shape(logits_, out.shape(0), out.shape(1));
      kernels::to_float(out.data(), logits_.data(), out.size());
      return logits_;
    }
  }

  // d(loss)/d(logits) in fp32; multiplied by the loss scale (fp16) and rounded to the storage type.
  void run_backward(Context& ctx, const Matrix& dlogits) {
    if constexpr (std::is_same_v<act_t, float>) {
      model_.backward(ctx, dlogits);
    } else {
      ensure_shape(dlogits_lp_, dlogits.shape(0), dlogits.shape(1));
      if constexpr (PrecisionPolicy::uses_loss_scaling) {
        scaled_.resize(dlogits.size());
        const float s = scaler_.scale();
        for (std::size_t i = 0; i < dlogits.size(); ++i) scaled_[i] = dlogits.data()[i] * s;
        kernels::from_float(scaled_.data(), dlogits_lp_.data(), dlogits.size());
      } else {
        kernels::from_float(dlogits.data(), dlogits_lp_.data(), dlogits.size());
      }
      model_.backward(ctx, dlogits_lp_);
    }
  }

  static void on_layer_done(void* self, std::size_t layer) {
    auto* e = static_cast<Engine*>(self);
    e->buckets_.layer_done(e->comm_, e->arena_.grads(), layer);
  }

  // Deterministic mode: the gradient of every chunk of `chunk` samples of the global batch is
  // computed alone; this rank's chunks are summed in a balanced tree, the ranks' subtree roots
  // are gathered and combined in the same tree. The arithmetic is the same on any rank count.
  float deterministic_micro_step(const Matrix& x, std::span<const std::int32_t> y, std::size_t offset,
                                 double normalizer) {
    const std::size_t chunk = options_.deterministic_chunk, rows = y.size(), d = x.shape(1);
    const std::size_t chunks = options_.global_batch / chunk / comm_.size();
    double loss = 0.0;
    loss_sum_ = 0.0;
    correct_ = 0;
    for (std::size_t j = 0; j < chunks; ++j) {
      arena_.zero_grad();
      const std::size_t begin = std::min(j * chunk, rows), end = std::min(begin + chunk, rows);
      if (end > begin) {
        ensure_shape(chunk_x_, end - begin, d);
        std::copy_n(x.data() + begin * d, (end - begin) * d, chunk_x_.data());
        Context ctx = context(true);
        ctx.sample_offset = offset + begin;
        loss += loss_.forward(run_forward(ctx, chunk_x_), y.subspan(begin, end - begin), normalizer);
        loss_sum_ += loss_.sum();
        correct_ += loss_.correct();
        ctx.input_grad = false;
        run_backward(ctx, loss_.backward());
      }
      tree_.push(arena_.grads());
    }
    pending_.resize((micro_ + 1) * arena_.size());
    tree_.result(std::span<float>(pending_).subspan(micro_ * arena_.size(), arena_.size()));
    return static_cast<float>(loss);
  }

  void deterministic_reduce() {
    const std::size_t n = arena_.size(), micro = pending_.size() / n, w = comm_.size();
    gathered_.resize(pending_.size() * w);
    comm_.allgather(pending_, gathered_, "deterministic gradient gather");
    auto grads = arena_.grads();
    std::fill(grads.begin(), grads.end(), 0.0f);
    root_.resize(n);
    for (std::size_t m = 0; m < micro; ++m) {  // ranks in a balanced tree, then micro-steps in order
      for (std::size_t r = 0; r < w; ++r) tree_.push(std::span<const float>(gathered_).subspan((r * micro + m) * n, n));
      tree_.result(root_);
      for (std::size_t i = 0; i < n; ++i) grads[i] += root_[i];
    }
    pending_.clear();
  }

  void check_deterministic_layout() const {
    const std::size_t c = options_.deterministic_chunk, g = options_.global_batch, w = comm_.size();
    XTRAIN_CHECK(g > 0 && g % c == 0, ValueError, "deterministic reduction: the global batch ", g,
                 " must be a multiple of the chunk size ", c);
    const std::size_t chunks = g / c;
    XTRAIN_CHECK(chunks % w == 0 && ((chunks / w) & (chunks / w - 1)) == 0 && (w & (w - 1)) == 0, ValueError,
                 "deterministic reduction: ", chunks, " chunks of ", c,
                 " samples cannot be split into equal power-of-two "
                 "halves over ",
                 w, " ranks (use a power-of-two rank count and global batch / chunk)");
  }

  /// Every rank must have built the same model; then rank 0's parameters and buffers win.
  void synchronize() {
    if (comm_.size() == 1) return;
    std::string mine, root;
    for (const auto& e : arena_.entries()) mine += e.name + " " + shape_string(e.shape) + "\n";
    root = mine;
    comm_.broadcast(root, "model structure check");
    if (root != mine) throw ValueError(structure_mismatch(root, mine));
    comm_.broadcast(arena_.values(), "broadcast initial parameters");
    broadcast_buffers();
  }

  std::string structure_mismatch(const std::string& root, const std::string& mine) const {
    auto lines = [](const std::string& s) {
      std::vector<std::string> out;
      std::size_t a = 0;
      for (std::size_t b; (b = s.find('\n', a)) != std::string::npos; a = b + 1) out.push_back(s.substr(a, b - a));
      return out;
    };
    const auto r = lines(root), m = lines(mine);
    const std::string here = "rank " + std::to_string(comm_.rank());
    for (std::size_t i = 0; i < std::max(r.size(), m.size()); ++i) {
      const std::string a = i < r.size() ? r[i] : "(none)", b = i < m.size() ? m[i] : "(none)";
      if (a != b) {
        const std::string name = b.substr(0, b.find(' '));
        return "model differs across ranks: parameter '" + name + "' is '" + b + "' on " + here + " but '" + a +
               "' on rank 0 (build the same model on every rank)";
      }
    }
    return "model differs across ranks";
  }

  Model model_;
  Optimizer optimizer_;
  Communicator comm_;
  EngineOptions options_;
  ParamArena arena_;
  bool shard_;
  std::size_t block_;  // optimizer-state elements on this rank
  typename Optimizer::State state_;
  parallel::GradientBuckets<Communicator> buckets_;
  parallel::CollectivesOf<Communicator> collectives_;
  loss::CrossEntropyLoss loss_;
  double loss_sum_ = 0.0;
  std::size_t correct_ = 0;
  std::uint64_t step_ = 0;
  std::size_t micro_ = 0, micro_samples_ = 0;
  // deterministic mode
  parallel::TreeSum tree_;
  AlignedVector pending_, gathered_, root_;
  Matrix chunk_x_;
  Context ctx_;  // of the micro-step in flight (forward to backward)
  // mixed precision
  DynamicLossScaler scaler_;
  Batch<act_t> x_lp_, dlogits_lp_;
  Matrix logits_;
  std::vector<float> scaled_;
  bool unscaled_ = false, found_inf_ = false;
};

}  // namespace xtrain
