#pragma once
/// \file memory.hpp
/// How much memory a training run needs per rank, before it runs out of it: `estimate_memory`
/// breaks it into parameters, gradients, optimizer state, activations kept per module, the data
/// batch, evaluation buffers, workspaces and communication buffers, with bytes per parameter for
/// each precision (what `accelerate estimate-memory` prints, and the "model training anatomy"
/// guide's table).
///
/// How: parameters, gradients, optimizer state and communication buffers are counted from the
/// model's parameters; activations and workspaces are measured by a dry run: one training step
/// of a copy of the model on one process, with the profiler's memory accounting per module, and
/// the backend's own count of what it holds (its memory resource's stats: the engine allocates
/// every buffer of a training there, workspaces included). Above 256 samples the dry run takes
/// two steps, at 128 and 256 samples, and extrapolates (activations grow linearly with the batch;
/// the GEMM workspaces stop growing at 128 rows), so an estimate for a batch that would not fit
/// does not need it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "xtrain/core/concepts.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/profiler.hpp"
#include "xtrain/core/recompute_memory.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/loss/cross_entropy.hpp"
#include "xtrain/parallel/buckets.hpp"
#include "xtrain/parallel/single_process.hpp"
#include "xtrain/precision/policy.hpp"
#include "xtrain/profile/report.hpp"
#include "xtrain/train/engine.hpp"

namespace xtrain::profile {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define XTRAIN_HEAP_REPLACED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define XTRAIN_HEAP_REPLACED 1
#endif
#endif

/// Bytes the C heap has handed out and not taken back (glibc: mallinfo2's in-use bytes of every
/// arena plus mmapped blocks); -1 where it cannot be known (another C library; a sanitizer's
/// allocator, which glibc does not see).
inline std::int64_t heap_in_use() noexcept {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33)) && !defined(XTRAIN_HEAP_REPLACED)
  const struct mallinfo2 m = mallinfo2();
  return static_cast<std::int64_t>(m.uordblks + m.hblkhd);
#else
  return -1;
#endif
}

/// Measures the peak memory a stretch of code on this thread adds: the peak of its tensor storage
/// (exact: memory::counters() tracks it at every allocation) plus what else it left on the heap
/// at the end (parameters, optimizer state, workspaces: they only grow during training, so their
/// end is their peak). `start()`, run, `bytes()`.
class PeakMeter {
 public:
  void start() noexcept {
    heap0_ = heap_in_use();
    memory::reset_peak();
    live0_ = memory::counters().live;
    outside0_ = memory::detail::recompute_held();
  }
  /// The peak since start(), in bytes (-1 where the heap cannot be read).
  std::int64_t bytes() const noexcept {
    const std::int64_t heap = heap_in_use();
    if (heap < 0 || heap0_ < 0) return -1;
    const std::int64_t tensors_now = memory::counters().live - live0_, tensor_peak = memory::counters().peak - live0_;
    // (recomputed blocks' pages are tensors outside the heap)
    const std::int64_t outside_heap = memory::detail::recompute_held() - outside0_;
    return tensor_peak + (heap - heap0_ - (tensors_now - outside_heap));
  }

 private:
  std::int64_t heap0_ = 0, live0_ = 0, outside0_ = 0;
};

