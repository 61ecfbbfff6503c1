#pragma once
/// \file lowered.hpp
/// Models lowered onto a device: the device implementation of each layer type
/// (`lowering::Lowered<L, D>`, chosen at compile time) and the training state of a model on a
/// device (`lowering::DeviceModel`: parameters, gradients, Adam's moments, the loss, the metrics),
/// written once against a Device policy D:
///  - `lowering::HostDevice` (here): host memory, each kernel body run as a loop, the CPU's GEMM.
///    What the tests run on every machine: the whole lowered step, checked against the CPU
///    layers and Engine, GPU or not;
///  - `cuda::CudaDevice` (train/cuda_program.hpp, nvcc only): device memory, the bodies launched on
///    the stream, cuBLASLt.
/// A Device provides Buffer<T> (made with (D&, n); reserve(D&, n) keeps memory that is large
/// enough: a warm step allocates nothing), launch(body), gemm(RowMajorGemm, a, b, c, alpha, beta,
/// bias), zero / upload / download / set_scalar / synchronize, and allocations().
///
/// The layers keep their CPU implementations untouched; a lowered layer binds to their
/// parameters (through the host ParamArena's offsets) and settings. Lowered so far: Sequential,
/// Linear, Conv2d (im2col and one product for the batch), MaxPool2d, BatchNorm1d (over [N, C])
/// and BatchNorm2d (each with the ReLU after it fused), ReLU, Dropout (the CPU's masks), Flatten.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "xtrain/core/error.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/device_ops.hpp"
#include "xtrain/kernels/gemm.hpp"
#include "xtrain/layers/activations.hpp"
#include "xtrain/layers/batch_norm.hpp"
#include "xtrain/layers/conv2d.hpp"
#include "xtrain/layers/dropout.hpp"
#include "xtrain/layers/linear.hpp"
#include "xtrain/layers/pooling.hpp"
#include "xtrain/layers/sequential.hpp"
#include "xtrain/optim/adam.hpp"

namespace xtrain::lowering {

namespace ops = kernels::device;

/// The Device that runs lowered models on the host (tests; no GPU needed): host memory, kernel
/// bodies as loops, the CPU's GEMM. It counts the allocations its buffers make.
class HostDevice {
 public:
  template <class T>
  class Buffer {
   public:
    Buffer() = default;
    Buffer(HostDevice& d, std::size_t n) { reserve(d, n); }
    void reserve(HostDevice& d, std::size_t n) {
      if (n <= size_ && data_) return;
      data_ = std::make_unique<T[]>(std::max<std::size_t>(n, 1));
      size_ = n;
      ++d.allocations_;
    }
    T* data() const noexcept { return data_.get(); }
    std::size_t size() const noexcept { return size_; }

   private:
    std::unique_ptr<T[]> data_;
    std::size_t size_ = 0;
  };

  template <class Body>
  void launch(const Body& body) {
    ops::run_on_host(body);
  }
  void gemm(const ops::RowMajorGemm& g, const float* a, const float* b, float* c, float alpha, float beta,
            const float* bias = nullptr) {
    using kernels::Trans;
    kernels::gemm(g.trans_a ? Trans::yes : Trans::no, g.trans_b ? Trans::yes : Trans::no, g.m, g.n, g.k, alpha, a,
                  g.lda, b, g.ldb, beta, c, g.ldc, nullptr, bias);
  }
  template <class T>
  void zero(T* p, std::size_t n) {
    std::fill_n(p, n, T{});
  }
  template <class T>
  void upload(T* device, const T* host, std::size_t n) {
    std::copy_n(host, n, device);
  }
  template <class T>
  void download(T* host, const T* device, std::size_t n) {
    std::copy_n(device, n, host);
  }
  void set_scalar(float* device, float value) { *device = value; }
  void synchronize() {}
  std::uint64_t allocations() const noexcept { return allocations_; }

