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
/// bias) with float or bf16 operands (fp32 accumulation and output), zero / upload / download / set_scalar /
/// synchronize, and allocations().
///
/// The layers keep their CPU implementations untouched; a lowered layer binds to their
/// parameters (through the host ParamArena's offsets) and settings.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

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
  /// bf16 operands, fp32 accumulation (MixedPrecision<bf16>): the CPU's mixed-precision GEMM.
  void gemm(const ops::RowMajorGemm& g, const bf16* a, const bf16* b, float* c, float alpha, float beta,
            const float* bias = nullptr) {
    using kernels::Trans;
    kernels::gemm_lowp<bf16>(g.trans_a ? Trans::yes : Trans::no, g.trans_b ? Trans::yes : Trans::no, g.m, g.n, g.k,
                             alpha, a, g.lda, b, g.ldb, beta, c, g.ldc, nullptr, bias);
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
  /// Under MixedPrecision<bf16>: the parameters rounded to bf16 (same offsets), the operands of
  /// the products; else null (fp32 products).
  const bf16* lowp_values = nullptr;
  /// On the device: the samples of the accumulation window before this micro-batch (Dropout's
  /// element positions; 0 without accumulation).
  const std::uint64_t* sample_offset = nullptr;
  float* value(const Param& p) const { return values + (p.data() - host_base); }
  float* grad(const Param& p) const { return grads + (p.data() - host_base); }
  const bf16* lowp_value(const Param& p) const { return lowp_values ? lowp_values + (p.data() - host_base) : nullptr; }
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
                "BatchNorm2d, the activations, Dropout, Flatten)");
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
