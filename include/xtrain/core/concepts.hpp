#pragma once
/// \file concepts.hpp
/// The Module and Optimizer contracts. `check_module<L>()` / `check_optimizer<O>()` fail with one
/// readable message naming the missing member instead of a wall of template errors.

#include <concepts>
#include <cstdint>
#include <span>
#include <string>

#include "xtrain/core/context.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain {

template <class L>
concept HasForward = requires(L& layer, Context& ctx, const Tensor<float>& x) {
  { layer.forward(ctx, x) } -> std::convertible_to<const Tensor<float>&>;
};
template <class L>
concept HasBackward = requires(L& layer, Context& ctx, const Tensor<float>& dy) {
  { layer.backward(ctx, dy) } -> std::convertible_to<const Tensor<float>&>;
};
/// A model whose input is token ids (`Tensor<std::int32_t>`, a language model's first layer is an
/// Embedding): the activation type of its output cannot be deduced from the input, so forward is
/// called as `m.template forward<T>(ctx, ids)`.
template <class L, class T>
concept TokenModuleFor = requires(L& layer, Context& ctx, const Tensor<std::int32_t>& ids, const Tensor<T>& dy) {
  { layer.template forward<T>(ctx, ids) } -> std::same_as<const Tensor<T>&>;
  { layer.backward(ctx, dy) } -> std::same_as<const Tensor<T>&>;
};
template <class L>
concept HasVisit = requires(L& layer, detail::VisitorArchetype& v) {
  layer.visit(v);
};

/// Module: `forward(ctx, x) -> const Tensor<float>&`, `backward(ctx, dy) -> const Tensor<float>&`
/// (ADDS into its parameter gradients), `visit(v)` (parameters, buffers, children, identity: see
/// core/module.hpp). A model of token ids has `forward<T>(ctx, ids)` instead (TokenModuleFor).
template <class L>
concept Module = (HasForward<L> || TokenModuleFor<L, float>)&&HasBackward<L>&& HasVisit<L>;

/// Fails compilation with a message naming the first missing Module member.
template <class L>
consteval bool check_module() {
  static_assert(HasForward<L> || TokenModuleFor<L, float>,
                "xtrain: this type is not a Module: it has no member "
                "`const Tensor<float>& forward(Context&, const Tensor<float>&)` (nor, for a model of token ids, "
                "`template <ActivationType T> const Tensor<T>& forward(Context&, const Tensor<std::int32_t>&)`)");
  static_assert(HasBackward<L>,
                "xtrain: this type is not a Module: it has no member "
                "`const Tensor<float>& backward(Context&, const Tensor<float>& dy)`");
  static_assert(HasVisit<L>,
                "xtrain: this type is not a Module: it has no member template `visit(V& v)` (report "
                "v.param(name, Param&), v.buffer(...), v.child(name, module); an empty body for modules "
                "without any)");
  return Module<L>;
}

/// A module that runs with activations stored as T: for bf16/fp16, forward/backward taking and
/// returning `const Tensor<T>&` exactly; for float, forward and backward.
template <class L, class T>
concept ModuleFor = (std::same_as<T, float> && HasForward<L> && HasBackward<L>) ||
                    requires(L& layer, Context& ctx, const Tensor<T>& x) {
  { layer.forward(ctx, x) } -> std::same_as<const Tensor<T>&>;
  { layer.backward(ctx, x) } -> std::same_as<const Tensor<T>&>;
};

/// What an engine can train with T activations: a ModuleFor<M, T>, or a model of token ids
/// (TokenModuleFor<M, T>). Containers take ModuleFor children only: a model of token ids is the
/// root (GPT), which calls its embeddings itself.
template <class M, class T>
concept ModelFor = ModuleFor<M, T> || TokenModuleFor<M, T>;

/// Fails compilation with a readable message when a model cannot run with T activations.
template <class L, class T>
consteval bool check_module_for() {
  static_assert(ModelFor<L, T>,
                "xtrain: this module cannot run under MixedPrecision: it needs `forward` and `backward` over "
                "Tensor<T> for the policy's storage type (make them templates over xtrain::ActivationType T, as "
                "the built-in modules are)");
  return ModelFor<L, T>;
}

/// What an optimizer step needs besides parameters and gradients.
struct StepInfo {
  float lr = 0.0f;                  ///< learning rate of this step (after the schedule)
  std::uint64_t step = 1;           ///< 1-based count of optimizer steps taken, this one included
  std::size_t state_offset = 0;     ///< index of params[0] in the optimizer state's flat vectors
  float weight_decay_scale = 1.0f;  ///< multiplies the optimizer's weight decay (parameter groups)
};

