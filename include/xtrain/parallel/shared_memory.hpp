#pragma once
/// \file shared_memory.hpp
/// Sums between the processes of one machine through a POSIX shared-memory segment: the segment
/// (create, map, unlink), a barrier of per-process arrival counters, and the collectives that
/// MpiAllReduce runs over it. Nothing here includes MPI: parallel/mpi/node_reducer.hpp finds the processes of
/// a node, shares the segment's name, and adds the MPI step between nodes.

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <thread>
#include <utility>

#include "xtrain/parallel/communicator.hpp"

namespace xtrain::parallel::shm {

/// Spins until `done()`; yields after a while (an oversubscribed peer must get the core) and
/// calls `expired()`, which must not return, once `timeout` has passed.
template <class Done, class Expired>
void spin_until(Done&& done, std::chrono::duration<double> timeout, Expired&& expired) {
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t spins = 0;; ++spins) {
    if (done()) return;
    if (spins > 2000) std::this_thread::yield();
    if ((spins & 255) == 0 && std::chrono::steady_clock::now() - start > timeout) expired();
  }
}

/// A POSIX shared-memory segment mapped into this process; unmapped on destruction.
class Segment {
 public:
  /// Creates the segment `name` of `bytes`, reserved with posix_fallocate (a full /dev/shm is an
  /// error now, not a SIGBUS at first touch). Returns 0 or the errno.
  static int create(const char* name, std::size_t bytes) noexcept {
    const int fd = ::shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return errno;
    const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    ::close(fd);
    return err;
  }
  /// Removes the name (mappings stay valid; the memory goes with the last one).
  static void unlink(const char* name) noexcept { ::shm_unlink(name); }

  Segment() = default;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment() { unmap(); }

  /// Maps the existing segment `name` of `bytes`. Returns 0 or the errno.
  int map(const char* name, std::size_t bytes) noexcept {
    unmap();
    const int fd = ::shm_open(name, O_RDWR, 0600);
    if (fd < 0) return errno;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = p == MAP_FAILED ? errno : 0;
    ::close(fd);
    if (err == 0) {
      data_ = static_cast<char*>(p);
      bytes_ = bytes;
    }
    return err;
  }
  void unmap() noexcept {
    if (data_) ::munmap(data_, bytes_);
    data_ = nullptr;
  }
  char* data() const noexcept { return data_; }

 private:
  char* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// The collectives over a mapped segment shared by the `ranks` processes of a node (this one is
/// `local`). Layout: one arrival counter per rank (own cache line), two sets of scratch slots
/// (other vectors are copied through them in chunks; alternate chunks use alternate sets, so a
/// rank may start the next while a slower one still copies out of the last), one gradient slot
/// per rank (the Engine trains with its gradients there: no copy in) and, for the sharded
/// optimizer, one parameter slot per rank (the all-gather of the stepped blocks reads them in
/// place). A sum is a reduce-scatter and an allgather: rank l adds block l over the slots in rank
/// order and publishes it, every rank copies the other blocks; every rank ends with the same bits.
class NodeSums {
 public:
  /// Called when a wait runs out: names the collective and ends the job (must not return).
  using Expired = void (*)(const char* what, std::size_t count, std::chrono::duration<double> timeout);
  /// One collective's name (for the timeout report) and bound on its waits.
  struct Call {
    const char* what;
    std::chrono::duration<double> timeout;
  };

  /// Bytes of the segment for `ranks` ranks with gradient slots of `gradients` floats and
  /// parameter slots of `parameters` floats (0: none).
  static std::size_t bytes(std::size_t ranks, std::size_t gradients, std::size_t parameters) noexcept {
    return Layout(ranks, gradients, parameters).bytes;
  }

  NodeSums() = default;
  /// Over a segment of bytes(ranks, gradients, parameters) at `base`, zero-filled or with this
  /// rank's counter not yet used; every rank must construct before any rank's first collective.
  NodeSums(char* base, std::size_t ranks, std::size_t local, std::size_t gradients, std::size_t parameters,
           Expired expired)
      : base_(base), ranks_(ranks), local_(local), expired_(expired), layout_(ranks, gradients, parameters) {
    new (&flag(local_)) Flag{};
  }

  /// This rank's gradient slot (empty if none was asked for).
  std::span<float> gradient_slot() noexcept { return {grad_slot(local_), layout_.grad_len}; }
  /// This rank's parameter slot (empty if none was asked for).
  std::span<float> parameter_slot() noexcept { return {param_slot(local_), layout_.param_len}; }

