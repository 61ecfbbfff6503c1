// Data parallelism over real MPI (run by ctest under mpiexec -n 2 and -n 4, shared memory and
// TCP). Runs on 1, 2 and 4 ranks are compared inside one job through sub-communicators.
#define CATCH_CONFIG_RUNNER
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "xtrain/parallel/mpi.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using xtrain::test::fashion;
using xtrain::test::head;
using xtrain::test::SaveAndStop;
namespace nn = xtrain::layers;
using parallel::MpiAllReduce;

namespace {
int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
auto mlp() {
  set_seed(11);
  return nn::Sequential{nn::Linear{784, 32}, nn::ReLU{}, nn::Dropout{0.1f}, nn::Linear{32, 10}};
}
using MlpTrainer = Trainer<decltype(mlp()), optim::Adam, FullPrecision, MpiAllReduce>;

/// Trains 50 steps (3200 samples, global batch 64) on the first `ranks` world ranks; returns the
/// parameters on world rank 0 (empty elsewhere). Ranks outside the group wait.
std::vector<float> train_on(int ranks, const TrainingOptions& options) {
  MPI_Comm group;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < ranks ? 0 : MPI_UNDEFINED, world_rank(), &group);
  std::vector<float> params;
  if (group != MPI_COMM_NULL) {
    static const auto train = head(fashion().train, 3200), test = head(fashion().test, 500);
    MlpTrainer t{mlp(), optim::Adam{}.lr(2e-3f), TrainingOptions{options}.epochs(1).verbose(false),
                 MpiAllReduce(group)};
    t.fit(train, test);
    if (world_rank() == 0) params.assign(t.params().values().begin(), t.params().values().end());
    MPI_Comm_free(&group);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return params;
}
float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}
}  // namespace

TEST_CASE("MPI: fixed global batch on 1, 2 (and 4) ranks agrees to 1e-5, bitwise when deterministic", "[mpi]") {
  const auto plain = TrainingOptions{}.global_batch_size(64),
             det = TrainingOptions{}.global_batch_size(64).deterministic(16);
  const auto one = train_on(1, plain), two = train_on(2, plain);
  const auto det_one = train_on(1, det), det_two = train_on(2, det);
  if (world_rank() == 0) {
    REQUIRE(max_abs_diff(one, two) <= 1e-5f);
    REQUIRE(det_one == det_two);
  }
  if (world_size() >= 4) {
    const auto four = train_on(4, plain), det_four = train_on(4, det);
    if (world_rank() == 0) {
      REQUIRE(max_abs_diff(one, four) <= 1e-5f);
      REQUIRE(det_one == det_four);
    }
  }
}

namespace {

/// Runs f(trainer) on the first `ranks` world ranks (the others wait).
template <class F>
void run_on(int ranks, const TrainingOptions& options, F&& f) {
  MPI_Comm group;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < ranks ? 0 : MPI_UNDEFINED, world_rank(), &group);
  if (group != MPI_COMM_NULL) {
    MlpTrainer t{mlp(), optim::Adam{}.lr(2e-3f), TrainingOptions{options}.epochs(1).verbose(false),
                 MpiAllReduce(group)};
    f(t);
    MPI_Comm_free(&group);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

/// The first `save_ranks` ranks train to step 20 and save; then the first `load_ranks` ranks load
/// and finish the epoch. Returns world rank 0's parameters.
std::vector<float> save_then_resume(int save_ranks, int load_ranks, const TrainingOptions& options) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("xtrain_mpi_ckpt_np" + std::to_string(world_size()) + "_" +
                                                 std::to_string(save_ranks) + "_" + std::to_string(load_ranks)))
          .string();
  static const auto train = head(fashion().train, 3200), test = head(fashion().test, 500);
  run_on(save_ranks, options, [&](MlpTrainer& t) {
    try {
      t.fit(train, test, SaveAndStop{dir, 20});
    } catch (const std::runtime_error&) {
    }
  });
  std::vector<float> params;
  run_on(load_ranks, options, [&](MlpTrainer& t) {
    t.load_state(dir);
    t.fit(train, test);
    if (world_rank() == 0) params.assign(t.params().values().begin(), t.params().values().end());
  });
  return params;
}
}  // namespace

