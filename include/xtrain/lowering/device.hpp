#pragma once
/// \file device.hpp
/// What lowered models are written against: the Device policy, the lowering Context, the
/// primary template `lowering::Lowered<L, D>` (a layer type's device implementation).
///
/// Models are lowered onto a device one layer type at a time: `Lowered<L, D>` is the device
/// implementation of layer type L (chosen at compile time), written once against a Device
/// policy D:
///  - `lowering::HostDevice` (here): host memory, each kernel body run as a loop, the CPU's GEMM.
///    What the tests run on every machine: the whole lowered step, checked against the CPU
///    layers and Engine, GPU or not;
///  - `cuda::CudaDevice` (train/cuda_program.hpp, nvcc only): device memory, the bodies launched on
///    the stream, cuBLASLt.
/// A Device provides Buffer<T> (made with (D&, n); reserve(D&, n) keeps memory that is large
/// enough: a warm step allocates nothing), launch(body), gemm(RowMajorGemm, a, b, c, alpha, beta,
/// bias) with float, bf16 or fp16 operands (fp32 accumulation and output), zero / upload / download /
/// set_scalar / synchronize, and allocations().
///
/// The layers keep their CPU implementations untouched; a lowered layer binds to their
/// parameters (through the host ParamArena's offsets) and settings.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>

#include "xtrain/core/param.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/kernels/device_ops.hpp"
#include "xtrain/kernels/gemm.hpp"
#include "xtrain/kernels/gemm_lowp.hpp"

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
  /// bf16 or fp16 operands, fp32 accumulation (MixedPrecision): the CPU's mixed-precision GEMM.
  template <class T>
  requires(std::is_same_v<T, bf16> || std::is_same_v<T, fp16>) void gemm(const ops::RowMajorGemm& g, const T* a,
                                                                         const T* b, float* c, float alpha, float beta,
                                                                         const float* bias = nullptr) {
    using kernels::Trans;
    kernels::gemm_lowp<T>(g.trans_a ? Trans::yes : Trans::no, g.trans_b ? Trans::yes : Trans::no, g.m, g.n, g.k, alpha,
                          a, g.lda, b, g.ldb, beta, c, g.ldc, nullptr, bias);
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
  template <class T>
  void set_scalar(T* device, T value) {
    *device = value;
  }
  void synchronize() {}
  std::uint64_t allocations() const noexcept { return allocations_; }

 private:
  std::uint64_t allocations_ = 0;
};

/// The shape of one sample of a batch of shape `batch` (its first dimension dropped).
inline Shape sample_shape(const Shape& batch) {
  return batch.rank() ? Shape(std::span<const std::size_t>(batch.begin() + 1, batch.end())) : Shape{};
}

/// What the products of Linear and Conv2d take: fp32 operands (FullPrecision), or operands
/// rounded to bf16 or fp16 with fp32 accumulation (MixedPrecision<bf16> or <fp16>; tensor cores).
enum class Products { fp32, bf16, fp16 };

/// The Products of precision policy P.
template <class P>
constexpr Products products_of() noexcept {
  using T = typename P::compute_type;
  return std::is_same_v<T, bf16> ? Products::bf16 : std::is_same_v<T, fp16> ? Products::fp16 : Products::fp32;
}

/// A product's operand rounded to bf16 or fp16 (one of the two set), or none (both null).
struct LowpOperand {
  const bf16* b = nullptr;
  const fp16* h = nullptr;
  explicit operator bool() const noexcept { return b || h; }
  LowpOperand plus(std::ptrdiff_t i) const noexcept { return {b ? b + i : nullptr, h ? h + i : nullptr}; }
};

/// An fp32 array's copy rounded to the products' type (a layer's input or output gradient).
template <class D>
class LowpCopy {
 public:
  /// x [n] rounded into this copy (bf16 or fp16, as `kind`); returns it.
  LowpOperand round(D& dev, const float* x, std::size_t n, Products kind) {
    if (kind == Products::bf16) {
      b_.reserve(dev, n);
      dev.launch(ops::ToBf16{x, b_.data(), n});
      return {b_.data(), nullptr};
    }
    h_.reserve(dev, n);
    dev.launch(ops::ToFp16{x, h_.data(), n});
    return {nullptr, h_.data()};
  }

 private:
  typename D::template Buffer<bf16> b_;
  typename D::template Buffer<fp16> h_;
};

/// c = alpha op(a) op(b) + beta c (+ bias) on operands of the same low-precision type.
template <class D>
void gemm(D& dev, const ops::RowMajorGemm& g, LowpOperand a, LowpOperand b, float* c, float alpha, float beta,
          const float* bias = nullptr) {
  if (a.b)
    dev.gemm(g, a.b, b.b, c, alpha, beta, bias);
  else
    dev.gemm(g, a.h, b.h, c, alpha, beta, bias);
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
  const std::uint64_t* step = nullptr;  // on the device: the optimizer steps applied (Dropout's stream)
  /// Under MixedPrecision: the parameters rounded to bf16 or fp16 (same offsets), the operands
  /// of the products; else none (fp32 products).
  LowpOperand lowp_values{};
  /// On the device: the samples of the accumulation window before this micro-batch (Dropout's
  /// element positions; 0 without accumulation).
  const std::uint64_t* sample_offset = nullptr;
  /// On the device under fp16: the loss scale's state (its skipped steps, which `step` leaves out).
  const ops::LossScaleState* loss_scale = nullptr;
  float* value(const Param& p) const { return values + (p.data() - host_base); }
  float* grad(const Param& p) const { return grads + (p.data() - host_base); }
  LowpOperand lowp_value(const Param& p) const { return lowp_values.plus(p.data() - host_base); }
  /// The products' type.
  Products products() const noexcept {
    return lowp_values.b ? Products::bf16 : lowp_values.h ? Products::fp16 : Products::fp32;
  }
};

template <class>
inline constexpr bool no_lowering = false;

/// The device implementation of layer type L (specialised in lowering/dense.hpp, conv.hpp,
/// batch_norm.hpp and composite.hpp). Each has:
///   Lowered(L&, Context<D>&);  Shape out_shape(const Shape& in)   (sample shapes, no batch)
///   const float* forward(Context<D>&, const float* x, std::size_t n, const Shape& in)
///   const float* backward(Context<D>&, const float* dy, bool need_dx)   (adds into the gradients)
///   void upload(Context<D>&) / download(Context<D>&): buffers that are not parameters.
template <class L, class D>
class Lowered {
  static_assert(no_lowering<L>,
                "xtrain: backend::Cuda has no device implementation of this layer yet (lowered so far: Sequential, "
                "Residual, BasicBlock, Linear, Conv2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, BatchNorm1d, "
                "BatchNorm2d, LayerNorm, CausalSelfAttention, the activations, Dropout, Flatten)");
};

/// Whether lowered layer L has no parameters (it declares `static constexpr bool parameter_free`
/// true): a chain whose layers before L are all parameter-free does not need L's input gradient.
template <class L>
inline constexpr bool parameter_free = [] {
  if constexpr (requires { L::parameter_free; })
    return L::parameter_free;
  else
    return false;
}();

}  // namespace xtrain::lowering