  /// In-place sum of `v` over the node's ranks; `across(block, n)` then sums this rank's block
  /// with the other nodes (no-op on one node). Every rank passes the same size (and, within the
  /// gradient slot, the same offset).
  template <class Across>
  void allreduce(std::span<float> v, Call call, Across&& across) {
    call_ = call;
    count_ = v.size();
    if (const std::ptrdiff_t off = offset_in_slot(v); off >= 0) {
      float* slots = grad_slot(0) + off;     // no copy in; the third barrier keeps a rank from
      float* own = grad_slot(local_) + off;  // writing its slot (next backward) while a peer
      arrive_and_wait();                     // still copies a block out of it
      const auto [lo, hi] = block(v.size(), local_);
      sum_block(slots, layout_.grad_len, lo, hi, own + lo);
      across(own + lo, hi - lo);
      arrive_and_wait();
      copy_other_blocks(slots, layout_.grad_len, v.size(), own);
      arrive_and_wait();
      return;
    }
    const std::size_t chunk = layout_.chunk;
    for (std::size_t off = 0; off < v.size(); off += chunk) {
      const std::size_t m = std::min(chunk, v.size() - off);
      float* set = next_scratch_set();
      float* mine = v.data() + off;
      std::memcpy(set + local_ * chunk, mine, m * sizeof(float));
      arrive_and_wait();
      const auto [lo, hi] = block(m, local_);
      sum_block(set, chunk, lo, hi, mine + lo);
      across(mine + lo, hi - lo);
      std::memcpy(set + local_ * chunk + lo, mine + lo, (hi - lo) * sizeof(float));
      arrive_and_wait();
      copy_other_blocks(set, chunk, m, mine);
    }
  }

  /// `v` within this rank's gradient slot, size a multiple of ranks: block `local` (equal
  /// blocks) of `v` becomes the sum over the node's ranks, in rank order; the rest of `v` is left
  /// as it was. False (nothing done) when `v` is elsewhere.
  bool reduce_scatter(std::span<float> v, Call call) {
    const std::ptrdiff_t off = offset_in_slot(v);
    if (off < 0 || v.size() % ranks_ != 0) return false;
    call_ = call;
    count_ = v.size();
    const std::size_t b = v.size() / ranks_;
    arrive_and_wait();
    sum_block(grad_slot(0) + off, layout_.grad_len, local_ * b, (local_ + 1) * b, v.data() + local_ * b);
    arrive_and_wait();  // every peer has read this rank's slot: it may be written again
    return true;
  }

  /// Of the elements [lo, hi) of `v`, those in block `local` (equal blocks of `b` elements) become
  /// the sum over the node's ranks, in rank order; the others are left as they were. Through the
  /// scratch slots, a chunk at a time (ZeRO-2's gradient buckets): a rank copies in only what
  /// its peers sum, and reads its own part of the sum where it is.
  void reduce_scatter_range(std::span<float> v, std::size_t lo, std::size_t hi, std::size_t b, Call call) {
    call_ = call;
    count_ = hi - lo;
    const std::size_t chunk = layout_.chunk, mine = local_ * b, end = mine + b;
    for (std::size_t off = lo; off < hi; off += chunk) {
      const std::size_t m = std::min(chunk, hi - off);
      const std::size_t a = std::clamp(mine, off, off + m), e = std::clamp(end, off, off + m);
      float* set = next_scratch_set();
      float* in = set + local_ * chunk;  // element off + i of v at in[i]
      std::memcpy(in, v.data() + off, (a - off) * sizeof(float));
      std::memcpy(in + (e - off), v.data() + e, (off + m - e) * sizeof(float));
      arrive_and_wait();  // alternate sets: the next chunk's copy-in cannot meet this one's readers
      if (e > a)          // (in place: sum_in_rank_order reads a tile of every rank before writing it)
        sum_in_rank_order([&](std::size_t k) { return k == local_ ? v.data() + off : set + k * chunk; }, ranks_,
                          a - off, e - off, v.data() + a);
    }
  }

  /// Every rank's block `local` (equal blocks; size a multiple of ranks) of `v` copied into
  /// every rank's `v`: read in place from the peers' parameter slots when `v` is in this rank's
  /// (every rank passes the same offset), else through the scratch slots.
  void allgather(std::span<float> v, Call call) {
    call_ = call;
    count_ = v.size();
    const std::size_t b = v.size() / ranks_, chunk = layout_.chunk;
    if (const std::ptrdiff_t off = offset_in(v, param_slot(local_), layout_.param_len); off >= 0) {
      arrive_and_wait();  // every rank has written its block
      for (std::size_t k = 0; k < ranks_; ++k)
        if (k != local_) std::memcpy(v.data() + k * b, param_slot(k) + off + k * b, b * sizeof(float));
      arrive_and_wait();  // every peer has read this rank's block: it may be written again
      return;
    }
    for (std::size_t off = 0; off < b; off += chunk) {
      const std::size_t m = std::min(chunk, b - off);
      float* set = next_scratch_set();
      std::memcpy(set + local_ * chunk, v.data() + local_ * b + off, m * sizeof(float));
      arrive_and_wait();  // alternate sets: the next chunk's copy-in cannot meet this one's readers
      for (std::size_t k = 0; k < ranks_; ++k)
        if (k != local_) std::memcpy(v.data() + k * b + off, set + k * chunk, m * sizeof(float));
    }
  }

