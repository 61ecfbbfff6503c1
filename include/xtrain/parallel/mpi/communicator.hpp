#pragma once
/// \file mpi/communicator.hpp
/// MpiAllReduce: the communicator for `mpirun`/`srun` jobs (a model of the Communicator contract
/// of parallel/communicator.hpp). Gradients and metrics go through raw MPI calls on a private
/// duplicate of the communicator, float sums between the processes of one node through a
/// shared-memory segment (detail::NodeReducer), strings through Boost.MPI. Every wait is bounded
/// (a stalled collective names itself and aborts the job); XTRAIN_DEBUG_COLLECTIVES=1 checks that
/// every rank enters the same collective.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/mpi/collectives/broadcast.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/serialization/string.hpp>
#include <mpi.h>

#include "xtrain/core/error.hpp"
#include "xtrain/core/precision.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/parallel/communicator.hpp"
#include "xtrain/parallel/mpi/abort.hpp"
#include "xtrain/parallel/mpi/node_reducer.hpp"
#include "xtrain/parallel/shared_memory.hpp"

#if defined(__GLIBC__)
#include <malloc.h>  // mallopt
#endif

namespace xtrain::parallel {

namespace detail {
/// glibc only, once per process, unless the user chose (XTRAIN_MALLOC_TUNING=0, or glibc's own
/// settings in GLIBC_TUNABLES, MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_): freed blocks of up
/// to `bytes` stay in the heap (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD). Open MPI's collectives
/// allocate and free bucket-sized buffers at every call; with glibc's defaults the heap gives
/// them back to the system each time and the next call faults their pages in again (a 52M-parameter
/// GPT on 2 processes: 0.7M to 1.2M page faults in 12 steps, 40-60 % of the time in the system).
inline void keep_freed_memory(std::size_t bytes = std::size_t{256} << 20) noexcept {
#if defined(__GLIBC__)
  static const bool once = [bytes] {
    const char* tuning = std::getenv("XTRAIN_MALLOC_TUNING");
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    if ((tuning && std::strcmp(tuning, "0") == 0) || (tunables && std::strstr(tunables, "glibc.malloc.")) ||
        std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("MALLOC_TRIM_THRESHOLD_"))
      return false;
    const int n = static_cast<int>(std::min<std::size_t>(bytes, std::size_t{1} << 30));
    // (glibc before 2.35 takes no mmap threshold above 32 MiB on 64-bit: then that)
    const bool mmap = mallopt(M_MMAP_THRESHOLD, n) == 1 || mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
    return mallopt(M_TRIM_THRESHOLD, n) == 1 && mmap;
  }();
  (void)once;
#else
  (void)bytes;
#endif
}
}  // namespace detail

class MpiAllReduce {
 public:
  /// A pending non-blocking collective.
  struct Request {
    MPI_Request handle = MPI_REQUEST_NULL;
    const char* name = "";
    std::size_t count = 0;
    std::shared_ptr<std::vector<int>> counts;  // what a non-blocking collective's call must keep
    float* result = nullptr;                   // on completion, `moved` floats from `result` to `place`
    float* place = nullptr;
    std::size_t moved = 0;
  };

  static constexpr const char* name = "mpi";

  /// Over MPI_COMM_WORLD. Requires MPI initialised (an MpiEnvironment alive).
  MpiAllReduce() : MpiAllReduce(MPI_COMM_WORLD) {}

