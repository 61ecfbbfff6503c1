// Data parallelism on ranks-as-threads (ThreadAllReduce): the same training on 1, 2 or 4 ranks,
// bitwise with the deterministic reduction; accumulation; exact global evaluation; buckets;
// SyncBatchNorm; failures that end every rank instead of hanging.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "xtrain/parallel/thread.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using xtrain::test::fashion;
using xtrain::test::head;
namespace nn = xtrain::layers;
using parallel::ThreadAllReduce;

namespace {
const data::TensorDataset& train3200() {
  static const auto d = head(fashion().train, 3200);
  return d;
}
const data::TensorDataset& test500() {
  static const auto d = head(fashion().test, 500);
  return d;
}

/// A model without BatchNorm (its per-rank statistics differ by design), with Dropout (whose
/// masks follow the global sample position).
auto mlp() {
  set_seed(11);
  return nn::Sequential{nn::Linear{784, 32}, nn::ReLU{}, nn::Dropout{0.1f}, nn::Linear{32, 10}};
}

/// Trains on `ranks` threads for one epoch of train3200(); returns rank 0's parameters.
template <class MakeModel>
std::vector<float> train_on(std::size_t ranks, TrainerOptions options, MakeModel make_model,
                            std::vector<EpochMetrics>* metrics = nullptr) {
  std::vector<float> params;
  std::mutex m;
  options.epochs(1).verbose(false);  // before the ranks start: they share `options`
  parallel::launch_threads(ranks, [&](ThreadAllReduce& comm) {
    Trainer<decltype(make_model()), optim::Adam, FullPrecision, ThreadAllReduce> t{
        make_model(), optim::Adam{}.lr(2e-3f), options, comm};
    const History h = t.fit(train3200(), test500());
    std::lock_guard lock(m);
    if (comm.rank() == 0) {
      params.assign(t.params().values().begin(), t.params().values().end());
      if (metrics) *metrics = h.epochs;
    }
  });
  return params;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}
}  // namespace

TEST_CASE("Fixed global batch: 1, 2 and 4 ranks agree to 1e-5 after 50 steps", "[parallel]") {
  const auto options = TrainerOptions{}.global_batch_size(64);
  const auto one = train_on(1, options, mlp), two = train_on(2, options, mlp), four = train_on(4, options, mlp);
  CHECK(max_abs_diff(one, two) <= 1e-5f);
  CHECK(max_abs_diff(one, four) <= 1e-5f);
  CHECK(one != std::vector<float>(one.size(), 0.0f));
}

TEST_CASE("Deterministic reduction: 1, 2 and 4 ranks give bitwise identical parameters", "[parallel]") {
  const auto options = TrainerOptions{}.global_batch_size(64).deterministic(16);
  const auto one = train_on(1, options, mlp), two = train_on(2, options, mlp), four = train_on(4, options, mlp);
  REQUIRE(one == two);
  REQUIRE(one == four);
  // The deterministic reduction computes the same gradients as the default one, up to rounding.
  const auto plain = train_on(2, TrainerOptions{}.global_batch_size(64), mlp);
  REQUIRE(max_abs_diff(one, plain) <= 1e-5f);
  REQUIRE_THROWS_WITH(train_on(3, options, mlp), Catch::Contains("power-of-two"));
}

TEST_CASE("Accumulating 2 micro-batches of 32 equals one batch of 64", "[parallel]") {
  const auto batch64 = train_on(2, TrainerOptions{}.global_batch_size(64), mlp);
  const auto accumulated = train_on(2, TrainerOptions{}.global_batch_size(32).accumulate(2), mlp);
  REQUIRE(max_abs_diff(batch64, accumulated) <= 1e-5f);
  // With the deterministic reduction (chunks of 16) the two are bitwise equal.
  REQUIRE(train_on(2, TrainerOptions{}.global_batch_size(64).deterministic(16), mlp) ==
          train_on(2, TrainerOptions{}.global_batch_size(32).accumulate(2).deterministic(16), mlp));
}

TEST_CASE("Same seed twice on 2 ranks gives bitwise identical parameters", "[parallel]") {
  const auto options = TrainerOptions{}.batch_size(32).seed(5);
  REQUIRE(train_on(2, options, mlp) == train_on(2, options, mlp));
  REQUIRE(train_on(2, options, mlp) != train_on(2, TrainerOptions{}.batch_size(32).seed(6), mlp));
}

