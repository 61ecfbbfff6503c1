#pragma once
/// \file concepts.hpp
/// The Layer and Optimizer contracts. `check_layer<L>()` / `check_optimizer<O>()` fail with one
/// readable message naming the missing member instead of a wall of template errors.

#include <concepts>
#include <cstdint>
#include <span>
#include <string>

#include "xtrain/core/context.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain {

namespace detail {
/// Stands for any callable passed to visit_params.
struct ParamVisitorArchetype {
  void operator()(const std::string&, Param&) const {}
};
/// Stands for any callable passed to visit_buffers.
struct BufferVisitorArchetype {
  void operator()(const std::string&, std::span<float>) const {}
  void operator()(const std::string&, std::int64_t&) const {}
};
}  // namespace detail

template <class L>
concept HasForward = requires(L& layer, Context& ctx, const Matrix& x) {
  { layer.forward(ctx, x) } -> std::convertible_to<const Matrix&>;
};
template <class L>
concept HasBackward = requires(L& layer, Context& ctx, const Matrix& dy) {
  { layer.backward(ctx, dy) } -> std::convertible_to<const Matrix&>;
};
template <class L>
concept HasVisitParams = requires(L& layer, const std::string& prefix) {
  layer.visit_params(prefix, detail::ParamVisitorArchetype{});
};
/// Optional: layers with state that is not trained (BatchNorm running statistics).
template <class L>
concept HasBuffers = requires(L& layer, const std::string& prefix) {
  layer.visit_buffers(prefix, detail::BufferVisitorArchetype{});
};

/// Layer: `forward(ctx, x) -> const Matrix&`, `backward(ctx, dy) -> const Matrix&` (ADDS into its
/// parameter gradients), `visit_params(prefix, f)`; optionally `visit_buffers(prefix, f)`.
template <class L>
concept Layer = HasForward<L> && HasBackward<L> && HasVisitParams<L>;

/// Fails compilation with a message naming the first missing Layer member.
template <class L>
consteval bool check_layer() {
  static_assert(HasForward<L>,
                "xtrain: this type is not a Layer: it has no member "
                "`const Matrix& forward(Context&, const Matrix&)`");
  static_assert(HasBackward<L>,
                "xtrain: this type is not a Layer: it has no member "
                "`const Matrix& backward(Context&, const Matrix& dy)`");
  static_assert(HasVisitParams<L>,
                "xtrain: this type is not a Layer: it has no member template "
                "`visit_params(const std::string& prefix, F&& f)` (call f(name, Param&) per parameter; "
                "an empty body for layers without parameters)");
  return Layer<L>;
}

/// A layer that runs with activations stored as T: for bf16/fp16, forward/backward taking and
/// returning `const Batch<T>&` exactly (a Matrix-only layer would otherwise seem to qualify:
/// xtensor converts a Batch<bf16> to a Matrix implicitly); for float, forward and backward.
template <class L, class T>
concept LayerFor = (std::same_as<T, float> && HasForward<L> && HasBackward<L>) ||
                   requires(L& layer, Context& ctx, const Batch<T>& x) {
  { layer.forward(ctx, x) } -> std::same_as<const Batch<T>&>;
  { layer.backward(ctx, x) } -> std::same_as<const Batch<T>&>;
};

/// Fails compilation with a readable message when a layer cannot run with T activations.
template <class L, class T>
consteval bool check_layer_for() {
  static_assert(LayerFor<L, T>,
                "xtrain: this layer cannot run under MixedPrecision: it needs `forward` and `backward` over "
                "Batch<T> for the policy's storage type (make them templates over xtrain::ActivationType T, as "
                "the built-in layers are)");
  return LayerFor<L, T>;
}

/// What an optimizer step needs besides parameters and gradients.
struct StepInfo {
  float lr = 0.0f;         ///< learning rate of this step (after the schedule)
  std::uint64_t step = 1;  ///< 1-based count of optimizer steps taken, this one included
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

/// Optimizer: nested `State`, `init(n) -> State`, const `step(params, grads, state, info)` over the
/// flat buffers, `learning_rate()` (the base learning rate).
template <class O>
concept Optimizer = HasOptimizerInit<O> && HasOptimizerStep<O> && HasLearningRate<O>;

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
  return Optimizer<O>;
}

}  // namespace xtrain
