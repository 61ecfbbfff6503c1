#pragma once
/// \file cpu.hpp
/// Device backend policies: the fifth parameter of Trainer<Model, Optimizer, Precision,
/// Communicator, Backend, Loss> and Engine, the third of Accelerator<Precision, Communicator,
/// Backend>. A backend decides where kernels run and where buffers live: its executor runs the
/// kernels' loops and owns a workspace per part; its memory resource gives every buffer of a
/// training (the engine makes its buffers there and names it in Context::memory). Layers reach it
/// through Context::executor, the engine through Engine::backend(). docs/design.md ("Backends and
/// threads") says how a GPU backend would plug in.
///  - Cpu: one thread per rank (the default; scale out with ranks: mpirun -np <cores>).
///  - CpuThreads: a pool of N threads per rank that splits GEMMs, elementwise maps and the
///    optimizer's pass (N: TrainingOptions::threads, else XTRAIN_NUM_THREADS or OMP_NUM_THREADS, else
///    the rank's share of its cores). Results are bitwise the same for every N. Ranks run as
///    threads (parallel::ThreadAllReduce) each get a pool: give them a thread count yourself.

#include <concepts>
#include <cstddef>
#include <memory>
#include <string>

#include "xtrain/backend/executor.hpp"
#include "xtrain/backend/thread_pool.hpp"
#include "xtrain/backend/topology.hpp"
#include "xtrain/core/error.hpp"

namespace xtrain::backend {

/// What Engine needs of a backend: built from a requested thread count (0: its default), the
/// executor kernels run on (never null; it owns the workspaces and the memory resource), the
/// threads it uses.
template <class B>
concept Backend = requires(B& b, const B& cb, std::size_t n) {
  { B::name } -> std::convertible_to<const char*>;
  B(n);
  { b.executor() } -> std::same_as<Executor*>;
  { cb.threads() } -> std::convertible_to<std::size_t>;
};

/// Fails compilation with one message when `B` is not a Backend.
template <class B>
consteval bool check_backend() {
  static_assert(Backend<B>,
                "xtrain: the Backend policy is not a Backend (backend::Cpu, backend::CpuThreads): it needs a static "
                "`name`, a constructor from a thread count, `Executor* executor()` and `threads()` (the order: "
                "Trainer<Model, Optimizer, Precision, Communicator, Backend, Loss>, Accelerator<Precision, "
                "Communicator, Backend>)");
  return Backend<B>;
}

/// One thread per rank: kernels run on the calling thread.
class Cpu {
 public:
  static constexpr const char* name = "cpu";
  /// Requires requested <= 1 (0: default); more threads need CpuThreads. Buffers come from
  /// `resource` (a host memory resource of this backend's own by default, so that its stats()
  /// are this training's).
  explicit Cpu(std::size_t requested = 0, std::shared_ptr<memory::Resource> resource = nullptr)
      : executor_(std::make_unique<Serial>(resource ? std::move(resource) : std::make_shared<memory::HostResource>())) {
    XTRAIN_CHECK(requested <= 1, ValueError, "backend::Cpu runs one thread per rank, ", requested,
                 " threads were asked for: use backend::CpuThreads (Trainer's fifth parameter)");
  }
  Executor* executor() noexcept { return executor_.get(); }
  std::size_t threads() const noexcept { return 1; }
  /// Where this backend's buffers live.
  memory::Resource& memory() noexcept { return executor_->memory(); }

 private:
  std::unique_ptr<Serial> executor_;  // on the heap: layers keep its address while the backend moves
};

/// N threads per rank (intra-op parallelism); N = 1 runs as Cpu does.
class CpuThreads {
 public:
  static constexpr const char* name = "cpu-threads";
  /// `requested` threads; 0: XTRAIN_NUM_THREADS, else OMP_NUM_THREADS, else default_threads().
  /// Buffers come from `resource` (a host memory resource of this backend's own by default).
  explicit CpuThreads(std::size_t requested = 0, std::shared_ptr<memory::Resource> resource = nullptr)
      : pool_(std::make_unique<ThreadPool>(
            resolve_threads(requested), resource ? std::move(resource) : std::make_shared<memory::HostResource>())) {}
  Executor* executor() noexcept { return pool_.get(); }
  std::size_t threads() const noexcept { return pool_->threads(); }
  memory::Resource& memory() noexcept { return pool_->memory(); }

 private:
  std::unique_ptr<ThreadPool> pool_;
};

/// Where `backend`'s buffers live: its executor's memory resource. Throws ValueError when the
/// backend has no executor.
template <Backend B>
memory::Resource& memory_of(B& backend) {
  Executor* e = backend.executor();
  XTRAIN_CHECK(e != nullptr, ValueError, "backend '", B::name,
               "' has no executor: Backend::executor() must not be null (backend::Serial runs kernels on the "
               "calling thread)");
  return e->memory();
}

/// "cpu-threads: 2 threads" and, where the threads would share cores, why and what to do.
template <Backend B>
std::string describe(const B& backend) {
  const std::size_t n = backend.threads();
  std::string s = std::string(B::name) + ": " + std::to_string(n) + (n == 1 ? " thread" : " threads") + " per process";
  if (const std::string w = oversubscription_warning(n); !w.empty()) s += "\nwarning: " + w;
  return s;
}

}  // namespace xtrain::backend