TEST_CASE("Buckets: several small buckets sum exactly as one", "[parallel]") {
  const auto one_bucket = train_on(2, TrainerOptions{}.global_batch_size(64), mlp);
  const auto many = train_on(2, TrainerOptions{}.global_batch_size(64).bucket_bytes(1024), mlp);
  REQUIRE(one_bucket == many);
  parallel::launch_threads(1, [](ThreadAllReduce& comm) {
    Trainer<decltype(mlp()), optim::Adam, FullPrecision, ThreadAllReduce> t{mlp(), optim::Adam{},
                                                                            TrainerOptions{}.verbose(false), comm};
    REQUIRE(t.bucket_count() == 1);  // a small model is one bucket: one collective per step
    Trainer<decltype(mlp()), optim::Adam, FullPrecision, ThreadAllReduce> small{
        mlp(), optim::Adam{}, TrainerOptions{}.bucket_bytes(1024).verbose(false), comm};
    REQUIRE(small.bucket_count() == 4);  // 256 floats: 3.bias | 3.weight (320) | 0.bias | 0.weight
  });
}

TEST_CASE("Evaluation counts every test sample exactly once on any rank count", "[parallel]") {
  for (std::size_t ranks : {1u, 2u, 3u, 4u}) {
    parallel::launch_threads(ranks, [&](ThreadAllReduce& comm) {
      Trainer<decltype(mlp()), optim::Adam, FullPrecision, ThreadAllReduce> t{
          mlp(), optim::Adam{}, TrainerOptions{}.eval_batch_size(999).verbose(false), comm};
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
  const auto options = TrainerOptions{}.global_batch_size(64);
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
        std::move(model), optim::Adam{}, TrainerOptions{}.epochs(1).verbose(false), comm};
    t.fit(head(fashion().train, 640), test500());
    auto mean = t.model().get<1>().running_mean();
    stats[comm.rank()].assign(mean.begin(), mean.end());
  });
  REQUIRE(stats[0] == stats[1]);
}

TEST_CASE("One rank throwing ends every rank with that rank's message", "[parallel][errors]") {
  REQUIRE_THROWS_WITH(parallel::launch_threads(3,
                                               [](ThreadAllReduce& comm) {
                                                 if (comm.rank() == 1) throw ValueError("rank 1 broke");
                                                 std::vector<float> v(10, 1.0f);
                                                 comm.allreduce_sum(std::span<float>(v), "test allreduce");
                                               }),
                      "rank 1 broke");
}

TEST_CASE("A rank that never arrives makes the collective time out and name itself", "[parallel][errors]") {
  REQUIRE_THROWS_WITH(parallel::launch_threads(
                          2,
                          [](ThreadAllReduce& comm) {
                            if (comm.rank() == 1) return;  // never joins
                            std::vector<double> v(3, 1.0);
                            comm.allreduce_sum(std::span<double>(v), "epoch training metrics");
                          },
                          std::chrono::milliseconds(200)),
                      Catch::Contains("collective 'epoch training metrics' waited longer than"));
}

TEST_CASE("Ranks that built different models get an error naming the parameter and both shapes", "[parallel][errors]") {
  REQUIRE_THROWS_WITH(
      parallel::launch_threads(
          2,
          [](ThreadAllReduce& comm) {
            const std::size_t hidden = comm.rank() == 0 ? 32 : 64;
            auto model = nn::Sequential{nn::Linear{784, hidden}, nn::ReLU{}, nn::Linear{hidden, 10}};
            Trainer<decltype(model), optim::Adam, FullPrecision, ThreadAllReduce> t{std::move(model), optim::Adam{},
                                                                                    TrainerOptions{}, comm};
          }),
      Catch::Contains("parameter '0.weight'") && Catch::Contains("[64, 784]") && Catch::Contains("[32, 784]"));
}

TEST_CASE("clip_grad_norm and clip_grad_value follow PyTorch", "[optim][clip]") {
  std::vector<float> g{3.0f, 4.0f};
  REQUIRE(optim::clip_grad_norm(g, 1.0) == Approx(5.0));
  REQUIRE(g[0] == Approx(3.0f / (5.0f + 1e-6f)));
  REQUIRE(std::hypot(g[0], g[1]) <= 1.0f);
  std::vector<float> small{0.3f, 0.4f};
  optim::clip_grad_norm(small, 1.0);
  REQUIRE(small[1] == 0.4f);  // below the limit: untouched
  std::vector<float> v{-2.0f, 0.5f, 7.0f};
  optim::clip_grad_value(v, 1.0f);
  REQUIRE(v == std::vector<float>{-1.0f, 0.5f, 1.0f});
}

