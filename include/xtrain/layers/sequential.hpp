#pragma once
/// \file sequential.hpp
/// Sequential container. `Sequential{Linear{784, 32}, BatchNorm1d{32}, ReLU{}, Linear{32, 10}}`
/// deduces `Sequential<Linear, BatchNorm1d, ReLU, Linear>`: layer types in the type, sizes at run
/// time. Parameters are named as PyTorch's nn.Sequential state_dict ("0.weight", "1.running_mean").

#include <cstddef>
#include <string>
#include <tuple>
#include <utility>

#include "xtrain/core/concepts.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain::layers {

template <class... Layers>
class Sequential {
  // In the class body, so it fires when the type is formed, with check_layer's message first.
  static_assert((check_layer<Layers>() && ...));
  static_assert(sizeof...(Layers) > 0, "xtrain: Sequential needs at least one layer");
  static constexpr bool valid = (Layer<Layers> && ...);

 public:
  explicit Sequential(Layers... layers) : layers_(std::move(layers)...) {}

  /// Runs the layers in order, activations stored as T between them (float, or bf16/fp16 under
  /// MixedPrecision). The returned reference lives in the last layer until its next forward.
  /// Offered only for the T every layer supports, so that `LayerFor<Sequential<...>, T>` tells
  /// whether the whole model can run with T activations.
  template <ActivationType T>
  requires(LayerFor<Layers, T>&&...) const Batch<T>& forward(Context& ctx, const Batch<T>& x) {
    if constexpr (valid)
      return forward_from<0>(ctx, x);
    else
      return x;
  }

  /// Runs the layers' backward in reverse order. Layer 0 produces dx only if `ctx.input_grad`
  /// (the Trainer clears it: nothing needs the gradient of the data). After each layer,
  /// `ctx.grads_ready` (if set) is told that layer's parameter gradients are final.
  template <ActivationType T>
  requires(LayerFor<Layers, T>&&...) const Batch<T>& backward(Context& ctx, const Batch<T>& dy) {
    if constexpr (valid) {
      const bool want_input_grad = ctx.input_grad;
      const Batch<T>& dx = backward_from<sizeof...(Layers) - 1>(ctx, dy, want_input_grad);
      ctx.input_grad = want_input_grad;
      return dx;
    } else {
      return dy;
    }
  }

  /// Calls f(name, Param&) for every parameter, layer by layer, names prefixed by the layer index.
  template <class F>
  void visit_params(const std::string& prefix, F&& f) {
    visit_each([&]<std::size_t I>(auto& layer) { layer.visit_params(prefix + std::to_string(I) + ".", f); });
  }

  /// Calls f(name, span<float>) / f(name, int64_t&) for every buffer of the layers that have some.
  template <class F>
  void visit_buffers(const std::string& prefix, F&& f) {
    visit_each([&]<std::size_t I>(auto& layer) {
      if constexpr (HasBuffers<std::remove_cvref_t<decltype(layer)>>)
        layer.visit_buffers(prefix + std::to_string(I) + ".", f);
    });
  }

  /// The I-th layer.
  template <std::size_t I>
  auto& get() noexcept {
    return std::get<I>(layers_);
  }
  static constexpr std::size_t size() noexcept { return sizeof...(Layers); }

  /// A PyTorch-like listing of the layers.
  std::string describe() const {
    std::string s = "Sequential(\n";
    std::size_t i = 0;
    std::apply(
        [&](const auto&... layer) { ((s += "  (" + std::to_string(i++) + "): " + describe_layer(layer) + "\n"), ...); },
        layers_);
    return s + ")";
  }

 private:
  template <class L>
  static std::string describe_layer(const L& layer) {
    if constexpr (requires { layer.describe(); })
      return layer.describe();
    else
      return "(layer)";
  }

  template <class F>
  void visit_each(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f.template operator()<I>(std::get<I>(layers_)), ...);
    }
    (std::index_sequence_for<Layers...>{});
  }

  template <std::size_t I, class T>
  const Batch<T>& forward_from(Context& ctx, const Batch<T>& x) {
    if constexpr (I == sizeof...(Layers)) {
      return x;
    } else {
      ctx.layer = I;
      const Batch<T>& y = std::get<I>(layers_).forward(ctx, x);
      return forward_from<I + 1>(ctx, y);
    }
  }

  template <std::size_t I, class T>
  const Batch<T>& backward_from(Context& ctx, const Batch<T>& dy, bool want_input_grad) {
    ctx.layer = I;
    ctx.input_grad = I == 0 ? want_input_grad : true;
    const Batch<T>& dx = std::get<I>(layers_).backward(ctx, dy);
    if (ctx.grads_ready) ctx.grads_ready(ctx.grads_ready_user, I);
    if constexpr (I == 0)
      return dx;
    else
      return backward_from<I - 1>(ctx, dx, want_input_grad);
  }

  std::tuple<Layers...> layers_;
};

template <class... Layers>
Sequential(Layers...) -> Sequential<Layers...>;

}  // namespace xtrain::layers
