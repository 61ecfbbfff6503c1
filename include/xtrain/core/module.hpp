#pragma once
/// \file module.hpp
/// How a module shows what it owns, and what containers call on their children.
///
/// A module's `visit(v)` reports, in a fixed order:
///   - `v.param(name, Param&, kind)`  a trainable parameter (kind: weight, bias, norm, embedding);
///   - `v.buffer(name, Tensor<float>&, persistent)` or `v.buffer(name, std::int64_t&)`  state that
///     is not trained (BatchNorm's running statistics); non-persistent buffers are not saved;
///   - `v.child(name, module)`  a child module; names join with '.' as in PyTorch's state_dict
///     (`blocks.0.attn.qkv.weight`); an empty name makes the child transparent (its names are
///     the parent's, as Residual does);
///   - `v.id(ModuleId&)`  asks for this module's identity (the pre-order index of the module in
///     the model, given when the model is adopted: Dropout keys its random stream on it).
/// Visitors below: names (`visit_parameters`, `visit_buffers`), identities (`assign_module_ids`),
/// and readiness (`xtrain::backward`, which reports a module's own parameters once its backward
/// has added their gradients).

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "xtrain/core/context.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/param.hpp"
#include "xtrain/core/profiler.hpp"
#include "xtrain/core/tensor.hpp"

