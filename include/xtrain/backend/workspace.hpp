#pragma once
/// \file workspace.hpp
/// Scratch memory of one thread of a backend: the GEMMs' packed panels, the fp32 accumulators of
/// low-precision layers, the fp32 copies a layer widens a 16-bit activation into. Each slot grows
/// to the largest size asked of it and is reused, so a training step allocates nothing once warm.
/// The backend owns one workspace per part of a loop (backend::Executor::workspace), allocated from its
/// memory resource, where kernels once kept thread_local buffers.

#include <array>
#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>

#include "xtrain/core/memory.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain::backend {

class Workspace {
 public:
  /// The raw buffers, one per use that may be live at the same time on a thread.
  enum class Slot : unsigned {
    pack_b,      ///< an fp32 GEMM's packed block of op(B)
    pack_a,      ///< an fp32 GEMM's packed block of op(A)
    words_b,     ///< a bf16 GEMM's packed block of op(B) (pairs of bf16 as 32-bit words)
    words_a,     ///< a bf16 GEMM's packed block of op(A)
    accumulate,  ///< fp32 accumulator of a low-precision product (kernels::gemm_into), or LayerNorm's widened rows
    planes,      ///< a direct convolution's framed fp32 planes (kernels/conv_direct.hpp)
    count
  };

  /// Buffers from `resource` (host memory by default). Requires a resource (not null).
  explicit Workspace(std::shared_ptr<memory::Resource> resource = memory::host().shared_from_this())
      : resource_(std::move(resource)) {
    XTRAIN_CHECK(resource_ != nullptr, ValueError, "backend::Workspace: the memory resource is null");
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() {
    for (Block& b : blocks_) release(b);
  }

  /// At least `n` elements of T in `slot`, 64-byte aligned. The contents are unspecified; the
  /// pointer stays valid until `slot` is asked for more.
  template <class T>
  T* get(Slot slot, std::size_t n) {
    static_assert(std::is_trivial_v<T> && alignof(T) <= memory::Resource::alignment);
    Block& b = blocks_[static_cast<unsigned>(slot)];
    const std::size_t bytes = n * sizeof(T);
    if (b.bytes < bytes) {
      release(b);
      b.data = resource_->allocate(bytes);
      b.bytes = bytes;
    }
    return static_cast<T*>(b.data);
  }

  /// fp32 tensor 0 or 1 of `shape` (from this workspace's resource; contents unspecified): what
  /// a layer widens a 16-bit input and output into (BatchNorm).
  Tensor<float>& tensor(std::size_t i, const Shape& shape) {
    const memory::Use use(*resource_);
    tensors_[i].resize(shape);
    return tensors_[i];
  }

  /// Bytes held in the raw slots.
  std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for (const Block& b : blocks_) n += b.bytes;
    return n;
  }
  memory::Resource& resource() const noexcept { return *resource_; }

 private:
  struct Block {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  void release(Block& b) noexcept {
    if (b.data) resource_->deallocate(b.data, b.bytes);
    b = {};
  }

  std::shared_ptr<memory::Resource> resource_;
  std::array<Block, static_cast<unsigned>(Slot::count)> blocks_{};
  std::array<Tensor<float>, 2> tensors_;
};

}  // namespace xtrain::backend
