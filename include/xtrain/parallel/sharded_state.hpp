#pragma once
/// \file sharded_state.hpp
/// The optimizer state of a sharded step (ShardedSync) in a checkpoint's layout: each state
/// vector of the full state is the ranks' parts one after the other, so that a checkpoint saved on
/// N ranks loads on any other count. ShardedState places this rank's parts (for its shard file),
/// gathers the full state from every rank's parts, and cuts this rank's parts out of a full state.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "xtrain/core/error.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/gradient_sync.hpp"

namespace xtrain::parallel::detail {

template <Communicator C>
class ShardedState {
 public:
  /// Buffers from `memory`; `comm` and `memory` must outlive this object.
  ShardedState(C& comm, memory::Resource& memory) : comm_(&comm), memory_(&memory) {}

  /// This rank's parts of the state's vectors (`mine`), each placed where it starts in the
  /// checkpoint's layout. Collective.
  template <class Optimizer>
  std::vector<StatePiece> pieces(typename Optimizer::State& mine) {
    std::vector<StatePiece> out;
    for (const Part& p : parts_of<Optimizer>(mine)) out.push_back({p.data, offsets(p)[comm_->rank()], p.count, p.elem});
    return out;
  }

  /// Calls f(state) with the full state (`make_full()`: the optimizer's state for the unpadded
  /// arena), each vector gathered from the ranks' parts and cut to its length. Collective.
  template <class Optimizer, class MakeFull, class F>
  void with_full(typename Optimizer::State& mine, MakeFull&& make_full, F&& f) {
    const memory::Use use(*memory_);  // the state's copy and the buffers
    typename Optimizer::State full = make_full();
    const std::vector<Part> parts = parts_of<Optimizer>(mine), wholes = parts_of<Optimizer>(full);
    for (std::size_t i = 0; i < parts.size(); ++i) gather(parts[i], wholes[i]);
    f(full);
  }

  /// `mine` (the state this rank keeps) filled from a full state in the checkpoint's layout
  /// (zeros where it is shorter). Collective.
  template <class Optimizer>
  typename Optimizer::State take(typename Optimizer::State full, typename Optimizer::State mine) {
    const std::vector<Part> parts = parts_of<Optimizer>(mine), wholes = parts_of<Optimizer>(full);
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const Part& p = parts[i];
      const std::size_t bytes = p.count * p.elem, from = offsets(p)[comm_->rank()] * p.elem,
                        whole = wholes[i].count * p.elem, n = from < whole ? std::min(bytes, whole - from) : 0;
      if (n) std::memcpy(p.data, wholes[i].data + from, n);
      if (bytes > n) std::memset(p.data + n, 0, bytes - n);  // (an empty vector's data() may be null)
    }
    return mine;
  }

 private:
  // A state vector as bytes: its elements, their count and size, whether they are floats.
  struct Part {
    std::byte* data;
    std::size_t count, elem;
    bool floats;
  };
  template <class Optimizer>
  static std::vector<Part> parts_of(typename Optimizer::State& s) {
    std::vector<Part> parts;
    Optimizer::visit_state(s, [&](auto& v) {
      using T = typename std::remove_cvref_t<decltype(v)>::value_type;
      static_assert(std::is_trivially_copyable_v<T>);
      parts.push_back({reinterpret_cast<std::byte*>(v.data()), v.size(), sizeof(T), std::is_same_v<T, float>});
    });
    return parts;
  }
  // Where each rank's part starts in the full vector (in elements), the total last.
  std::vector<std::size_t> offsets(const Part& p) {
    std::vector<double> counts(comm_->size(), 0.0);
    counts[comm_->rank()] = static_cast<double>(p.count);
    comm_->allreduce_sum(std::span<double>(counts), "optimizer state sizes");
    std::vector<std::size_t> at(counts.size() + 1, 0);
    for (std::size_t r = 0; r < counts.size(); ++r) at[r + 1] = at[r] + static_cast<std::size_t>(counts[r]);
    return at;
  }
  // Fills `whole` with the ranks' parts in rank order: equal parts are all-gathered as raw bits
  // (allgather_blocks copies), unequal ones (fp32 only) summed into zeros.
  void gather(const Part& mine, const Part& whole) {
    const std::vector<std::size_t> at = offsets(mine);
    const std::size_t ranks = comm_->size(), total = at.back() * mine.elem, want = whole.count * mine.elem;
    bool equal = true;
    for (std::size_t r = 0; r < ranks; ++r) equal = equal && at[r + 1] - at[r] == mine.count;
    if (equal) {
      const std::size_t bytes = mine.count * mine.elem, floats = (bytes + sizeof(float) - 1) / sizeof(float);
      AlignedVector buffer(floats * ranks, 0.0f, memory::Allocator<float>(memory_));
      auto* b = reinterpret_cast<std::byte*>(buffer.data());
      if (bytes) std::memcpy(b + comm_->rank() * floats * sizeof(float), mine.data, bytes);
      comm_->allgather_blocks(buffer, "gather optimizer state");
      for (std::size_t r = 0, done = 0; bytes && r < ranks && done < want; ++r, done += bytes)
        std::memcpy(whole.data + done, b + r * floats * sizeof(float), std::min(bytes, want - done));
    } else {
      XTRAIN_CHECK(mine.floats, ValueError,
                   "ShardedSync: optimizer state vectors of other than float must have "
                   "the same length on every rank");
      AlignedVector buffer(at.back(), 0.0f, memory::Allocator<float>(memory_));
      if (mine.count) std::memcpy(buffer.data() + at[comm_->rank()], mine.data, mine.count * sizeof(float));
      comm_->allreduce_sum(std::span<float>(buffer), "gather optimizer state");
      if (std::min(total, want)) std::memcpy(whole.data, buffer.data(), std::min(total, want));
    }
    if (want > total) std::memset(whole.data + total, 0, want - total);
  }

  C* comm_;
  memory::Resource* memory_;
};

}  // namespace xtrain::parallel::detail
