#pragma once
/// \file mpi.hpp
/// MpiAllReduce: the communicator for `mpirun`/`srun` jobs. The ONLY header that includes MPI
/// (link `xtrain::mpi`). Boost.MPI runs the environment and the object collectives; gradients and
/// metrics go through raw MPI calls on a private duplicate of the communicator, and float sums
/// between the processes of one node through a shared-memory segment (NodeReducer).
///
/// Failure is loud, never a hang:
///  - MpiEnvironment makes an exception that escapes main() on any rank print its message with
///    the rank and end the whole job (MPI_Abort, exit code 1);
///  - every wait is bounded (default 300 s, `timeout()` or XTRAIN_COLLECTIVE_TIMEOUT=seconds): a
///    stalled collective names itself and aborts the job (blocking collectives first meet in a
///    timed non-blocking barrier, then run Open MPI's faster blocking algorithm);
///  - XTRAIN_DEBUG_COLLECTIVES=1 checks before each collective that every rank entered the same
///    one (kind, name, element count) and reports the first mismatch.

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/mpi/collectives/broadcast.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>
#include <boost/serialization/string.hpp>

#include "xtrain/core/error.hpp"
#include "xtrain/core/precision.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/shared_memory.hpp"

namespace xtrain::parallel {

/// Rank and size as the launcher announced them (Slurm's SLURM_PROCID/SLURM_NTASKS, Open MPI's
/// OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/PMI_SIZE), for logging before or without MPI; -1 if none.
struct LaunchInfo {
  long rank = -1, size = -1;
  const char* launcher = "none";
};
inline LaunchInfo launch_info() {
  auto read = [](const char* name) -> long {
    const char* v = std::getenv(name);
    return v ? std::strtol(v, nullptr, 10) : -1;
  };
  if (read("SLURM_PROCID") >= 0) return {read("SLURM_PROCID"), read("SLURM_NTASKS"), "slurm"};
  if (read("OMPI_COMM_WORLD_RANK") >= 0)
    return {read("OMPI_COMM_WORLD_RANK"), read("OMPI_COMM_WORLD_SIZE"), "open mpi"};
  if (read("PMI_RANK") >= 0) return {read("PMI_RANK"), read("PMI_SIZE"), "pmi"};
  return {};
}

/// The world rank for log prefixes (MPI's if initialised, else the launcher's, else -1).
inline long world_rank() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (initialised && !finalised) {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
  return launch_info().rank;
}

/// Prints `message` with the rank to stderr and ends the whole job with `code`.
[[noreturn]] inline void abort_job(const std::string& message, int code = 1) {
  std::fprintf(stderr, "[xtrain rank %ld] %s\n", world_rank(), message.c_str());
  std::fflush(stderr);
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (initialised && !finalised) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

namespace detail {
[[noreturn]] inline void terminate_with_abort() {
  std::string what = "terminate called without an active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = std::string("error: ") + ex.what();
    } catch (...) {
      what = "error: unknown exception";
    }
  }
  abort_job(what + " (aborting all ranks)");
}

[[noreturn]] inline void abort_timed_out(const char* name, std::size_t count, std::chrono::duration<double> timeout) {
  abort_job("collective '" + std::string(name) + "' (" + std::to_string(count) + " values) waited longer than " +
            std::to_string(static_cast<long>(timeout.count())) +
            " s for the other ranks; a rank is stuck or dead. Aborting the job.");
}

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

/// Initialises and finalises MPI (through Boost.MPI). Construct it first thing in main():
/// `xtrain::parallel::MpiEnvironment env{argc, argv};`. Installs a terminate handler so that an
/// uncaught exception on any rank aborts the whole job with its message.
class MpiEnvironment {
 public:
  MpiEnvironment(int& argc, char**& argv) : env_(argc, argv, boost::mpi::threading::funneled) {
    std::set_terminate(&detail::terminate_with_abort);
  }
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  /// Runs fn() and returns its exit code. An exception is printed with the rank; on several
  /// ranks it then aborts the whole job (a rank that returned would leave the others waiting), on
  /// one it returns 1.
  template <class F>
  int run(F&& fn) {
    try {
      return fn();
    } catch (const std::exception& e) {
      int size = 1;
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      if (size > 1) abort_job(std::string("error: ") + e.what() + " (aborting all ranks)");
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }

 private:
  boost::mpi::environment env_;
};

class MpiAllReduce {
 public:
  /// A pending non-blocking collective.
  struct Request {
    MPI_Request handle = MPI_REQUEST_NULL;
    const char* name = "";
    std::size_t count = 0;
  };