/// What the run looks like beyond the model, optimizer and batch.
struct MemoryOptions {
  Shape sample_shape;                          ///< one sample's shape ([784]; [T] token ids for a token model)
  std::size_t ranks = 1;                       ///< data-parallel ranks
  bool shard_optimizer = false;                ///< ZeRO stage 1: each rank keeps 1/ranks of the optimizer state
  bool shard_gradients = false;                ///< ZeRO stage 2: and 1/ranks of the gradients (implies stage 1)
  bool shard_parameters = false;               ///< ZeRO stage 3: and of the parameters in units (implies stage 2)
  std::size_t bucket_bytes = 25u << 20;        ///< gradient bucket size (stage 2 holds one being reduced)
  std::size_t buckets_in_flight = 2;           ///< ZeRO-2/3: buckets reduced while backward goes on (MPI: 2;
                                               ///< ThreadAllReduce reduces each at once: 0)
  std::size_t units_in_flight = 2;             ///< ZeRO-3: units gathered at a time (MPI with prefetch_units: 2;
                                               ///< without, or ThreadAllReduce: 1)
  std::size_t eval_batch = 0;                  ///< evaluation batch per rank (0: no evaluation)
  bool shared_memory_reduction = true;         ///< ranks > 1 on one node sum gradients in a shared segment (MPI)
  std::size_t gradient_compression_bytes = 4;  ///< bytes per gradient element sent (2: bf16/fp16 compression)
  /// The loader may gather the next batch in the background (backend::CpuThreads of 2 or more
  /// threads; it does when the step splits no loop): a second training batch is counted.
  bool prefetch = false;
  /// Threads of the backend (backend::CpuThreads): each holds a workspace of its own (GEMM
  /// panels and the like), measured on one thread by the dry run and counted this many times.
  std::size_t threads = 1;
};

/// One precision's estimate, per rank, in bytes.
struct MemoryEstimate {
  std::string precision;
  std::size_t parameters = 0;             ///< trainable parameters
  std::int64_t parameter_bytes = 0;       ///< fp32 master parameters (the arena, with alignment padding; ZeRO-3:
                                          ///< this rank's block, those outside the units, one unit gathered)
  std::int64_t gradient_bytes = 0;        ///< fp32 gradients (this rank's block with ZeRO-2)
  std::int64_t optimizer_bytes = 0;       ///< optimizer state (this rank's block with ZeRO-1 and 2)
  std::int64_t low_precision_copies = 0;  ///< 16-bit weight copies kept between steps (none: see docs)
  std::int64_t activation_bytes = 0;      ///< what the modules keep between forward and backward, and dx buffers
  std::int64_t recomputed_bytes = 0;      ///< of the modules' buffers, what recomputed blocks (Checkpointed) do
                                          ///< not hold at the step's peak (already out of activation_bytes)
  std::int64_t data_bytes = 0;            ///< the batch (inputs and targets; two with MemoryOptions::prefetch)
  std::int64_t evaluation_bytes = 0;      ///< forward buffers growing to the evaluation batch
  std::int64_t workspace_bytes = 0;       ///< everything else the step allocates (GEMM panels, loss, casts)
  std::int64_t communication_bytes = 0;   ///< per rank: its share of the shared gradient segment, or buffers
                                          ///< (ZeRO-2: the largest bucket, less the rank's share)
  /// Per module (state_dict name and kind): bytes allocated in forward and in backward.
  std::vector<std::pair<std::string, std::pair<std::int64_t, std::int64_t>>> modules;

  std::int64_t total() const noexcept {
    return parameter_bytes + gradient_bytes + optimizer_bytes + low_precision_copies + activation_bytes + data_bytes +
           evaluation_bytes + workspace_bytes + communication_bytes;
  }
  /// (parameters + gradients + optimizer state + 16-bit copies) / parameters: the anatomy guide's
  /// bytes per parameter (fp32 + Adam: 16).
  double bytes_per_parameter() const noexcept {
    return parameters ? static_cast<double>(parameter_bytes + gradient_bytes + optimizer_bytes + low_precision_copies) /
                            static_cast<double>(parameters)
                      : 0.0;
  }
};

