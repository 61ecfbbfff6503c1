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
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((names_[I] = name_of<I>()), ...);
      (fuse<I>(), ...);
    }
    (std::index_sequence_for<Layers...>{});
  }

  /// Runs the modules in order, activations stored as T between them (float, or bf16/fp16 under
  /// MixedPrecision). The returned reference lives in the last module until its next forward.
  /// Offered only for the T every module supports, so that `ModuleFor<Sequential<...>, T>` tells
  /// whether the whole model can run with T activations.
  template <ActivationType T>
  requires(ModuleFor<unnamed_t<Layers>, T>&&...) const Tensor<T>& forward(Context& ctx, const Tensor<T>& x) {
    if constexpr (valid)
      return forward_from<0>(ctx, x);
    else
      return x;
  }

  /// Runs the modules' backward in reverse order (through xtrain::backward, which reports each
  /// module's parameters ready). The first module produces dx only if `ctx.input_grad` (the
  /// engine clears it: nothing needs the gradient of the data).
  template <ActivationType T>
  requires(ModuleFor<unnamed_t<Layers>, T>&&...) const Tensor<T>& backward(Context& ctx, const Tensor<T>& dy) {
    if constexpr (valid) {
      const bool want_input_grad = ctx.input_grad;
      const Tensor<T>& dx = backward_from<count - 1>(ctx, dy, want_input_grad);
      ctx.input_grad = want_input_grad;
      return dx;
    } else {
      return dy;
    }
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

  // Whether module I can apply the ReLU that module I + 1 is (a BatchNorm followed by a ReLU):
  // then the ReLU runs inside it (BatchNorm::fuse_relu), the same values with two passes over
  // memory fewer, and this container skips the ReLU whenever the BatchNorm says it applied it.
  template <std::size_t I>
  static constexpr bool fusable() {
    if constexpr (I + 1 < count)
      return requires(unnamed_t<std::tuple_element_t<I, std::tuple<Layers...>>> & m,
                      const unnamed_t<std::tuple_element_t<I + 1, std::tuple<Layers...>>>& next) {
        m.fuse_relu(true);
        { m.relu_applied() } -> std::convertible_to<bool>;
        { next.is_relu() } -> std::convertible_to<bool>;
      };
    else
      return false;
  }
  template <std::size_t I>
  void fuse() {
    if constexpr (fusable<I>()) get<I>().fuse_relu(get<I + 1>().is_relu());
  }

  // Whether module I can take the ReLU before it (MaxPool2d::relu_input): a ReLU followed by a
  // max pool then runs as the pool alone, which takes max(x, 0) of each value it reads and masks
  // its gradient, the same values, and this container skips the ReLU whenever the pool says it
  // did (relu_input_applied). A ReLU already fused into the module before it is not taken again.
  template <std::size_t I>
  static constexpr bool takes_relu() {
    if constexpr (I > 0 && I < count)
      return requires(unnamed_t<std::tuple_element_t<I, std::tuple<Layers...>>> & m,
                      const unnamed_t<std::tuple_element_t<I - 1, std::tuple<Layers...>>>& before) {
        m.relu_input(true);
        { m.relu_input_applied() } -> std::convertible_to<bool>;
        { before.is_relu() } -> std::convertible_to<bool>;
      };
    else
      return false;
  }

  // Whether module I (a Conv2d) can apply the 2 x 2 max pool of module I + D itself
  // (Conv2d::fuse_max_pool): D = 1, the pool right after it, or D = 2, after a ReLU at I + 1 that
  // it then applies too. This container then skips the modules it covered whenever
  // `pool_applied()` says it did.
  template <std::size_t I, std::size_t D>
  static constexpr bool pools() {
    if constexpr (I + D < count) {
      using M = unnamed_t<std::tuple_element_t<I, std::tuple<Layers...>>>;
      using P = unnamed_t<std::tuple_element_t<I + D, std::tuple<Layers...>>>;
      using R = unnamed_t<std::tuple_element_t<I + 1, std::tuple<Layers...>>>;
      return requires(M & m, const P& pool, const R& between) {
        m.fuse_max_pool(true, true);
        { m.pool_applied() } -> std::convertible_to<bool>;
        { pool.window_2x2() } -> std::convertible_to<bool>;
        requires D == 1 || requires {
          { between.is_relu() } -> std::convertible_to<bool>;
        };
      };
    } else {
      return false;
    }
  }
  // Decides module I's pooling for this forward (the modules after it may have been replaced).
  template <std::size_t I>
  void fuse_pool() {
    if constexpr (pools<I, 1>())
      get<I>().fuse_max_pool(get<I + 1>().window_2x2(), false);
    else if constexpr (pools<I, 2>())
      get<I>().fuse_max_pool(get<I + 1>().is_relu() && get<I + 2>().window_2x2(), true);
  }

  // Runs modules I... on x; `relu_pending`: module I - 1 is a ReLU that module I takes.
  template <std::size_t I, class T>
  const Tensor<T>& forward_from(Context& ctx, const Tensor<T>& x, bool relu_pending = false) {
    if constexpr (I == count) {
      return x;
    } else {
      fuse<I>();  // decided at each forward: the next module may have been replaced since
      fuse_pool<I>();
      if constexpr (takes_relu<I>()) get<I>().relu_input(relu_pending);
      if constexpr (takes_relu<I + 1>())
        if (get<I>().is_relu()) return forward_from<I + 1>(ctx, x, true);  // ReLU I: taken by module I + 1
      const Tensor<T>& y = xtrain::forward(ctx, get<I>(), x);
      if constexpr (fusable<I>())
        if (get<I>().relu_applied()) return forward_from<I + 2>(ctx, y);
      if constexpr (pools<I, 1>()) {
        if (get<I>().pool_applied()) return forward_from<I + 2>(ctx, y);  // MaxPool2d I + 1: applied
      } else if constexpr (pools<I, 2>()) {
        if (get<I>().pool_applied()) return forward_from<I + 3>(ctx, y);  // ReLU and MaxPool2d: applied
      }
      return forward_from<I + 1>(ctx, y);
    }
  }

  template <std::size_t I, class T>
  const Tensor<T>& backward_from(Context& ctx, const Tensor<T>& dy, bool want_input_grad) {
    // Module I applied by the Conv2d before it (fuse_max_pool): the pool (or the ReLU) at I - 1's
    // I + 1, the pool after a ReLU at I - 2's I + 2.
    if constexpr (I >= 1) {
      if constexpr (pools<I - 1, 1>() || pools<I - 1, 2>())
        if (get<I - 1>().pool_applied()) return backward_from<I - 1>(ctx, dy, want_input_grad);
    }
    if constexpr (I >= 2) {
      if constexpr (pools<I - 2, 2>() && !pools<I - 2, 1>())  // as fuse_pool decides
        if (get<I - 2>().pool_applied()) return backward_from<I - 2>(ctx, dy, want_input_grad);
    }
    if constexpr (I > 0) {
      if constexpr (fusable<I - 1>())
        if (get<I - 1>().relu_applied()) return backward_from<I - 1>(ctx, dy, want_input_grad);  // ReLU I: fused
    }
    if constexpr (takes_relu<I + 1>())
      if (get<I + 1>().relu_input_applied()) {  // ReLU I: applied by module I + 1
        if constexpr (I == 0)
          return dy;
        else
          return backward_from<I - 1>(ctx, dy, want_input_grad);
      }
    ctx.input_grad = I == 0 ? want_input_grad : true;
    const Tensor<T>& dx = xtrain::backward(ctx, get<I>(), dy);
    if constexpr (I == 0)
      return dx;
    else
      return backward_from<I - 1>(ctx, dx, want_input_grad);
  }

  std::tuple<Layers...> layers_;
  std::array<std::string, count> names_;
};

template <class... Layers>
Sequential(Layers...) -> Sequential<Layers...>;

}  // namespace xtrain::layers