template <class O>
concept HasOptimizerState = requires {
  typename O::State;
};
template <class O>
concept HasOptimizerInit = HasOptimizerState<O> && requires(const O& opt, std::size_t n) {
  { opt.init(n) } -> std::same_as<typename O::State>;
};
template <class O>
concept HasOptimizerStep = HasOptimizerState<O> &&
    requires(const O& opt, std::span<float> p, std::span<const float> g, typename O::State& s, const StepInfo& info) {
  opt.step(p, g, s, info);
};
template <class O>
concept HasLearningRate = requires(const O& opt) {
  { opt.learning_rate() } -> std::convertible_to<float>;
};
template <class O>
concept HasOptimizerName = requires {
  { O::name } -> std::convertible_to<const char*>;
};
namespace detail {
/// Stands for what visit_state is given: a callable on each state vector.
struct StateVectorArchetype {
  void operator()(AlignedVector&) const {}
  void operator()(ByteVector&) const {}
};
/// Stands for the Boost archive a State is saved to and loaded from (for the Optimizer concept).
struct ArchiveArchetype {
  template <class T>
  ArchiveArchetype& operator&(T&) {
    return *this;
  }
  template <class T>
  ArchiveArchetype& operator<<(const T&) {
    return *this;
  }
  template <class T>
  ArchiveArchetype& operator>>(T&) {
    return *this;
  }
};
}  // namespace detail
template <class O>
concept HasStateVisit = HasOptimizerState<O> && requires(typename O::State& s, detail::StateVectorArchetype f) {
  O::visit_state(s, f);
};
template <class O>
concept HasSerializableState = HasOptimizerState<O> && std::default_initializable<typename O::State> &&
    std::copyable<typename O::State> &&(
        requires(typename O::State& s, detail::ArchiveArchetype& ar) { s.serialize(ar, 0u); } ||
        requires(typename O::State & s, detail::ArchiveArchetype& ar) { serialize(ar, s, 0u); });

/// Optimizer: a static `name` (checkpoints record it), a nested `State` (default-constructible,
/// copyable, serializable with Boost: `template <class Ar> void serialize(Ar&, unsigned)`), a
/// static `visit_state(State&, f)` calling f on each of its state vectors, AlignedVector or
/// ByteVector (the sharded step and checkpoints split and gather the state through it: a vector
/// of the whole state is the ranks' vectors one after the other), `init(n) -> State` for n
/// elements, const `step(params, grads, state, info)` over a range of the flat buffers, and
/// `learning_rate()` (the base learning rate). `step` must be element-wise: the engine calls it
/// on sub-ranges (state at `info.state_offset`), concurrently on several threads with
/// backend::CpuThreads; an update that needs a norm over a tensor (LAMB, LARS) does not fit. An
/// optimizer whose state is quantized per block of the arena steps whole blocks instead
/// (optim::BlockOptimizer, optim/param_groups.hpp: Adam8bit).
template <class O>
concept Optimizer = HasOptimizerName<O> && HasOptimizerInit<O> && HasOptimizerStep<O> && HasLearningRate<O> &&
    HasSerializableState<O> && HasStateVisit<O>;

/// Fails compilation with a message naming the first missing Optimizer member.
template <class O>
consteval bool check_optimizer() {
  static_assert(HasOptimizerState<O>, "xtrain: this type is not an Optimizer: it has no nested type `State`");
  static_assert(HasOptimizerInit<O>,
                "xtrain: this type is not an Optimizer: it has no const member `State init(std::size_t n) const`");
  static_assert(HasOptimizerStep<O>,
                "xtrain: this type is not an Optimizer: it has no const member "
                "`step(std::span<float> params, std::span<const float> grads, State&, const StepInfo&) const`");
  static_assert(HasLearningRate<O>,
                "xtrain: this type is not an Optimizer: it has no member `float learning_rate() const`");
  static_assert(HasOptimizerName<O>,
                "xtrain: this type is not an Optimizer: it has no `static constexpr const char* name` (checkpoints "
                "record it)");
  static_assert(HasSerializableState<O>,
                "xtrain: this type is not an Optimizer: its State is not default-constructible, copyable and "
                "serializable (`template <class Archive> void serialize(Archive& ar, unsigned) { ar& v; ... }`)");
  static_assert(HasStateVisit<O>,
                "xtrain: this type is not an Optimizer: it has no `template <class F> static void "
                "visit_state(State&, F&& f)` calling f(AlignedVector&) on each per-element state vector (the "
                "sharded step and checkpoints split and gather the state through it)");
  return Optimizer<O>;
}

}  // namespace xtrain
