#pragma once
/// \file recompute_memory.hpp
/// Where a recomputed block (layers::Checkpointed) keeps its activations: a memory::Resource
/// whose large blocks can hand their pages over to another block without a copy and without a
/// page fault. `park()` moves the pages of the resource's blocks into the calling thread's pool of
/// parked pages (Linux: `mremap(MREMAP_DONTUNMAP)`, which moves page-table entries and leaves the
/// block mapped and empty); `unpark()` moves pages of the same size from the pool back under the
/// blocks (`mremap(MREMAP_FIXED)`). A model of N checkpointed blocks then holds one block's
/// activations, which pass from block to block as the pages move: block 2's forward runs in the
/// pages block 1's forward has just parked, and backward's recomputations likewise. The contents
/// a block finds after unpark() are another block's (or zeros): a module must rewrite what it reads
/// in the call that allocated it, which forward and backward do (outputs, saved activations, input
/// gradients are all rewritten by each call). Blocks under four pages come from the heap and are
/// never parked. Where mremap cannot move pages (not Linux, an old kernel), park() gives them back
/// to the system (MADV_DONTNEED) or, elsewhere, keeps them.
///
/// memory::counters().live counts what the thread's pages hold, as the resident memory does:
/// parked pages stay counted until the pool gives them back to the system (it keeps 1.25x the
/// most one park() moved), and a block that finds no pages of its size counts again. The profiler's
/// memory columns and the memory estimator's dry run then see one block's activations.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "xtrain/core/memory.hpp"

#if defined(__linux__) && !defined(MREMAP_DONTUNMAP)
#define MREMAP_DONTUNMAP 4  // Linux 5.7 (glibc before 2.32 does not name it)
#endif

namespace xtrain::memory {

namespace detail {
/// Bytes the calling thread has allocated from RecomputeMemory (never decreases; the memory
/// estimator's dry run reads it).
inline std::int64_t& recompute_allocated() noexcept {
  thread_local std::int64_t bytes = 0;
  return bytes;
}
/// Of memory::counters().live, the bytes in pageable blocks and parked pages (outside the heap:
/// profile::PeakMeter adds them to what it reads of the heap).
inline std::int64_t& recompute_held() noexcept {
  thread_local std::int64_t bytes = 0;
  return bytes;
}

/// A thread's parked pages: mappings of pages moved out of recompute blocks, waiting for a block of
/// their size. Trimmed to what one block has parked at most (plus a quarter), oldest first.
class PagePool {
 public:
  PagePool() = default;
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;
  ~PagePool() { trim(0); }

  /// Parks `bytes` bytes of pages that memory::counters() counts as `counted`.
  void put(std::byte* pages, std::size_t bytes, std::int64_t counted) {
    entries_.push_back({pages, bytes, counted});
    bytes_ += bytes;
  }
  /// Pages of exactly `bytes` bytes (the most recently parked), or null; `counted` gets what
  /// memory::counters() counted for them.
  std::byte* take(std::size_t bytes, std::int64_t& counted) noexcept {
    for (std::size_t i = entries_.size(); i-- > 0;)
      if (entries_[i].bytes == bytes) {
        std::byte* p = entries_[i].pages;
        counted = entries_[i].counted;
        entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
        bytes_ -= bytes;
        return p;
      }
    return nullptr;
  }
  /// Notes that one park() moved `bytes`, and unmaps the oldest entries over 1.25x the most any
  /// park() moved.
  void parked(std::size_t bytes) noexcept {
    largest_ = std::max(largest_, bytes);
    trim(largest_ + largest_ / 4);
  }
  /// Unmaps the oldest entries until at most `keep` bytes are parked.
  void trim(std::size_t keep) noexcept {
    std::size_t drop = 0;
    while (drop < entries_.size() && bytes_ > keep) {
      unmap(entries_[drop]);
      bytes_ -= entries_[drop].bytes;
      counters().live -= entries_[drop].counted;
      recompute_held() -= entries_[drop].counted;
      ++drop;
    }
    entries_.erase(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(drop));
  }
  std::size_t bytes() const noexcept { return bytes_; }
  /// Unmaps every entry and forgets the largest park().
  void clear() noexcept {
    trim(0);
    largest_ = 0;
  }