  static constexpr const char* name = "mpi";

  /// Over MPI_COMM_WORLD. Requires MPI initialised (an MpiEnvironment alive).
  MpiAllReduce() : MpiAllReduce(MPI_COMM_WORLD) {}

  /// Over a duplicate of `comm` (the library's traffic never mixes with the caller's).
  explicit MpiAllReduce(MPI_Comm comm) {
    int initialised = 0;
    MPI_Initialized(&initialised);
    XTRAIN_CHECK(initialised, ValueError,
                 "MpiAllReduce: MPI is not initialised; construct xtrain::parallel::MpiEnvironment env{argc, argv} "
                 "first thing in main()");
    MPI_Comm_dup(comm, &comm_);
    int r = 0, s = 0;
    MPI_Comm_rank(comm_, &r);
    MPI_Comm_size(comm_, &s);
    rank_ = static_cast<std::size_t>(r);
    size_ = static_cast<std::size_t>(s);
    if (const char* t = std::getenv("XTRAIN_COLLECTIVE_TIMEOUT"))
      timeout_ = std::chrono::duration<double>(std::atof(t));
    if (const char* d = std::getenv("XTRAIN_DEBUG_COLLECTIVES")) debug_ = std::strcmp(d, "0") != 0;
    if (const char* m = std::getenv("XTRAIN_SHARED_MEMORY")) shared_memory_ = std::strcmp(m, "0") != 0;
    if (const char* k = std::getenv("XTRAIN_RANKS_PER_NODE")) ranks_per_node_ = std::atoi(k);
  }

  MpiAllReduce(const MpiAllReduce&) = delete;
  MpiAllReduce& operator=(const MpiAllReduce&) = delete;
  MpiAllReduce(MpiAllReduce&& o) noexcept { *this = std::move(o); }
  MpiAllReduce& operator=(MpiAllReduce&& o) noexcept {
    std::swap(comm_, o.comm_);
    rank_ = o.rank_;
    size_ = o.size_;
    timeout_ = o.timeout_;
    debug_ = o.debug_;
    compression_ = o.compression_;
    shared_memory_ = o.shared_memory_;
    ranks_per_node_ = o.ranks_per_node_;
    std::swap(node_, o.node_);
    node_tried_ = o.node_tried_;
    return *this;
  }
  ~MpiAllReduce() {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (comm_ != MPI_COMM_NULL && !finalised) MPI_Comm_free(&comm_);
  }

  /// Longest wait of any collective before the job is aborted (default 300 s).
  MpiAllReduce& timeout(std::chrono::duration<double> t) {
    timeout_ = t;
    return *this;
  }
  /// Send gradients as bf16 or fp16 (half the bytes; Compression::none: fp32, the default).
  /// The sum is taken in fp32 from the rounded values, in rank order, then rounded once more
  /// for the return trip, so every rank ends with the same gradients. Applies to the gradient
  /// buckets (not to the deterministic reduction, the sharded optimizer or other collectives).
  MpiAllReduce& compress_gradients(Compression c) {
    compression_ = c;
    return *this;
  }
  Compression gradient_compression() const noexcept { return compression_; }