 private:
  std::uint64_t allocations_ = 0;
};

/// The shape of one sample of a batch of shape `batch` (its first dimension dropped).
inline Shape sample_shape(const Shape& batch) {
  return batch.rank() ? Shape(std::span<const std::size_t>(batch.begin() + 1, batch.end())) : Shape{};
}

/// What lowered layers share: the device, where the host arena's parameters are on it, the mode.
template <class D>
struct Context {
  D& dev;
  const float* host_base;  // the host ParamArena's values
  float* values;           // the device copy, same offsets
  float* grads;
  bool training = true;
  std::uint64_t seed = 0;               // of Dropout's masks (TrainingOptions::seed)
  const std::uint64_t* step = nullptr;  // on the device: the optimizer steps taken (Dropout's stream)
  float* value(const Param& p) const { return values + (p.data() - host_base); }
  float* grad(const Param& p) const { return grads + (p.data() - host_base); }
};

template <class>
inline constexpr bool no_lowering = false;

/// The device implementation of layer type L (specialised below). Each has:
///   Lowered(L&, Context<D>&);  Shape out_shape(const Shape& in)   (sample shapes, no batch)
///   const float* forward(Context<D>&, const float* x, std::size_t n, const Shape& in)
///   const float* backward(Context<D>&, const float* dy, bool need_dx)   (adds into the gradients)
///   void upload(Context<D>&) / download(Context<D>&): buffers that are not parameters.
template <class L, class D>
class Lowered {
  static_assert(no_lowering<L>,
                "xtrain: backend::Cuda has no device implementation of this layer yet (lowered so far: Sequential, "
                "Linear, Conv2d, MaxPool2d, BatchNorm1d, BatchNorm2d, ReLU, Dropout, Flatten)");
};

template <class D>
class Lowered<layers::Linear, D> {
 public:
  Lowered(layers::Linear& l, Context<D>& c)
      : in_(l.in_features()),
        out_(l.out_features()),
        w_(c.value(l.weight())),
        gw_(c.grad(l.weight())),
        b_(l.has_bias() ? c.value(l.bias()) : nullptr),
        gb_(l.has_bias() ? c.grad(l.bias()) : nullptr) {}
  /// [*, in] -> [*, out].
  Shape out_shape(const Shape& in) const {
    XTRAIN_CHECK(in.rank() >= 1 && in[in.rank() - 1] == in_, ShapeError, "Linear(", in_, ", ", out_,
                 ") on the device: a sample of shape ", in.str());
    return in.with_back(out_);
  }
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    (void)out_shape(in);
    rows_ = n * (in.elements() / in_);
    x_ = x;
    y_.reserve(c.dev, rows_ * out_);
    c.dev.gemm({false, true, rows_, out_, in_, in_, in_, out_}, x, w_, y_.data(), 1.0f, 0.0f, b_);
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    c.dev.gemm({true, false, out_, in_, rows_, out_, in_, in_}, dy, x_, gw_, 1.0f, 1.0f);
    if (gb_) c.dev.launch(ops::ColumnSums{dy, gb_, rows_, out_, true});
    if (!need_dx) return nullptr;
    dx_.reserve(c.dev, rows_ * in_);
    c.dev.gemm({false, false, rows_, in_, out_, out_, in_, in_}, dy, w_, dx_.data(), 1.0f, 0.0f);
    return dx_.data();
  }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}

 private:
  std::size_t in_, out_, rows_ = 0;
  const float* w_;
  float* gw_;
  const float* b_;
  float* gb_;
  const float* x_ = nullptr;
  typename D::template Buffer<float> y_, dx_;
};

template <class D>
class Lowered<layers::Activation, D> {
 public:
  Lowered(layers::Activation& a, Context<D>&) {
    XTRAIN_CHECK(a.kind() == layers::ActivationKind::relu, ValueError, a.describe(),
                 " has no device implementation yet (lowered so far: ReLU)");
  }
  Shape out_shape(const Shape& in) const { return in; }
  /// Set when the layer before it applies the ReLU itself (as the CPU's fusion).
  bool absorbed = false;
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    if (absorbed) return x;
    n_ = n * in.elements();
    y_.reserve(c.dev, n_);
    c.dev.launch(ops::ReluForward{x, y_.data(), n_});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    if (absorbed) return need_dx ? dy : nullptr;
    if (!need_dx) return nullptr;
    dx_.reserve(c.dev, n_);
    c.dev.launch(ops::ReluBackward{y_.data(), dy, dx_.data(), n_});
    return dx_.data();
  }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}

 private:
  std::size_t n_ = 0;
  typename D::template Buffer<float> y_, dx_;
};
template <class D>
class Lowered<layers::ReLU, D> : public Lowered<layers::Activation, D> {
  using Lowered<layers::Activation, D>::Lowered;
};

template <class D>
class Lowered<layers::Flatten, D> {
 public:
  Lowered(layers::Flatten&, Context<D>&) {}
  Shape out_shape(const Shape& in) const { return Shape{in.elements()}; }
  const float* forward(Context<D>&, const float* x, std::size_t, const Shape&) { return x; }
  const float* backward(Context<D>&, const float* dy, bool need_dx) { return need_dx ? dy : nullptr; }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}
};

