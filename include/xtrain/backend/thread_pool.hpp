#pragma once
/// \file thread_pool.hpp
/// A fork-join pool for intra-op parallelism: the calling thread and N - 1 workers run the parts
/// of one loop, each part claimed once by whichever thread asks first (the caller included, so a
/// worker that is asleep or busy never holds a loop up). Workers spin briefly after each loop (a
/// training step runs its kernels back to back, microseconds apart) and then sleep on a futex
/// (std::atomic::wait), so an idle pool costs nothing. With more threads than the cores of the
/// process's affinity mask, waiting threads yield instead of spinning (a spinning thread would
/// take the core of the one it waits for). Each part has a workspace of its own, and parts run
/// with the pool's memory resource as their thread's current one. The first worker also runs
/// background work (the data loader's next batch) while the caller goes on. benchmarks/RESULTS.md
/// compares its fork-join latency with OpenMP's.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "xtrain/backend/executor.hpp"
#include "xtrain/backend/topology.hpp"
#include "xtrain/core/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace xtrain::backend {

/// N threads (the caller and N - 1 workers) that run the parts of one loop at a time.
class ThreadPool final : public Executor {
 public:
  /// How long a worker spins for the next loop before it sleeps.
  static constexpr std::chrono::microseconds spin_time{1000};

