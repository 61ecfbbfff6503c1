#pragma once
/// \file memory.hpp
/// Where buffers come from. A `memory::Resource` is a source of 64-byte aligned blocks: the
/// backend's (backend/cpu.hpp), or the process's `host()` one. Every Tensor, the parameter arena,
/// optimizer state and the layers' buffers allocate through `memory::Allocator`: from the resource
/// it was made with, when its owner names one (the engine's and the loader's buffers name the
/// backend's), else from the calling thread's current resource: `host()` unless a `memory::Use`
/// scope says otherwise (as std::pmr's default resource, but per thread and scoped). Code an
/// owner calls but does not own runs under such a scope at one place each (xtrain::forward and
/// backward for modules, through Context::memory; the engine for the loss and the optimizer's
/// state; the loader for a data set's gather), so the backend owns every buffer of a training. A
/// block remembers its resource and keeps it alive, so a tensor may outlive the backend it came
/// from.
///
/// Also counts the bytes each thread allocates and frees (`counters()`): what the profiler's
/// `profile_memory` reports per module, and what a memory check measures.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>  // madvise, mmap, mincore
#include <unistd.h>    // sysconf
#endif

#include "xtrain/core/error.hpp"

namespace xtrain::memory {

/// Storage of the calling thread, in bytes (what memory::Allocator allocated on it).
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

/// What a resource has handed out, over all threads. Blocks of memory::Allocator include its
/// 64-byte header.
struct Stats {
  std::int64_t allocations = 0;  ///< blocks allocated since the resource was made (never decreases)
  std::int64_t live = 0;         ///< bytes of the blocks not yet freed
  std::int64_t peak = 0;         ///< the highest `live` so far
};

/// A source of memory blocks aligned to `alignment` bytes, safe to use from several threads.
/// Create resources with std::make_shared (a block keeps its resource alive through it).
/// Implement do_allocate/do_deallocate; allocate/deallocate count the blocks (stats()).
class Resource : public std::enable_shared_from_this<Resource> {
 public:
  static constexpr std::size_t alignment = 64;

  virtual ~Resource() = default;
  /// A name for messages ("host").
  virtual std::string name() const = 0;

  /// A block of `bytes` bytes aligned to `alignment`; throws std::bad_alloc when there is none.
  void* allocate(std::size_t bytes) {
    void* p = do_allocate(bytes);
    if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0) {
      do_deallocate(p, bytes);
      throw ValueError("memory resource '" + name() + "' returned a block that is not " + std::to_string(alignment) +
                       "-byte aligned (kernels load them with aligned SIMD loads)");
    }
    allocations_.fetch_add(1, std::memory_order_relaxed);
    const std::int64_t live =
        live_.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed) + static_cast<std::int64_t>(bytes);
    std::int64_t peak = peak_.load(std::memory_order_relaxed);
    while (live > peak && !peak_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    return p;
  }
  /// Returns a block of allocate(bytes).
  void deallocate(void* p, std::size_t bytes) noexcept {
    live_.fetch_sub(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
    do_deallocate(p, bytes);
  }
  Stats stats() const noexcept {
    return {allocations_.load(std::memory_order_relaxed), live_.load(std::memory_order_relaxed),
            peak_.load(std::memory_order_relaxed)};
  }

 protected:
  virtual void* do_allocate(std::size_t bytes) = 0;
  virtual void do_deallocate(void* p, std::size_t bytes) noexcept = 0;

 private:
  std::atomic<std::int64_t> allocations_{0}, live_{0}, peak_{0};
};

/// Host memory from the global operator new (aligned). On Linux, blocks of 8 MiB or more (a
/// data set, a large model's arena) are aligned to 2 MiB and marked for transparent huge pages
/// (`madvise(MADV_HUGEPAGE)`; used where the kernel's THP setting is `madvise` or `always`): a
/// batch of random rows then misses the TLB once per 2 MiB instead of once per 4 KiB
/// (benchmarks/RESULTS.md: gathering a batch of 32 random Fashion-MNIST rows 14 -> 11 us).
class HostResource final : public Resource {
 public:
  std::string name() const override { return "host"; }

 protected:
  void* do_allocate(std::size_t bytes) override {
    const std::size_t align = huge_alignment(bytes);
    void* p = ::operator new (bytes, std::align_val_t{align});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (align == huge_page) ::madvise(p, bytes, MADV_HUGEPAGE);  // a hint: failure is harmless
#endif
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes) noexcept override {
    ::operator delete (p, std::align_val_t{huge_alignment(bytes)});
  }