namespace detail {
// The window of `k` (kernel, stride, padding, dilation) over n images of sample shape [c, h, w].
inline ops::Window2 window_over(const kernels::Window& k, std::size_t n, const Shape& in, const std::string& who) {
  XTRAIN_CHECK(in.rank() == 3, ShapeError, who, " on the device: a sample of shape ", in.str(),
               ", expected [channels, height, width]");
  kernels::Window w = k;
  XTRAIN_CHECK(w.set_input(in[1], in[2]), ShapeError, who, ": a ", in[1], " x ", in[2],
               " input is smaller than its window");
  return {n,          in[0],       in[1],       in[2],        k.kernel.h,   k.kernel.w, k.stride.h,
          k.stride.w, k.padding.h, k.padding.w, k.dilation.h, k.dilation.w, w.oh,       w.ow};
}
}  // namespace detail

template <class D>
class Lowered<layers::Conv2d, D> {
 public:
  Lowered(layers::Conv2d& conv, Context<D>& c)
      : host_(&conv),
        w_(c.value(conv.weight())),
        gw_(c.grad(conv.weight())),
        b_(conv.has_bias() ? c.value(conv.bias()) : nullptr),
        gb_(conv.has_bias() ? c.grad(conv.bias()) : nullptr) {
    XTRAIN_CHECK(conv.groups() == 1, ValueError, conv.describe(),
                 ": grouped convolutions have no device implementation yet");
    window_.kernel = conv.kernel_size();
    window_.stride = conv.stride();
    window_.padding = conv.padding();
    window_.dilation = conv.dilation();
  }
  Shape out_shape(const Shape& in) const {
    const ops::Window2 g = detail::window_over(window_, 1, in, host_->describe());
    XTRAIN_CHECK(in[0] == host_->in_channels(), ShapeError, host_->describe(), " on the device: a sample of shape ",
                 in.str());
    return Shape{host_->out_channels(), g.oh, g.ow};
  }
  // Forward: the input unfolded (Im2col), one product by the weights for every image at once, then
  // laid out as NCHW images with the bias added. Backward: the weights' gradient from the kept
  // unfolded input, the bias's from plane sums, the input's folded back (Col2im).
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    (void)out_shape(in);
    g_ = detail::window_over(window_, n, in, host_->describe());
    const std::size_t ckk = g_.c * g_.kh * g_.kw, cols = n * g_.oh * g_.ow, o = host_->out_channels();
    cols_.reserve(c.dev, ckk * cols);
    yc_.reserve(c.dev, o * cols);
    y_.reserve(c.dev, o * cols);
    c.dev.launch(ops::Im2col{x, cols_.data(), g_});
    c.dev.gemm({false, false, o, cols, ckk, ckk, cols, cols}, w_, cols_.data(), yc_.data(), 1.0f, 0.0f);
    c.dev.launch(ops::ChannelsImages{yc_.data(), b_, y_.data(), n, o, g_.oh * g_.ow, false});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    const std::size_t ckk = g_.c * g_.kh * g_.kw, planes = g_.oh * g_.ow, cols = g_.n * planes,
                      o = host_->out_channels();
    c.dev.launch(ops::ChannelsImages{dy, nullptr, yc_.data(), g_.n, o, planes, true});  // dy by channel
    c.dev.gemm({false, true, o, ckk, cols, cols, cols, ckk}, yc_.data(), cols_.data(), gw_, 1.0f, 1.0f);
    if (gb_) {
      partial_.reserve(c.dev, g_.n * o);
      c.dev.launch(ops::RowSums{dy, partial_.data(), g_.n * o, planes});   // per image and channel
      c.dev.launch(ops::ColumnSums{partial_.data(), gb_, g_.n, o, true});  // over the images, in order
    }
    if (!need_dx) return nullptr;
    c.dev.gemm({true, false, ckk, cols, o, ckk, cols, cols}, w_, yc_.data(), cols_.data(), 1.0f, 0.0f);  // dcols
    dx_.reserve(c.dev, g_.n * g_.c * g_.h * g_.w);
    c.dev.launch(ops::Col2im{cols_.data(), dx_.data(), g_});
    return dx_.data();
  }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}

 private:
  layers::Conv2d* host_;
  kernels::Window window_;
  ops::Window2 g_{};
  const float* w_;
  float* gw_;
  const float* b_;
  float* gb_;
  typename D::template Buffer<float> cols_, yc_, y_, dx_, partial_;
};