namespace detail {
inline std::string mib(std::int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

// Targets for an output of shape `out`: class ids (zeros) of its shape without the last
// dimension, or zeros of its shape (regression).
template <class Target>
Target dry_run_targets(const Shape& out) {
  Target y;
  if constexpr (std::is_same_v<typename Target::value_type, std::int32_t>) {
    std::vector<std::size_t> dims(out.begin(), out.end() - 1);
    y = Target(Shape(dims));
  } else {
    y = Target(out);
  }
  return y;
}

// What one dry-run step at `batch` samples measures (bytes).
struct DryRun {
  std::int64_t held = 0;  // what the backend holds after the construction and the training step
  std::int64_t parameters = 0, gradients = 0, optimizer = 0, data = 0, evaluation = 0;
  std::int64_t activations = 0, forward = 0;  // all modules; their forwards alone
  std::int64_t largest_bucket = 0;            // the largest gradient bucket (of the DryRun's bucket_bytes)
  // Recomputed blocks (Checkpointed): the module buffers they allocated (outside the backend's
  // memory), and what of the modules' buffers the step did not hold at its peak.
  std::int64_t recompute_allocated = 0, recompute_released = 0;
  std::size_t parameter_count = 0;
  std::vector<std::pair<std::string, std::pair<std::int64_t, std::int64_t>>> modules;
};

// A dry run's batch: token ids (zeros) for a model that takes them (the GPT), else floats.
template <class Model, class Precision>
using DryRunInput =
    std::conditional_t<TokenModuleFor<Model, typename Precision::storage_type>, Tensor<std::int32_t>, Tensor<float>>;
template <class Input>
void dry_run_batch(Input& x, const Shape& shape) {
  x.resize(shape);
  std::fill(x.begin(), x.end(), typename Input::value_type{0});
}

template <class Precision, class Model, class Optimizer, class Loss>
DryRun dry_run(const Model& model, const Optimizer& optimizer, std::size_t batch, std::size_t eval_batch,
               const Shape& sample, const Loss& loss, std::size_t bucket_bytes) {
  using Input = DryRunInput<Model, Precision>;
  DryRun r;
  profile::Profiler profiler({.profile_memory = true});  // before the first reading: its buffers are not the step's
  profiler.reserve(4096);
  {
    typename Optimizer::State probe;  // the optimizer state's size, measured on its own
    Engine<Model, Optimizer, Precision, parallel::SingleProcess, backend::Cpu, Loss> engine(
        Model(model), Optimizer(optimizer), parallel::SingleProcess{}, TrainingOptions{}, Loss(loss));
    const std::size_t n = engine.params().size();
    r.parameter_count = engine.params().parameter_count();
    r.parameters = r.gradients = static_cast<std::int64_t>(n * sizeof(float));
    const parallel::GradientBuckets<parallel::SingleProcess> buckets(engine.params(), bucket_bytes);
    for (const auto& b : buckets.buckets())
      r.largest_bucket = std::max(r.largest_bucket, static_cast<std::int64_t>((b.end - b.begin) * sizeof(float)));
    {
      const std::int64_t before = memory::counters().live;  // optimizer state is AlignedVector: counted
      probe = optim::init_state(optimizer, engine.params(), 0, n);
      r.optimizer = memory::counters().live - before;
    }
    probe = {};
    engine.set_profiler(&profiler);
    std::vector<std::size_t> dims{batch};
    dims.insert(dims.end(), sample.begin(), sample.end());
    // The batch, the loss and everything else of the step in the backend's memory, as in a Trainer.
    const std::int64_t data0 = memory::counters().live;
    Input x(engine.memory());
    dry_run_batch(x, Shape(dims));
    r.data = memory::counters().live - data0;
    const std::int64_t outer_peak = memory::counters().peak;  // (a caller's PeakMeter keeps its reading)
    // The caller's parked pages (a recomputed model trained on this thread) go back to the system
    // first: the copy's blocks would take them, and its step would seem to hold less than it does.
    memory::release_parked();
    memory::reset_peak();
    const std::int64_t live0 = memory::counters().live, allocated0 = memory::counters().allocated,
                       recompute0 = memory::detail::recompute_allocated();
    const Tensor<float>& out = engine.forward(x, 0);
    const std::int64_t target0 = memory::counters().live;
    auto y = [&] {
      const memory::Use use(engine.memory());
      return dry_run_targets<typename Loss::target_type>(out.shape());
    }();
    r.data += memory::counters().live - target0;
    engine.loss_forward(out, y, static_cast<double>(batch));
    engine.backward(engine.loss_backward(), true);
    r.recompute_allocated = memory::detail::recompute_allocated() - recompute0;
    if (r.recompute_allocated > 0)  // what the step allocated less its peak: the buffers parked by recomputation
      r.recompute_released =
          std::max<std::int64_t>(0, (memory::counters().allocated - allocated0) - (memory::counters().peak - live0));
    memory::counters().peak = std::max(memory::counters().peak, outer_peak);
    engine.step(true, batch);
    r.held = engine.memory().stats().live;  // arena, state, activations, batch, workspaces
    // Per module: the tensor bytes its forward and its backward allocated (self, children apart).
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> per_module;
    std::vector<std::string> order;
    for (const profile::Event& e : profiler.events()) {
      if (e.category != profile::Category::forward && e.category != profile::Category::backward) continue;
      const std::string name = profiler.labels()[e.label].text();
      if (!per_module.count(name)) order.push_back(name);
      auto& slot = per_module[name];
      (e.category == profile::Category::forward ? slot.first : slot.second) += e.bytes - e.child_bytes;
    }
    for (const auto& name : order) {
      r.modules.emplace_back(name, per_module[name]);
      r.activations += per_module[name].first + per_module[name].second;
      r.forward += per_module[name].first;
    }
    if (eval_batch > 0) {
      engine.set_profiler(nullptr);
      dims[0] = eval_batch;
      const std::int64_t before = engine.memory().stats().live;
      Input xe(engine.memory());
      dry_run_batch(xe, Shape(dims));
      const std::int64_t input = engine.memory().stats().live - before;
      Context ctx = engine.context(false);
      const std::int64_t outer = memory::counters().peak, eval0 = memory::counters().live;
      memory::reset_peak();
      engine.predict(ctx, xe);
      const std::int64_t transient = memory::counters().peak - eval0;  // what the forward held at its peak
      memory::counters().peak = std::max(outer, memory::counters().peak);
      // The forward buffers' growth past the training batch (or, where more, what the forward held
      // at once: buffers it frees before it ends), plus the evaluation batch's input (the Trainer
      // evaluates inside fit(): the training loader still holds its batch).
      r.evaluation = std::max<std::int64_t>({0, engine.memory().stats().live - before - input, transient}) + input;
    }
  }
  if (r.recompute_allocated > 0) memory::release_parked();  // the copy's parked pages
  return r;
}

}  // namespace detail

/// Estimates the memory per rank of training `model` with `optimizer` under `Precision`
/// (FullPrecision, MixedPrecision<bf16>, MixedPrecision<fp16>) at `batch` samples per rank.
/// Runs a dry run of one step (two above 256 samples) on a copy of the model; the data set itself
/// is not counted.
template <class Precision, class Model, class Optimizer, class Loss = loss::CrossEntropyLoss>
MemoryEstimate estimate_memory(const Model& model, const Optimizer& optimizer, std::size_t batch,
                               const MemoryOptions& options, const Loss& loss = {}) {
  XTRAIN_CHECK(batch > 1, ValueError, "estimate_memory: batch ", batch, " must be at least 2 samples per rank");
  XTRAIN_CHECK(options.sample_shape.rank() > 0, ValueError,
               "estimate_memory: set MemoryOptions::sample_shape (one sample's shape, e.g. {784})");
  XTRAIN_CHECK(options.ranks > 0, ValueError, "estimate_memory: ranks must be at least 1");
  constexpr std::size_t direct_limit = 256, low = 128;
  auto run = [&](std::size_t b, std::size_t eval) {
    return detail::dry_run<Precision>(model, optimizer, b, eval, options.sample_shape, loss, options.bucket_bytes);
  };
  detail::DryRun r;
  if (batch <= direct_limit) {
    r = run(batch, options.eval_batch);
  } else {  // affine in the batch past `low` samples: extrapolate from low and direct_limit
    const detail::DryRun a = run(low, 0), b = run(direct_limit, 0);
    const double t = static_cast<double>(batch - low) / static_cast<double>(direct_limit - low);
    auto lerp = [t](std::int64_t u, std::int64_t v) {
      return u + static_cast<std::int64_t>(t * static_cast<double>(v - u));
    };
    r = b;
    r.held = lerp(a.held, b.held);
    r.data = lerp(a.data, b.data);
    r.activations = lerp(a.activations, b.activations);
    r.recompute_allocated = lerp(a.recompute_allocated, b.recompute_allocated);
    r.recompute_released = lerp(a.recompute_released, b.recompute_released);
    for (std::size_t i = 0; i < r.modules.size() && i < a.modules.size(); ++i) {
      r.modules[i].second.first = lerp(a.modules[i].second.first, b.modules[i].second.first);
      r.modules[i].second.second = lerp(a.modules[i].second.second, b.modules[i].second.second);
    }
    // Evaluation: the forward buffers and the input grow from the training batch to the
    // evaluation batch, both affine in the batch.
    const auto at = [&](std::int64_t u, std::int64_t v, std::size_t n) {
      return u + static_cast<std::int64_t>((static_cast<double>(n) - static_cast<double>(low)) /
                                           static_cast<double>(direct_limit - low) * static_cast<double>(v - u));
    };
    if (options.eval_batch > 0)
      r.evaluation =
          std::max<std::int64_t>(0, at(a.forward, b.forward, options.eval_batch) - at(a.forward, b.forward, batch)) +
          at(a.data, b.data, options.eval_batch);
  }
  MemoryEstimate m;
  m.precision = Precision::name;
  m.parameters = r.parameter_count;
  m.parameter_bytes = r.parameters;
  m.gradient_bytes = r.gradients;
  m.optimizer_bytes = r.optimizer;
  const auto ranks = static_cast<std::int64_t>(options.ranks);
  const bool zero3 = options.shard_parameters && ranks > 1,
             zero1 = (options.shard_optimizer || options.shard_gradients || zero3) && ranks > 1,
             zero2 = (options.shard_gradients || zero3) && ranks > 1;
  if (zero1) m.optimizer_bytes = (r.optimizer + ranks - 1) / ranks;
  if (zero2) m.gradient_bytes = (r.gradients + ranks - 1) / ranks;
  if (zero3) {  // the units' share of this rank, everything outside the units, the largest unit gathered (twice:
                // prefetch)
    std::size_t total = 0, most = 0, count = 0;  // the units' floats (padded as in the arena): all, the largest's
    visit_units(const_cast<Model&>(model), [&](const std::string&, auto& unit) {  // (visit is not const)
      ++count;
      std::size_t n = 0;
      visit_parameters(unit.module(), [&](const std::string&, Param& p, ParamKind) {
        n += (p.size() + ParamArena::alignment - 1) / ParamArena::alignment * ParamArena::alignment;
      });
      total += n;
      most = std::max(most, n);
    });
    const auto in_units = static_cast<std::int64_t>(total * sizeof(float)),
               largest = static_cast<std::int64_t>(most * sizeof(float));
    const auto in_flight =
        static_cast<std::int64_t>(std::min(count, std::max<std::size_t>(1, options.units_in_flight)));
    m.parameter_bytes = (r.parameters - in_units) + (in_units + ranks - 1) / ranks + in_flight * largest;
  }
  m.activation_bytes = r.activations - r.recompute_released;
  m.recomputed_bytes = r.recompute_released;
  m.data_bytes = options.prefetch ? 2 * r.data : r.data;
  m.evaluation_bytes = r.evaluation;
  m.modules = r.modules;
  m.workspace_bytes = static_cast<std::int64_t>(std::max<std::size_t>(1, options.threads)) *
                      std::max<std::int64_t>(0, r.held - (r.parameters + r.gradients + r.optimizer +
                                                          (r.activations - r.recompute_allocated) + r.data));
  if (zero2) {
    // ZeRO-2: the largest bucket, written by backward before it is reduce-scattered and given
    // back, and those whose reductions are in flight, less the rank's own share of each (counted
    // with the gradients).
    m.communication_bytes =
        static_cast<std::int64_t>(1 + options.buckets_in_flight) * (r.largest_bucket - r.largest_bucket / ranks);
  } else if (options.ranks > 1) {
    // Shared-memory reduction: the node's ranks sum in one segment of the gradients (and, sharded,
    // the parameters); each rank's share of it. Otherwise MPI's buffers for the bucket in flight.
    const std::int64_t segment = r.gradients + (zero1 ? r.parameters : 0);
    m.communication_bytes = options.shared_memory_reduction
                                ? segment / ranks
                                : static_cast<std::int64_t>(options.gradient_compression_bytes) * r.gradients / 4;
  }
  return m;
}

/// A table of estimates side by side (one column per precision), in MiB, with bytes per parameter.
inline std::string memory_table(const std::vector<MemoryEstimate>& estimates, std::size_t batch,
                                const MemoryOptions& options) {
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"per rank (batch " + std::to_string(batch) + ", " + std::to_string(options.ranks) + " rank" +
                   (options.ranks == 1 ? "" : "s") +
                   (options.ranks > 1 && options.shard_parameters  ? ", ZeRO-3"
                    : options.ranks > 1 && options.shard_gradients ? ", ZeRO-2"
                    : options.ranks > 1 && options.shard_optimizer ? ", ZeRO-1"
                                                                   : "") +
                   ")"});
  for (const auto& e : estimates) cells[0].push_back(e.precision);
  auto row = [&](const std::string& what, auto value) {
    cells.push_back({what});
    for (const auto& e : estimates) cells.back().push_back(value(e));
  };
  row("parameters (count)", [](const MemoryEstimate& e) { return std::to_string(e.parameters); });
  row("parameters (fp32 master)", [](const MemoryEstimate& e) { return detail::mib(e.parameter_bytes); });
  row("gradients (fp32)", [](const MemoryEstimate& e) { return detail::mib(e.gradient_bytes); });
  row("optimizer state", [](const MemoryEstimate& e) { return detail::mib(e.optimizer_bytes); });
  row("16-bit weight copies", [](const MemoryEstimate& e) { return detail::mib(e.low_precision_copies); });
  row("bytes per parameter", [](const MemoryEstimate& e) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", e.bytes_per_parameter());
    return std::string(buf);
  });
  if (!estimates.empty())
    for (std::size_t i = 0; i < estimates[0].modules.size(); ++i)
      row("  activations " + estimates[0].modules[i].first, [i](const MemoryEstimate& e) {
        return i < e.modules.size() ? detail::mib(e.modules[i].second.first + e.modules[i].second.second)
                                    : std::string("-");
      });
  if (std::any_of(estimates.begin(), estimates.end(), [](const MemoryEstimate& e) { return e.recomputed_bytes > 0; }))
    row("  not held (recomputed blocks)", [](const MemoryEstimate& e) { return detail::mib(-e.recomputed_bytes); });
  row("activations (all modules)", [](const MemoryEstimate& e) { return detail::mib(e.activation_bytes); });
  row("data batch", [](const MemoryEstimate& e) { return detail::mib(e.data_bytes); });
  if (options.eval_batch)
    row("evaluation (batch " + std::to_string(options.eval_batch) + ")",
        [](const MemoryEstimate& e) { return detail::mib(e.evaluation_bytes); });
  row("workspaces and other", [](const MemoryEstimate& e) { return detail::mib(e.workspace_bytes); });
  if (options.ranks > 1)
    row("communication", [](const MemoryEstimate& e) { return detail::mib(e.communication_bytes); });
  row("total", [](const MemoryEstimate& e) { return detail::mib(e.total()); });
  return profile::detail::render(cells);
}

}  // namespace xtrain::profile
