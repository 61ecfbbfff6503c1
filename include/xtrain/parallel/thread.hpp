#pragma once
/// \file thread.hpp
/// ThreadAllReduce: N ranks as N threads of one process, for one machine without mpirun (the
/// analog of Accelerate's notebook_launcher) and for testing the distributed logic in unit tests.
/// `launch_threads(n, fn)` runs fn(comm) on n threads; if one rank throws, the others are released
/// from any collective with an error and the first exception is rethrown to the caller.
/// Sums are computed rank 0 + rank 1 + ... in that order for every element (deterministic).

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "xtrain/core/error.hpp"
#include "xtrain/parallel/communicator.hpp"

namespace xtrain::parallel {

/// State shared by the ranks of one thread group.
class ThreadGroup {
 public:
  /// Requires size > 0. `timeout` bounds every wait in a collective.
  explicit ThreadGroup(std::size_t size, std::chrono::duration<double> timeout = std::chrono::seconds(300))
      : size_(size), timeout_(timeout), slots_(size) {
    XTRAIN_CHECK(size > 0, ValueError, "ThreadGroup: size must be positive");
  }

  std::size_t size() const noexcept { return size_; }

  /// Waits until all ranks arrive; throws Error if the group was aborted or the wait times out.
  void arrive_and_wait(const char* collective) {
    std::unique_lock lock(mutex_);
    const std::size_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else if (!cv_.wait_for(lock, timeout_, [&] { return generation_ != generation || aborted_; })) {
      aborted_ = true;
      cv_.notify_all();
      throw Error(std::string("collective '") + collective + "' waited longer than " +
                  std::to_string(timeout_.count()) + " s for the other ranks (thread group); aborting");
    }
    if (aborted_) throw Error(std::string("collective '") + collective + "' abandoned: another rank failed");
  }

  /// Releases every waiting rank with an error (called when a rank throws).
  void abort() {
    std::lock_guard lock(mutex_);
    aborted_ = true;
    cv_.notify_all();
  }

  /// Per-rank exchange slot (pointer and length of the rank's buffer in the running collective).
  struct Slot {
    const void* data = nullptr;
    std::size_t count = 0;
  };
  std::vector<Slot>& slots() noexcept { return slots_; }

 private:
  std::size_t size_;
  std::chrono::duration<double> timeout_;
  std::vector<Slot> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::size_t arrived_ = 0, generation_ = 0;
  bool aborted_ = false;
};

class ThreadAllReduce {
  /// rank k -> the values rank k published for the running collective.
  template <class T>
  auto rank_values() const noexcept {
    return [this](std::size_t k) { return static_cast<const T*>(group_->slots()[k].data); };
  }

 public:
  struct Request {};

  ThreadAllReduce(std::shared_ptr<ThreadGroup> group, std::size_t rank) : group_(std::move(group)), rank_(rank) {
    XTRAIN_CHECK(rank_ < group_->size(), ValueError, "ThreadAllReduce: rank ", rank_, " of ", group_->size());
  }

  static constexpr const char* name = "threads";
  std::size_t rank() const noexcept { return rank_; }
  std::size_t size() const noexcept { return group_->size(); }