template <class D>
class Lowered<layers::MaxPool2d, D> {
 public:
  Lowered(layers::MaxPool2d& pool, Context<D>&) : host_(&pool) {}
  Shape out_shape(const Shape& in) const {
    const ops::Window2 g = detail::window_over(host_->window(), 1, in, host_->describe());
    return Shape{in[0], g.oh, g.ow};
  }
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    g_ = detail::window_over(host_->window(), n, in, host_->describe());
    const std::size_t out = n * g_.c * g_.oh * g_.ow;
    y_.reserve(c.dev, out);
    argmax_.reserve(c.dev, out);
    c.dev.launch(ops::MaxPoolForward{x, y_.data(), argmax_.data(), g_});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    if (!need_dx) return nullptr;
    dx_.reserve(c.dev, g_.n * g_.c * g_.h * g_.w);
    c.dev.launch(ops::MaxPoolBackward{dy, argmax_.data(), dx_.data(), g_});
    return dx_.data();
  }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}

 private:
  layers::MaxPool2d* host_;
  ops::Window2 g_{};
  typename D::template Buffer<float> y_, dx_;
  typename D::template Buffer<std::int32_t> argmax_;
};

// Copies a BatchNorm's buffers from the device into the host layer (as its visit names them).
template <class D>
struct BatchNormBuffers {
  D& dev;
  const float* running;  // [mean (c)] [var (c)]
  const std::int64_t* tracked;
  std::size_t c;
  void param(std::string_view, Param&, ParamKind = ParamKind::weight) {}
  void buffer(std::string_view name, Tensor<float>& t, bool = true) {
    if (name == "running_mean") dev.download(t.data(), running, c);
    if (name == "running_var") dev.download(t.data(), running + c, c);
  }
  void buffer(std::string_view, std::int64_t& n) { dev.download(&n, tracked, 1); }
  template <class M>
  void child(std::string_view, M&) {}
  void id(ModuleId&) {}
};

template <class D>
class Lowered<layers::BatchNorm1d, D> {
 public:
  Lowered(layers::BatchNorm1d& bn, Context<D>& c)
      : host_(&bn),
        c_(bn.features()),
        gamma_(c.value(bn.weight())),
        beta_(c.value(bn.bias())),
        ggamma_(c.grad(bn.weight())),
        gbeta_(c.grad(bn.bias())),
        running_(c.dev, 2 * c_),
        stats_(c.dev, 5 * c_),
        tracked_(c.dev, 1) {
    XTRAIN_CHECK(!bn.sync_stats(), ValueError, bn.describe(), ": SyncBatchNorm has no device implementation yet");
  }
  /// Set when the ReLU after it is applied here.
  bool fuse_relu = false;
  Shape out_shape(const Shape& in) const {
    XTRAIN_CHECK(in.rank() == 1 && in[0] == c_, ShapeError, host_->describe(), " on the device: a sample of shape ",
                 in.str(), " (over [N, C] rows so far)");
    return in;
  }
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    (void)out_shape(in);
    XTRAIN_CHECK(!c.training || n > 1, ValueError, host_->describe(),
                 ": expected more than 1 value per channel when training (use a batch of 2 or more, or drop_last)");
    rows_ = n;
    training_ = c.training;
    xhat_.reserve(c.dev, n * c_);
    y_.reserve(c.dev, n * c_);
    c.dev.launch(ops::BatchNormStatistics{x, mean(), invstd(), running_.data(), running_.data() + c_, tracked_.data(),
                                          n, c_, host_->momentum(), host_->eps(), c.training});
    c.dev.launch(
        ops::BatchNormNormalize{x, mean(), invstd(), gamma_, beta_, xhat_.data(), y_.data(), n, c_, fuse_relu});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    XTRAIN_CHECK(training_, ValueError, host_->describe(), " on the device: backward after an evaluation forward");
    const float* relu_out = fuse_relu ? y_.data() : nullptr;
    float* s = stats_.data();
    c.dev.launch(ops::BatchNormBackwardSums{dy, xhat_.data(), relu_out, gamma_, invstd(), ggamma_, gbeta_, s + 2 * c_,
                                            s + 3 * c_, s + 4 * c_, rows_, c_});
    if (!need_dx) return nullptr;
    dx_.reserve(c.dev, rows_ * c_);
    c.dev.launch(
        ops::BatchNormInputGrad{dy, xhat_.data(), relu_out, s + 2 * c_, s + 3 * c_, s + 4 * c_, dx_.data(), rows_, c_});
    return dx_.data();
  }
  /// The running statistics and the batch count, from the host layer / back to it.
  void upload(Context<D>& c) {
    c.dev.upload(running_.data(), host_->running_mean().data(), c_);
    c.dev.upload(running_.data() + c_, host_->running_var().data(), c_);
    tracked_host_ = host_->num_batches_tracked();
    c.dev.upload(tracked_.data(), &tracked_host_, 1);
    c.dev.synchronize();
  }
  void download(Context<D>& c) {
    BatchNormBuffers<D> v{c.dev, running_.data(), tracked_.data(), c_};
    host_->visit(v);
    c.dev.synchronize();
  }

 private:
  float* mean() const { return stats_.data(); }
  float* invstd() const { return stats_.data() + c_; }

  layers::BatchNorm1d* host_;
  std::size_t c_, rows_ = 0;
  bool training_ = true;
  const float *gamma_, *beta_;
  float *ggamma_, *gbeta_;
  typename D::template Buffer<float> running_;  // [running_mean (c)] [running_var (c)]
  typename D::template Buffer<float> stats_;    // [mean] [invstd] [scale] [mean_dy] [mean_dy_xhat], c each
  typename D::template Buffer<std::int64_t> tracked_;
  std::int64_t tracked_host_ = 0;
  typename D::template Buffer<float> xhat_, y_, dx_;
};

