// train/engine.hpp: the step the Trainer and the Accelerator share. A micro-step is forward, the
// loss, backward and step, bitwise; its buffers live in the backend's memory; the modes that
// cannot run the Accelerate-style path say so.
#include <algorithm>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "train/helpers.hpp"
#include "xtrain/parallel/thread.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;

TEST_CASE("Engine::micro_step is forward, the loss, backward and step", "[train][engine]") {
  const auto data = head(fashion().train, 256);
  data::Loader<data::TensorDataset> loader(data, 32, 7, true, false, 0, 1);
  loader.set_epoch(0);
  using E = Engine<decltype(simple_model()), optim::Adam, MixedPrecision<bf16>>;
  set_seed(4);
  E whole{simple_model(), optim::Adam{}, parallel::SingleProcess{}, TrainingOptions{}.accumulate(2)};
  set_seed(4);
  E parts{simple_model(), optim::Adam{}, parallel::SingleProcess{}, TrainingOptions{}.accumulate(2)};
  for (std::size_t k = 0; k < loader.batches(); ++k) {
    const auto b = loader.batch(k);
    const StepResult r = whole.micro_step(b.x, b.y, b.global_offset, b.global_count);
    const bool sync = parts.sync_next();
    const float loss =
        parts.loss_forward(parts.forward(b.x, b.global_offset), b.y, parts.loss_normalizer(b.y, b.global_count));
    parts.backward(parts.loss_backward(), sync);
    parts.step(sync, b.global_count);
    REQUIRE(r.loss == loss);
  }
  REQUIRE(whole.step() == 4);  // 8 micro-batches, 2 per step
  REQUIRE(std::equal(whole.params().values().begin(), whole.params().values().end(), parts.params().values().begin()));
  REQUIRE(&memory::resource_of(whole.params().values().data()) == &whole.memory());
}

TEST_CASE("The engine says which modes cannot run the Accelerate-style path", "[train][engine][errors]") {
  Engine<decltype(simple_model()), optim::Adam> tree{simple_model(), optim::Adam{}, parallel::SingleProcess{},
                                                     TrainingOptions{}.deterministic(8).global_batch_size(32)};
  CHECK_THROWS_WITH(tree.forward(Tensor<float>({4, 784}), 0), Catch::Contains("needs Engine::micro_step"));
  parallel::launch_threads(2, [](parallel::ThreadAllReduce& comm) {
    Engine<decltype(simple_model()), optim::Adam, FullPrecision, parallel::ThreadAllReduce> sharded{
        simple_model(), optim::Adam{}, comm, TrainingOptions{}.shard_optimizer(true)};
    CHECK_THROWS_WITH(sharded.unscale_gradients(), Catch::Contains("not with shard_optimizer"));
  });
}