  /// Requires threads >= 1 (1: no workers, every loop runs on the caller). Buffers (the
  /// workspaces, and what parts allocate) come from `resource` (host memory by default).
  explicit ThreadPool(std::size_t threads,
                      std::shared_ptr<memory::Resource> resource = memory::host().shared_from_this())
      : resource_(std::move(resource)), oversubscribed_(threads > affinity_cores()) {
    XTRAIN_CHECK(threads >= 1 && threads <= 1024, ValueError, "a thread pool needs 1 to 1024 threads, got ", threads);
    XTRAIN_CHECK(resource_ != nullptr, ValueError, "ThreadPool: the memory resource is null");
    workspaces_.reserve(threads + 1);
    for (std::size_t i = 0; i <= threads; ++i) workspaces_.push_back(std::make_unique<Workspace>(resource_));
    workers_.reserve(threads - 1);
    try {
      for (std::size_t id = 1; id < threads; ++id) workers_.emplace_back([this, id] { work(id); });
    } catch (...) {  // a thread could not be started: stop those that were
      stop_workers();
      throw;
    }
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() override { stop_workers(); }

  std::size_t threads() const noexcept override { return workers_.size() + 1; }
  /// The workspace of the part the calling thread runs (part p's is the same whichever thread
  /// claimed it, so each grows once to what its part needs); outside a loop, the first (the thread
  /// driving the pool) or the background task's.
  Workspace& workspace() noexcept override {
    const ThreadState& s = state();
    return *workspaces_[s.part_of == this ? s.workspace : 0];
  }
  memory::Resource& memory() noexcept override { return *resource_; }

  void run(std::size_t parts, PartFunction body) override {
    XTRAIN_CHECK(parts <= threads(), ValueError, "ThreadPool::run: ", parts, " parts for ", threads(), " threads");
    const memory::Use use(*resource_);
    // One part, a loop started on a worker (inside a part, or by background work), or nested: inline.
    if (parts <= 1 || state().worker_of == this || busy_.exchange(true, std::memory_order_acquire)) {
      XTRAIN_CHECK(parts <= 1 || state().worker_of == this ||
                       driver_.load(std::memory_order_relaxed) == std::this_thread::get_id(),
                   ValueError,
                   "ThreadPool::run called from a second thread while another runs a loop: one thread drives an "
                   "executor (give each thread a backend of its own)");
      for (std::size_t p = 0; p < parts; ++p) body(p);
      return;
    }
    driver_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    struct Release {
      std::atomic<bool>& busy;
      ~Release() { busy.store(false, std::memory_order_release); }
    } release{busy_};
    ++parallel_loops_;
    body_ = &body;
    remaining_.store(parts, std::memory_order_relaxed);
    // Part 0 is the caller's; parts 1.. go to whoever claims them first (claim()), the caller too.
    const std::uint64_t run = ((ticket_.load(std::memory_order_relaxed) >> 32) + 1) & 0xffffffffu;
    ticket_.store(run << 32 | std::uint64_t{parts} << 16 | 1, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_seq_cst);  // wakes the workers
    if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
    std::exception_ptr mine;
    const auto run_part = [&](std::size_t p) {
      if (!mine) {  // after the caller's first exception, the parts it claims are skipped
        const InPart in(this, p);
        try {
          body(p);
        } catch (...) {
          mine = std::current_exception();
        }
      }
      finish_part();
    };
    run_part(0);
    for (std::size_t p; (p = claim(run)) != no_part;) run_part(p);
    spin_until([&] { return remaining_.load(std::memory_order_acquire) == 0; },
               [&] {
                 const std::size_t left = remaining_.load(std::memory_order_acquire);
                 if (left) remaining_.wait(left, std::memory_order_acquire);
               });
    std::exception_ptr theirs = std::exchange(error_, nullptr);  // never left for a later loop
    if (mine) std::rethrow_exception(mine);
    if (theirs) std::rethrow_exception(theirs);
  }

  bool runs_background() const noexcept override { return !workers_.empty(); }
  std::uint64_t parallel_loops() const noexcept override { return parallel_loops_; }

  /// Starts task() on the first worker and returns at once (after the previous background task,
  /// if one is still running, has ended). Without workers the task runs here, before returning.
  /// A background task must not start or wait for background work itself.
  std::uint64_t start_background(PartFunction task) override {
    XTRAIN_CHECK(state().worker_of != this, ValueError,
                 "ThreadPool::start_background called from the pool's own thread (a background task or a part)");
    if (workers_.empty()) {
      const memory::Use use(*resource_);
      task(0);
      return 0;
    }
    wait_done(background_started_.load(std::memory_order_relaxed));  // one task at a time
    background_task_.emplace(task);
    const std::uint64_t ticket = background_started_.fetch_add(1, std::memory_order_release) + 1;
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
    return ticket;
  }

  /// Waits until the background task `ticket` (and those before it) has ended; rethrows what that
  /// task threw (each task's exception goes to the wait for its own ticket, once).
  void wait_background(std::uint64_t ticket) override {
    wait_done(ticket);
    std::exception_ptr e;
    {
      const std::lock_guard<std::mutex> lock(error_mutex_);
      const auto it = std::find_if(background_errors_.begin(), background_errors_.end(),
                                   [&](const auto& t) { return t.first == ticket; });
      if (it == background_errors_.end()) return;
      e = it->second;
      background_errors_.erase(it);
    }
    std::rethrow_exception(e);
  }

 private:
  // Returns when the background tasks up to `ticket` have ended.
  void wait_done(std::uint64_t ticket) const {
    spin_until([&] { return background_done_.load(std::memory_order_acquire) >= ticket; },
               [&] {
                 const std::uint64_t done = background_done_.load(std::memory_order_acquire);
                 if (done < ticket) background_done_.wait(done, std::memory_order_acquire);
               });
  }

  void stop_workers() noexcept {
    // Background work started and not yet run would never end: let it run first.
    if (!workers_.empty()) wait_done(background_started_.load(std::memory_order_relaxed));
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    generation_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void pause() const noexcept {
#if defined(__x86_64__) || defined(__i386__)
    if (!oversubscribed_) {
      _mm_pause();
      return;
    }
#endif
    std::this_thread::yield();
  }

  // Spins on done() for spin_time, then calls sleep() until done().
  template <class Done, class Sleep>
  void spin_until(Done&& done, Sleep&& sleep) const {
    if (done()) return;
    const auto until = std::chrono::steady_clock::now() + spin_time;
    for (unsigned i = 1;; ++i) {
      if (done()) return;
      pause();
      if (i % 64 == 0 && std::chrono::steady_clock::now() > until) break;
    }
    while (!done()) sleep();
  }

  static constexpr std::size_t no_part = ~std::size_t{0};

  // What the calling thread is to a pool: whose worker (none: null), and whose part it runs now
  // (none: null) with which workspace.
  struct ThreadState {
    const ThreadPool* worker_of = nullptr;
    const ThreadPool* part_of = nullptr;
    std::size_t workspace = 0;
  };
  static ThreadState& state() noexcept {
    thread_local ThreadState s;
    return s;
  }
  // For its lifetime, the calling thread runs a part of `pool` with workspace `workspace`.
  struct InPart {
    ThreadState saved;
    InPart(const ThreadPool* pool, std::size_t workspace) noexcept : saved(state()) {
      state().part_of = pool;
      state().workspace = workspace;
    }
    InPart(const InPart&) = delete;
    InPart& operator=(const InPart&) = delete;
    ~InPart() { state() = saved; }
  };

  // The next unclaimed part of loop `run`, or no_part when that loop has none left (or is over).
  std::size_t claim(std::uint64_t run) noexcept {
    std::uint64_t t = ticket_.load(std::memory_order_acquire);
    for (;;) {
      const std::size_t next = t & 0xffff, parts = (t >> 16) & 0xffff;
      if ((t >> 32) != run || next >= parts) return no_part;
      if (ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire)) return next;
    }
  }

  void finish_part() noexcept {
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) remaining_.notify_one();
  }