template <class D>
class Lowered<layers::BatchNorm2d, D> {
 public:
  Lowered(layers::BatchNorm2d& bn, Context<D>& c)
      : host_(&bn),
        c_(bn.features()),
        gamma_(c.value(bn.weight())),
        beta_(c.value(bn.bias())),
        ggamma_(c.grad(bn.weight())),
        gbeta_(c.grad(bn.bias())),
        running_(c.dev, 2 * c_),
        stats_(c.dev, 5 * c_),
        tracked_(c.dev, 1) {
    XTRAIN_CHECK(!bn.sync_stats(), ValueError, bn.describe(), ": SyncBatchNorm has no device implementation yet");
  }
  /// Set when the ReLU after it is applied here.
  bool fuse_relu = false;
  Shape out_shape(const Shape& in) const {
    XTRAIN_CHECK(in.rank() == 3 && in[0] == c_, ShapeError, host_->describe(), " on the device: a sample of shape ",
                 in.str(), ", expected [", c_, ", height, width]");
    return in;
  }
  // Statistics from per-plane sums (one thread per plane) added per channel over the images in
  // order; x-hat recomputed from x in backward (as the CPU's planes): x is the caller's buffer,
  // kept until backward as every layer's input.
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    (void)out_shape(in);
    n_ = n;
    sp_ = in[1] * in[2];
    x_ = x;
    training_ = c.training;
    const std::size_t total = n * c_ * sp_;
    XTRAIN_CHECK(!c.training || n * sp_ > 1, ValueError, host_->describe(),
                 ": expected more than 1 value per channel when training");
    y_.reserve(c.dev, total);
    sums_.reserve(c.dev, 2 * n * c_);
    float* rm = running_.data();
    if (c.training) {
      c.dev.launch(ops::PlaneSums{x, nullptr, sums_.data(), n * c_, c_, sp_});
      c.dev.launch(ops::ChannelStatistics{sums_.data(), mean(), invstd(), rm, rm + c_, tracked_.data(), n, c_, sp_,
                                          host_->momentum(), host_->eps(), false});
      c.dev.launch(ops::PlaneSums{x, mean(), sums_.data(), n * c_, c_, sp_});
      c.dev.launch(ops::ChannelStatistics{sums_.data(), mean(), invstd(), rm, rm + c_, tracked_.data(), n, c_, sp_,
                                          host_->momentum(), host_->eps(), true});
    } else {
      c.dev.launch(ops::BatchNormStatistics{x, mean(), invstd(), rm, rm + c_, tracked_.data(), 0, c_, host_->momentum(),
                                            host_->eps(), false});
    }
    c.dev.launch(ops::NormalizePlanes{x, mean(), invstd(), gamma_, beta_, y_.data(), total, c_, sp_, fuse_relu});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    XTRAIN_CHECK(training_, ValueError, host_->describe(), " on the device: backward after an evaluation forward");
    float* s = stats_.data();
    c.dev.launch(
        ops::PlaneSumDotXhat{dy, x_, mean(), invstd(), gamma_, beta_, sums_.data(), n_ * c_, c_, sp_, fuse_relu});
    c.dev.launch(ops::ChannelBackwardSums{sums_.data(), gamma_, invstd(), ggamma_, gbeta_, s + 2 * c_, s + 3 * c_,
                                          s + 4 * c_, n_, c_, sp_});
    if (!need_dx) return nullptr;
    dx_.reserve(c.dev, n_ * c_ * sp_);
    c.dev.launch(ops::PlaneInputGrad{dy, x_, mean(), invstd(), gamma_, beta_, s + 2 * c_, s + 3 * c_, s + 4 * c_,
                                     dx_.data(), n_ * c_ * sp_, c_, sp_, fuse_relu});
    return dx_.data();
  }
  void upload(Context<D>& c) {
    c.dev.upload(running_.data(), host_->running_mean().data(), c_);
    c.dev.upload(running_.data() + c_, host_->running_var().data(), c_);
    tracked_host_ = host_->num_batches_tracked();
    c.dev.upload(tracked_.data(), &tracked_host_, 1);
    c.dev.synchronize();
  }
  void download(Context<D>& c) {
    BatchNormBuffers<D> v{c.dev, running_.data(), tracked_.data(), c_};
    host_->visit(v);
    c.dev.synchronize();
  }

 private:
  float* mean() const { return stats_.data(); }
  float* invstd() const { return stats_.data() + c_; }

  layers::BatchNorm2d* host_;
  std::size_t c_, n_ = 0, sp_ = 0;
  bool training_ = true;
  const float* x_ = nullptr;
  const float *gamma_, *beta_;
  float *ggamma_, *gbeta_;
  typename D::template Buffer<float> running_, stats_;
  typename D::template Buffer<std::int64_t> tracked_;
  std::int64_t tracked_host_ = 0;
  typename D::template Buffer<double> sums_;
  typename D::template Buffer<float> y_, dx_;
};

