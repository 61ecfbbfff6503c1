#pragma once
/// \file fusion.hpp
/// The one fusion protocol: a module may apply a neighbouring operation itself, saving that
/// operation's passes over memory, with the values of the separate modules bit for bit.
///  - A module that IS such an operation says which: `fusion::Op fusion_op() const` (ReLU: relu;
///    MaxPool2d: max_pool, or max_pool_2x2 for the 2 x 2 window of stride 2).
///  - A module that can apply its neighbours declares `fusion::Taken absorb(fusion::Offer)`, called
///    by its container right before its forward with the operations around it, and returning what
///    it will take: the operation just before it (taken for sure: the container does not run that
///    module) and at most how many of the (up to two) operations after it; and
///    `fusion::Taken absorbed() const`, what its last forward took (fewer after-operations when a
///    path cannot pool, say), which its backward undoes as well.
///  - An offer holds for one forward: a module called on its own (by you, or after it left its
///    container) applies nothing it was not offered.
/// Today: BatchNorm takes a ReLU after it; MaxPool2d takes a ReLU before it; Conv2d (fp32,
/// image_lanes) takes a 2 x 2 MaxPool2d after it, or a ReLU and then one.
///
/// fusion::Chain runs modules in sequence with the protocol resolved (Sequential's children,
/// BasicBlock's body): left to right, an operation already taken by the module before it is not
/// offered again; backward runs the modules that ran, in reverse.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "xtrain/core/context.hpp"
#include "xtrain/core/module.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain::fusion {

/// An operation a module is, as its neighbours see it.
enum class Op : std::uint8_t { none, relu, max_pool, max_pool_2x2 };

/// The operations around a module, offered for its next forward: the one just before it (not run
/// yet) and the (up to) two after it.
struct Offer {
  Op before = Op::none;
  std::array<Op, 2> after = {Op::none, Op::none};
};

/// What a module applies of its neighbours: the operation before it (0 or 1) and how many of the
/// operations after it (0 to 2).
struct Taken {
  std::uint8_t before = 0, after = 0;
};

/// A module that is an operation its neighbours may take.
template <class M>
concept Operation = requires(const M& m) {
  { m.fusion_op() } -> std::same_as<Op>;
};

/// A module that can take neighbouring operations.
template <class M>
concept Absorber = requires(M& m, const M& cm, Offer offer) {
  { m.absorb(offer) } -> std::same_as<Taken>;
  { cm.absorbed() } -> std::same_as<Taken>;
};

/// The operation `m` is (none for a module that is not one).
template <class M>
Op op_of(const M& m) noexcept {
  if constexpr (Operation<M>)
    return m.fusion_op();
  else
    return Op::none;
}

/// Runs N modules in sequence with fusion resolved, and their backward in reverse over the ones
/// that ran. The modules are given at each call as a tuple of references (std::tie), so the chain
/// holds no pointers to them.
template <std::size_t N>
class Chain {
 public:
  /// Runs the modules on x (through xtrain::forward), letting each take what is offered.
  template <class Modules, class T>
  const Tensor<T>& forward(Context& ctx, Modules&& modules, const Tensor<T>& x) {
    return forward_from<0>(ctx, modules, x, 0, false);
  }

  /// Runs the backward of the modules that ran in the last forward, last first (through
  /// xtrain::backward). The first of them produces dx only if ctx.input_grad (restored after).
  template <class Modules, class T>
  const Tensor<T>& backward(Context& ctx, Modules&& modules, const Tensor<T>& dy) {
    const bool want_input_grad = ctx.input_grad;
    std::size_t first = 0;
    while (first + 1 < N && !ran_[first]) ++first;
    const Tensor<T>& dx = backward_from<N - 1>(ctx, modules, dy, first, want_input_grad);
    ctx.input_grad = want_input_grad;
    return dx;
  }

  /// Whether module i ran in the last forward (false: a neighbour applied it).
  bool ran(std::size_t i) const noexcept { return ran_[i]; }

 private:
  template <std::size_t I, class Modules>
  using module_t = std::remove_cvref_t<std::tuple_element_t<I, std::remove_cvref_t<Modules>>>;

  // The operations module I is offered (`before`: the one of module I - 1 when not run yet).
  template <std::size_t I, class Modules>
  static Offer offer(Modules& m, Op before) {
    Offer o;
    o.before = before;
    if constexpr (I + 1 < N) o.after[0] = op_of(std::get<I + 1>(m));
    if constexpr (I + 2 < N) o.after[1] = op_of(std::get<I + 2>(m));
    return o;
  }

  // Runs modules I... on x; `skip`: modules the one before took; `planned`: module I already took
  // its offer (it took module I - 1). One call to the next level per level (a call graph of N
  // calls, not 2^N paths).
  template <std::size_t I, class Modules, class T>
  const Tensor<T>& forward_from(Context& ctx, Modules& m, const Tensor<T>& x, std::size_t skip, bool planned) {
    if constexpr (I == N) {
      return x;
    } else {
      using M = module_t<I, Modules>;
      auto& mod = std::get<I>(m);
      const Tensor<T>* y = &x;
      std::size_t next_skip = 0;
      bool next_planned = false;
      ran_[I] = false;
      // Skipped: applied by the module before it, or by the next one (unless this one already
      // promised to apply the module before it: then it runs).
      if (skip > 0) {
        next_skip = skip - 1;
      } else if (!planned && taken_by_next<I>(m)) {
        next_planned = true;
      } else {
        if constexpr (Absorber<M>)
          if (!planned) mod.absorb(offer<I>(m, Op::none));
        y = &xtrain::forward(ctx, mod, x);
        ran_[I] = true;
        if constexpr (Absorber<M>) next_skip = mod.absorbed().after;
      }
      return forward_from<I + 1>(ctx, m, *y, next_skip, next_planned);
    }
  }

  // Whether module I is an operation module I + 1 takes as its input (offering it).
  template <std::size_t I, class Modules>
  bool taken_by_next(Modules& m) {
    if constexpr (I + 1 < N) {
      if constexpr (Absorber<module_t<I + 1, Modules>>) {
        const Op op = op_of(std::get<I>(m));
        return op != Op::none && std::get<I + 1>(m).absorb(offer<I + 1>(m, op)).before;
      }
    }
    return false;
  }

  template <std::size_t I, class Modules, class T>
  const Tensor<T>& backward_from(Context& ctx, Modules& m, const Tensor<T>& dy, std::size_t first, bool want) {
    const Tensor<T>* dx = &dy;
    if (ran_[I]) {  // (else a neighbour applied it, and its backward covers it)
      ctx.input_grad = I == first ? want : true;
      dx = &xtrain::backward(ctx, std::get<I>(m), dy);
    }
    if constexpr (I == 0)
      return *dx;
    else
      return backward_from<I - 1>(ctx, m, *dx, first, want);
  }

  std::array<bool, N> ran_{};
};

}  // namespace xtrain::fusion
