#pragma once
/// \file sequential.hpp
/// Sequential container. `Sequential{Linear{784, 32}, BatchNorm1d{32}, ReLU{}, Linear{32, 10}}`
/// deduces `Sequential<Linear, BatchNorm1d, ReLU, Linear>`: module types in the type, sizes at run
/// time. Children are named by index as in PyTorch's nn.Sequential ("0.weight", "1.running_mean"),
/// or by name when wrapped in `named("ln_1", module)` (PyTorch's `nn.Sequential(OrderedDict(...))`).
/// Sequentials nest: `Sequential{Linear{8, 8}, Sequential{ReLU{}, Linear{8, 4}}}` names its
/// parameters "0.weight", "1.1.weight", ...

#include <array>
#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "xtrain/core/concepts.hpp"
#include "xtrain/core/context.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/tensor.hpp"
#include "xtrain/layers/fusion.hpp"

namespace xtrain::layers {

/// A child of a Sequential with a name instead of its index.
template <class M>
struct Named {
  std::string name;
  M module;
};

/// `named("attn", CausalSelfAttention{...})`: a Sequential child named "attn".
template <class M>
Named<M> named(std::string name, M module) {
  return {std::move(name), std::move(module)};
}

namespace detail {
template <class C>
struct Unnamed {
  using type = C;
};
template <class M>
struct Unnamed<Named<M>> {
  using type = M;
};
}  // namespace detail

/// The module type of a Sequential child (Named<M> -> M).
template <class C>
using unnamed_t = typename detail::Unnamed<C>::type;

template <class... Layers>
class Sequential {
  // In the class body, so it fires when the type is formed, with check_module's message first.
  static_assert((check_module<unnamed_t<Layers>>() && ...));
  static_assert(sizeof...(Layers) > 0, "xtrain: Sequential needs at least one module");
  static_assert(((HasForward<unnamed_t<Layers>> || !TokenModuleFor<unnamed_t<Layers>, float>)&&...),
                "xtrain: a module of token ids (Embedding, GPT) cannot be a child of Sequential: write the model as "
                "a module of its own that calls it with xtrain::forward_tokens<T> (as layers::GPT does)");
  static constexpr bool valid = (Module<unnamed_t<Layers>> && ...);
  static constexpr std::size_t count = sizeof...(Layers);

 public:
  explicit Sequential(Layers... layers) : layers_(std::move(layers)...) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { ((names_[I] = name_of<I>()), ...); }
    (std::index_sequence_for<Layers...>{});
  }

  /// Runs the modules in order, activations stored as T between them (float, or bf16/fp16 under
  /// MixedPrecision), a module taking a neighbour it can apply itself (layers/fusion.hpp). The
  /// returned reference lives in the last module that ran until its next forward. Offered only for
  /// the T every module supports, so that `ModuleFor<Sequential<...>, T>` tells whether the whole
  /// model can run with T activations.
  template <ActivationType T>
  requires(ModuleFor<unnamed_t<Layers>, T>&&...) const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    if constexpr (valid)
      return chain_.forward(ctx, modules(), x);
    else
      return x;
  }

  /// Runs the backward of the modules that ran, in reverse order (through xtrain::backward,
  /// which reports each module's parameters ready). The first produces dx only if
  /// `ctx.input_grad` (the engine clears it: nothing needs the gradient of the data).
  template <ActivationType T>
  requires(ModuleFor<unnamed_t<Layers>, T>&&...) const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    if constexpr (valid)
      return chain_.backward(ctx, modules(), dy);
    else
      return dy;
  }

  /// Reports the children, named by index or by their `named(...)` name.
  template <class V>
  void visit(V& v) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (v.child(names_[I], get<I>()), ...); }
    (std::index_sequence_for<Layers...>{});
  }

  /// The I-th module.
  template <std::size_t I>
  auto& get() noexcept {
    auto& c = std::get<I>(layers_);
    if constexpr (requires { c.module; })
      return c.module;
    else
      return c;
  }
  template <std::size_t I>
  const auto& get() const noexcept {
    return const_cast<Sequential*>(this)->get<I>();
  }
  static constexpr std::size_t size() noexcept { return count; }

  /// A PyTorch-like listing of the modules (nested ones indented).
  std::string describe() const {
    std::string s = "Sequential(\n";
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((s += "  (" + names_[I] + "): " + indent(describe_module(get<I>())) + "\n"), ...);
    }
    (std::index_sequence_for<Layers...>{});
    return s + ")";
  }

 private:
  template <std::size_t I>
  std::string name_of() const {
    if constexpr (requires { std::get<I>(layers_).name; })
      return std::get<I>(layers_).name;
    else
      return std::to_string(I);
  }

  template <class L>
  static std::string describe_module(const L& layer) {
    if constexpr (requires { layer.describe(); })
      return layer.describe();
    else
      return "(module)";
  }
  static std::string indent(std::string s) {
    for (std::size_t i = 0; (i = s.find('\n', i)) != std::string::npos; i += 3) s.insert(i + 1, "  ");
    return s;
  }

  // References to the modules (Named<M> -> M), in order.
  std::tuple<unnamed_t<Layers>&...> modules() noexcept {
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return std::tie(get<I>()...); }
    (std::index_sequence_for<Layers...>{});
  }

  std::tuple<Layers...> layers_;
  std::array<std::string, count> names_;
  fusion::Chain<count> chain_;
};

template <class... Layers>
Sequential(Layers...) -> Sequential<Layers...>;

}  // namespace xtrain::layers