template <class D>
class Lowered<layers::Dropout, D> {
 public:
  Lowered(layers::Dropout& d, Context<D>&) : host_(&d) {}
  Shape out_shape(const Shape& in) const { return in; }
  // The CPU layer's masks: stream (dropout | id << 40 | step), element e of the batch at word e % 4
  // of block e / 4 (one process: the batch's first sample is sample 0 of the global batch).
  const float* forward(Context<D>& c, const float* x, std::size_t n, const Shape& in) {
    active_ = c.training && host_->p() > 0.0f;
    if (!active_) return x;
    n_ = n * in.elements();
    y_.reserve(c.dev, n_);
    mask_.reserve(c.dev, n_);
    const float p = host_->p(), scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    const std::uint64_t stream = streams::dropout | (static_cast<std::uint64_t>(host_->id()) << 40);
    c.dev.launch(ops::DropoutForward{x, y_.data(), mask_.data(), n_, c.seed, stream, c.step, p, scale});
    return y_.data();
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    if (!need_dx) return nullptr;
    if (!active_) return dy;
    dx_.reserve(c.dev, n_);
    c.dev.launch(ops::Multiply{dy, mask_.data(), dx_.data(), n_});
    return dx_.data();
  }
  void upload(Context<D>&) {}
  void download(Context<D>&) {}

 private:
  layers::Dropout* host_;
  bool active_ = false;
  std::size_t n_ = 0;
  typename D::template Buffer<float> y_, mask_, dx_;
};

template <class... Layers, class D>
class Lowered<layers::Sequential<Layers...>, D> {
  using Children = std::tuple<Lowered<layers::unnamed_t<Layers>, D>...>;
  static constexpr std::size_t count = sizeof...(Layers);