TEST_CASE("Linear LR scaling multiplies the learning rate by the rank count", "[parallel]") {
  parallel::launch_threads(2, [](ThreadAllReduce& comm) {
    Trainer<decltype(mlp()), optim::SGD, FullPrecision, ThreadAllReduce> t{
        mlp(), optim::SGD{}.lr(0.1f), TrainerOptions{}.scale_lr(true).verbose(false), comm};
    Matrix x({16, 784});
    std::vector<std::int32_t> y(16, 1);
    const auto r = t.train_step(x, y, comm.rank() * 16, 32);
    REQUIRE(r.lr == Approx(0.2f));
  });
}

TEST_CASE("Accelerate-style loop: the same training as the Trainer, bitwise", "[parallel][accelerator]") {
  const auto options = TrainerOptions{}.batch_size(16).accumulate(2).seed(9);
  const auto trainer = train_on(2, options, mlp);
  std::vector<float> own_loop;
  parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
    Accelerator acc{comm, AcceleratorOptions{}.gradient_accumulation_steps(2).seed(9)};
    auto ddp = acc.prepare(mlp(), optim::Adam{}.lr(2e-3f));
    auto loader = acc.prepare(train3200(), 16);
    loss::CrossEntropyLoss ce;
    loader.set_epoch(0);
    for (std::size_t k = 0; k < loader.batches(); ++k) {
      const auto batch = loader.batch(k);
      const bool sync = acc.accumulate(ddp, k + 1 == loader.batches());
      ce.forward(ddp.forward(batch.x, batch.global_offset), batch.y, acc.loss_normalizer(batch));
      acc.backward(ddp, ce.backward(), sync);
      ddp.step(sync, batch.global_count);
    }
    REQUIRE(ddp.step() == 50);
    acc.wait_for_everyone();
    if (acc.is_main_process()) own_loop.assign(ddp.params().values().begin(), ddp.params().values().end());
  });
  REQUIRE(own_loop == trainer);
}

TEST_CASE("gather_for_metrics concatenates uneven per-rank values in rank order", "[parallel][accelerator]") {
  std::vector<float> gathered;
  parallel::launch_threads(3, [&](ThreadAllReduce& comm) {
    Accelerator acc{comm};
    std::vector<float> mine(comm.rank() + 1, static_cast<float>(comm.rank()));  // 1, 2, 3 values
    const auto all = acc.gather_for_metrics(mine);
    if (acc.is_main_process()) gathered = all;
    REQUIRE(acc.num_processes() == 3);
  });
  REQUIRE(gathered == std::vector<float>{0, 1, 1, 2, 2, 2});
}

namespace {
/// The sharded arena is padded to a multiple of ranks x 16 floats: check the padding is still
/// zero and drop it, leaving the unsharded layout.
std::vector<float> without_padding(std::vector<float> v, std::size_t n) {
  REQUIRE(v.size() >= n);
  for (std::size_t i = n; i < v.size(); ++i) REQUIRE(v[i] == 0.0f);
  v.resize(n);
  return v;
}
}  // namespace

TEST_CASE("Sharded optimizer step (ZeRO-1) gives the parameters of the unsharded one", "[parallel][zero]") {
  for (const std::size_t ranks : {2u, 4u}) {
    INFO(ranks << " ranks");
    const auto plain = train_on(ranks, TrainerOptions{}.global_batch_size(64), mlp);
    const auto sharded = without_padding(
        train_on(ranks, TrainerOptions{}.global_batch_size(64).shard_optimizer(true), mlp), plain.size());
    REQUIRE(sharded == plain);  // same sums in the same order: bitwise
    const auto clipped = train_on(ranks, TrainerOptions{}.global_batch_size(64).clip_grad_norm(0.5), mlp);
    const auto clipped_sharded = without_padding(
        train_on(ranks, TrainerOptions{}.global_batch_size(64).clip_grad_norm(0.5).shard_optimizer(true), mlp),
        plain.size());
    REQUIRE(max_abs_diff(clipped, clipped_sharded) <= 1e-6f);  // the norm is summed in another order
    REQUIRE(max_abs_diff(clipped, plain) > 1e-4f);             // and clipping did act
  }
}

