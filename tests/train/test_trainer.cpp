// train/trainer.hpp on the real Fashion-MNIST: SimpleModel learns, the same seed gives the same
// bits, every sample is counted, and data that does not fit the model is refused.
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "train/helpers.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;

TEST_CASE("SimpleModel learns Fashion-MNIST: 2 epochs reach 84 percent test accuracy", "[trainer][fashion]") {
  set_seed(42);
  Trainer trainer{simple_model(), optim::Adam{}.lr(1e-3f), TrainingOptions{}.epochs(2).verbose(false)};
  const History h = trainer.fit(fashion().train, fashion().test);
  REQUIRE(h.epochs.size() == 2);
  const auto& m = h.epochs.back();
  REQUIRE(m.train.count == 60000);  // every training sample once per epoch (last batch partial)
  REQUIRE(m.test.count == 10000);   // every test sample exactly once
  REQUIRE(m.test.accuracy >= 84.0);
  REQUIRE(h.epochs[1].train.loss < h.epochs[0].train.loss);
  REQUIRE(trainer.step() == 2 * 1875);
  REQUIRE(trainer.epoch() == 2);
  REQUIRE(m.samples_per_second > 0);
}

TEST_CASE("Same seed twice gives bitwise identical parameters and another seed does not", "[trainer]") {
  const auto train = head(fashion().train, 3000), test = head(fashion().test, 500);
  auto run = [&](std::uint64_t seed) {
    set_seed(seed);
    Trainer t{
        nn::Sequential{nn::Linear{784, 16}, nn::Dropout{0.2f}, nn::BatchNorm1d{16}, nn::GELU{}, nn::Linear{16, 10}},
        optim::AdamW{}, TrainingOptions{}.epochs(2).seed(seed).verbose(false)};
    t.fit(train, test);
    return std::vector<float>(t.params().values().begin(), t.params().values().end());
  };
  const auto a = run(7), b = run(7), c = run(8);
  REQUIRE(a == b);
  REQUIRE(a != c);
}

TEST_CASE("Data that does not fit the model is refused with the layer and shapes", "[trainer][errors]") {
  const auto train = head(fashion().train, 64);
  Trainer trainer{nn::Sequential{nn::Linear{512, 8}, nn::ReLU{}, nn::Linear{8, 10}}, optim::Adam{},
                  TrainingOptions{}.epochs(1).verbose(false)};
  REQUIRE_THROWS_WITH(trainer.fit(train, train), Catch::Contains("Linear(512, 8): input has shape [32, 784]"));
  Trainer few_classes{nn::Sequential{nn::Linear{784, 8}, nn::ReLU{}, nn::Linear{8, 5}}, optim::Adam{},
                      TrainingOptions{}.epochs(1).verbose(false)};
  REQUIRE_THROWS_WITH(few_classes.fit(train, train), Catch::Contains("outside [0, 5)"));
}