 public:
  Lowered(layers::Sequential<Layers...>& s, Context<D>& c)
      : children_([&]<std::size_t... I>(std::index_sequence<I...>) {
          return Children{Lowered<layers::unnamed_t<Layers>, D>(s.template get<I>(), c)...};
        }(std::index_sequence_for<Layers...>{})) {
    // A BatchNorm followed by a ReLU applies it in its own pass (the CPU's fusion).
    [&]<std::size_t... I>(std::index_sequence<I...>) { (fuse<I>(), ...); }
    (std::make_index_sequence<count - 1>{});
  }
  Shape out_shape(Shape s) const {
    std::apply([&](const auto&... c) { ((s = c.out_shape(s)), ...); }, children_);
    return s;
  }
  const float* forward(Context<D>& c, const float* x, std::size_t n, Shape s) {
    std::apply([&](auto&... child) { ((x = child.forward(c, x, n, s), s = child.out_shape(s)), ...); }, children_);
    return x;
  }
  const float* backward(Context<D>& c, const float* dy, bool need_dx) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      // Last child first; the first child's input gradient only when asked for.
      ((dy = std::get<count - 1 - I>(children_).backward(c, dy, need_dx || count - 1 - I > 0)), ...);
    }
    (std::index_sequence_for<Layers...>{});
    return dy;
  }
  void upload(Context<D>& c) {
    std::apply([&](auto&... child) { (child.upload(c), ...); }, children_);
  }
  void download(Context<D>& c) {
    std::apply([&](auto&... child) { (child.download(c), ...); }, children_);
  }

 private:
  template <std::size_t I>
  void fuse() {
    using A = std::tuple_element_t<I, Children>;
    using B = std::tuple_element_t<I + 1, Children>;
    if constexpr ((std::is_same_v<A, Lowered<layers::BatchNorm1d, D>> ||
                   std::is_same_v<
                       A, Lowered<layers::BatchNorm2d, D>>)&&std::is_base_of_v<Lowered<layers::Activation, D>, B>) {
      std::get<I>(children_).fuse_relu = true;
      std::get<I + 1>(children_).absorbed = true;
    }
  }
  Children children_;
};

/// The training state of a model on device D, bound to the host model and its ParamArena:
/// parameters, gradients and Adam's moments as four device arrays in the arena's order, the
/// lowered model, the loss's buffers, the metrics summed on the device, Adam's step counter and
/// learning rate there. enqueue_step() puts one training step on the device (capturable as a
/// graph); upload() and download() move the whole state between host and device.
template <class Model, class Optimizer, class D>
class DeviceModel {
  static_assert(std::is_same_v<Optimizer, optim::Adam> || std::is_same_v<Optimizer, optim::AdamW>,
                "xtrain: the device backends run optim::Adam and optim::AdamW so far");
  static constexpr bool decoupled = std::is_same_v<Optimizer, optim::AdamW>;
  template <class T>
  using Buffer = typename D::template Buffer<T>;

 public:
  /// `seed`: Dropout's (TrainingOptions::seed, as the CPU engine's).
  DeviceModel(D& dev, Model& model, ParamArena& arena, const Optimizer& optimizer, std::uint64_t seed = 0)
      : dev_(dev),
        optimizer_(optimizer),
        arena_(arena),
        values_(dev, arena.size()),
        grads_(dev, arena.size()),
        m_(dev, arena.size()),
        v_(dev, arena.size()),
        metrics_(dev, 1),
        scalars_(dev, 1),
        step_(dev, 1),
        lr_(dev, 1),
        ctx_{dev, arena.values().data(), values_.data(), grads_.data(), true, seed, step_.data()},
        lowered_(model, ctx_) {
    reset_metrics();
  }
  /// Dropout's seed from now on (a resumed run's).
  void set_seed(std::uint64_t seed) noexcept { ctx_.seed = seed; }
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  /// The learning rate of the steps enqueued from now on (copied to the device when it changes).
  void set_lr(float lr) {
    if (lr == lr_now_) return;
    dev_.set_scalar(lr_.data(), lr);
    lr_now_ = lr;
  }

  /// One training step on n samples of shape `sample` at x and their class labels (device
  /// memory): gradients zeroed, forward, cross-entropy / normaliser with its sums, backward,
  /// Adam. Enqueues only.
  void enqueue_step(const float* x, const std::int32_t* labels, std::size_t n, const Shape& sample, double normaliser) {
    dev_.zero(grads_.data(), arena_.size());
    const float* out = lowered_.forward(ctx_, x, n, sample);
    loss_sums(out, labels, n, sample, normaliser);
    lowered_.backward(ctx_, dlogits_.data(), false);
    dev_.launch(ops::AdamPrepare{lr_.data(), step_.data(), scalars_.data(), optimizer_.beta1(), optimizer_.beta2(),
                                 optimizer_.eps(), optimizer_.weight_decay()});
    dev_.launch(ops::AdamUpdate<decoupled>{values_.data(), m_.data(), v_.data(), grads_.data(), scalars_.data(),
                                           arena_.size()});
  }