TEST_CASE("MPI: a state saved on 2 ranks resumes on 1, and 1 on 2, matching the uninterrupted run", "[mpi]") {
  for (const std::size_t chunk : {std::size_t{0}, std::size_t{16}}) {
    const auto options = TrainingOptions{}.global_batch_size(64).deterministic(chunk);
    const auto straight = train_on(1, options);
    const auto two_to_one = save_then_resume(2, 1, options), one_to_two = save_then_resume(1, 2, options);
    if (world_rank() == 0) {
      INFO("deterministic chunk " << chunk);
      REQUIRE(max_abs_diff(straight, two_to_one) <= 1e-5f);
      REQUIRE(max_abs_diff(straight, one_to_two) <= 1e-5f);
      if (chunk) {
        REQUIRE(straight == two_to_one);
        REQUIRE(straight == one_to_two);
      }
    }
  }
}

TEST_CASE("MPI: accumulating 2 micro-batches of 32 equals one batch of 64", "[mpi]") {
  const auto n = world_size();
  const auto once = train_on(n, TrainingOptions{}.global_batch_size(64));
  const auto accumulated = train_on(n, TrainingOptions{}.global_batch_size(32).accumulate(2));
  if (world_rank() == 0) REQUIRE(max_abs_diff(once, accumulated) <= 1e-5f);
}

TEST_CASE("MPI: the same seed twice gives bitwise identical parameters", "[mpi]") {
  const auto n = world_size();
  const auto a = train_on(n, TrainingOptions{}.batch_size(32).seed(3)),
             b = train_on(n, TrainingOptions{}.batch_size(32).seed(3));
  if (world_rank() == 0) REQUIRE(a == b);
}

TEST_CASE("MPI: evaluation counts the 10,000 test samples exactly, and every rank agrees", "[mpi]") {
  MlpTrainer t{mlp(), optim::Adam{}, TrainingOptions{}.eval_batch_size(999).verbose(false), MpiAllReduce()};
  const EvalResult r = t.evaluate(fashion().test);
  REQUIRE(r.count == 10000);
  double acc = r.accuracy, max_acc = r.accuracy;
  MPI_Allreduce(&acc, &max_acc, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  REQUIRE(max_acc == r.accuracy);
}

TEST_CASE("MPI: the homework model with per-rank BatchNorm learns, ranks hold rank 0's statistics", "[mpi]") {
  set_seed(42);
  auto model = nn::Sequential{nn::Linear{784, 32}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 10}};
  Trainer<decltype(model), optim::Adam, FullPrecision, MpiAllReduce> t{
      std::move(model), optim::Adam{}, TrainingOptions{}.epochs(1).verbose(false), MpiAllReduce()};
  const History h = t.fit(fashion().train, fashion().test);
  REQUIRE(h.epochs.back().test.count == 10000);
  REQUIRE(h.epochs.back().train.count == 60000);
  REQUIRE(h.epochs.back().test.accuracy > 80.0);
  std::vector<float> mean(t.model().get<1>().running_mean().begin(), t.model().get<1>().running_mean().end());
  std::vector<float> root = mean;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  REQUIRE(mean == root);
}

int main(int argc, char** argv) {
  xtrain::parallel::MpiEnvironment env{argc, argv};
  return Catch::Session().run(argc, argv);
}

TEST_CASE("MPI: the sharded optimizer step (ZeRO-1) matches the unsharded one", "[mpi]") {
  const auto n = world_size();
  const auto plain = train_on(n, TrainingOptions{}.global_batch_size(64));
  auto sharded = train_on(n, TrainingOptions{}.global_batch_size(64).shard_optimizer(true));
  if (world_rank() == 0) {
    for (std::size_t i = plain.size(); i < sharded.size(); ++i) REQUIRE(sharded[i] == 0.0f);  // padding
    sharded.resize(plain.size());
    REQUIRE(max_abs_diff(plain, sharded) <= 1e-6f);
  }
}

