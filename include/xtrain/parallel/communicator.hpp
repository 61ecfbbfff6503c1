#pragma once
/// \file communicator.hpp
/// The Communicator contract (a policy template parameter of the Trainer) and the type-erased
/// view of it that layers needing collectives (SyncBatchNorm) receive through the Context.

#include <concepts>
#include <cstddef>
#include <span>
#include <string>

#include "xtrain/core/context.hpp"

namespace xtrain::parallel {

/// Gradients on the wire: fp32 (none), or rounded to bf16/fp16 (half the bytes) and summed in
/// fp32 on arrival. Each rank's gradient is already its share of the global mean (the loss is
/// normalised by the global sample count): the values sent are the pre-divided ones, and the sum
/// cannot overflow where the mean does not.
enum class Compression { none, bf16, fp16 };

/// "none", "bf16", "fp16".
constexpr const char* compression_name(Compression c) noexcept {
  return c == Compression::bf16 ? "bf16" : c == Compression::fp16 ? "fp16" : "none";
}

/// out[i - lo] = src(0)[i] + src(1)[i] + ... + src(ranks - 1)[i] for i in [lo, hi): the ranks'
/// values added in rank order, so every rank that computes an element gets the same bits
/// (`src(k)`: rank k's values). `out` may be one of the sources (a tile is read from every rank
/// before it is written). The summing step of the reduce-scatters of ThreadAllReduce and of the
/// shared-memory path of MpiAllReduce.
template <class T, class Src>
void sum_in_rank_order(Src&& src, std::size_t ranks, std::size_t lo, std::size_t hi, T* out) noexcept {
  constexpr std::size_t tile = 64;
  T acc[tile];
  for (std::size_t i0 = lo; i0 < hi; i0 += tile) {
    const std::size_t n = hi - i0 < tile ? hi - i0 : tile;
    const T* first = src(std::size_t{0}) + i0;
    for (std::size_t j = 0; j < n; ++j) acc[j] = first[j];
    for (std::size_t k = 1; k < ranks; ++k) {
      const T* s = src(k) + i0;
      for (std::size_t j = 0; j < n; ++j) acc[j] += s[j];
    }
    for (std::size_t j = 0; j < n; ++j) out[i0 - lo + j] = acc[j];
  }
}

/// Optional: a communicator that can compress gradient reductions (`gradient_compression()`,
/// `allreduce_gradients(span, name)`: a blocking sum over ranks in the compressed form).
template <class C>
concept CompressesGradients = requires(C& c, std::span<float> f) {
  { c.gradient_compression() } -> std::same_as<Compression>;
  c.allreduce_gradients(f, "name");
};

/// Optional: a communicator that reduce-scatters part of a buffer:
/// `reduce_scatter_range(buffer, lo, hi, name)`, `buffer` cut into size() equal blocks as for
/// reduce_scatter_sum; of the elements [lo, hi), those in block rank() become the sum over ranks,
/// the others are unspecified (every rank passes the same size, lo and hi). ZeRO-2 reduces each
/// gradient bucket so; a communicator without it gets the bucket all-reduced (twice the traffic).
template <class C>
concept ReduceScattersRanges = requires(C& c, std::span<float> f, std::size_t i) {
  c.reduce_scatter_range(f, i, i, "name");
};

/// Optional: a non-blocking reduce_scatter_range: `ireduce_scatter_range(buffer, lo, hi, name)`
/// returns a Request (poll with test(), complete with wait()); once complete, this rank's
/// elements of [lo, hi) hold their sums in place. ZeRO-2 overlaps its buckets' reductions with
/// backward through it.
template <class C>
concept IReduceScattersRanges = requires(C& c, std::span<float> f, std::size_t i) {
  { c.ireduce_scatter_range(f, i, i, "name") } -> std::same_as<typename C::Request>;
};

/// Optional: a communicator that gathers part of a buffer and exchanges blocks of it:
/// `allgather_range(buffer, lo, hi, name)` (of the elements [lo, hi), each rank's part in its
/// block rank() copied to every rank; `buffer` cut into size() equal blocks as for
/// allgather_blocks) and `exchange_range(buffer, lo, hi, out, name)` (an all-to-all: `out` gets,
/// rank by rank, every rank's values of [lo, hi) that fall in this rank's block). ZeRO-3 gathers
/// a unit's parameters with the first; the deterministic reduction under ZeRO sums what the
/// second brings in a fixed tree.
template <class C>
concept GathersRanges = requires(C& c, std::span<float> f, std::span<const float> cf, std::size_t i) {
  c.allgather_range(f, i, i, "name");
  c.exchange_range(cf, i, i, f, "name");
};

/// Optional: allgather_range without blocking (`iallgather_range(buffer, lo, hi, name)` ->
/// Request, completed by wait): ZeRO-3 gathers the next unit so while the current one computes.
template <class C>
concept IGathersRanges = requires(C& c, std::span<float> f, std::size_t i) {
  { c.iallgather_range(f, i, i, "name") } -> std::same_as<typename C::Request>;
};

/// Buffers a communicator provides in memory its peers read (MpiAllReduce's node segment): the
/// Engine moves its gradients (and, sharded, its parameters) there so that collectives read them
/// in place. An empty span: keep the arena's own buffer.
struct NodeStorage {
  std::span<float> gradients, parameters;
};

/// Optional: a communicator that offers such buffers (`node_storage(n, parameters)`, collective).
template <class C>
concept ProvidesNodeStorage = requires(C& c, std::size_t n, bool p) {
  { c.node_storage(n, p) } -> std::same_as<NodeStorage>;
};

/// Communicator: rank()/size(); in-place sums over ranks of float and double spans; broadcast
/// from rank 0 (spans and a string); allgather of equal-sized float blocks; barrier; and a
/// non-blocking float sum (`iallreduce_sum` -> Request, `test`, `wait`) for gradient buckets;
/// `duplicate()`: another handle on the same ranks; for the sharded optimizer step,
/// `reduce_scatter_sum(buffer)` (buffer = size() equal blocks; afterwards block rank() holds the sum
/// over ranks of that block, the other blocks are unspecified) and `allgather_blocks(buffer)`
/// (every rank's block rank() copied to every rank).
/// Every collective is named (the name appears in timeout and mismatch reports).
template <class C>
concept Communicator = requires(C& c, const C& cc, std::span<float> f, std::span<double> d, std::span<const float> cf,
                                std::string& s, typename C::Request& r) {
  { cc.rank() } -> std::convertible_to<std::size_t>;
  { cc.size() } -> std::convertible_to<std::size_t>;
  c.allreduce_sum(f, "name");
  c.allreduce_sum(d, "name");
  c.broadcast(f, "name");
  c.broadcast(d, "name");
  c.broadcast(s, "name");
  c.allgather(cf, f, "name");
  c.barrier("name");
  { c.iallreduce_sum(f, "name") } -> std::same_as<typename C::Request>;
  { c.test(r) } -> std::convertible_to<bool>;
  c.wait(r);
  { c.duplicate() } -> std::same_as<C>;
  c.reduce_scatter_sum(f, "name");
  c.allgather_blocks(f, "name");
};

/// Fails compilation with a message naming the first missing group of Communicator members.
template <class C>
consteval bool check_communicator() {
  static_assert(
      requires(const C& c) {
        { c.rank() } -> std::convertible_to<std::size_t>;
        { c.size() } -> std::convertible_to<std::size_t>;
      },
      "xtrain: the Communicator policy is not a Communicator (SingleProcess, parallel::ThreadAllReduce, "
      "parallel::MpiAllReduce): it has no const members `rank()` and `size()` (the order: Trainer<Model, Optimizer, "
      "Precision, Communicator, Backend, Loss>, Accelerator<Precision, Communicator, Backend>)");
  static_assert(
      requires(C & c, std::span<float> f, std::span<double> d, std::span<const float> cf, std::string & s) {
        c.allreduce_sum(f, "name");
        c.allreduce_sum(d, "name");
        c.broadcast(f, "name");
        c.broadcast(d, "name");
        c.broadcast(s, "name");
        c.allgather(cf, f, "name");
        c.barrier("name");
      },
      "xtrain: this type is not a Communicator: it needs allreduce_sum (float and double spans), broadcast "
      "(float, double, std::string), allgather and barrier, each taking the collective's name last");
  static_assert(
      requires { typename C::Request; },
      "xtrain: this type is not a Communicator: it has no nested type `Request` (of iallreduce_sum)");
  static_assert(
      requires(C & c, std::span<float> f, typename C::Request & r) {
        { c.iallreduce_sum(f, "name") } -> std::same_as<typename C::Request>;
        { c.test(r) } -> std::convertible_to<bool>;
        c.wait(r);
      },
      "xtrain: this type is not a Communicator: it needs `Request iallreduce_sum(std::span<float>, const char*)`, "
      "`bool test(Request&)` and `wait(Request&)` (gradient buckets)");
  static_assert(
      requires(C & c) {
        { c.duplicate() } -> std::same_as<C>;
      },
      "xtrain: this type is not a Communicator: it has no member `C duplicate()` (another handle on the same ranks)");
  static_assert(Communicator<C>,
                "xtrain: this type is not a Communicator: it needs `reduce_scatter_sum(std::span<float>, const "
                "char*)` and `allgather_blocks(std::span<float>, const char*)` (the sharded optimizer step)");
  return Communicator<C>;
}

using xtrain::Collectives;

/// Adapts any Communicator to Collectives.
template <Communicator C>
class CollectivesOf final : public Collectives {
 public:
  explicit CollectivesOf(C& comm) : comm_(&comm) {}
  std::size_t size() const override { return comm_->size(); }
  void allreduce_sum(std::span<double> values, const char* name) override { comm_->allreduce_sum(values, name); }

 private:
  C* comm_;
};

}  // namespace xtrain::parallel