namespace xtrain {

/// A module's identity: its pre-order index in the adopted model (the root is 0).
struct ModuleId {
  std::uint32_t value = 0;
};

namespace detail {
/// Stands for any visitor a module's visit() is given (for the Module concept).
struct VisitorArchetype {
  void param(std::string_view, Param&, ParamKind = ParamKind::weight) {}
  void buffer(std::string_view, Tensor<float>&, bool = true) {}
  void buffer(std::string_view, std::int64_t&) {}
  template <class M>
  void child(std::string_view, M&) {}
  void id(ModuleId&) {}
};

inline std::string join_name(const std::string& prefix, std::string_view name) {
  if (name.empty()) return prefix;
  std::string s = prefix;
  if (!s.empty()) s += '.';
  s += name;
  return s;
}

/// Calls f(full_name, Param&, kind) for every parameter use, depth first in visit order.
template <class F>
struct ParamNamer {
  F& f;
  std::string prefix;
  void param(std::string_view name, Param& p, ParamKind kind = ParamKind::weight) {
    f(join_name(prefix, name), p, kind);
  }
  void buffer(std::string_view, Tensor<float>&, bool = true) {}
  void buffer(std::string_view, std::int64_t&) {}
  template <class M>
  void child(std::string_view name, M& m) {
    ParamNamer inner{f, join_name(prefix, name)};
    m.visit(inner);
  }
  void id(ModuleId&) {}
};

/// Calls f(full_name, buffer) for every buffer (persistent ones only unless `all`).
template <class F>
struct BufferNamer {
  F& f;
  std::string prefix;
  bool all = false;
  void param(std::string_view, Param&, ParamKind = ParamKind::weight) {}
  void buffer(std::string_view name, Tensor<float>& t, bool persistent = true) {
    if (persistent || all) f(join_name(prefix, name), t);
  }
  void buffer(std::string_view name, std::int64_t& v) { f(join_name(prefix, name), v); }
  template <class M>
  void child(std::string_view name, M& m) {
    BufferNamer inner{f, join_name(prefix, name), all};
    m.visit(inner);
  }
  void id(ModuleId&) {}
};

/// Calls f(full_name, unit) for every module that reports itself as a ZeRO-3 unit (its visit
/// calls `v.shard_unit(*this)` first: layers::ShardedUnit), in visit order, nested ones too.
template <class F>
struct UnitNamer {
  F& f;
  std::string prefix;
  void param(std::string_view, Param&, ParamKind = ParamKind::weight) {}
  void buffer(std::string_view, Tensor<float>&, bool = true) {}
  void buffer(std::string_view, std::int64_t&) {}
  template <class M>
  void child(std::string_view name, M& m) {
    UnitNamer inner{f, join_name(prefix, name)};
    m.visit(inner);
  }
  void id(ModuleId&) {}
  template <class U>
  void shard_unit(U& unit) {
    f(prefix, unit);
  }
};

/// Gives every module its pre-order index.
struct IdAssigner {
  std::uint32_t next = 1, current = 0;
  void param(std::string_view, Param&, ParamKind = ParamKind::weight) {}
  void buffer(std::string_view, Tensor<float>&, bool = true) {}
  void buffer(std::string_view, std::int64_t&) {}
  template <class M>
  void child(std::string_view, M& m) {
    const std::uint32_t saved = current;
    current = next++;
    m.visit(*this);
    current = saved;
  }
  void id(ModuleId& id) {
    XTRAIN_CHECK(current < (1u << 16), ValueError, "a module asking for its id is module ", current,
                 " of the model; ids above 65535 do not fit the random streams' key");
    id.value = current;
  }
};

/// Reports a module's OWN parameters (not its children's: they report when their own backward
/// ran) to ctx.grads_ready.
struct ReadyReporter {
  Context& ctx;
  void param(std::string_view, Param& p, ParamKind = ParamKind::weight) {
    ctx.grads_ready(ctx.grads_ready_user, p.slot());
  }
  void buffer(std::string_view, Tensor<float>&, bool = true) {}
  void buffer(std::string_view, std::int64_t&) {}
  template <class M>
  void child(std::string_view, M&) {}
  void id(ModuleId&) {}
};
}  // namespace detail

/// Calls f(name, Param&, ParamKind) for every parameter of module `m` with its state_dict name
/// (a tied parameter once per name).
template <class M, class F>
void visit_parameters(M& m, F&& f) {
  detail::ParamNamer<std::remove_reference_t<F>> v{f, {}};
  m.visit(v);
}

/// Calls f(name, Tensor<float>&) and f(name, std::int64_t&) for every buffer of module `m` with its
/// state_dict name: the persistent ones (what state_dict and checkpoints hold), or all.
template <class M, class F>
void visit_buffers(M& m, F&& f, bool include_non_persistent = false) {
  detail::BufferNamer<std::remove_reference_t<F>> v{f, {}, include_non_persistent};
  m.visit(v);
}

/// Calls f(name, unit) for every ZeRO-3 unit of module `m` (layers::ShardedUnit: unit.module() is
/// what it wraps), by its state_dict prefix, in layer order (nested units too).
template <class M, class F>
void visit_units(M& m, F&& f) {
  detail::UnitNamer<std::remove_reference_t<F>> v{f, {}};
  m.visit(v);
}

/// Gives every module of `model` its identity (pre-order index; the root is 0). Engines call it
/// when they adopt a model; ids depend only on the model's structure.
template <class M>
void assign_module_ids(M& model) {
  detail::IdAssigner v;
  model.visit(v);
}

/// Runs `module.forward(ctx, x)`: what containers call on a child (recorded by ctx.profiler), with
/// the memory resource of ctx's backend current (the module's buffers are the backend's).
template <class M, class X>
decltype(auto) forward(Context& ctx, M& module, const X& x) {
  const memory::Use use(ctx.memory);
  if (ctx.profiler && ctx.profiler->recording()) [[unlikely]] {
    const auto scope = ctx.profiler->module_scope(module, profile::Category::forward, x);
    return module.forward(ctx, x);
  }
  return module.forward(ctx, x);
}

/// Runs `module.forward<T>(ctx, ids)` for a module of token ids (an Embedding, a language model),
/// its output stored as T (recorded by ctx.profiler).
template <ActivationType T, class M>
const Tensor<T>& forward_tokens(Context& ctx, M& module, const Tensor<std::int32_t>& ids) {
  const memory::Use use(ctx.memory);
  if (ctx.profiler && ctx.profiler->recording()) [[unlikely]] {
    const auto scope = ctx.profiler->module_scope(module, profile::Category::forward, ids);
    return module.template forward<T>(ctx, ids);
  }
  return module.template forward<T>(ctx, ids);
}

/// Reports the own parameters of module `m` ready (their gradients final for this backward), as
/// xtrain::backward does after a backward: for a module whose gradient its owner added itself.
template <class M>
void report_gradients_ready(Context& ctx, M& m) {
  if (ctx.grads_ready) {
    detail::ReadyReporter r{ctx};
    m.visit(r);
  }
}

/// Runs `module.backward(ctx, dy)` (with the memory resource of ctx's backend current) and then
/// reports the module's own parameters ready: what
/// containers (and the engine, for the root) call on a child. A container that calls a child's
/// backward directly instead leaves that child's gradient buckets waiting (an error names the
/// parameter at the end of backward).
template <class M, class DY>
decltype(auto) backward(Context& ctx, M& module, const DY& dy) {
  const memory::Use use(ctx.memory);
  auto scope =
      ctx.profiler ? ctx.profiler->module_scope(module, profile::Category::backward, dy) : profile::Profiler::Scope{};
  decltype(auto) dx = module.backward(ctx, dy);
  report_gradients_ready(ctx, module);
  return dx;
}

}  // namespace xtrain