  void allreduce_sum(std::span<float> v, const char* what) { reduce(v, what); }
  void allreduce_sum(std::span<double> v, const char* what) { reduce(v, what); }
  void broadcast(std::span<float> v, const char* what) { bcast(v, what); }
  void broadcast(std::span<double> v, const char* what) { bcast(v, what); }
  void broadcast(std::string& s, const char* what) {
    publish(s.data(), s.size(), what);
    const auto& root = group_->slots()[0];
    std::string copy(static_cast<const char*>(root.data), root.count);
    group_->arrive_and_wait(what);
    s = std::move(copy);
  }
  /// all[r * mine.size() ...] = rank r's `mine`. Requires equal sizes on every rank.
  void allgather(std::span<const float> mine, std::span<float> all, const char* what) {
    publish(mine.data(), mine.size(), what);
    for (std::size_t r = 0; r < size(); ++r) {
      const auto& slot = group_->slots()[r];
      const auto* src = static_cast<const float*>(slot.data);
      std::copy(src, src + mine.size(), all.begin() + static_cast<std::ptrdiff_t>(r * mine.size()));
    }
    group_->arrive_and_wait(what);
  }
  void barrier(const char* what) { group_->arrive_and_wait(what); }
  /// Threads reduce synchronously: the request is complete on return.
  Request iallreduce_sum(std::span<float> v, const char* what) {
    reduce(v, what);
    return {};
  }
  bool test(Request&) noexcept { return true; }
  void wait(Request&) noexcept {}
  /// Another handle on the same group of ranks (for a second engine).
  ThreadAllReduce duplicate() const { return *this; }

  /// Block rank() of `v` becomes the sum over ranks (in rank order) of that block.
  void reduce_scatter_sum(std::span<float> v, const char* what) { reduce_scatter_range(v, 0, v.size(), what); }
  /// Of the elements [lo, hi) of `v` (size() equal blocks), those in block rank() become the sum
  /// over ranks (in rank order: the bits of allreduce_sum).
  void reduce_scatter_range(std::span<float> v, std::size_t lo, std::size_t hi, const char* what) {
    publish(v.data(), v.size(), what);
    check_counts(v.size(), what);
    const std::size_t block = v.size() / size(), begin = std::clamp(rank_ * block, lo, hi),
                      end = std::clamp((rank_ + 1) * block, lo, hi);
    std::vector<float>& sum = scratch<float>(end - begin);
    sum_in_rank_order(rank_values<float>(), size(), begin, end, sum.data());
    group_->arrive_and_wait(what);  // all reads of this rank's elements done before they are overwritten
    std::copy(sum.begin(), sum.end(), v.begin() + static_cast<std::ptrdiff_t>(begin));
    group_->arrive_and_wait(what);
  }
  /// Of the elements [lo, hi) of `v` (size() equal blocks), each rank's part in its block copied
  /// to every rank.
  void allgather_range(std::span<float> v, std::size_t lo, std::size_t hi, const char* what) {
    publish(v.data(), v.size(), what);
    check_counts(v.size(), what);
    const std::size_t block = v.size() / size();
    for (std::size_t r = 0; r < size(); ++r)
      if (r != rank_) {
        const std::size_t b = std::clamp(r * block, lo, hi), e = std::clamp((r + 1) * block, lo, hi);
        const float* src = static_cast<const float*>(group_->slots()[r].data);
        std::copy(src + b, src + e, v.begin() + static_cast<std::ptrdiff_t>(b));
      }
    group_->arrive_and_wait(what);
  }
  /// Each rank's values of [lo, hi) that fall in this rank's block, rank by rank into `out`.
  void exchange_range(std::span<const float> v, std::size_t lo, std::size_t hi, std::span<float> out,
                      const char* what) {
    publish(v.data(), v.size(), what);
    check_counts(v.size(), what);
    const std::size_t block = v.size() / size(), b = std::clamp(rank_ * block, lo, hi),
                      e = std::clamp((rank_ + 1) * block, lo, hi);
    XTRAIN_CHECK(out.size() >= size() * (e - b), ValueError, "exchange_range '", what, "': ", out.size(),
                 " floats for ", size(), " x ", e - b);
    for (std::size_t r = 0; r < size(); ++r) {
      const float* src = static_cast<const float*>(group_->slots()[r].data);
      std::copy(src + b, src + e, out.begin() + static_cast<std::ptrdiff_t>(r * (e - b)));
    }
    group_->arrive_and_wait(what);
  }
  /// Every rank's block rank() of `v` copied into every rank's `v`.
  void allgather_blocks(std::span<float> v, const char* what) {
    publish(v.data(), v.size(), what);
    check_counts(v.size(), what);
    const std::size_t block = v.size() / size();
    for (std::size_t r = 0; r < size(); ++r)
      if (r != rank_) {
        const float* src = static_cast<const float*>(group_->slots()[r].data) + r * block;
        std::copy(src, src + block, v.begin() + static_cast<std::ptrdiff_t>(r * block));
      }
    group_->arrive_and_wait(what);
  }

