#pragma once
/// \file cuda_program.hpp
/// Training on a backend::Cuda GPU (nvcc only): `cuda::CudaDevice`, the Device policy of
/// lowering/ on a GPU (device memory, the kernel bodies launched on the stream, cuBLASLt),
/// and `cuda::Program<Model, Optimizer>`: a model of the lowered layers, its cross-entropy loss and
/// its optimizer (Adam, AdamW, SGD) with the data set in device memory, one training step one
/// graph launch. (Trainer<..., backend::Cuda> runs on the same DeviceModel: train/engine_cuda.hpp.)
///
/// Memory the llm.c way: parameters, gradients and the optimizer's state are device arrays in the
/// order of the model's host ParamArena (one copy moves all weights either way); activations are
/// sized by the first step and reused; the data set lives in device memory. The step after the
/// first is captured: the batch gather (from a permutation uploaded once per epoch), forward, loss
/// with its metrics (summed on the device, read when asked), backward and the optimizer are one
/// graph launch; the learning rate is read by the graph from device memory.

#if !defined(__CUDACC__)
#error "xtrain/train/cuda_program.hpp is compiled by nvcc (a .cu file, or CMake's LANGUAGE CUDA)"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <utility>

#include "xtrain/backend/cuda.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/cuda_gemm.hpp"
#include "xtrain/kernels/device_ops.hpp"
#include "xtrain/lowering/model.hpp"
#include "xtrain/precision/policy.hpp"

namespace xtrain::cuda {

using backend::Cuda;
namespace ops = kernels::device;

/// The Device policy of lowering/ on a GPU: Buffer<T> in device memory (counted by the
/// backend), kernel bodies launched on its stream, row-major products through cuBLASLt, copies on
/// the stream, and scalars (the learning rate, the sample offset of a micro-step) copied from a
/// ring of pinned slots so that a step in flight keeps reading its own.
class CudaDevice {
 public:
  explicit CudaDevice(Cuda& gpu) : gpu_(gpu) {
    backend::cuda::check(cudaMallocHost(reinterpret_cast<void**>(&ring_), slots * sizeof(std::uint64_t)),
                         "allocating pinned memory");
  }
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;
  ~CudaDevice() {
    (void)cudaStreamSynchronize(gpu_.stream());
    if (ring_) (void)cudaFreeHost(ring_);
  }

  template <class T>
  class Buffer : public backend::cuda::Buffer<T> {
   public:
    Buffer() = default;
    Buffer(CudaDevice& d, std::size_t n) : backend::cuda::Buffer<T>(d.gpu(), n) {}
    void reserve(CudaDevice& d, std::size_t n) { backend::cuda::Buffer<T>::reserve(d.gpu(), n); }
  };

  template <class Body>
  void launch(const Body& body) {
    backend::cuda::launch(gpu_.stream(), body);
  }
  template <class T>  // float, bf16 or fp16 operands
  void gemm(const ops::RowMajorGemm& g, const T* a, const T* b, float* c, float alpha, float beta,
            const float* bias = nullptr) {
    gemm_.run(gpu_, g, a, b, c, alpha, beta, bias);
  }
  template <class T>
  void zero(T* p, std::size_t n) {
    backend::cuda::check(cudaMemsetAsync(p, 0, n * sizeof(T), gpu_.stream()), "zeroing device memory");
  }
  template <class T>
  void upload(T* device, const T* host, std::size_t n) {
    backend::cuda::upload(gpu_, device, host, n);
  }
  template <class T>
  void download(T* host, const T* device, std::size_t n) {
    backend::cuda::download(gpu_, host, device, n);
  }
  template <class T>  // a float or a 64-bit count (8 bytes at most: a slot)
  void set_scalar(T* device, T value) {
    static_assert(sizeof(T) <= sizeof(std::uint64_t) && std::is_trivially_copyable_v<T>);
    if (++slot_ == slots) {
      gpu_.synchronize();  // every slot's copy has run
      slot_ = 0;
    }
    std::memcpy(ring_ + slot_, &value, sizeof(T));
    backend::cuda::check(cudaMemcpyAsync(device, ring_ + slot_, sizeof(T), cudaMemcpyHostToDevice, gpu_.stream()),
                         "copying a scalar to the GPU");
  }
  void synchronize() { gpu_.synchronize(); }
  std::uint64_t allocations() const noexcept { return gpu_.allocations(); }
  Cuda& gpu() noexcept { return gpu_; }