  /// The model's output in evaluation mode for n samples at x, and the loss sums into the
  /// metrics when `labels` is given. Returns where the logits are.
  const float* enqueue_eval(const float* x, const std::int32_t* labels, std::size_t n, const Shape& sample,
                            double normaliser) {
    ctx_.training = false;
    const float* out = lowered_.forward(ctx_, x, n, sample);
    ctx_.training = true;
    if (labels) loss_sums(out, labels, n, sample, normaliser);
    return out;
  }

  /// The metrics summed on the device since the last read (waits for the device), then zeroed.
  /// Throws DataError when a label was outside [0, classes).
  ops::Metrics read_metrics() {
    ops::Metrics m;
    dev_.download(&m, metrics_.data(), 1);
    dev_.synchronize();
    reset_metrics();
    XTRAIN_CHECK(m.bad_labels == 0, DataError, "the device's loss: ", m.bad_labels,
                 " labels were outside [0, classes) (their rows were left out of the loss)");
    return m;
  }

  /// Copies the host's parameters (the arena's values), the layers' buffers (BatchNorm's running
  /// statistics), Adam's moments (shorter spans than the arena: zeros) and its step count to the
  /// device.
  void upload(std::span<const float> exp_avg, std::span<const float> exp_avg_sq, std::uint64_t optimizer_steps) {
    dev_.upload(values_.data(), arena_.values().data(), arena_.size());
    lowered_.upload(ctx_);
    moment_upload(m_, exp_avg);
    moment_upload(v_, exp_avg_sq);
    step_host_ = optimizer_steps;
    dev_.upload(step_.data(), &step_host_, 1);
    dev_.synchronize();
  }
  /// Copies the device's parameters, buffers and (where the spans are not empty) Adam's moments
  /// back to the host (waits for the device).
  void download(std::span<float> exp_avg = {}, std::span<float> exp_avg_sq = {}) {
    dev_.download(arena_.values().data(), values_.data(), arena_.size());
    if (!exp_avg.empty()) dev_.download(exp_avg.data(), m_.data(), std::min(exp_avg.size(), arena_.size()));
    if (!exp_avg_sq.empty()) dev_.download(exp_avg_sq.data(), v_.data(), std::min(exp_avg_sq.size(), arena_.size()));
    dev_.synchronize();
    lowered_.download(ctx_);
  }

  /// The shape of the model's output for samples of shape `sample`.
  Shape out_shape(const Shape& sample) const { return lowered_.out_shape(sample); }
  D& device() noexcept { return dev_; }

 private:
  void reset_metrics() { dev_.zero(metrics_.data(), 1); }
  void moment_upload(Buffer<float>& dest, std::span<const float> host) {
    if (host.size() >= arena_.size())
      dev_.upload(dest.data(), host.data(), arena_.size());
    else
      dev_.zero(dest.data(), arena_.size());
  }

  // Softmax cross-entropy on n logits: the gradient (scaled by 1/normaliser) and the sums.
  void loss_sums(const float* logits, const std::int32_t* labels, std::size_t n, const Shape& sample,
                 double normaliser) {
    const Shape out = lowered_.out_shape(sample);
    XTRAIN_CHECK(out.rank() == 1, ShapeError, "the device's cross-entropy: the model's output per sample is ",
                 out.str(), ", expected [classes]");
    const std::size_t classes = out[0];
    dlogits_.reserve(dev_, n * classes);
    row_loss_.reserve(dev_, n);
    row_correct_.reserve(dev_, n);
    dev_.launch(ops::SoftmaxCrossEntropy{logits, labels, dlogits_.data(), row_loss_.data(), row_correct_.data(), n,
                                         classes, static_cast<float>(1.0 / normaliser)});
    dev_.launch(ops::SumLossRows{row_loss_.data(), row_correct_.data(), metrics_.data(), n, normaliser});
  }

  D& dev_;
  Optimizer optimizer_;
  ParamArena& arena_;
  Buffer<float> values_, grads_, m_, v_;
  Buffer<ops::Metrics> metrics_;
  Buffer<ops::AdamScalars> scalars_;
  Buffer<std::uint64_t> step_;
  Buffer<float> lr_;
  Context<D> ctx_;
  Lowered<Model, D> lowered_;
  float lr_now_ = -1.0f;
  std::uint64_t step_host_ = 0;
  Buffer<float> dlogits_;
  Buffer<double> row_loss_;
  Buffer<std::int32_t> row_correct_;
};

}  // namespace xtrain::lowering