 private:
  static constexpr std::size_t huge_page = std::size_t{1} << 21, huge_threshold = std::size_t{1} << 23;
  static constexpr std::size_t huge_alignment(std::size_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    return bytes >= huge_threshold ? huge_page : alignment;
#else
    (void)bytes;
    return alignment;
#endif
  }
};

/// The process's host resource: where buffers come from outside any backend's scope. Never
/// destroyed (a buffer may be freed during static destruction).
inline Resource& host() {
  static auto* const resource = new std::shared_ptr<Resource>(std::make_shared<HostResource>());
  return **resource;
}

namespace detail {
inline Resource*& current_slot() noexcept {
  thread_local Resource* current = nullptr;
  return current;
}
}  // namespace detail

/// The resource new blocks of the calling thread come from: the innermost Use's, else host().
inline Resource& current() {
  Resource* r = detail::current_slot();
  return r ? *r : host();
}

/// While it lives, blocks allocated on this thread come from `resource`. Scopes nest; destroy
/// them in reverse order of construction (as locals are). Requires: `resource` is owned by a
/// std::shared_ptr (made by std::make_shared), since each block keeps its resource alive.
class Use {
 public:
  explicit Use(Resource& resource) : Use(&resource) {}
  /// The same for a resource that may be absent: null keeps the calling thread's current one.
  explicit Use(Resource* resource) : previous_(detail::current_slot()) {
    if (!resource) return;
    XTRAIN_CHECK(!resource->weak_from_this().expired(), ValueError, "memory resource '", resource->name(),
                 "' is not owned by a std::shared_ptr: create it with std::make_shared (its blocks keep it alive)");
    detail::current_slot() = resource;
  }
  Use(const Use&) = delete;
  Use& operator=(const Use&) = delete;
  ~Use() { detail::current_slot() = previous_; }

 private:
  Resource* previous_;
};

namespace detail {
/// Stored before each block of Allocator: the resource it came from, kept alive. One alignment
/// unit long, so the data after it keeps the block's alignment (padded rather than over-aligned:
/// nvcc's front end cannot placement-new an over-aligned type).
struct BlockHeader {
  std::shared_ptr<Resource> owner;
  char padding[Resource::alignment - sizeof(std::shared_ptr<Resource>)];
};
static_assert(sizeof(BlockHeader) == Resource::alignment);
}  // namespace detail

/// The allocator of Tensor storage, the parameter arena, optimizer state and layer buffers: blocks
/// aligned to 64 bytes, each freed where it came from (its header keeps its resource), counted
/// into counters(). Blocks come from the resource it was made with (`Allocator<float>(&r)`: the
/// engine's own buffers name the backend's memory explicitly; the allocator then keeps the
/// resource alive), or, made without one, from the calling thread's current resource at the time
/// of the allocation. The resource goes with a container when it is copy- or move-constructed,
/// move-assigned or swapped; a copy-assigned container keeps its own. Any two allocators can free
/// each other's blocks: they compare equal.
template <class T>
struct Allocator {
  using value_type = T;
  using propagate_on_container_copy_assignment = std::false_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using is_always_equal = std::true_type;
  static_assert(alignof(T) <= Resource::alignment);

  Allocator() noexcept = default;
  /// Blocks from `resource` (null: the current resource at each allocation), which it keeps
  /// alive. Requires: a resource owned by a std::shared_ptr (std::make_shared).
  explicit Allocator(Resource* resource) : resource_(resource ? shared(*resource) : nullptr) {}
  template <class U>
  Allocator(const Allocator<U>& other) noexcept : resource_(other.shared_resource()) {}

  /// The resource it allocates from (null: the current one).
  Resource* resource() const noexcept { return resource_.get(); }
  const std::shared_ptr<Resource>& shared_resource() const noexcept { return resource_; }