 private:
  static constexpr std::size_t slots = 256;
  Cuda& gpu_;
  kernels::cuda::Gemm gemm_;
  std::uint64_t* ring_ = nullptr;
  std::size_t slot_ = slots - 1;
};

/// A model's training state on a GPU (lowering::DeviceModel on a CudaDevice).
template <class Model, class Optimizer, class Loss = loss::CrossEntropyLoss>
using DeviceModel = lowering::DeviceModel<Model, Optimizer, CudaDevice, Loss>;

/// A step that runs eagerly once per batch size, is captured as a CUDA graph the next time the
/// same size comes, and is replayed from then on; another size runs eagerly (the last partial
/// batch of an epoch) without losing the graph, unless that eager step had to allocate (a larger
/// batch): buffers the graph captured have then moved, so it is dropped and made again.
class StepGraph {
 public:
  template <class F>
  void run(Cuda& gpu, std::size_t rows, F&& enqueue) {
    if (graph_.ready() && rows == rows_) return graph_.replay(gpu);
    if (!graph_.ready() && warm_ && rows == rows_) {
      graph_.capture(gpu, enqueue);
      return graph_.replay(gpu);
    }
    const std::uint64_t before = gpu.allocations();
    enqueue();
    if (gpu.allocations() != before) reset();
    if (!graph_.ready()) {
      warm_ = true;
      rows_ = rows;
    }
  }
  /// Drops the graph (a buffer or a value it captured changed): the next step runs eagerly.
  void reset() noexcept {
    graph_.reset();
    warm_ = false;
  }
  /// Nodes of the captured step (kernels, copies, memsets); 0 before the capture.
  std::size_t nodes() const noexcept { return graph_.nodes(); }

 private:
  backend::cuda::Graph graph_;
  std::size_t rows_ = 0;
  bool warm_ = false;
};

/// A model, its optimizer (Adam, AdamW, SGD) and cross-entropy on a GPU with the data set in device memory, one
/// training step per graph launch. Adopts the model as an Engine does (its parameters move into a
/// host ParamArena the program owns; model() is the host copy); train with train_epoch() on a
/// data set uploaded by set_data(); download() writes the weights and BatchNorm buffers back into
/// model() (to save, export or evaluate on the CPU). Precision: FullPrecision, or
/// MixedPrecision<bf16> or <fp16> (the products of Linear and Conv2d on tensor cores: bf16 or fp16
/// operands, fp32 accumulation; the rest fp32; fp16 with dynamic loss scaling on the device, from
/// 65536 and doubled after 2000 clean steps as PyTorch's GradScaler: loss_scale()).
template <class Model, class Optimizer, class Precision = FullPrecision>
class Program {
  static_assert(std::is_same_v<Precision, FullPrecision> || std::is_same_v<Precision, MixedPrecision<bf16>> ||
                    std::is_same_v<Precision, MixedPrecision<fp16>>,
                "xtrain: cuda::Program runs in FullPrecision, MixedPrecision<bf16> or MixedPrecision<fp16>");