  void work(std::size_t id) {
    state().worker_of = this;
    const memory::Use use(*resource_);
    std::uint32_t seen = 0;
    std::uint64_t background_seen = 0;
    for (;;) {
      spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; },
                 [&] {
                   sleepers_.fetch_add(1, std::memory_order_seq_cst);
                   if (generation_.load(std::memory_order_seq_cst) == seen)
                     generation_.wait(seen, std::memory_order_acquire);
                   sleepers_.fetch_sub(1, std::memory_order_relaxed);
                 });
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_relaxed)) return;
      const std::uint64_t run = ticket_.load(std::memory_order_acquire) >> 32;
      for (std::size_t p; (p = claim(run)) != no_part;) {
        const InPart in(this, p);
        try {
          (*body_)(p);
        } catch (...) {
          const std::lock_guard<std::mutex> lock(error_mutex_);
          if (!error_) error_ = std::current_exception();
        }
        finish_part();
      }
      if (id == 1 && background_started_.load(std::memory_order_acquire) != background_seen) {
        ++background_seen;
        const InPart in(this, workspaces_.size() - 1);  // the background task's workspace
        try {
          (*background_task_)(0);
        } catch (...) {
          const std::lock_guard<std::mutex> lock(error_mutex_);
          background_errors_.emplace_back(background_seen, std::current_exception());
        }
        background_done_.store(background_seen, std::memory_order_release);
        background_done_.notify_all();
      }
    }
  }

  std::shared_ptr<memory::Resource> resource_;
  std::vector<std::unique_ptr<Workspace>> workspaces_;  // one per part, then the background task's
  bool oversubscribed_;                                 // more threads than cores: yield while waiting
  std::vector<std::thread> workers_;
  alignas(64) std::atomic<std::uint32_t> generation_{0};  // bumped to start a loop or a task (or to stop)
  std::atomic<std::uint32_t> sleepers_{0};                // workers asleep in generation_.wait
  // The running loop: its number (bits 32-63), its parts (16-31) and the next unclaimed part (0-15).
  alignas(64) std::atomic<std::uint64_t> ticket_{0};
  std::atomic<std::size_t> remaining_{0};  // parts of this loop not done yet
  std::atomic<bool> busy_{false};          // a loop is running (nested calls go inline)
  std::atomic<std::thread::id> driver_{};  // the thread that started the running loop
  std::atomic<bool> stop_{false};
  const PartFunction* body_ = nullptr;
  std::uint64_t parallel_loops_ = 0;  // loops run on several threads (the driving thread's count)
  std::mutex error_mutex_;
  std::exception_ptr error_;
  // Background work (the first worker's): tasks started and ended, counted from 1.
  alignas(64) std::atomic<std::uint64_t> background_started_{0};
  std::atomic<std::uint64_t> background_done_{0};
  std::optional<PartFunction> background_task_;
  std::vector<std::pair<std::uint64_t, std::exception_ptr>> background_errors_;  // (ticket, what it threw)
};

}  // namespace xtrain::backend