  T* allocate(std::size_t n) {
    if (n > (std::size_t(-1) - sizeof(detail::BlockHeader)) / sizeof(T)) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    Resource& r = resource_ ? *resource_ : current();
    std::shared_ptr<Resource> owner = resource_ ? resource_ : shared(r);
    auto* block = static_cast<std::byte*>(r.allocate(bytes + sizeof(detail::BlockHeader)));
    new (block) detail::BlockHeader{std::move(owner), {}};
    Counters& c = counters();
    c.allocated += static_cast<std::int64_t>(bytes);
    c.live += static_cast<std::int64_t>(bytes);
    c.peak = std::max(c.peak, c.live);
    return reinterpret_cast<T*>(block + sizeof(detail::BlockHeader));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    const std::size_t bytes = n * sizeof(T);
    counters().live -= static_cast<std::int64_t>(bytes);
    auto* block = reinterpret_cast<std::byte*>(p) - sizeof(detail::BlockHeader);
    auto* header = std::launder(reinterpret_cast<detail::BlockHeader*>(block));
    const std::shared_ptr<Resource> owner = std::move(header->owner);
    header->~BlockHeader();
    owner->deallocate(block, bytes + sizeof(detail::BlockHeader));
  }
  template <class U>
  friend bool operator==(const Allocator&, const Allocator<U>&) noexcept {
    return true;
  }

 private:
  static std::shared_ptr<Resource> shared(Resource& r) {
    XTRAIN_CHECK(!r.weak_from_this().expired(), ValueError, "memory resource '", r.name(),
                 "' is not owned by a std::shared_ptr: create it with std::make_shared (its blocks keep it alive)");
    return r.shared_from_this();
  }