 public:
  /// `batch`: the rows of every training step (the last partial batch of an epoch is dropped);
  /// `seed`: Dropout's masks (as TrainingOptions::seed on the CPU).
  Program(Cuda& gpu, Model model, Optimizer optimizer, std::size_t batch, std::uint64_t seed = 0)
      : gpu_(gpu),
        model_(std::move(model)),
        batch_(batch),
        arena_(adopt_model(model_, ParamArena::alignment, memory::host())),
        dev_(gpu),
        device_(dev_, model_, arena_, optimizer, seed, loss::CrossEntropyLoss{}, lowering::products_of<Precision>()),
        cursor_(gpu, 1) {
    XTRAIN_CHECK(batch > 1, ValueError, "cuda::Program: batch ", batch, " (BatchNorm needs 2 or more rows)");
    device_.upload(typename Optimizer::State{}, 0);
    device_.set_lr(optimizer.learning_rate());
    if constexpr (Precision::uses_loss_scaling) device_.set_loss_scaling({}, 2000);
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  /// The learning rate of the next steps.
  void set_lr(float lr) { device_.set_lr(lr); }

  /// Uploads a data set (inputs [N, ...] seen as N rows, class labels [N]) into device memory.
  void set_data(const Tensor<float>& inputs, std::span<const std::int32_t> labels) {
    XTRAIN_CHECK(inputs.dimension() >= 2 && inputs.shape(0) == labels.size(), ShapeError,
                 "cuda::Program::set_data: inputs of shape ", inputs.shape().str(), " but ", labels.size(), " labels");
    gpu_.make_current();
    graph_.reset();  // the data's buffers may move
    samples_ = inputs.shape(0);
    sample_ = lowering::sample_shape(inputs.shape());
    cols_ = sample_.elements();
    data_.reserve(gpu_, inputs.size());
    data_labels_.reserve(gpu_, samples_);
    order_.reserve(gpu_, samples_);
    backend::cuda::upload(gpu_, data_.data(), inputs.data(), inputs.size());
    backend::cuda::upload(gpu_, data_labels_.data(), labels.data(), samples_);
    gpu_.synchronize();
  }

  /// One epoch over the uploaded data in the order `order` (sample indices, e.g.
  /// parallel::GlobalSampler's permutation; whole batches of it, the rest dropped): returns the
  /// steps run. The first step ever runs eagerly (it sizes every buffer), the second is captured;
  /// every later one is a replay.
  std::size_t train_epoch(std::span<const std::uint32_t> order) {
    XTRAIN_CHECK(samples_ > 0, ValueError, "cuda::Program::train_epoch: no data (call set_data first)");
    gpu_.make_current();
    XTRAIN_CHECK(order.size() <= samples_, ValueError, "cuda::Program::train_epoch: ", order.size(), " indices for ",
                 samples_, " samples");
    backend::cuda::upload(gpu_, order_.data(), order.data(), order.size());
    backend::cuda::check(cudaMemsetAsync(cursor_.data(), 0, sizeof(std::size_t), gpu_.stream()), "zeroing");
    batch_x_.reserve(gpu_, batch_ * cols_);
    batch_y_.reserve(gpu_, batch_);
    const std::size_t steps = order.size() / batch_;
    for (std::size_t s = 0; s < steps; ++s)
      graph_.run(gpu_, batch_, [&] {
        backend::cuda::launch(gpu_.stream(),
                              ops::GatherBatch{data_.data(), data_labels_.data(), order_.data(), cursor_.data(),
                                               batch_x_.data(), batch_y_.data(), batch_, cols_});
        device_.enqueue_step(batch_x_.data(), batch_y_.data(), batch_, sample_, static_cast<double>(batch_));
        backend::cuda::launch(gpu_.stream(), ops::AdvanceCursor{cursor_.data(), batch_});
      });
    return steps;
  }

  /// Loss and accuracy summed on the device since the last call (waits for the GPU).
  struct Summary {
    double mean_loss = 0.0, accuracy = 0.0;
    std::int64_t samples = 0;
    float last_loss = 0.0f;
  };
  Summary read_metrics() {
    const ops::Metrics m = device_.read_metrics();
    Summary s;
    s.samples = m.samples;
    s.last_loss = m.last_loss;
    if (m.samples > 0) {
      s.mean_loss = m.loss_sum / static_cast<double>(m.samples);
      s.accuracy = static_cast<double>(m.correct) / static_cast<double>(m.samples);
    }
    return s;
  }

  /// Loss and accuracy of the model in evaluation mode (BatchNorm's running statistics) on
  /// inputs/labels in host memory, in batches of the training batch size. (Training metrics not
  /// yet read are read and dropped first.)
  Summary evaluate(const Tensor<float>& inputs, std::span<const std::int32_t> labels) {
    XTRAIN_CHECK(inputs.dimension() >= 2 && inputs.shape(0) == labels.size(), ShapeError,
                 "cuda::Program::evaluate: inputs of shape ", inputs.shape().str(), " but ", labels.size(), " labels");
    gpu_.make_current();
    (void)read_metrics();
    const std::size_t n = inputs.shape(0);
    const Shape sample = lowering::sample_shape(inputs.shape());
    const std::size_t cols = sample.elements();
    eval_x_.reserve(gpu_, batch_ * cols);
    eval_y_.reserve(gpu_, batch_);
    for (std::size_t b = 0; b < n; b += batch_) {
      const std::size_t rows = std::min(batch_, n - b);
      backend::cuda::upload(gpu_, eval_x_.data(), inputs.data() + b * cols, rows * cols);
      backend::cuda::upload(gpu_, eval_y_.data(), labels.data() + b, rows);
      device_.enqueue_eval(eval_x_.data(), eval_y_.data(), rows, sample, static_cast<double>(n));
    }
    return read_metrics();
  }

  /// Writes the device's weights and buffers into model() (waits for the GPU).
  void download() { device_.download(); }
  /// Copies model()'s weights and buffers to the device (after loading weights into it, e.g. by
  /// checkpoint::load_model); the optimizer's state and step count start again from zero.
  void upload_parameters() { device_.upload(typename Optimizer::State{}, 0); }

  /// The host model and its arena (what checkpoint::save_model writes after download()).
  Model& model() noexcept { return model_; }
  ParamArena& arena() noexcept { return arena_; }
  /// Nodes of the captured step (kernels, copies, memsets); 0 before the capture.
  std::size_t graph_nodes() const noexcept { return graph_.nodes(); }
  /// Under MixedPrecision<fp16>: the loss scale's state (scale, steps skipped for overflow; waits
  /// for the GPU).
  ops::LossScaleState loss_scale() { return device_.read_loss_scale(); }
  Cuda& gpu() noexcept { return gpu_; }

 private:
  Cuda& gpu_;
  Model model_;
  std::size_t batch_, samples_ = 0, cols_ = 0;
  Shape sample_;
  ParamArena arena_;
  CudaDevice dev_;
  DeviceModel<Model, Optimizer> device_;
  backend::cuda::Buffer<std::size_t> cursor_;
  backend::cuda::Buffer<float> data_, batch_x_, eval_x_;
  backend::cuda::Buffer<std::int32_t> data_labels_, batch_y_, eval_y_;
  backend::cuda::Buffer<std::uint32_t> order_;
  StepGraph graph_;
};

}  // namespace xtrain::cuda
