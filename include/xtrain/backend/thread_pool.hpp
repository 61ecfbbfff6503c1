#pragma once
/// \file thread_pool.hpp
/// A fork-join pool for intra-op parallelism: the calling thread runs part 0 of a loop, N - 1
/// workers run the others. Workers spin briefly after each loop (a training step runs its kernels
/// back to back, microseconds apart) and then sleep on a futex (std::atomic::wait), so an idle
/// pool costs nothing. With more threads than the cores of the process's affinity mask, waiting
/// threads yield instead of spinning (a spinning thread would take the core of the one it waits
/// for). Each thread has a workspace of its own, and parts run with the pool's memory resource as
/// their thread's current one. benchmarks/RESULTS.md compares its fork-join latency with OpenMP's.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
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
    workspaces_.reserve(threads);
    for (std::size_t i = 0; i < threads; ++i) workspaces_.push_back(std::make_unique<Workspace>(resource_));
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
  /// The calling thread's: a worker's own, else (the thread driving the pool) the first.
  Workspace& workspace() noexcept override {
    const Worker& w = worker();
    return *workspaces_[w.pool == this ? w.id : 0];
  }
  memory::Resource& memory() noexcept override { return *resource_; }

  void run(std::size_t parts, PartFunction body) override {
    XTRAIN_CHECK(parts <= threads(), ValueError, "ThreadPool::run: ", parts, " parts for ", threads(), " threads");
    const memory::Use use(*resource_);
    if (parts <= 1 || busy_.exchange(true, std::memory_order_acquire)) {  // one part, or nested: inline
      XTRAIN_CHECK(
          parts <= 1 || worker().pool == this || driver_.load(std::memory_order_relaxed) == std::this_thread::get_id(),
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
    body_ = &body;
    parts_ = parts;
    pending_.store(workers_.size(), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_seq_cst);  // publishes body_ and parts_
    if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
    std::exception_ptr mine;
    try {
      body(0);
    } catch (...) {
      mine = std::current_exception();
    }
    spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; },
               [&] {
                 const std::size_t left = pending_.load(std::memory_order_acquire);
                 if (left) pending_.wait(left, std::memory_order_acquire);
               });
    std::exception_ptr theirs = std::exchange(error_, nullptr);  // never left for a later loop
    if (mine) std::rethrow_exception(mine);
    if (theirs) std::rethrow_exception(theirs);
  }

 private:
  void stop_workers() noexcept {
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

  // Which pool's worker the calling thread is (none: null), and its index.
  struct Worker {
    const ThreadPool* pool = nullptr;
    std::size_t id = 0;
  };
  static Worker& worker() noexcept {
    thread_local Worker w;
    return w;
  }

  void work(std::size_t id) {
    worker() = {this, id};
    const memory::Use use(*resource_);
    std::uint32_t seen = 0;
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
      if (id < parts_) {
        try {
          (*body_)(id);
        } catch (...) {
          const std::lock_guard<std::mutex> lock(error_mutex_);
          if (!error_) error_ = std::current_exception();
        }
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  std::shared_ptr<memory::Resource> resource_;
  std::vector<std::unique_ptr<Workspace>> workspaces_;  // one per thread (index 0: the caller's)
  bool oversubscribed_;                                 // more threads than cores: yield while waiting
  std::vector<std::thread> workers_;
  alignas(64) std::atomic<std::uint32_t> generation_{0};  // bumped to start a loop (or to stop)
  std::atomic<std::uint32_t> sleepers_{0};                // workers asleep in generation_.wait
  alignas(64) std::atomic<std::size_t> pending_{0};       // workers not done with this loop
  std::atomic<bool> busy_{false};                         // a loop is running (nested calls go inline)
  std::atomic<std::thread::id> driver_{};                 // the thread that started the running loop
  std::atomic<bool> stop_{false};
  const PartFunction* body_ = nullptr;
  std::size_t parts_ = 0;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace xtrain::backend