 private:
  struct Entry {
    std::byte* pages;
    std::size_t bytes;
    std::int64_t counted;
  };
  static void unmap(const Entry& e) noexcept {
#if defined(__linux__)
    ::munmap(e.pages, e.bytes);
#else
    (void)e;
#endif
  }
  std::vector<Entry> entries_;
  std::size_t bytes_ = 0, largest_ = 0;
};

/// The calling thread's pool (its pages are unmapped when the thread ends).
inline PagePool& page_pool() {
  thread_local PagePool pool;
  return pool;
}

}  // namespace detail

/// Whether this system moves pages between mappings (Linux 5.7 or later: mremap with
/// MREMAP_DONTUNMAP, tried once). Where not, park() gives pages back to the system.
inline bool pages_can_move() {
#if defined(__linux__)
  static const bool can = [] {
    const std::size_t page = page_size();
    void* p = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    static_cast<volatile char*>(p)[0] = 1;
    // (The kernel reads a new address with MREMAP_DONTUNMAP, as a hint: pass one, null. Left out,
    // the variadic argument is whatever the register holds, and an unaligned one is EINVAL.)
    void* q = ::mremap(p, page, page, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, nullptr);
    const bool moved = q != MAP_FAILED && static_cast<volatile char*>(q)[0] == 1;
    if (q != MAP_FAILED) ::munmap(q, page);
    ::munmap(p, page);
    return moved;
  }();
  return can;
#else
  return false;
#endif
}

/// Bytes of parked pages the calling thread holds (waiting for the next recomputed block).
inline std::size_t parked_bytes() { return detail::page_pool().bytes(); }
/// Gives the calling thread's parked pages back to the system (after training with recomputed
/// blocks, before other work on this thread; the next recomputed block faults pages in again).
inline void release_parked() { detail::page_pool().clear(); }

/// The resource of one recomputed block: see the file comment. Make it with std::make_shared.
class RecomputeMemory final : public Resource {
 public:
  RecomputeMemory() = default;
  RecomputeMemory(const RecomputeMemory&) = delete;
  RecomputeMemory& operator=(const RecomputeMemory&) = delete;

  std::string name() const override { return "recompute"; }

  /// Moves the pages of every block except the ones whose data starts at a pointer of `keep`
  /// (null entries ignored) into the calling thread's pool. Returns the bytes moved.
  std::size_t park(std::initializer_list<const void*> keep) {
    const std::lock_guard lock(mutex_);
    std::size_t moved = 0;
    detail::PagePool& pool = detail::page_pool();
    [[maybe_unused]] const bool movable = pages_can_move();
    for (Block& b : blocks_) {
      if (b.parked || std::find(keep.begin(), keep.end(), static_cast<const void*>(b.data)) != keep.end()) continue;
#if defined(__linux__)
      void* pages =
          movable ? ::mremap(b.data, b.bytes, b.bytes, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, nullptr) : MAP_FAILED;
      if (pages != MAP_FAILED) {
        pool.put(static_cast<std::byte*>(pages), b.bytes, b.counted);
      } else {
        ::madvise(b.data, b.bytes, MADV_DONTNEED);  // a kernel before 5.7: given back, faulted in again
        counters().live -= b.counted;
        detail::recompute_held() -= b.counted;
      }
#endif
      b.parked = true;
      moved += b.bytes;
    }
    if (moved) pool.parked(moved);
    return moved;
  }

  /// Puts pages under every parked block: pages of its size from the calling thread's pool, moved
  /// without a copy, where there are some; else the block gets zero pages as it is written.
  void unpark() {
    const std::lock_guard lock(mutex_);
    detail::PagePool& pool = detail::page_pool();
    Counters& c = counters();
    for (Block& b : blocks_) {
      if (!b.parked) continue;
      std::int64_t counted = 0;  // what the counters hold for the pages it gets (none: new pages)
#if defined(__linux__)
      if (std::byte* pages = pool.take(b.bytes, counted)) {
        if (::mremap(pages, b.bytes, b.bytes, MREMAP_MAYMOVE | MREMAP_FIXED, b.data) == MAP_FAILED) {
          ::munmap(pages, b.bytes);  // the block keeps its empty mapping
          c.live -= counted;
          detail::recompute_held() -= counted;
          counted = 0;
        }
      }
#endif
      b.parked = false;
      c.live += b.counted - counted;
      detail::recompute_held() += b.counted - counted;
    }
    c.peak = std::max(c.peak, c.live);
  }