  /// Sum floats between the processes of a node through a shared-memory segment (default on;
  /// also XTRAIN_SHARED_MEMORY=0 to turn off): the gradients' path. Across nodes the ranks that
  /// own the same block of a node's sum allreduce it over MPI. Set before the first collective.
  MpiAllReduce& shared_memory(bool on) {
    shared_memory_ = on;
    return *this;
  }
  /// Treat every `k` consecutive ranks as one node (0: MPI's node, the default; also
  /// XTRAIN_RANKS_PER_NODE=k): runs the multi-node path (shared memory within each group, MPI
  /// between them) on one machine, for tests. Set before the first collective.
  MpiAllReduce& ranks_per_node(int k) {
    ranks_per_node_ = k;
    return *this;
  }

  /// Collective: buffers of `n` floats for this rank's gradients and, when `parameters` (the
  /// sharded optimizer), its parameters in the node's shared-memory segment, so that the
  /// reduction reads the peers' gradients where backward wrote them and the parameter all-gather
  /// reads their stepped blocks where the optimizer wrote them (the Engine moves its buffers
  /// there). Empty spans when shared memory is off or not possible. A later call replaces the
  /// segment: spans from an earlier call are then invalid.
  NodeStorage node_storage(std::size_t n, bool parameters) {
    if (!shared_memory_ || size_ == 1) return {};
    enter("node_storage", "node storage", n);
    make_node_reducer(n, parameters ? n : 0);
    node_tried_ = true;
    return {node_->gradient_slot(), node_->parameter_slot()};
  }
  /// Ranks per node summing through shared memory: 0 until the first float allreduce, and when
  /// off or not possible (one rank per node, nodes with different rank counts, no /dev/shm).
  std::size_t shared_memory_ranks() const noexcept { return node_ && node_->active() ? node_->ranks_per_node() : 0; }

  /// Check that all ranks enter the same collectives (also XTRAIN_DEBUG_COLLECTIVES=1).
  MpiAllReduce& debug_collectives(bool on) {
    debug_ = on;
    return *this;
  }

  std::size_t rank() const noexcept { return rank_; }
  std::size_t size() const noexcept { return size_; }
  MPI_Comm handle() const noexcept { return comm_; }
  /// Another communicator over the same ranks (its own MPI duplicate), same timeout and debug mode.
  MpiAllReduce duplicate() const {
    MpiAllReduce d(comm_);
    d.timeout_ = timeout_;
    d.debug_ = debug_;
    d.compression_ = compression_;
    d.shared_memory_ = shared_memory_;
    d.ranks_per_node_ = ranks_per_node_;
    return d;
  }