namespace {
template <class T>
void check_compressed_allreduce(parallel::Compression c) {
  MpiAllReduce comm;
  comm.compress_gradients(c);
  const std::size_t n = 1001;  // not a multiple of the rank count: a padded last block
  auto value = [](std::size_t r, std::size_t i) {
    return std::sin(0.1f * static_cast<float>(i) + static_cast<float>(r)) * (i % 7 == 0 ? 1e-3f : 1.0f);
  };
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value(comm.rank(), i);
  comm.allreduce_gradients(v, "compressed test");
  // Definition: every rank's value rounded to T, summed in fp32 in rank order, rounded to T.
  for (std::size_t i = 0; i < n; ++i) {
    float sum = 0.0f;
    for (std::size_t r = 0; r < comm.size(); ++r) sum += static_cast<float>(T(value(r, i)));
    INFO(T::name << " element " << i);
    REQUIRE(v[i] == static_cast<float>(T(sum)));
  }
}
}  // namespace

TEST_CASE("MPI: the range collectives of ZeRO-3 and of the deterministic reduction", "[mpi][zero]") {
  MpiAllReduce comm;
  const std::size_t ranks = comm.size(), rank = comm.rank(), block = 37, n = ranks * block;
  auto value = [](std::size_t r, std::size_t i) { return static_cast<float>(1000 * r + i); };
  // A range that starts inside rank 0's block and ends inside the last rank's (or rank 0's).
  const std::size_t lo = 5, hi = n - 3;
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value(rank, i);
  comm.allgather_range(v, lo, hi, "allgather_range test");
  for (std::size_t i = 0; i < n; ++i) {
    INFO("element " << i);
    REQUIRE(v[i] == (i >= lo && i < hi ? value(i / block, i) : value(rank, i)));  // the owner's value
  }
  // Without blocking: another collective may run while it is in flight; done once waited for.
  for (std::size_t i = 0; i < n; ++i) v[i] = value(rank, i);
  auto request = comm.iallgather_range(v, lo, hi, "iallgather_range test");
  double one = 1.0;
  comm.allreduce_sum(std::span<double>(&one, 1), "between");
  comm.wait(request);
  REQUIRE(one == static_cast<double>(ranks));
  for (std::size_t i = 0; i < n; ++i) {
    INFO("element " << i);
    REQUIRE(v[i] == (i >= lo && i < hi ? value(i / block, i) : value(rank, i)));
  }
  for (std::size_t i = 0; i < n; ++i) v[i] = value(rank, i);
  const std::size_t b = std::clamp(rank * block, lo, hi), e = std::clamp((rank + 1) * block, lo, hi);
  std::vector<float> out(ranks * (e - b), -1.0f);
  comm.exchange_range(v, lo, hi, out, "exchange_range test");
  for (std::size_t r = 0; r < ranks; ++r)
    for (std::size_t i = b; i < e; ++i) REQUIRE(out[r * (e - b) + i - b] == value(r, i));  // rank r's copy
}

TEST_CASE("MPI: ZeRO-3 prefetching the next unit trains the same parameters as gathering each when it runs",
          "[mpi][zero]") {
  static const auto train = head(fashion().train, 3200);
  std::vector<float> result[2];
  for (const bool prefetch : {false, true}) {
    set_seed(3);
    auto model = nn::Sequential{nn::ShardedUnit{nn::Linear{784, 64}}, nn::ReLU{},
                                nn::ShardedUnit{nn::Sequential{nn::Linear{64, 32}, nn::ReLU{}}},
                                nn::ShardedUnit{nn::Linear{32, 10}}};
    Trainer<decltype(model), optim::Adam, FullPrecision, MpiAllReduce> t{
        std::move(model), optim::Adam{},
        TrainingOptions{}.epochs(1).global_batch_size(64).zero_stage(3).prefetch_units(prefetch).verbose(false),
        MpiAllReduce{}};
    const History h = t.fit(train, head(fashion().test, 500));
    REQUIRE(h.epochs.back().test.accuracy > 60.0);
    // Forward: units 1 and 2 found in flight; backward: units 1 and 0.
    if (prefetch)
      REQUIRE(t.comm_stats().units_prefetched >= 4 * t.step());
    else
      REQUIRE(t.comm_stats().units_prefetched == 0);
    t.with_full_parameters([&] { result[prefetch].assign(t.params().values().begin(), t.params().values().end()); });
  }
  REQUIRE(result[1] == result[0]);
}

