#pragma once
/// \file mpi/node_reducer.hpp
/// detail::NodeReducer: the MPI side of the shared-memory float sums between the processes of a
/// node (parallel/shared_memory.hpp holds the MPI-free segment and collectives): finds the
/// node's ranks, shares the segment's name, agrees on whether it can be used, and runs the step
/// between nodes. Used by MpiAllReduce.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>

#include <mpi.h>

#include "xtrain/parallel/mpi/abort.hpp"
#include "xtrain/parallel/shared_memory.hpp"

namespace xtrain::parallel {

namespace detail {
/// Sums float vectors over the ranks of a node through a shared-memory segment
/// (shm::NodeSums), and across nodes with MPI (hierarchical: reduce-scatter in the node,
/// allreduce of each block between the ranks that own it on every node, allgather in the node).
/// This class does the MPI part: finds the node's ranks, shares the segment's name, agrees on
/// whether it can be used, and runs the step between nodes.
///
/// Why: Open MPI's allreduce between the processes of one node copies through its shared-memory
/// transport (single-copy reads by system call for large messages); here the peers' values are
/// read in place: a 100 KB sum is faster, a 3 MB one the same (benchmarks/RESULTS.md).
class NodeReducer {
 public:
  /// Collective over `comm`; `ranks_per_node` > 0 groups consecutive ranks (to exercise the
  /// multi-node path on one machine), 0 uses MPI's shared-memory node; `gradients`,
  /// `parameters`: length of each rank's gradient and parameter slots (0: none). active() is
  /// false (and the caller uses plain MPI) when a node holds one rank, nodes hold different
  /// numbers of ranks, or the segment cannot be created (then `problem()` says why); every rank
  /// reaches the same verdict.
  NodeReducer(MPI_Comm comm, int ranks_per_node, std::size_t gradients, std::size_t parameters) {
    int rank = 0, local = 0, local_size = 0, nodes = 0;
    MPI_Comm_rank(comm, &rank);
    if (ranks_per_node > 0)
      MPI_Comm_split(comm, rank / ranks_per_node, rank, &node_);
    else
      MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node_);
    MPI_Comm_rank(node_, &local);
    MPI_Comm_size(node_, &local_size);
    MPI_Comm_split(comm, local, rank, &cross_);
    MPI_Comm_size(cross_, &nodes);
    ranks_ = static_cast<std::size_t>(local_size);
    nodes_ = static_cast<std::size_t>(nodes);
    int sizes[2] = {-local_size, local_size};  // equal on every node?
    MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, comm);
    if (ranks_ < 2) return;
    if (-sizes[0] != sizes[1]) {
      problem_ = "the nodes run different numbers of ranks (launch as many on each)";
      return;
    }
    const std::size_t bytes = shm::NodeSums::bytes(ranks_, gradients, parameters);
    char name[64] = {};
    int err = 0;  // node rank 0's creation, then any rank's mapping
    if (local == 0) {
      std::snprintf(name, sizeof name, "/xtrain-%ld-%d-%u", static_cast<long>(::getpid()), rank,
                    counter().fetch_add(1));
      err = shm::Segment::create(name, bytes);
    }
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, node_);
    MPI_Bcast(&err, 1, MPI_INT, 0, node_);
    if (err == 0) err = segment_.map(name, bytes);
    MPI_Allreduce(MPI_IN_PLACE, &err, 1, MPI_INT, MPI_MAX, comm);  // every rank mapped it, or none uses it
    if (local == 0) shm::Segment::unlink(name);                    // the name goes; the mappings stay
    if (err != 0) {
      problem_ = "cannot create a " + std::to_string(bytes >> 20) + " MiB shared-memory segment in /dev/shm (" +
                 std::strerror(err) + "); give /dev/shm more room (docker run --shm-size)";
      segment_.unmap();
      return;
    }
    sums_ = shm::NodeSums(segment_.data(), ranks_, static_cast<std::size_t>(local), gradients, parameters,
                          &abort_timed_out);
    MPI_Barrier(node_);
  }
  NodeReducer(const NodeReducer&) = delete;
  NodeReducer& operator=(const NodeReducer&) = delete;
  ~NodeReducer() {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised) {
      if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
      if (cross_ != MPI_COMM_NULL) MPI_Comm_free(&cross_);
    }
  }

  bool active() const noexcept { return segment_.data() != nullptr; }
  /// Why a node with several ranks could not use shared memory ("" otherwise).
  const std::string& problem() const noexcept { return problem_; }
  std::size_t ranks_per_node() const noexcept { return ranks_; }
  /// This rank's gradient buffer in the segment (empty when inactive or no gradients asked for).
  std::span<float> gradient_slot() noexcept { return active() ? sums_.gradient_slot() : std::span<float>{}; }
  /// This rank's parameter buffer in the segment (empty when inactive or none asked for).
  std::span<float> parameter_slot() noexcept { return active() ? sums_.parameter_slot() : std::span<float>{}; }

  /// In-place sum of `v` over all ranks. Collective; every rank passes the same size. A wait
  /// longer than `timeout` aborts the job, naming `what`.
  void allreduce(std::span<float> v, const char* what, std::chrono::duration<double> timeout) {
    sums_.allreduce(v, {what, timeout}, [&](float* block, std::size_t n) {
      if (nodes_ == 1 || n == 0) return;
      MPI_Request r = MPI_REQUEST_NULL;  // the ranks owning this block on the other nodes:
      MPI_Ibarrier(cross_, &r);          // timed rendezvous first, as every blocking collective
      shm::spin_until([&] { return test(r); }, timeout, [&] { abort_timed_out(what, v.size(), timeout); });
      MPI_Allreduce(MPI_IN_PLACE, block, static_cast<int>(n), MPI_FLOAT, MPI_SUM, cross_);
    });
  }
  /// One node, `v` in the gradient slot: block `rank` of `v` becomes the sum (ZeRO-1). False
  /// (nothing done) otherwise.
  bool reduce_scatter(std::span<float> v, const char* what, std::chrono::duration<double> timeout) {
    return nodes_ == 1 && sums_.reduce_scatter(v, {what, timeout});
  }
  /// One node: of the elements [lo, hi) of `v` (equal blocks of `block`), those in block `rank`
  /// become the sum. False (nothing done) otherwise.
  bool reduce_scatter_range(std::span<float> v, std::size_t lo, std::size_t hi, std::size_t block, const char* what,
                            std::chrono::duration<double> timeout) {
    if (nodes_ != 1) return false;
    sums_.reduce_scatter_range(v, lo, hi, block, {what, timeout});
    return true;
  }
  /// One node: every rank's block `rank` of `v` into every rank's `v`. False (nothing done) otherwise.
  bool allgather(std::span<float> v, const char* what, std::chrono::duration<double> timeout) {
    if (nodes_ != 1 || v.size() % ranks_ != 0) return false;
    sums_.allgather(v, {what, timeout});
    return true;
  }

 private:
  static bool test(MPI_Request& r) {
    int done = 0;
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    return done != 0;
  }
  static std::atomic<unsigned>& counter() {
    static std::atomic<unsigned> c{0};
    return c;
  }

  MPI_Comm node_ = MPI_COMM_NULL, cross_ = MPI_COMM_NULL;
  std::size_t ranks_ = 1, nodes_ = 1;
  shm::Segment segment_;
  shm::NodeSums sums_;
  std::string problem_;
};
}  // namespace detail

}  // namespace xtrain::parallel