  std::shared_ptr<Resource> resource_;
};

/// The resource a block came from. Requires: `p` is the start of a block of memory::Allocator
/// (a Tensor's data(), an AlignedVector's data()), not null.
template <class T>
Resource& resource_of(const T* p) noexcept {
  const auto* block = reinterpret_cast<const std::byte*>(p) - sizeof(detail::BlockHeader);
  return *std::launder(reinterpret_cast<const detail::BlockHeader*>(block))->owner;
}

/// The system's page size in bytes (4096 off Linux).
inline std::size_t page_size() noexcept {
#if defined(__linux__)
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return page;
#else
  return 4096;
#endif
}

/// The size of a transparent huge page where the system gives them on request (Linux: 2 MiB on
/// x86-64, read from /sys/kernel/mm/transparent_hugepage/hpage_pmd_size; 0 where `enabled` there
/// says `[never]`), else 0.
inline std::size_t huge_page_size() noexcept {
#if defined(__linux__)
  static const std::size_t size = [] {
    std::size_t n = 0;
    char mode[128] = {};
    if (std::FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r")) {
      if (std::fgets(mode, sizeof mode, f) == nullptr) mode[0] = '\0';
      std::fclose(f);
    }
    if (std::string_view(mode).find("[never]") != std::string_view::npos) return n;
    if (std::FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r")) {
      unsigned long long v = 0;
      if (std::fscanf(f, "%llu", &v) == 1) n = static_cast<std::size_t>(v);
      std::fclose(f);
    }
    return n % page_size() == 0 ? n : 0;
  }();
  return size;
#else
  return 0;
#endif
}

/// Floats in pages of their own, zero at first, whose ranges can be given back to the system:
/// `release(begin, end)` zeroes them, and on Linux (an anonymous mapping, MADV_DONTNEED) the whole
/// pages inside take no memory until written again. What ZeRO-2 keeps its gradients in: backward
/// writes a bucket, the ranks reduce it, each releases what the others own. Elsewhere a plain
/// aligned block whose release writes zeros. Not counted by counters() (not tensor storage).
class PageBuffer {
 public:
  PageBuffer() = default;
  /// `n` floats, all zero. Throws std::bad_alloc when the system has no room.
  explicit PageBuffer(std::size_t n) : size_(n), bytes_(round_up(n * sizeof(float))) {
    if (n == 0) return;
#if defined(__linux__)
    const std::size_t huge = huge_page_size();
    if (huge > 0 && bytes_ >= 4 * huge) {  // (mapped with a huge page's slack, trimmed to its alignment)
      bytes_ = (bytes_ + huge - 1) / huge * huge;
      void* p = ::mmap(nullptr, bytes_ + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      auto* raw = static_cast<std::byte*>(p);
      const auto skip = (huge - reinterpret_cast<std::uintptr_t>(raw) % huge) % huge;
      if (skip > 0) ::munmap(raw, skip);
      if (huge - skip > 0) ::munmap(raw + skip + bytes_, huge - skip);
      data_ = reinterpret_cast<float*>(raw + skip);
      huge_ = ::madvise(data_, bytes_, MADV_HUGEPAGE) == 0;
      return;
    }
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<float*>(p);
#else
    data_ = static_cast<float*>(::operator new (bytes_, std::align_val_t{Resource::alignment}));
    std::fill_n(data_, size_, 0.0f);
#endif
  }
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  PageBuffer(PageBuffer&& o) noexcept { swap(o); }
  PageBuffer& operator=(PageBuffer&& o) noexcept {
    PageBuffer(std::move(o)).swap(*this);
    return *this;
  }
  ~PageBuffer() {
    if (!data_) return;
#if defined(__linux__)
    ::munmap(data_, bytes_);
#else
    ::operator delete (data_, std::align_val_t{Resource::alignment});
#endif
  }

  std::span<float> span() noexcept { return {data_, size_}; }
  std::size_t size() const noexcept { return size_; }

  /// Sets elements [begin, end) (clamped to size()) to zero, giving the whole pages among them
  /// back to the system; the partial pages at either end are written.
  void release(std::size_t begin, std::size_t end) noexcept {
    end = std::min(end, size_);
    if (begin >= end) return;
    auto* lo = reinterpret_cast<std::byte*>(data_ + begin);
    auto* hi = reinterpret_cast<std::byte*>(data_ + end);
#if defined(__linux__)
    auto* base = reinterpret_cast<std::byte*>(data_);
    const std::size_t page = page_size(), from = begin * sizeof(float), to = tail(end);
    std::byte* first = base + (from + page - 1) / page * page;  // whole pages: [first, last)
    std::byte* last = base + to / page * page;
    if (first < last && ::madvise(first, static_cast<std::size_t>(last - first), MADV_DONTNEED) == 0) {
      std::fill(lo, std::min(first, hi), std::byte{0});
      if (last < hi) std::fill(last, hi, std::byte{0});
      return;
    }
#endif
    std::fill(lo, hi, std::byte{0});
  }

  /// The values [begin, end) (clamped to size()) are no longer needed: the whole grains among them
  /// (huge pages where the buffer has them, else pages) are given back and read zero; the rest keep
  /// what they hold. Faster than release() where a later release() covers the range: a huge page
  /// at either end is not split into small ones (whose faults cost more).
  void discard(std::size_t begin, std::size_t end) noexcept {
#if defined(__linux__)
    end = std::min(end, size_);
    if (begin >= end) return;
    const std::size_t grain = this->grain(), from = begin * sizeof(float), to = tail(end),
                      first = (from + grain - 1) / grain * grain, last = to / grain * grain;
    if (first < last) ::madvise(reinterpret_cast<std::byte*>(data_) + first, last - first, MADV_DONTNEED);
#else
    (void)begin, (void)end;
#endif
  }

  /// What discard() gives back whole: a huge page where the buffer asked for them (Linux, at
  /// least four huge pages long: then its data also starts on one), else a page.
  std::size_t grain() const noexcept { return huge_ ? huge_page_size() : page_size(); }

  /// Bytes of the buffer backed by memory now (Linux: mincore, which also counts released pages
  /// that were read since, mapped to the system's zero page; elsewhere all of it).
  std::size_t resident_bytes() const {
#if defined(__linux__)
    if (!data_) return 0;
    const std::size_t page = page_size(), pages = bytes_ / page;
    std::vector<unsigned char> in(pages);
    if (::mincore(data_, bytes_, in.data()) != 0) return bytes_;
    std::size_t n = 0;
    for (unsigned char c : in) n += c & 1u;
    return n * page;
#else
    return bytes_;
#endif
  }

 private:
  // The byte where the elements [..., end) end; with the last element, the buffer's end (a
  // huge page's rest past size() is given back with it).
  std::size_t tail(std::size_t end) const noexcept { return end == size_ ? bytes_ : end * sizeof(float); }
  static std::size_t round_up(std::size_t bytes) noexcept {
    const std::size_t page = page_size();
    return (bytes + page - 1) / page * page;
  }
  void swap(PageBuffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(bytes_, o.bytes_);
    std::swap(huge_, o.huge_);
  }

  float* data_ = nullptr;
  std::size_t size_ = 0, bytes_ = 0;
  bool huge_ = false;  // transparent huge pages asked for
};

}  // namespace xtrain::memory

namespace xtrain {
/// Aligned fp32 storage (memory::Allocator: counted, from a resource) for the parameter arena and
/// the optimizer state.
using AlignedVector = std::vector<float, memory::Allocator<float>>;
/// Bytes from memory::Allocator: the 8-bit optimizers' quantized state.
using ByteVector = std::vector<std::uint8_t, memory::Allocator<std::uint8_t>>;
}  // namespace xtrain
