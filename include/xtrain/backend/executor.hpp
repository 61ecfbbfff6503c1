#pragma once
/// \file executor.hpp
/// How a backend runs the loops of kernels and where their buffers live: `Executor` (type-erased,
/// so layers and kernels are not templates on the backend), with its memory resource and a
/// workspace per part of a loop, and `parallel_for`, which splits a range into parts at fixed boundaries.
/// A null executor, or one of one thread, runs everything on the calling thread.
///
/// Determinism: a part computes outputs that no other part touches, and every output is computed
/// by the same instructions in the same order whatever the split (parts are aligned to the SIMD
/// width and to the kernels' register tiles). Sums over a split dimension are never combined from
/// parts. So results are bitwise the same on any number of threads.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "xtrain/backend/workspace.hpp"
#include "xtrain/core/memory.hpp"

namespace xtrain::backend {

/// A non-owning reference to a callable `void(std::size_t part)`.
class PartFunction {
 public:
  // Implicit, a view of f for the duration of a call (as function_ref); never a copy constructor.
  template <class F>
  // NOLINTNEXTLINE(google-explicit-constructor,bugprone-forwarding-reference-overload)
  requires(!std::is_same_v<std::remove_cvref_t<F>, PartFunction>) PartFunction(F&& f)
  noexcept
      : object_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, std::size_t part) { (*static_cast<std::remove_reference_t<F>*>(o))(part); }) {}
  void operator()(std::size_t part) const { call_(object_, part); }

 private:
  void* object_;
  void (*call_)(void*, std::size_t);
};

/// Runs parts of a loop on threads, and owns the memory they work in. Implementations: the
/// single-thread `Serial` below and backend::ThreadPool (backend/thread_pool.hpp). One thread at
/// a time drives an executor (calls run, or kernels with it); the threads it runs parts on are
/// its own.
class Executor {
 public:
  virtual ~Executor() = default;
  /// Threads a loop may be split over (the calling thread included).
  virtual std::size_t threads() const noexcept = 0;
  /// Calls body(p) for every p in [0, parts), on up to `parts` threads (concurrently, or some
  /// one after another on one thread: a part must never wait for another), and returns when all
  /// have returned. Requires parts <= threads(). A call made from inside a body (or from
  /// background work) runs its parts one after another on the calling thread. The first
  /// exception thrown by a part is rethrown here. Parts run with memory() as their thread's
  /// current resource (the caller's part included).
  virtual void run(std::size_t parts, PartFunction body) = 0;
  /// The workspace of the part the calling thread runs (outside a loop: the driving thread's).
  virtual Workspace& workspace() noexcept = 0;
  /// Where the backend's buffers live (memory::Use scopes and the workspaces allocate from it).
  virtual memory::Resource& memory() noexcept = 0;
  /// Whether start_background runs its task beside the calling thread (on a thread of its own).
  virtual bool runs_background() const noexcept { return false; }
  /// Loops run so far on more than one thread (what tells the data loader whether the training
  /// step leaves a thread free for background work).
  virtual std::uint64_t parallel_loops() const noexcept { return 0; }
  /// Starts task(0) in the background and returns a ticket for wait_background. One task runs at a
  /// time: a start waits for the previous task first. The task must stay alive until waited for;
  /// it runs with memory() as its thread's resource, and must not start or wait for background
  /// work itself. Here (no background thread): runs it now.
  virtual std::uint64_t start_background(PartFunction task) {
    const memory::Use use(memory());
    task(0);
    return 0;
  }
  /// Returns when the task of `ticket` (and every one started before it) has ended, rethrowing
  /// what a task threw.
  virtual void wait_background(std::uint64_t /*ticket*/) {}
};

/// Everything on the calling thread, with one workspace.
class Serial final : public Executor {
 public:
  /// Buffers from `resource` (host memory by default). Requires a resource (not null).
  explicit Serial(std::shared_ptr<memory::Resource> resource = memory::host().shared_from_this())
      : workspace_(resource), resource_(std::move(resource)) {}
  std::size_t threads() const noexcept override { return 1; }
  void run(std::size_t parts, PartFunction body) override {
    const memory::Use use(*resource_);
    for (std::size_t p = 0; p < parts; ++p) body(p);
  }
  Workspace& workspace() noexcept override { return workspace_; }
  memory::Resource& memory() noexcept override { return *resource_; }

 private:
  Workspace workspace_;
  std::shared_ptr<memory::Resource> resource_;
};

/// The calling thread's workspace of `e`, or, without an executor, a workspace of its own that
/// lives as long as this object (from the current resource: kernels called without a backend
/// allocate their scratch per call).
class WorkspaceFor {
 public:
  explicit WorkspaceFor(Executor* e) {
    if (e)
      workspace_ = &e->workspace();
    else
      workspace_ = &own_.emplace(memory::current().shared_from_this());
  }
  WorkspaceFor(const WorkspaceFor&) = delete;
  WorkspaceFor& operator=(const WorkspaceFor&) = delete;
  Workspace& operator*() const noexcept { return *workspace_; }
  Workspace* operator->() const noexcept { return workspace_; }

 private:
  std::optional<Workspace> own_;
  Workspace* workspace_ = nullptr;
};

/// Makes `e`'s memory resource the current one for the scope (nothing without an executor).
class UseMemoryOf {
 public:
  explicit UseMemoryOf(Executor* e) {
    if (e) use_.emplace(e->memory());
  }

 private:
  std::optional<memory::Use> use_;
};

/// Threads available through `e` (1 when null).
inline std::size_t threads_of(const Executor* e) noexcept { return e ? e->threads() : 1; }

/// Splits [0, n) into at most threads_of(e) parts of at least `grain` elements, each boundary a
/// multiple of `align`, and calls f(begin, end) for each part (on the calling thread when there
/// is one part), or f(begin, end, part) when f takes the part's index (below threads_of(e): to
/// pick a per-thread scratch buffer). Parts are as equal as the alignment allows.
template <class F>
void parallel_for(Executor* e, std::size_t n, std::size_t grain, std::size_t align, F&& f) {
  auto call = [&](std::size_t b, std::size_t end, std::size_t p) {
    if constexpr (std::is_invocable_v<F&, std::size_t, std::size_t, std::size_t>)
      f(b, end, p);
    else
      f(b, end);
  };
  const std::size_t units = (n + align - 1) / align;  // aligned blocks
  const std::size_t by_grain = std::max<std::size_t>(1, n / std::max<std::size_t>(grain, 1));
  const std::size_t parts = std::min({threads_of(e), by_grain, units});
  if (e == nullptr || parts <= 1) {
    if (n) call(std::size_t{0}, n, std::size_t{0});
    return;
  }
  auto part = [&](std::size_t p) {
    const std::size_t b = std::min(n, units * p / parts * align), end = std::min(n, units * (p + 1) / parts * align);
    if (b < end) call(b, end, p);
  };
  e->run(parts, part);
}

/// parallel_for with boundaries at multiples of 64 elements (whole SIMD vectors, whole cache lines).
template <class F>
void parallel_for(Executor* e, std::size_t n, std::size_t grain, F&& f) {
  parallel_for(e, n, grain, 64, std::forward<F>(f));
}

}  // namespace xtrain::backend
