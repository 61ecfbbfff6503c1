#pragma once
/// \file engine_cuda.hpp
/// Engine<Model, Optimizer, Precision, SingleProcess, backend::Cuda, Loss>: what
/// `Trainer<..., backend::Cuda>` runs on (nvcc only; engine.hpp includes it under nvcc). Each
/// micro-step copies the batch to the GPU and launches the step there (cuda::DeviceModel: the
/// model lowered layer by layer; from the second step of a batch size on, one CUDA graph). The
/// loss and accuracy are summed on the device and read at the end of an epoch (or a save), not
/// per step: StepResult::loss is NaN here.
///
/// Evaluation (predict in evaluation mode) runs on the GPU, in chunks of the training batch (so
/// that it allocates nothing the training step does not), the output copied back to the host.
/// A CPU engine over the same model is the host mirror: the Trainer's checkpoints, safetensors
/// export and everything else that reads the weights run on it, after the
/// device's weights, BatchNorm buffers and optimizer state are copied back (once per change). What a
/// host-side change writes (load_state, load_model, params() or model() used to write) goes to the
/// device before the next step. So a GPU run's checkpoints and exports are the CPU's files, and a
/// run resumes on either backend.
///
/// MixedPrecision<bf16> and <fp16>: the products of Linear and Conv2d on tensor cores (bf16 or
/// fp16 operands, fp32 accumulation), the rest in fp32 (activations are not stored in 16 bits on
/// the GPU yet). Under fp16 the dynamic loss scale lives on the device (the step's graph scales,
/// unscales, checks and skips; the host is not asked); the host mirror's loss_scaler() and
/// optimizer_steps() follow it when the device is read: every step when the learning rate's
/// schedule varies (the rate of the next step depends on the steps skipped; StepResult::skipped
/// is set then), otherwise when the metrics are read (epoch ends, log intervals) and at saves
/// (StepResult::skipped stays false).
///
/// Gradient accumulation (TrainingOptions::accumulate): the window's micro-steps add into the
/// gradients on the device, its last steps the optimizer; Dropout draws the masks of the whole
/// window's batch, as on the CPU.
///
/// Not yet on the GPU: several ranks, parameter groups, ZeRO, the deterministic reduction; each
/// is refused when the Trainer is built, by name. Losses: cross-entropy (per sample or per token,
/// with an ignore index) and MSE.

#if !defined(__CUDACC__)
#error "xtrain/train/engine_cuda.hpp is compiled by nvcc (a .cu file, or CMake's LANGUAGE CUDA)"
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xtrain/backend/cuda.hpp"
#include "xtrain/train/cuda_program.hpp"
#include "xtrain/train/engine.hpp"

namespace xtrain {

template <class Model, class Optimizer, class PrecisionPolicy, class Communicator, class Loss>
class Engine<Model, Optimizer, PrecisionPolicy, Communicator, backend::Cuda, Loss> {
  static_assert(std::is_same_v<PrecisionPolicy, FullPrecision> ||
                    std::is_same_v<PrecisionPolicy, MixedPrecision<bf16>> ||
                    std::is_same_v<PrecisionPolicy, MixedPrecision<fp16>>,
                "xtrain: backend::Cuda trains in FullPrecision, MixedPrecision<bf16> or MixedPrecision<fp16>");
  static_assert(std::is_same_v<Communicator, parallel::SingleProcess>,
                "xtrain: backend::Cuda trains on one process so far (parallel::SingleProcess)");
  static_assert(std::is_same_v<Loss, loss::CrossEntropyLoss> || std::is_same_v<Loss, loss::MSELoss>,
                "xtrain: backend::Cuda trains with loss::CrossEntropyLoss or loss::MSELoss so far");
  using Host = Engine<Model, Optimizer, PrecisionPolicy, Communicator, backend::Cpu, Loss>;

 public:
  using target_type = typename Loss::target_type;