  /// Bytes of the blocks' data pages backed by memory now (Linux: mincore; elsewhere all of it).
  std::size_t resident_bytes() const {
    const std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const Block& b : blocks_) {
#if defined(__linux__)
      const std::size_t page = page_size(), pages = b.bytes / page;
      std::vector<unsigned char> in(pages);
      if (::mincore(b.data, b.bytes, in.data()) != 0) {
        n += b.bytes;
        continue;
      }
      for (unsigned char v : in) n += (v & 1u) * page;
#else
      n += b.bytes;
#endif
    }
    return n;
  }
  /// Blocks that can be parked (the large ones).
  std::size_t blocks() const {
    const std::lock_guard lock(mutex_);
    return blocks_.size();
  }

 protected:
  void* do_allocate(std::size_t bytes) override {
    if (!pageable(bytes)) {
      detail::recompute_allocated() += static_cast<std::int64_t>(bytes - std::min(bytes, alignment));
      return ::operator new (bytes, std::align_val_t{alignment});
    }
#if defined(__linux__)
    // [header page: the allocator's header in its last 64 bytes][data pages], the data aligned to
    // 2 MiB when it spans one (mremap then moves whole page tables).
    const std::size_t page = page_size(), data_bytes = round_up(bytes - alignment, page);
    const std::size_t align = data_bytes >= huge ? huge : page;
    const std::size_t total = page + data_bytes + (align - page);
    void* raw = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    auto* const first = static_cast<std::byte*>(raw);
    auto* const data = first +
                       round_up(static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(first)) + page, align) -
                       reinterpret_cast<std::uintptr_t>(first);
    std::byte* const base = data - page;
    if (base > first) ::munmap(first, static_cast<std::size_t>(base - first));
    if (first + total > data + data_bytes)
      ::munmap(data + data_bytes, static_cast<std::size_t>(first + total - (data + data_bytes)));
    // A new block takes parked pages of its size too (a first step then holds one block's pages,
    // not one plus the pool's): they are counted already, as the allocator counts the block.
    std::int64_t counted = 0;
    if (std::byte* pages = pages_can_move() ? detail::page_pool().take(data_bytes, counted) : nullptr) {
      if (::mremap(pages, data_bytes, data_bytes, MREMAP_MAYMOVE | MREMAP_FIXED, data) == MAP_FAILED)
        ::munmap(pages, data_bytes);
      counters().live -= counted;
      detail::recompute_held() -= counted;
    }
    const std::lock_guard lock(mutex_);
    blocks_.push_back({data, data_bytes, static_cast<std::int64_t>(bytes - alignment), false});
    detail::recompute_allocated() += static_cast<std::int64_t>(bytes - alignment);
    detail::recompute_held() += static_cast<std::int64_t>(bytes - alignment);
    return data - alignment;
#else
    return ::operator new (bytes, std::align_val_t{alignment});
#endif
  }
  void do_deallocate(void* p, std::size_t bytes) noexcept override {
    if (!pageable(bytes)) {
      ::operator delete (p, std::align_val_t{alignment});
      return;
    }
#if defined(__linux__)
    auto* const data = static_cast<std::byte*>(p) + alignment;
    const std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < blocks_.size(); ++i)
      if (blocks_[i].data == data) {
        // A parked block's pages are the pool's (still counted); the allocator takes its bytes out.
        if (blocks_[i].parked)
          counters().live += blocks_[i].counted;
        else
          detail::recompute_held() -= blocks_[i].counted;
        ::munmap(data - page_size(), page_size() + blocks_[i].bytes);
        blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
#endif
  }

 private:
  static constexpr std::size_t huge = std::size_t{1} << 21;
  static std::size_t round_up(std::size_t n, std::size_t to) noexcept { return (n + to - 1) / to * to; }
  static bool pageable(std::size_t bytes) noexcept {
#if defined(__linux__)
    return bytes >= 4 * page_size() + alignment;
#else
    (void)bytes;
    return false;
#endif
  }

  struct Block {
    std::byte* data;       // page-aligned start of the elements
    std::size_t bytes;     // data pages' length
    std::int64_t counted;  // bytes memory::counters() counts for it
    bool parked;
  };
  mutable std::mutex mutex_;
  std::vector<Block> blocks_;
};

}  // namespace xtrain::memory