  // Blocking collectives: a timed rendezvous (non-blocking barrier waited with the timeout, so a
  // rank that never arrives is reported instead of hanging), then Open MPI's tuned blocking
  // collective, measured 1.8x (100 KB) to 2.2x (3 MB) faster than its non-blocking one here.
  // Float sums go through shared memory within a node (shared_memory()), whose waits are timed.
  void allreduce_sum(std::span<float> v, const char* what) {
    if (detail::NodeReducer* node = node_reducer(what, v.size())) {
      check("allreduce_sum(float)", what, v.size());
      return node->allreduce(v, what, timeout_);
    }
    enter("allreduce_sum(float)", what, v.size());
    MPI_Allreduce(MPI_IN_PLACE, v.data(), count(v.size()), MPI_FLOAT, MPI_SUM, comm_);
  }
  void allreduce_sum(std::span<double> v, const char* what) {
    enter("allreduce_sum(double)", what, v.size());
    MPI_Allreduce(MPI_IN_PLACE, v.data(), count(v.size()), MPI_DOUBLE, MPI_SUM, comm_);
  }
  void broadcast(std::span<float> v, const char* what) {
    enter("broadcast(float)", what, v.size());
    MPI_Bcast(v.data(), count(v.size()), MPI_FLOAT, 0, comm_);
  }
  void broadcast(std::span<double> v, const char* what) {
    enter("broadcast(double)", what, v.size());
    MPI_Bcast(v.data(), count(v.size()), MPI_DOUBLE, 0, comm_);
  }
  /// Rank 0's string on every rank (Boost.MPI object broadcast).
  void broadcast(std::string& s, const char* what) {
    enter("broadcast(string)", what, 0);
    boost::mpi::communicator world(comm_, boost::mpi::comm_attach);
    boost::mpi::broadcast(world, s, 0);
  }
  /// Block rank() of `v` (size() equal blocks) becomes the sum over ranks of that block.
  void reduce_scatter_sum(std::span<float> v, const char* what) {
    if (detail::NodeReducer* node = node_reducer(what, v.size())) {
      check("reduce_scatter_sum(float)", what, v.size());
      if (node->reduce_scatter(v, what, timeout_)) return;
    }
    enter("reduce_scatter_sum(float)", what, v.size());
    const std::size_t block = v.size() / size_;
    MPI_Reduce_scatter_block(MPI_IN_PLACE, v.data(), count(block), MPI_FLOAT, MPI_SUM, comm_);
    if (rank_ != 0) std::memmove(v.data() + rank_ * block, v.data(), block * sizeof(float));  // result lands first
  }
  /// Every rank's block rank() of `v` copied into every rank's `v`.
  void allgather_blocks(std::span<float> v, const char* what) {
    if (detail::NodeReducer* node = node_reducer(what, v.size())) {
      check("allgather_blocks(float)", what, v.size());
      if (node->allgather(v, what, timeout_)) return;
    }
    enter("allgather_blocks(float)", what, v.size());
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, v.data(), count(v.size() / size_), MPI_FLOAT, comm_);
  }
  /// all[r * mine.size() ...] = rank r's `mine`.
  void allgather(std::span<const float> mine, std::span<float> all, const char* what) {
    enter("allgather(float)", what, mine.size());
    MPI_Allgather(mine.data(), count(mine.size()), MPI_FLOAT, all.data(), count(mine.size()), MPI_FLOAT, comm_);
  }
  void barrier(const char* what) {
    check("barrier", what, 0);
    Request r{MPI_REQUEST_NULL, what, 0};
    MPI_Ibarrier(comm_, &r.handle);
    wait(r);
  }

  /// In-place sum of gradients over ranks, compressed as gradient_compression() says: each rank
  /// rounds its values to 16 bits, block r of every rank goes to rank r (all-to-all), rank r sums
  /// its block in fp32 in rank order and rounds it, the blocks are all-gathered and widened.
  void allreduce_gradients(std::span<float> v, const char* what) {
    if (compression_ == Compression::bf16)
      compressed_allreduce<bf16>(v, what);
    else if (compression_ == Compression::fp16)
      compressed_allreduce<fp16>(v, what);
    else
      allreduce_sum(v, what);
  }

  /// Starts an in-place sum of `v` over ranks; complete it with wait() (or poll with test()).
  Request iallreduce_sum(std::span<float> v, const char* what) {
    check("allreduce_sum(float)", what, v.size());
    Request r{MPI_REQUEST_NULL, what, v.size()};
    MPI_Iallreduce(MPI_IN_PLACE, v.data(), count(v.size()), MPI_FLOAT, MPI_SUM, comm_, &r.handle);
    return r;
  }
  /// Progresses `r`; true when complete.
  bool test(Request& r) {
    int done = 0;
    MPI_Test(&r.handle, &done, MPI_STATUS_IGNORE);
    return done != 0;
  }
  /// Completes `r`, aborting the job if it takes longer than the timeout.
  void wait(Request& r) {
    shm::spin_until([&] { return test(r); }, timeout_, [&] { detail::abort_timed_out(r.name, r.count, timeout_); });
  }