  Engine(Model model, Optimizer optimizer, Communicator communicator, TrainingOptions options = {}, Loss loss = {})
      : gpu_(0),
        dev_(gpu_),
        host_(std::move(model), optimizer, std::move(communicator), checked(std::move(options)), std::move(loss)),
        device_(dev_, host_.model(), host_.params(), optimizer, host_.options().seed(), host_.loss(),
                lowering::products_of<PrecisionPolicy>()) {
    device_.set_clipping(host_.options().clip_grad_norm(), host_.options().clip_grad_value());
    if constexpr (loss_scaling) device_.set_loss_scaling({}, host_.options().loss_scale_growth_interval());
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// One step on this process's batch (x [rows, ...] in host memory, its targets): copied to the
  /// GPU, then the step there (a graph replay once warm). The loss is not read back: NaN.
  template <class Input>
  StepResult micro_step(const Input& x, const target_type& y, std::size_t global_offset, std::size_t global_count,
                        bool force_sync = false) {
    static_assert(std::is_same_v<Input, Tensor<float>>, "xtrain: backend::Cuda trains on float inputs so far");
    const std::size_t rows = x.dimension() ? x.shape(0) : 0;
    const Shape sample = lowering::sample_shape(x.shape());
    const std::size_t cols = sample.elements();
    XTRAIN_CHECK(rows > 0 && y.dimension() > 0 && y.shape(0) == rows, ShapeError, "backend::Cuda: a batch of inputs ",
                 x.shape().str(), " with targets ", y.shape().str(), " (one row of targets per sample)");
    const std::size_t per_row = y.size() / rows;
    if constexpr (std::is_same_v<Loss, loss::MSELoss>) {
      const Shape out = device_.out_shape(sample);  // (no allocation per step: the message is built on failure only)
      XTRAIN_CHECK(y.shape().rank() == out.rank() + 1 && std::equal(out.begin(), out.end(), y.shape().begin() + 1),
                   ShapeError, "backend::Cuda: MSELoss targets of shape ", y.shape().str(), " for outputs of shape [",
                   rows, ", ", out.str().substr(1));
    } else {  // one class id per row of the output: its shape without the classes
      const Shape out = device_.out_shape(sample);
      XTRAIN_CHECK(y.shape().rank() == out.rank() && std::equal(out.begin(), out.end() - 1, y.shape().begin() + 1),
                   ShapeError, "backend::Cuda: labels of shape ", y.shape().str(), " for outputs of shape [", rows,
                   ", ", out.str().substr(1), " (expected the outputs' shape without its last dimension)");
    }
    gpu_.make_current();
    to_device();
    const std::size_t room = std::max(rows, host_.global_batch());  // sized once: the graph keeps the pointers
    batch_x_.reserve(gpu_, room * cols);
    batch_y_.reserve(gpu_, room * per_row);
    backend::cuda::upload(gpu_, batch_x_.data(), x.data(), rows * cols);
    backend::cuda::upload(gpu_, batch_y_.data(), y.data(), rows * per_row);
    const float lr = host_.current_lr();
    device_.set_lr(lr);
    const double normaliser = host_.loss_normalizer(y, global_count);  // the window's terms
    // Gradient accumulation: the window's first micro-step zeroes the gradients, its last steps
    // the optimizer; each of the four kinds is a graph of its own (the sample offset, read on the
    // device, places a micro-batch's Dropout masks in the window).
    const bool first = micro_ == 0, last = force_sync || micro_ + 1 == host_.options().accumulate();
    device_.set_sample_offset(micro_samples_ + global_offset);
    const std::uint64_t before = gpu_.allocations();
    graphs_[(first ? 1 : 0) + (last ? 2 : 0)].run(gpu_, rows, [&] {
      device_.enqueue_micro_step(batch_x_.data(), batch_y_.data(), rows, sample, normaliser, first, last);
    });
    if (gpu_.allocations() != before) reset_graphs();  // buffers the other graphs hold have moved
    device_changed_ = true;
    terms_ += static_cast<double>(host_.loss().count(y));
    StepResult r;
    r.loss = std::numeric_limits<float>::quiet_NaN();
    r.lr = lr;
    r.samples = micro_samples_ + global_count;
    if (last) {
      if constexpr (loss_scaling)  // the next step's rate counts the applied steps: read them now
        if (host_.options().schedule().varies()) r.skipped = read_loss_scale().found != 0;
      host_.restore(host_.step() + 1, host_.options().seed(), host_.options().schedule());
      micro_ = micro_samples_ = 0;
    } else {
      ++micro_;
      micro_samples_ += global_count;
    }
    r.step = host_.step();
    return r;
  }

  /// The Trainer's per-step metric sums [loss sum, correct, terms, samples]: the terms now, the
  /// loss and correct counts when flushed (they are summed on the device).
  void add_step_metrics(double* sums) const noexcept { (void)sums; }
  /// Adds what the device summed since the last flush to `sums` (waits for the GPU).
  void flush_step_metrics(double* sums) {
    const kernels::device::Metrics m = device_.read_metrics();
    if constexpr (loss_scaling) (void)read_loss_scale();
    sums[0] += m.loss_sum;
    sums[1] += static_cast<double>(m.correct);
    sums[2] += terms_;
    terms_ = 0.0;
  }

  /// The model's output for x: in evaluation mode on the GPU (BatchNorm's running statistics
  /// there), in chunks of at most the training batch, copied back to host memory; in training
  /// mode on the host mirror (the device's weights copied back first).
  template <class Input>
  const Tensor<float>& predict(Context& ctx, const Input& x) {
    if constexpr (std::is_same_v<Input, Tensor<float>>) {
      if (!ctx.training) return predict_on_device(x);
    }
    to_host();
    return host_.predict(ctx, x);
  }
  float loss_forward(const Tensor<float>& out, const target_type& y, double normaliser) {
    return host_.loss_forward(out, y, normaliser);
  }
  void skip_forward() { host_.skip_forward(); }
  Context context(bool training) { return host_.context(training); }
  /// One process: the buffers are the device's already (nothing to broadcast, nothing to copy).
  void broadcast_buffers() noexcept {}

  void save_state(const std::string& dir, checkpoint::Position position,
                  const std::vector<checkpoint::Registered>& objects) {
    to_host();
    host_.save_state(dir, position, objects);
  }
  checkpoint::Position load_state(const std::string& dir, const std::vector<checkpoint::Registered>& objects) {
    to_host();
    checkpoint::Position p = host_.load_state(dir, objects);
    host_changed_ = true;
    return p;
  }
  template <class F>
  decltype(auto) with_full_parameters(F&& f) {
    to_host();
    host_changed_ = true;
    return host_.with_full_parameters(std::forward<F>(f));
  }
  template <class F>
  void with_parameters_by_unit(F&& f) {
    to_host();
    host_.with_parameters_by_unit(std::forward<F>(f));
  }

  /// The host mirror's model, parameters and optimizer state, up to date with the device; what
  /// is written into them reaches the device before the next step.
  Model& model() {
    to_host();
    host_changed_ = true;
    return host_.model();
  }
  ParamArena& params() {
    to_host();
    host_changed_ = true;
    return host_.params();
  }
  typename Optimizer::State& optimizer_state() {
    to_host();
    host_changed_ = true;
    return host_.optimizer_state();
  }
  const Optimizer& optimizer() const noexcept { return host_.optimizer(); }

  backend::Cuda& backend() noexcept { return gpu_; }
  /// Host memory (the batches the loader makes; the host mirror's buffers).
  memory::Resource& memory() noexcept { return host_.memory(); }
  Communicator& communicator() noexcept { return host_.communicator(); }
  const TrainingOptions& options() const noexcept { return host_.options(); }
  Loss& loss() noexcept { return host_.loss(); }
  std::uint64_t step() const noexcept { return host_.step(); }
  std::uint64_t optimizer_steps() const noexcept { return host_.optimizer_steps(); }
  float current_lr() const { return host_.current_lr(); }
  std::size_t global_batch() const noexcept { return host_.global_batch(); }
  const DynamicLossScaler& loss_scaler() const noexcept { return host_.loss_scaler(); }
  const std::vector<optim::GroupScales>& param_groups() const noexcept { return host_.param_groups(); }
  const parallel::CommStats& comm_stats() const { return host_.comm_stats(); }
  void reset_comm_stats() { host_.reset_comm_stats(); }
  std::size_t bucket_count() const { return host_.bucket_count(); }
  std::size_t gradient_bytes() const { return host_.gradient_bytes(); }
  std::size_t parameter_bytes() const { return host_.parameter_bytes(); }
  profile::Profiler* profiler() const noexcept { return host_.profiler(); }
  /// Records the host side only (the device's kernels are not timed one by one yet).
  void set_profiler(profile::Profiler* p) { host_.set_profiler(p); }

  /// Nodes of the captured step (kernels, copies, memsets); 0 before the capture.
  /// (Of the step without accumulation: the window's first and last micro-step in one.)
  std::size_t graph_nodes() const noexcept { return graphs_[3].nodes(); }

 private:
  static TrainingOptions checked(TrainingOptions o) {
    auto refuse = [](bool bad, const std::string& what) {
      XTRAIN_CHECK(!bad, ValueError, "backend::Cuda does not support ", what,
                   " yet (the GPU engine runs one process); train with a CPU backend for it");
    };
    refuse(o.zero_stage() != 0, "zero_stage(" + std::to_string(o.zero_stage()) + ")");
    refuse(o.deterministic() != 0, "the deterministic reduction");
    refuse(!o.param_groups().empty(), "parameter groups");
    refuse(o.threads() > 1, "host threads (threads(" + std::to_string(o.threads()) + "))");
    return o;
  }

  const Tensor<float>& predict_on_device(const Tensor<float>& x) {
    gpu_.make_current();
    to_device();
    const std::size_t rows = x.dimension() ? x.shape(0) : 0;
    const Shape sample = lowering::sample_shape(x.shape());
    const Shape out = device_.out_shape(sample);
    std::vector<std::size_t> dims{rows};
    dims.insert(dims.end(), out.begin(), out.end());
    predicted_.resize(Shape(std::span<const std::size_t>(dims)));
    const std::size_t cols = sample.elements(), outs = out.elements();
    const std::size_t chunk = std::max<std::size_t>(host_.global_batch(), 1);
    eval_x_.reserve(gpu_, chunk * cols);  // its own buffer: the captured step does not hold it
    const std::uint64_t before = gpu_.allocations();
    for (std::size_t b = 0; b < rows; b += chunk) {
      const std::size_t n = std::min(chunk, rows - b);
      backend::cuda::upload(gpu_, eval_x_.data(), x.data() + b * cols, n * cols);
      const float* y = device_.enqueue_eval(eval_x_.data(), nullptr, n, sample, 1.0);
      backend::cuda::download(gpu_, predicted_.data() + b * outs, y, n * outs);
    }
    gpu_.synchronize();
    if (gpu_.allocations() != before) reset_graphs();  // buffers the captured steps hold have moved
    return predicted_;
  }

  static constexpr bool loss_scaling = PrecisionPolicy::uses_loss_scaling;

  // The device's loss scale into the host mirror's scaler (its skipped steps: optimizer_steps()).
  kernels::device::LossScaleState read_loss_scale() {
    const kernels::device::LossScaleState s = device_.read_loss_scale();
    host_.loss_scaler().restore(s.scale, s.tracker, s.skipped);
    return s;
  }

  void reset_graphs() noexcept {
    for (cuda::StepGraph& g : graphs_) g.reset();
  }
  // The device's state into the host mirror, if the device changed it since.
  void to_host() {
    if (!device_changed_) return;
    gpu_.make_current();
    device_.download(&host_.optimizer_state());
    if constexpr (loss_scaling) (void)read_loss_scale();
    device_changed_ = false;
  }
  // The host mirror's state onto the device, if the host changed it since.
  void to_device() {
    if (!host_changed_) return;
    gpu_.make_current();
    if (host_.options().seed() != seed_) {  // a resumed run's: the captured Dropout draws carry the old one
      seed_ = host_.options().seed();
      device_.set_seed(seed_);
      reset_graphs();
    }
    device_.upload(host_.optimizer_state(), host_.optimizer_steps());
    if constexpr (loss_scaling) {
      const DynamicLossScaler& s = host_.loss_scaler();
      kernels::device::LossScaleState state;
      state.scale = s.scale();
      state.tracker = s.growth_tracker();
      state.skipped = s.skipped_steps();
      device_.upload_loss_scale(state);
    }
    host_changed_ = false;
  }

  backend::Cuda gpu_;
  cuda::CudaDevice dev_;
  Host host_;
  cuda::DeviceModel<Model, Optimizer, Loss> device_;
  cuda::StepGraph graphs_[4];  // micro-steps: middle, first, last, first and last (no accumulation)
  backend::cuda::Buffer<float> batch_x_, eval_x_;
  Tensor<float> predicted_;
  backend::cuda::Buffer<typename cuda::DeviceModel<Model, Optimizer, Loss>::target_type> batch_y_;
  double terms_ = 0.0;
  std::size_t micro_ = 0, micro_samples_ = 0;  // the accumulation window so far
  std::uint64_t seed_ = host_.options().seed();
  bool host_changed_ = true, device_changed_ = false;
};

}  // namespace xtrain