 private:
  struct alignas(64) Flag {
    std::atomic<std::uint64_t> arrived{0};
  };
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "process-shared flags need lock-free atomics");

  struct Layout {
    Layout() = default;
    Layout(std::size_t ranks, std::size_t gradients, std::size_t parameters)
        : chunk(std::max<std::size_t>(16384, (std::size_t{1} << 20) / ranks) / 64 * 64),  // 4 MB per set
          grad_len((gradients + 15) / 16 * 16),
          param_len((parameters + 15) / 16 * 16),
          grads_at(ranks * sizeof(Flag) + 2 * ranks * chunk * sizeof(float)),
          params_at(grads_at + ranks * grad_len * sizeof(float)),
          bytes(params_at + ranks * param_len * sizeof(float)) {}
    std::size_t chunk = 0, grad_len = 0, param_len = 0, grads_at = 0, params_at = 0, bytes = 0;
  };

  Flag& flag(std::size_t k) noexcept { return reinterpret_cast<Flag*>(base_)[k]; }
  float* next_scratch_set() noexcept {
    return reinterpret_cast<float*>(base_ + ranks_ * sizeof(Flag)) + (chunks_++ & 1) * ranks_ * layout_.chunk;
  }
  float* grad_slot(std::size_t k) noexcept {
    return reinterpret_cast<float*>(base_ + layout_.grads_at) + k * layout_.grad_len;
  }
  float* param_slot(std::size_t k) noexcept {
    return reinterpret_cast<float*>(base_ + layout_.params_at) + k * layout_.param_len;
  }
  // Position of `v` in the slot of `len` floats at `slot`, -1 if it is not inside it.
  static std::ptrdiff_t offset_in(std::span<float> v, const float* slot, std::size_t len) noexcept {
    return len && v.data() >= slot && v.data() + v.size() <= slot + len ? v.data() - slot : -1;
  }
  std::ptrdiff_t offset_in_slot(std::span<float> v) noexcept {
    return offset_in(v, grad_slot(local_), layout_.grad_len);
  }

  /// Block k of m values: equal multiples of 16 values (64 bytes), the last one shorter.
  std::pair<std::size_t, std::size_t> block(std::size_t m, std::size_t k) const noexcept {
    const std::size_t b = ((m + ranks_ - 1) / ranks_ + 15) / 16 * 16;
    return {std::min(k * b, m), std::min((k + 1) * b, m)};
  }

  // out[0, hi - lo) = elements [lo, hi) of slot 0 + slot 1 + ... (slot k at slots + k * stride)
  void sum_block(const float* slots, std::size_t stride, std::size_t lo, std::size_t hi, float* out) noexcept {
    sum_in_rank_order([&](std::size_t k) { return slots + k * stride; }, ranks_, lo, hi, out);
  }

  void copy_other_blocks(const float* slots, std::size_t stride, std::size_t m, float* out) noexcept {
    for (std::size_t k = 0; k < ranks_; ++k) {
      const auto [b, e] = block(m, k);
      if (k != local_ && e > b) std::memcpy(out + b, slots + k * stride + b, (e - b) * sizeof(float));
    }
  }

  // Node barrier: publish this rank's arrival count, wait until every rank's has reached it.
  void arrive_and_wait() {
    const std::uint64_t epoch = ++epoch_;
    flag(local_).arrived.store(epoch, std::memory_order_release);
    for (std::size_t k = 0; k < ranks_; ++k)
      spin_until([&] { return flag(k).arrived.load(std::memory_order_acquire) >= epoch; }, call_.timeout,
                 [&] { expired_(call_.what, count_, call_.timeout); });
  }

  char* base_ = nullptr;
  std::size_t ranks_ = 1, local_ = 0, count_ = 0;
  Expired expired_ = nullptr;
  Layout layout_;
  std::uint64_t epoch_ = 0, chunks_ = 0;
  Call call_{"", std::chrono::seconds(300)};
};

}  // namespace xtrain::parallel::shm