 private:
  template <class T>
  void compressed_allreduce(std::span<float> v, const char* what) {
    enter(T::name == std::string_view("bf16") ? "allreduce_gradients(bf16)" : "allreduce_gradients(fp16)", what,
          v.size());
    const std::size_t n = v.size(), block = (n + size_ - 1) / size_;
    wire_.assign(2 * block * size_, 0);  // [sent: size_ blocks, zero-padded][received: size_ blocks]
    T* sent = reinterpret_cast<T*>(wire_.data());
    T* received = sent + block * size_;
    kernels::from_float(v.data(), sent, n);
    MPI_Alltoall(sent, count(block), MPI_UINT16_T, received, count(block), MPI_UINT16_T, comm_);
    sum_.assign(block, 0.0f);
    widened_.resize(block);
    for (std::size_t r = 0; r < size_; ++r) {  // rank order: the same arithmetic on every rank
      kernels::to_float(received + r * block, widened_.data(), block);
      for (std::size_t i = 0; i < block; ++i) sum_[i] += widened_[i];
    }
    T* mine = received;  // reuse: this rank's summed block, then everyone's
    kernels::from_float(sum_.data(), mine, block);
    T* gathered = sent;
    MPI_Allgather(mine, count(block), MPI_UINT16_T, gathered, count(block), MPI_UINT16_T, comm_);
    kernels::to_float(gathered, v.data(), n);
  }

  // The shared-memory reducer, set up (collectively, after a timed rendezvous) on first use.
  detail::NodeReducer* node_reducer(const char* what, std::size_t n) {
    if (!node_tried_ && shared_memory_ && size_ > 1) {
      enter("allreduce_sum(float)", what, n);
      make_node_reducer(0, 0);
    }
    node_tried_ = true;
    return node_ && node_->active() ? node_.get() : nullptr;
  }
  void make_node_reducer(std::size_t gradients, std::size_t parameters) {
    node_.reset();
    node_ = std::make_unique<detail::NodeReducer>(comm_, ranks_per_node_, gradients, parameters);
    if (!node_->problem().empty() && rank_ == 0)
      std::fprintf(stderr,
                   "xtrain: warning: gradients are summed with MPI_Allreduce, not through shared memory: %s. "
                   "XTRAIN_SHARED_MEMORY=0 silences this.\n",
                   node_->problem().c_str());
  }

  static int count(std::size_t n) {
    XTRAIN_CHECK(n <= 0x7FFFFFFFu, ValueError, "MpiAllReduce: ", n, " elements exceed MPI's int count");
    return static_cast<int>(n);
  }

  /// Debug check, then the timed rendezvous of every rank before a blocking collective.
  void enter(const char* kind, const char* what, std::size_t n) {
    check(kind, what, n);
    Request r{MPI_REQUEST_NULL, what, n};
    MPI_Ibarrier(comm_, &r.handle);
    wait(r);
  }

  /// Debug mode: every rank must be entering the same collective with the same element count.
  void check(const char* kind, const char* what, std::size_t n) {
    if (!debug_) return;
    struct Signature {
      char kind[32];
      char name[64];
      std::uint64_t count;
    } mine{};
    std::snprintf(mine.kind, sizeof mine.kind, "%s", kind);
    std::snprintf(mine.name, sizeof mine.name, "%s", what);
    mine.count = n;
    std::vector<Signature> all(size_);
    Request r{MPI_REQUEST_NULL, "debug signature check", sizeof(Signature)};
    MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm_, &r.handle);
    wait(r);
    for (std::size_t i = 0; i < size_; ++i)
      if (std::strcmp(all[i].kind, all[0].kind) || std::strcmp(all[i].name, all[0].name) ||
          all[i].count != all[0].count)
        abort_job("collective mismatch (XTRAIN_DEBUG_COLLECTIVES): rank 0 entered " + std::string(all[0].kind) + " '" +
                  all[0].name + "' with " + std::to_string(all[0].count) + " values, but rank " + std::to_string(i) +
                  " entered " + all[i].kind + " '" + all[i].name + "' with " + std::to_string(all[i].count) +
                  " values");
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::size_t rank_ = 0, size_ = 1;
  std::chrono::duration<double> timeout_ = std::chrono::seconds(300);
  bool debug_ = false;
  Compression compression_ = Compression::none;
  bool shared_memory_ = true, node_tried_ = false;
  int ranks_per_node_ = 0;
  std::unique_ptr<detail::NodeReducer> node_;
  std::vector<std::uint16_t> wire_;  // compressed send/receive buffers
  std::vector<float> sum_, widened_;
};

}  // namespace xtrain::parallel
