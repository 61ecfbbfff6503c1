// train/accelerator.hpp on ranks-as-threads: the Accelerate-style loop trains bitwise as the
// Trainer does, and gather_for_metrics concatenates uneven per-rank values in rank order.
// (With fp16 loss scaling: precision/test_policy.cpp; stop signals: train/test_preemption.cpp.)
#include <vector>

#include <catch2/catch.hpp>

#include "parallel/helpers.hpp"
#include "xtrain/parallel/thread.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
using parallel::ThreadAllReduce;

TEST_CASE("Accelerate-style loop: the same training as the Trainer, bitwise", "[parallel][accelerator]") {
  const auto options = TrainingOptions{}.batch_size(16).accumulate(2).seed(9);
  const auto trainer = train_on(2, options, mlp);
  std::vector<float> own_loop;
  parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
    Accelerator acc{comm, TrainingOptions{}.accumulate(2).seed(9)};
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
