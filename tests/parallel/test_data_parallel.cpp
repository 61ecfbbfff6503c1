// Data parallelism on ranks-as-threads (parallel/thread.hpp under the Trainer): the same training
// on 1, 2 or 4 ranks for a fixed global batch, accumulation, seeds, exact global evaluation,
// SyncBatchNorm and per-rank BatchNorm statistics, and linear LR scaling.
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "parallel/helpers.hpp"
#include "support.hpp"
#include "xtrain/parallel/thread.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;
using parallel::ThreadAllReduce;

TEST_CASE("Fixed global batch: 1, 2 and 4 ranks agree to 1e-5 after 50 steps", "[parallel]") {
  const auto options = TrainingOptions{}.global_batch_size(64);
  const auto one = train_on(1, options, mlp), two = train_on(2, options, mlp), four = train_on(4, options, mlp);
  CHECK(max_abs_diff(one, two) <= 1e-5f);
  CHECK(max_abs_diff(one, four) <= 1e-5f);
  CHECK(one != std::vector<float>(one.size(), 0.0f));
}

TEST_CASE("Accumulating 2 micro-batches of 32 equals one batch of 64", "[parallel]") {
  const auto batch64 = train_on(2, TrainingOptions{}.global_batch_size(64), mlp);
  const auto accumulated = train_on(2, TrainingOptions{}.global_batch_size(32).accumulate(2), mlp);
  REQUIRE(max_abs_diff(batch64, accumulated) <= 1e-5f);
  // With the deterministic reduction (chunks of 16) the two are bitwise equal.
  REQUIRE(train_on(2, TrainingOptions{}.global_batch_size(64).deterministic(16), mlp) ==
          train_on(2, TrainingOptions{}.global_batch_size(32).accumulate(2).deterministic(16), mlp));
}

TEST_CASE("Same seed twice on 2 ranks gives bitwise identical parameters", "[parallel]") {
  const auto options = TrainingOptions{}.batch_size(32).seed(5);
  REQUIRE(train_on(2, options, mlp) == train_on(2, options, mlp));
  REQUIRE(train_on(2, options, mlp) != train_on(2, TrainingOptions{}.batch_size(32).seed(6), mlp));
}

TEST_CASE("Evaluation counts every test sample exactly once on any rank count", "[parallel]") {
  for (std::size_t ranks : {1u, 2u, 3u, 4u}) {
    parallel::launch_threads(ranks, [&](ThreadAllReduce& comm) {
      Trainer<decltype(mlp()), optim::Adam, FullPrecision, ThreadAllReduce> t{
          mlp(), optim::Adam{}, TrainingOptions{}.eval_batch_size(999).verbose(false), comm};
      const EvalResult r = t.evaluate(fashion().test);
      REQUIRE(r.count == 10000);
    });
  }
}

TEST_CASE("SyncBatchNorm on 2 ranks equals BatchNorm on 1 rank with the same global batch", "[parallel]") {
  // No bias before BatchNorm: BN removes it, so its gradient is rounding noise that Adam would
  // amplify into steps of ~lr (see test_parity.cpp), drowning the comparison.
  auto with_bn = [] {
    set_seed(3);
    return nn::Sequential{nn::Linear{784, 16, false}, nn::SyncBatchNorm{16}, nn::ReLU{}, nn::Linear{16, 10}};
  };
  const auto options = TrainingOptions{}.global_batch_size(64);
  std::vector<EpochMetrics> m1, m2;
  const auto one = train_on(1, options, with_bn, &m1), two = train_on(2, options, with_bn, &m2);
  REQUIRE(max_abs_diff(one, two) <= 1e-5f);
  REQUIRE(m1.back().test.accuracy == Approx(m2.back().test.accuracy).margin(0.21));  // at most one sample of 500
}

TEST_CASE("Per-rank BatchNorm: rank 0's running statistics are broadcast before evaluation", "[parallel]") {
  std::vector<std::vector<float>> stats(2);
  parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
    set_seed(3);
    auto model = nn::Sequential{nn::Linear{784, 8}, nn::BatchNorm1d{8}, nn::ReLU{}, nn::Linear{8, 10}};
    Trainer<decltype(model), optim::Adam, FullPrecision, ThreadAllReduce> t{
        std::move(model), optim::Adam{}, TrainingOptions{}.epochs(1).verbose(false), comm};
    t.fit(head(fashion().train, 640), test500());
    auto mean = t.model().get<1>().running_mean();
    stats[comm.rank()].assign(mean.begin(), mean.end());
  });
  REQUIRE(stats[0] == stats[1]);
}

TEST_CASE("Linear LR scaling multiplies the learning rate by the rank count", "[parallel]") {
  parallel::launch_threads(2, [](ThreadAllReduce& comm) {
    Trainer<decltype(mlp()), optim::SGD, FullPrecision, ThreadAllReduce> t{
        mlp(), optim::SGD{}.lr(0.1f), TrainingOptions{}.scale_lr(true).verbose(false), comm};
    Tensor<float> x({16, 784});
    std::vector<std::int32_t> y(16, 1);
    const auto r = t.train_step(x, y, comm.rank() * 16, 32);
    REQUIRE(r.lr == Approx(0.2f));
  });
}
