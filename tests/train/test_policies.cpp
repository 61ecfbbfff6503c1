// train/policies.hpp, train/options.hpp: one order of the policies and one options type for the
// Trainer, the Engine and the Accelerator. The same TrainingOptions (accumulation, clipping in
// the step, a schedule) give the Trainer's loop and an Accelerator loop the same parameters; the
// options refuse values that make no sense, naming them. (Policies out of order fail to compile:
// compile_fail/policies_out_of_order.cpp.)
#include <algorithm>
#include <type_traits>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "train/helpers.hpp"
#include "xtrain/parallel/thread.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;

static_assert(check_policies<decltype(simple_model()), optim::Adam, MixedPrecision<bf16>, parallel::SingleProcess,
                             backend::CpuThreads, loss::CrossEntropyLoss>());
static_assert(check_policies<MixedPrecision<fp16>, parallel::SingleProcess, backend::Cpu>());
static_assert(std::is_same_v<decltype(Accelerator{parallel::SingleProcess{}}),
                             Accelerator<FullPrecision, parallel::SingleProcess, backend::Cpu>>);

TEST_CASE("One TrainingOptions drives the Trainer and an Accelerator loop to the same parameters",
          "[train][options][accelerator]") {
  const auto train = head(fashion().train, 512);
  const auto options = TrainingOptions{}
                           .batch_size(32)
                           .seed(5)
                           .accumulate(2)
                           .clip_grad_norm(0.25)
                           .schedule(optim::LrSchedule::cosine(8, 1e-4f))
                           .verbose(false);
  set_seed(3);
  Trainer trainer{simple_model(), optim::Adam{}, TrainingOptions{options}.epochs(1)};
  trainer.fit(train, head(fashion().test, 64));

  set_seed(3);
  Accelerator acc{parallel::SingleProcess{}, options};
  auto engine = acc.prepare(simple_model(), optim::Adam{});
  auto loader = acc.prepare(train, 32);
  loader.set_epoch(0);
  loss::CrossEntropyLoss loss;
  for (std::size_t k = 0; k < loader.batches(); ++k) {
    const auto b = loader.batch(k);
    const bool sync = acc.accumulate(engine, k + 1 == loader.batches());
    loss.forward(engine.forward(b.x, b.global_offset), b.y, acc.loss_normalizer(b));
    acc.backward(engine, loss.backward(), sync);
    engine.step(sync, b.global_count);  // clipped in the step, as the Trainer's
  }
  REQUIRE(engine.step() == trainer.step());
  REQUIRE(
      std::equal(engine.params().values().begin(), engine.params().values().end(), trainer.params().values().begin()));
}

TEST_CASE("TrainingOptions refuse values that make no sense, naming them", "[train][options][errors]") {
  CHECK_THROWS_WITH(TrainingOptions{}.batch_size(0), Catch::Contains("batch_size must be positive"));
  CHECK_THROWS_WITH(TrainingOptions{}.accumulate(0), Catch::Contains("accumulate must be at least 1"));
  CHECK_THROWS_WITH(TrainingOptions{}.clip_grad_norm(-1.0), Catch::Contains("clip_grad_norm -1 must be >= 0"));
  CHECK_THROWS_WITH(TrainingOptions{}.loss_scale(0.0f), Catch::Contains("positive scale"));
  CHECK_THROWS_WITH(TrainingOptions{}.threads(5000), Catch::Contains("threads 5000 is more than 1024"));
  // A global batch smaller than the ranks is refused by the engine that would split it.
  parallel::launch_threads(2, [](parallel::ThreadAllReduce& comm) {
    using T = Trainer<decltype(simple_model()), optim::Adam, FullPrecision, parallel::ThreadAllReduce>;
    CHECK_THROWS_WITH((T{simple_model(), optim::Adam{}, TrainingOptions{}.global_batch_size(1), comm}),
                      Catch::Contains("global batch 1 is smaller than the 2 ranks"));
  });
}