TEST_CASE("MPI: compressed gradient sums are the fp32 sum of the rounded values, the same on every rank", "[mpi]") {
  check_compressed_allreduce<bf16>(parallel::Compression::bf16);
  check_compressed_allreduce<fp16>(parallel::Compression::fp16);
}

TEST_CASE("MPI: bf16 training with bf16-compressed gradients learns and keeps the ranks identical", "[mpi]") {
  set_seed(42);
  auto model = nn::Sequential{nn::Linear{784, 32}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 10}};
  MpiAllReduce comm;
  comm.compress_gradients(parallel::Compression::bf16);
  static const auto train = head(fashion().train, 12000);
  Trainer<decltype(model), optim::Adam, MixedPrecision<bf16>, MpiAllReduce> t{
      std::move(model), optim::Adam{}, TrainingOptions{}.epochs(1).global_batch_size(64).verbose(false),
      std::move(comm)};
  const History h = t.fit(train, fashion().test);
  REQUIRE(h.epochs.back().test.count == 10000);
  REQUIRE(h.epochs.back().test.accuracy > 75.0);
  std::vector<float> mine(t.params().values().begin(), t.params().values().end()), root = mine;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  REQUIRE(mine == root);
}

namespace {
// Sums of small integers are exact in fp32: any summation order gives the same bits.
float summand(std::size_t rank, std::size_t i) { return static_cast<float>((i * 7 + rank * 13) % 101) - 50.0f; }
void check_float_sums(MpiAllReduce& comm) {
  // 1 value, an odd size, and more than the scratch slots hold (several chunks).
  for (const std::size_t n : {std::size_t{1}, std::size_t{1001}, std::size_t{1'300'007}}) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = summand(comm.rank(), i);
    comm.allreduce_sum(std::span<float>(v), "float sum test");
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      float sum = 0.0f;
      for (std::size_t r = 0; r < comm.size(); ++r) sum += summand(r, i);
      wrong += v[i] != sum;
    }
    INFO(n << " values");
    REQUIRE(wrong == 0);
  }
}
}  // namespace

TEST_CASE("MPI: float sums through shared memory are exact, within a node and across simulated nodes", "[mpi]") {
  const std::size_t size = static_cast<std::size_t>(world_size());
  SECTION("one node: every rank sums through the shared segment") {
    MpiAllReduce comm;
    comm.shared_memory(true);  // (the .tcp runs turn it off for the other tests by the environment)
    check_float_sums(comm);
    REQUIRE(comm.shared_memory_ranks() == size);
  }
  SECTION("nodes of 2 ranks: shared memory within each, MPI between them") {
    MpiAllReduce comm;
    comm.shared_memory(true).ranks_per_node(2);
    check_float_sums(comm);
    REQUIRE(comm.shared_memory_ranks() == 2);
  }
  SECTION("one rank per node, or nodes of different sizes: plain MPI") {
    MpiAllReduce comm;
    comm.shared_memory(true).ranks_per_node(size == 4 ? 3 : 1);  // 4 ranks: nodes of 3 and 1 (a warning says why)
    check_float_sums(comm);
    REQUIRE(comm.shared_memory_ranks() == 0);
  }
  SECTION("off") {
    MpiAllReduce comm;
    comm.shared_memory(false);
    check_float_sums(comm);
    REQUIRE(comm.shared_memory_ranks() == 0);
  }
}