 private:
  /// Publishes this rank's buffer and waits until every rank has published its own.
  void publish(const void* data, std::size_t count, const char* what) {
    group_->slots()[rank_] = {data, count};
    group_->arrive_and_wait(what);
  }

  void check_counts(std::size_t n, const char* what) const {
    for (std::size_t r = 0; r < size(); ++r)
      XTRAIN_CHECK(group_->slots()[r].count == n, ValueError, "collective '", what, "': rank ", rank_, " passed ", n,
                   " values but rank ", r, " passed ", group_->slots()[r].count);
  }

  template <class T>
  void reduce(std::span<T> v, const char* what) {
    publish(v.data(), v.size(), what);
    check_counts(v.size(), what);
    // Each rank sums its own slice over all ranks (in rank order), then writes it to every rank.
    const std::size_t n = v.size(), w = size();
    const std::size_t begin = n * rank_ / w, end = n * (rank_ + 1) / w;
    std::vector<T>& sum = scratch<T>(end - begin);
    sum_in_rank_order(rank_values<T>(), w, begin, end, sum.data());
    group_->arrive_and_wait(what);  // every slice read before any is written
    for (std::size_t r = 0; r < w; ++r) {
      T* dst = const_cast<T*>(static_cast<const T*>(group_->slots()[r].data));
      std::copy(sum.begin(), sum.end(), dst + begin);
    }
    group_->arrive_and_wait(what);
  }

  template <class T>
  void bcast(std::span<T> v, const char* what) {
    publish(v.data(), v.size(), what);
    XTRAIN_CHECK(group_->slots()[0].count == v.size(), ValueError, "collective '", what, "': rank ", rank_, " expects ",
                 v.size(), " values but rank 0 sends ", group_->slots()[0].count);
    if (rank_ != 0) {
      const T* src = static_cast<const T*>(group_->slots()[0].data);
      std::copy(src, src + v.size(), v.begin());
    }
    group_->arrive_and_wait(what);
  }

  /// This rank's partial-sum buffer, reused from call to call (no allocation per step).
  template <class T>
  std::vector<T>& scratch(std::size_t n) {
    std::vector<T>& v = [this]() -> std::vector<T>& {
      if constexpr (std::is_same_v<T, float>)
        return scratch_f_;
      else
        return scratch_d_;
    }();
    v.resize(n);
    return v;
  }

  std::shared_ptr<ThreadGroup> group_;
  std::size_t rank_;
  std::vector<float> scratch_f_;
  std::vector<double> scratch_d_;
};

/// Runs fn(ThreadAllReduce&) on `n` threads, ranks 0..n-1. Rethrows the first exception after all
/// threads have ended (the others are released from their collectives with an error).
template <class F>
void launch_threads(std::size_t n, F&& fn, std::chrono::duration<double> timeout = std::chrono::seconds(300)) {
  auto group = std::make_shared<ThreadGroup>(n, timeout);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (std::size_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        ThreadAllReduce comm(group, r);
        fn(comm);
      } catch (...) {
        errors[r] = std::current_exception();
        group->abort();
      }
    });
  for (auto& t : threads) t.join();
  // Prefer the root cause over the "abandoned" errors it caused on the other ranks.
  std::exception_ptr first;
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      if (std::string(ex.what()).find("abandoned: another rank failed") == std::string::npos) std::rethrow_exception(e);
    }
    if (!first) first = e;
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace xtrain::parallel