  /// Over a duplicate of `comm` (the library's traffic never mixes with the caller's). With more
  /// than one rank, glibc's heap keeps freed blocks of up to 256 MiB (detail::keep_freed_memory;
  /// XTRAIN_MALLOC_TUNING=0 leaves glibc's defaults).
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
    if (size_ > 1) detail::keep_freed_memory();
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
  /// Of the elements [lo, hi) of `v` (size() equal blocks), those in block rank() become the sum
  /// over ranks (the others are left unspecified): through shared memory within a node, else
  /// MPI_Reduce_scatter in place. ZeRO-2's buckets.
  void reduce_scatter_range(std::span<float> v, std::size_t lo, std::size_t hi, const char* what) {
    if (detail::NodeReducer* node = node_reducer(what, hi - lo)) {
      check("reduce_scatter_range(float)", what, hi - lo);
      if (node->reduce_scatter_range(v, lo, hi, v.size() / size_, what, timeout_)) return;
    }
    enter("reduce_scatter_range(float)", what, hi - lo);
    const std::size_t block = v.size() / size_;
    range_parts(v.size(), lo, hi);
    MPI_Reduce_scatter(MPI_IN_PLACE, v.data() + lo, range_counts_.data(), MPI_FLOAT, MPI_SUM, comm_);
    const std::size_t mine = std::clamp(rank_ * block, lo, hi);  // the result lands at lo
    if (mine != lo && range_counts_[rank_] > 0)
      std::memmove(v.data() + mine, v.data() + lo, static_cast<std::size_t>(range_counts_[rank_]) * sizeof(float));
  }
  /// Starts reduce_scatter_range: once the request completes (test() or wait()), this rank's
  /// elements of [lo, hi) hold their sums in place. [lo, hi) must not be touched meanwhile. Within
  /// a node with shared memory it is done at once, before returning (each rank sums its own part
  /// from the peers' copies in the segment: no buffer of MPI's, the work shared evenly); otherwise
  /// MPI_Ireduce_scatter, in place (Open MPI's reduces on one rank, in a buffer of the range's
  /// size), the sums moved to their place on completion.
  Request ireduce_scatter_range(std::span<float> v, std::size_t lo, std::size_t hi, const char* what) {
    Request r{MPI_REQUEST_NULL, what, hi - lo, {}};
    detail::NodeReducer* node = node_reducer(what, hi - lo);
    check("reduce_scatter_range(float)", what, hi - lo);
    if (node && node->reduce_scatter_range(v, lo, hi, v.size() / size_, what, timeout_)) return r;  // (complete)
    range_parts(v.size(), lo, hi);
    r.counts = std::make_shared<std::vector<int>>(range_counts_);
    const std::size_t mine = std::clamp(rank_ * (v.size() / size_), lo, hi);  // the result lands at lo
    r.result = v.data() + lo, r.place = v.data() + mine, r.moved = static_cast<std::size_t>(range_counts_[rank_]);
    MPI_Ireduce_scatter(MPI_IN_PLACE, v.data() + lo, r.counts->data(), MPI_FLOAT, MPI_SUM, comm_, &r.handle);
    return r;
  }
  /// Of the elements [lo, hi) of `v` (size() equal blocks), each rank's part in its block copied
  /// to every rank (MPI_Allgatherv, in place). ZeRO-3 gathers a unit's parameters so.
  void allgather_range(std::span<float> v, std::size_t lo, std::size_t hi, const char* what) {
    enter("allgather_range(float)", what, hi - lo);
    range_parts(v.size(), lo, hi);
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, v.data() + lo, range_counts_.data(), range_displs_.data(),
                   MPI_FLOAT, comm_);
  }
  /// Starts allgather_range (MPI_Iallgatherv, in place): once the request completes, [lo, hi)
  /// holds every rank's part; it must not be touched meanwhile. ZeRO-3 prefetches a unit so.
  Request iallgather_range(std::span<float> v, std::size_t lo, std::size_t hi, const char* what) {
    check("allgather_range(float)", what, hi - lo);
    range_parts(v.size(), lo, hi);
    auto parts = std::make_shared<std::vector<int>>(range_counts_);  // counts, then displacements
    parts->insert(parts->end(), range_displs_.begin(), range_displs_.end());
    Request r{MPI_REQUEST_NULL, what, hi - lo, parts};
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, v.data() + lo, parts->data(), parts->data() + size_, MPI_FLOAT,
                    comm_, &r.handle);
    return r;
  }
  /// Each rank's values of [lo, hi) that fall in this rank's block, rank by rank into `out`
  /// (size() x that many; an all-to-all): the deterministic reduce-scatter sums them in a fixed tree.
  void exchange_range(std::span<const float> v, std::size_t lo, std::size_t hi, std::span<float> out,
                      const char* what) {
    enter("exchange_range(float)", what, hi - lo);
    range_parts(v.size(), lo, hi);
    const int mine = range_counts_[rank_];
    recv_counts_.assign(size_, mine);
    recv_displs_.resize(size_);
    for (std::size_t r = 0; r < size_; ++r) recv_displs_[r] = count(r * static_cast<std::size_t>(mine));
    XTRAIN_CHECK(out.size() >= size_ * static_cast<std::size_t>(mine), ValueError, "exchange_range '", what,
                 "': ", out.size(), " floats for ", size_, " x ", mine);
    MPI_Alltoallv(v.data() + lo, range_counts_.data(), range_displs_.data(), MPI_FLOAT, out.data(), recv_counts_.data(),
                  recv_displs_.data(), MPI_FLOAT, comm_);
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
    Request r{MPI_REQUEST_NULL, what, 0, {}};
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
    Request r{MPI_REQUEST_NULL, what, v.size(), {}};
    MPI_Iallreduce(MPI_IN_PLACE, v.data(), count(v.size()), MPI_FLOAT, MPI_SUM, comm_, &r.handle);
    return r;
  }
  /// Progresses `r`; true when complete.
  bool test(Request& r) {
    int done = 0;
    MPI_Test(&r.handle, &done, MPI_STATUS_IGNORE);
    if (done != 0 && r.moved > 0) {
      if (r.result != r.place) std::memmove(r.place, r.result, r.moved * sizeof(float));
      r.moved = 0;
    }
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

  // Each rank's part of [lo, hi) (the elements in its block of n / size()): counts and offsets from lo.
  void range_parts(std::size_t n, std::size_t lo, std::size_t hi) {
    const std::size_t block = n / size_;
    range_counts_.resize(size_);
    range_displs_.resize(size_);
    for (std::size_t r = 0; r < size_; ++r) {
      const std::size_t b = std::clamp(r * block, lo, hi);
      range_counts_[r] = count(std::clamp((r + 1) * block, lo, hi) - b);
      range_displs_[r] = count(b - lo);
    }
  }
  static int count(std::size_t n) {
    XTRAIN_CHECK(n <= 0x7FFFFFFFu, ValueError, "MpiAllReduce: ", n, " elements exceed MPI's int count");
    return static_cast<int>(n);
  }

  /// Debug check, then the timed rendezvous of every rank before a blocking collective.
  void enter(const char* kind, const char* what, std::size_t n) {
    check(kind, what, n);
    Request r{MPI_REQUEST_NULL, what, n, {}};
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
    Request r{MPI_REQUEST_NULL, "debug signature check", sizeof(Signature), {}};
    MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm_, &r.handle);
    wait(r);
    for (std::size_t i = 0; i < size_; ++i)
      if (std::strcmp(all[i].kind, all[0].kind) != 0 || std::strcmp(all[i].name, all[0].name) != 0 ||
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
  std::vector<int> range_counts_, range_displs_;  // the *_range collectives' parts per rank (from lo)
  std::vector<int> recv_counts_, recv_displs_;    // exchange_range's receive side
};

}  // namespace xtrain::parallel