namespace {
/// Parameters after one epoch of 1600 samples (global batch 64) with `comm` (whose segment use
/// must be `expect_shared`); the arena's padding (sharded) must be zero and is dropped.
std::vector<float> train_with(MpiAllReduce comm, const TrainingOptions& options, bool expect_shared) {
  static const auto data = head(fashion().train, 1600);
  MlpTrainer t{mlp(), optim::Adam{}.lr(2e-3f), TrainingOptions{options}.epochs(1).global_batch_size(64).verbose(false),
               std::move(comm)};
  // The Engine moved its gradients (sharded: and parameters) into the segment when it was built.
  REQUIRE((t.communicator().shared_memory_ranks() > 0) == expect_shared);
  t.fit(data, head(fashion().test, 500));
  const auto values = t.params().values();
  const std::size_t natural = t.params().natural_size();
  for (std::size_t i = natural; i < values.size(); ++i) REQUIRE(values[i] == 0.0f);
  return std::vector<float>(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(natural));
}
void require_same_on_every_rank(const std::vector<float>& params) {
  std::vector<float> root = params;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  REQUIRE(params == root);
}
MpiAllReduce with_shared_memory(bool on, int ranks_per_node = 0) {
  MpiAllReduce comm;
  comm.shared_memory(on).ranks_per_node(ranks_per_node);
  return comm;
}
}  // namespace

TEST_CASE("MPI: training with gradients in shared memory equals training over MPI_Allreduce", "[mpi]") {
  // 2 ranks sum a + b either way: bitwise equal. 4 ranks: MPI's tree may add in another order.
  const auto shared = train_with(with_shared_memory(true), TrainingOptions{}, true);
  const auto plain = train_with(with_shared_memory(false), TrainingOptions{}, false);
  if (world_size() == 2)
    REQUIRE(shared == plain);
  else
    REQUIRE(max_abs_diff(shared, plain) < 1e-5f);
  require_same_on_every_rank(shared);
}

TEST_CASE("MPI: a range's reduce-scatter leaves each rank the sums of its part, through shared memory and over MPI",
          "[mpi][zero]") {
  for (const bool shared : {true, false}) {
    MpiAllReduce comm = with_shared_memory(shared);
    // Blocks longer than a scratch chunk of the segment (it takes several), a range that starts
    // inside rank 0's block and ends inside the last rank's.
    const std::size_t ranks = comm.size(), rank = comm.rank(), block = 300000, n = ranks * block, lo = 5, hi = n - 3;
    auto value = [](std::size_t r, std::size_t i) { return static_cast<float>(1000 * r + i % 997); };  // exact sums
    const std::size_t b = std::clamp(rank * block, lo, hi), e = std::clamp((rank + 1) * block, lo, hi);
    for (const bool blocking : {true, false}) {
      INFO((shared ? "shared memory, " : "MPI, ") << (blocking ? "blocking" : "non-blocking"));
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = value(rank, i);
      if (blocking) {
        comm.reduce_scatter_range(v, lo, hi, "reduce_scatter_range test");
      } else {
        auto request = comm.ireduce_scatter_range(v, lo, hi, "ireduce_scatter_range test");
        comm.wait(request);
      }
      std::size_t wrong = 0;
      for (std::size_t i = b; i < e; ++i) {
        float sum = 0.0f;
        for (std::size_t r = 0; r < ranks; ++r) sum += value(r, i);
        wrong += v[i] != sum ? 1 : 0;
      }
      for (std::size_t i = 0; i < n; ++i) wrong += (i < lo || i >= hi) && v[i] != value(rank, i) ? 1 : 0;  // untouched
      REQUIRE(wrong == 0);
    }
  }
}

TEST_CASE("MPI: the sharded step through shared memory equals the unsharded one", "[mpi]") {
  const auto plain = train_with(with_shared_memory(true), TrainingOptions{}, true);
  SECTION("one node: parameters all-gathered in place from the peers' slots") {
    // Both sum in rank order in the segment and Adam is elementwise: bitwise on any rank count.
    const auto sharded = train_with(with_shared_memory(true), TrainingOptions{}.shard_optimizer(true), true);
    REQUIRE(sharded == plain);
    require_same_on_every_rank(sharded);
  }
  SECTION("nodes of 2 ranks: on 4 ranks the sharded step takes MPI, with the parameters still in the segment") {
    const auto sharded = train_with(with_shared_memory(true, 2), TrainingOptions{}.shard_optimizer(true), true);
    REQUIRE(max_abs_diff(sharded, plain) < 1e-5f);
    require_same_on_every_rank(sharded);
  }
}

