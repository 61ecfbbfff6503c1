#pragma once
/// \file checkpointed.hpp
/// Checkpointed{m}: activation recomputation (PyTorch's `torch.utils.checkpoint.checkpoint(m, x,
/// use_reentrant=False)`). Forward runs m and keeps only its input (by address, as every module
/// does) and its output; the activations m saved for its backward are dropped. Backward runs m's
/// forward again on the same input, then m's backward. The gradients are bitwise those of m
/// unwrapped: the recomputation runs the same kernels on the same input, with the same dropout
/// masks (Dropout's masks are a function of the seed, the module, the step and the sample, not of
/// how often forward ran), and m's buffers (BatchNorm's running statistics) are restored after it,
/// so they are updated once per step as without recomputation.
///
/// Where the dropped activations go: m's buffers come from a memory::RecomputeMemory of its own
/// (core/recompute_memory.hpp), whose pages are moved, without a copy, to the next checkpointed
/// block after each call. N checkpointed blocks hold N outputs (after backward, N input gradients)
/// plus the activations of one block; blocks of the same sizes (a GPT's) pass the pages on without
/// page faults. The output is valid until backward (not until the next forward, as other modules'
/// outputs are): a model whose last module is a Checkpointed has its output read before backward.
///
/// Transparent: m's parameters, buffers and module identities are those of m unwrapped (a GPT's
/// `blocks.0.attn.qkv.weight` stays that), so a checkpoint or a safetensors export of a run with
/// recomputation loads into one without, and Dropout draws the same masks. `set_enabled(false)`
/// runs m as is. Costs one more forward of m per step.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xtrain/core/concepts.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/recompute_memory.hpp"
#include "xtrain/core/saved_input.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain::layers {

template <class M>
class Checkpointed {
  static_assert(check_module<M>());

 public:
  /// Wraps `module`; `enabled` false runs it as is (no recomputation).
  explicit Checkpointed(M module, bool enabled = true) : module_(std::move(module)), enabled_(enabled) {}
  /// A copy has memory of its own (a model's replicas never share pages).
  Checkpointed(const Checkpointed& other) : module_(other.module_), enabled_(other.enabled_) {}
  Checkpointed& operator=(const Checkpointed& other) {
    if (this != &other) {
      module_ = other.module_;
      enabled_ = other.enabled_;
    }
    return *this;
  }
  Checkpointed(Checkpointed&&) noexcept = default;
  Checkpointed& operator=(Checkpointed&&) noexcept = default;

  /// Runs m and drops its saved activations (keeps its input's address and its output).
  template <ActivationType T>
  requires ModuleFor<M, T>
  const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    if (!enabled_) return module_.forward(ctx, x);
    saved_.save(x);
    memory_->unpark();
    const Tensor<T>* y = nullptr;
    {
      const InMemory scope(ctx, *memory_);
      y = &module_.forward(ctx, x);
    }
    memory_->park({y->data(), nullptr});
    return *y;
  }

  /// Runs m's forward again on the saved input (m's buffers restored after it), then m's backward.
  template <ActivationType T>
  requires ModuleFor<M, T>
  const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    if (!enabled_) return module_.backward(ctx, dy);
    const Tensor<T>& x = saved_.get<T>(*this);
    memory_->unpark();
    const Tensor<T>* dx = nullptr;
    {
      const InMemory scope(ctx, *memory_);
      save_buffers();
      const bool input_grad = ctx.input_grad;
      module_.forward(ctx, x);
      ctx.input_grad = input_grad;
      restore_buffers();
      dx = &module_.backward(ctx, dy);
    }
    // The input gradient stays (the module before reads it); the output goes: the next module's
    // backward, its only reader, has run (a model whose last module is a Checkpointed: read the
    // output before backward, as the engine's loss and metrics do).
    memory_->park({dx->data(), nullptr});
    return *dx;
  }

  /// m's parameters, buffers and children, as m reports them (Checkpointed adds no name).
  template <class V>
  void visit(V& v) {
    module_.visit(v);
  }

  M& module() noexcept { return module_; }
  const M& module() const noexcept { return module_; }
  bool enabled() const noexcept { return enabled_; }
  /// Turns recomputation on or off (between steps). Turn it on before the model's first forward:
  /// buffers m made without it stay where they are (in the backend's memory), and nothing is saved.
  void set_enabled(bool on) {
    if (enabled_ && !on) memory_->unpark();  // m runs in its blocks again: pages under all of them
    enabled_ = on;
  }
  /// Bytes of m's buffers that are resident now (after forward: its output; after backward: its
  /// input gradient), of those recomputation manages.
  std::size_t resident_bytes() const { return memory_->resident_bytes(); }

  /// "Checkpointed(m)"; m's own description when recomputation is off.
  std::string describe() const {
    std::string inner = "(module)";
    if constexpr (requires { module_.describe(); }) inner = module_.describe();
    return enabled_ ? "Checkpointed(" + inner + ")" : inner;
  }

 private:
  // m's calls allocate from `memory` (ctx.memory and the thread's current resource), restored after.
  struct InMemory {
    InMemory(Context& c, memory::Resource& memory) : ctx(c), previous(c.memory), use(memory) { ctx.memory = &memory; }
    InMemory(const InMemory&) = delete;
    InMemory& operator=(const InMemory&) = delete;
    ~InMemory() { ctx.memory = previous; }
    Context& ctx;
    memory::Resource* previous;
    memory::Use use;
  };

  void save_buffers() {
    floats_.clear();
    counts_.clear();
    visit_buffers(
        module_,
        [this](const std::string&, auto& b) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(b)>, std::int64_t>)
            counts_.push_back(b);
          else
            floats_.insert(floats_.end(), b.begin(), b.end());
        },
        true);
  }
  void restore_buffers() {
    std::size_t f = 0, c = 0;
    visit_buffers(
        module_,
        [&](const std::string&, auto& b) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(b)>, std::int64_t>) {
            b = counts_[c++];
          } else {
            std::copy_n(floats_.data() + f, b.size(), b.begin());
            f += b.size();
          }
        },
        true);
  }

  M module_;
  bool enabled_ = true;
  std::shared_ptr<memory::RecomputeMemory> memory_ = std::make_shared<memory::RecomputeMemory>();
  SavedInput saved_;
  std::vector<float> floats_;  // m's buffers while it recomputes (capacity kept: no allocation once warm)
  std::vector<std::int64_t> counts_;
};

template <class M>
Checkpointed(M) -> Checkpointed<M>;
template <class M>
Checkpointed(M, bool) -> Checkpointed<M>;

}  // namespace xtrain::layers
