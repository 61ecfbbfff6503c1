#pragma once
/// \file memory_counter.hpp
/// Counts the bytes of tensor storage a thread allocates and frees: what the profiler's
/// `profile_memory` reports per module, and what a memory check measures. Every Tensor allocates
/// through CountingAllocator; the counters are per thread (a rank that is a thread counts its own).

#include <cstddef>
#include <cstdint>

#include <xsimd/memory/xsimd_aligned_allocator.hpp>

namespace xtrain::memory {

/// Tensor storage of the calling thread, in bytes.
struct Counters {
  std::int64_t allocated = 0;  ///< bytes allocated since the thread started (never decreases)
  std::int64_t live = 0;       ///< bytes allocated and not yet freed by this thread
  std::int64_t peak = 0;       ///< the highest `live` since the thread started or reset_peak()
};

/// The calling thread's counters.
inline Counters& counters() noexcept {
  thread_local Counters c;
  return c;
}

/// Starts a new peak measurement at the current live bytes.
inline void reset_peak() noexcept { counters().peak = counters().live; }

/// A 64-byte aligned allocator that counts into counters().
template <class T>
struct CountingAllocator : xsimd::aligned_allocator<T, 64> {
  using base = xsimd::aligned_allocator<T, 64>;
  template <class U>
  struct rebind {
    using other = CountingAllocator<U>;
  };
  CountingAllocator() noexcept = default;
  template <class U>
  CountingAllocator(const CountingAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    T* p = base::allocate(n);
    Counters& c = counters();
    const auto bytes = static_cast<std::int64_t>(n * sizeof(T));
    c.allocated += bytes;
    c.live += bytes;
    if (c.live > c.peak) c.peak = c.live;
    return p;
  }
  void deallocate(T* p, std::size_t n) noexcept {
    counters().live -= static_cast<std::int64_t>(n * sizeof(T));
    base::deallocate(p, n);
  }
  template <class U>
  friend bool operator==(const CountingAllocator&, const CountingAllocator<U>&) noexcept {
    return true;
  }
};

}  // namespace xtrain::memory