TEST_CASE("MPI: ZeRO-2 (each gradient bucket reduce-scattered, 1/N of the gradients kept) equals the unsharded step",
          "[mpi]") {
  const auto plain = train_with(with_shared_memory(true), TrainingOptions{}, true);
  // Two buckets of 16 KiB (the first straddles the ranks' blocks); gradients in pages of their
  // own, not in the node segment, each bucket summed in rank order through its scratch slots.
  const auto zero2 =
      train_with(with_shared_memory(true), TrainingOptions{}.zero_stage(2).bucket_bytes(16 << 10), false);
  if (world_size() == 2)
    REQUIRE(zero2 == plain);
  else
    REQUIRE(max_abs_diff(zero2, plain) < 1e-5f);
  require_same_on_every_rank(zero2);
  if (world_size() == 4) {  // nodes of 2 ranks: the buckets and the all-gather go between nodes over MPI
    const auto nodes =
        train_with(with_shared_memory(true, 2), TrainingOptions{}.zero_stage(2).bucket_bytes(16 << 10), false);
    REQUIRE(max_abs_diff(nodes, plain) < 1e-5f);
    require_same_on_every_rank(nodes);
  }
}

namespace {
/// The nested residual model of the thread-rank tests (tests/parallel/helpers.hpp): a Linear, a
/// residual block, a Dropout, and a block of a Linear and a second Dropout.
auto nested() {
  set_seed(21);
  return nn::Sequential{nn::Linear{784, 32},
                        nn::Residual{nn::Sequential{nn::Linear{32, 32}, nn::ReLU{}, nn::Linear{32, 32}}},
                        nn::Dropout{0.2f}, nn::Sequential{nn::Linear{32, 10}, nn::Dropout{0.1f}}};
}

/// One epoch of 1024 samples of the nested model on the first `ranks` world ranks (a communicator
/// made by `make_comm(group)`); world rank 0's parameters and bucket count.
template <class Comm, class MakeComm>
std::vector<float> train_nested(int ranks, const TrainingOptions& options, MakeComm make_comm,
                                std::size_t* buckets = nullptr) {
  MPI_Comm group;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < ranks ? 0 : MPI_UNDEFINED, world_rank(), &group);
  std::vector<float> params;
  if (group != MPI_COMM_NULL) {
    static const auto train = head(fashion().train, 1024), test = head(fashion().test, 200);
    Trainer<decltype(nested()), optim::Adam, FullPrecision, Comm> t{
        nested(), optim::Adam{}.lr(2e-3f), TrainingOptions{options}.epochs(1).verbose(false), make_comm(group)};
    t.fit(train, test);
    if (world_rank() == 0) {
      params.assign(t.params().values().begin(), t.params().values().end());
      if (buckets) *buckets = t.bucket_count();
    }
    MPI_Comm_free(&group);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return params;
}
}  // namespace

TEST_CASE("MPI: a nested residual model with 3+ buckets ends bitwise as with one, and as on 1 rank", "[mpi]") {
  auto mpi = [](MPI_Comm g) { return MpiAllReduce(g); };
  auto single = [](MPI_Comm) { return parallel::SingleProcess{}; };
  const auto base = TrainingOptions{}.global_batch_size(64);
  std::size_t buckets = 0;
  const auto one_bucket = train_nested<MpiAllReduce>(2, base, mpi);
  const auto many = train_nested<MpiAllReduce>(2, TrainingOptions{base}.bucket_bytes(4096), mpi, &buckets);
  const auto det = TrainingOptions{base}.deterministic(16).bucket_bytes(4096);
  const auto det_two = train_nested<MpiAllReduce>(2, det, mpi);
  const auto det_one = train_nested<parallel::SingleProcess>(1, det, single);
  if (world_rank() == 0) {
    REQUIRE(buckets >= 3);
    REQUIRE(one_bucket == many);
    REQUIRE(det_two == det_one);
  }
}