TEST_CASE("A sharded optimizer state is saved whole and resumes unsharded on another rank count",
          "[parallel][zero][checkpoint]") {
  const std::string dir = (std::filesystem::temp_directory_path() / "xtrain_zero_ckpt").string();
  std::filesystem::remove_all(dir);
  using T = Trainer<decltype(mlp()), optim::Adam, FullPrecision, ThreadAllReduce>;
  const auto options = TrainerOptions{}.global_batch_size(64).epochs(1).verbose(false);
  const auto straight = train_on(1, options, mlp);
  parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
    T t{mlp(), optim::Adam{}.lr(2e-3f), TrainerOptions{options}.shard_optimizer(true), comm};
    try {
      t.fit(train3200(), test500(), test::SaveAndStop{dir, 20});
    } catch (const std::runtime_error&) {
    }
  });
  std::vector<float> resumed;
  parallel::launch_threads(1, [&](ThreadAllReduce& comm) {
    T t{mlp(), optim::Adam{}.lr(2e-3f), options, comm};
    t.load_state(dir);
    REQUIRE(t.optimizer_state().exp_avg.size() == t.params().size());
    t.fit(train3200(), test500());
    resumed.assign(t.params().values().begin(), t.params().values().end());
  });
  REQUIRE(max_abs_diff(straight, resumed) <= 1e-5f);
}

TEST_CASE("Ranks that disagree on the configuration or the data stop at once, naming the field", "[parallel]") {
  // Rank 1 runs with `tweak` applied; every other setting and the data are rank 0's.
  auto run = [](auto tweak) {
    parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
      TrainerOptions options = TrainerOptions{}.global_batch_size(64).epochs(1).verbose(false);
      optim::Adam adam = optim::Adam{}.lr(2e-3f);
      const data::TensorDataset* train = &train3200();
      static const data::TensorDataset shuffled = [] {  // same size, other content
        data::TensorDataset d = head(fashion().train, 3200);
        Matrix x = d.features();
        std::reverse(x.begin(), x.end());
        return data::TensorDataset(std::move(x), std::vector<std::int32_t>(d.labels().begin(), d.labels().end()), 10,
                                   "reversed");
      }();
      if (comm.rank() == 1) tweak(options, adam, train, shuffled);
      Trainer<decltype(mlp()), optim::Adam, FullPrecision, ThreadAllReduce> t{mlp(), adam, options, comm};
      t.fit(*train, test500());
    });
  };
  using D = const data::TensorDataset*;
  REQUIRE_THROWS_WITH(run([](TrainerOptions& o, optim::Adam&, D&, const data::TensorDataset&) { o.epochs(2); }),
                      Catch::Contains("ranks disagree: epochs is '2' on rank 1 but '1' on rank 0"));
  REQUIRE_THROWS_WITH(run([](TrainerOptions& o, optim::Adam&, D&, const data::TensorDataset&) { o.seed(43); }),
                      Catch::Contains("the seed is '43' on rank 1 but '42' on rank 0"));
  REQUIRE_THROWS_WITH(run([](TrainerOptions&, optim::Adam& a, D&, const data::TensorDataset&) { a.lr(1e-3f); }),
                      Catch::Contains("the optimizer is 'Adam(lr=0.001") && Catch::Contains("'Adam(lr=0.002"));
  REQUIRE_THROWS_WITH(run([](TrainerOptions&, optim::Adam&, D& d, const data::TensorDataset& other) { d = &other; }),
                      Catch::Contains("the training set is 'size 3200, crc32") && Catch::Contains("on rank 0"));
  REQUIRE_THROWS_WITH(run([](TrainerOptions&, optim::Adam&, D& d, const data::TensorDataset&) {
                        static const auto smaller = head(fashion().train, 1600);
                        d = &smaller;
                      }),
                      Catch::Contains("the training set is 'size 1600"));
}

namespace {
/// Changes rank 1's first parameter after step 3: a rank drifting away from the others.
struct Drift {
  template <class T>
  void on_step_end(T& t, const StepResult& r) const {
    if (t.rank() == 1 && r.step == 3) t.params().values()[0] += 1e-3f;
  }
};
}  // namespace

TEST_CASE("XTRAIN_DEBUG_COLLECTIVES: ranks whose parameters drift apart are stopped, naming the step", "[parallel]") {
  ::setenv("XTRAIN_DEBUG_COLLECTIVES", "1", 1);
  ::setenv("XTRAIN_DEBUG_PARAMETERS_EVERY", "2", 1);
  auto run = [](bool drift) {
    parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
      Trainer<decltype(mlp()), optim::Adam, FullPrecision, ThreadAllReduce> t{
          mlp(), optim::Adam{}, TrainerOptions{}.global_batch_size(64).epochs(1).verbose(false), comm};
      if (drift)
        t.fit(train3200(), test500(), Drift{});
      else
        t.fit(train3200(), test500());
    });
  };
  REQUIRE_NOTHROW(run(false));
  REQUIRE_THROWS_WITH(run(true), Catch::Contains("parameters differ across ranks after step 4"));
  ::unsetenv("XTRAIN_DEBUG_COLLECTIVES");
  ::unsetenv("XTRAIN_DEBUG_PARAMETERS_EVERY");
}
