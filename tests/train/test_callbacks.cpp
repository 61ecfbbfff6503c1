// train/callbacks.hpp: callbacks found by detection (any subset of the hooks), schedules driving
// the step's learning rate, EarlyStopping and CsvLogger.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "train/helpers.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;

namespace {
struct Recorder {
  std::size_t begins = 0, epochs = 0, steps = 0, ends = 0;
  std::uint64_t last_step = 0;
  float first_lr = -1, last_lr = -1;
  template <class T>
  void on_train_begin(T&) {
    ++begins;
  }
  template <class T>
  void on_step_end(T&, const StepResult& r) {
    ++steps;
    last_step = r.step;
    if (first_lr < 0) first_lr = r.lr;
    last_lr = r.lr;
  }
  template <class T>
  void on_epoch_end(T&, const EpochMetrics&) {
    ++epochs;
  }
  template <class T>
  void on_train_end(T&, const History&) {
    ++ends;
  }
};
struct OnlyEpochs {  // any subset of the hooks is fine
  int seen = 0;
  template <class T>
  void on_epoch_end(T&, const EpochMetrics&) {
    ++seen;
  }
};
}  // namespace

TEST_CASE("Callbacks are found by detection and schedules drive the step's learning rate", "[trainer][callbacks]") {
  const auto train = head(fashion().train, 640), test = head(fashion().test, 100);
  set_seed(1);
  Trainer trainer{
      simple_model(8), optim::SGD{}.lr(0.1f).momentum(0.9f),
      TrainingOptions{}.epochs(3).batch_size(64).schedule(optim::LrSchedule::step(10, 0.5f)).verbose(false)};
  Recorder rec;
  OnlyEpochs only;
  trainer.fit(train, test, rec, only);
  REQUIRE(rec.begins == 1);
  REQUIRE(rec.ends == 1);
  REQUIRE(rec.epochs == 3);
  REQUIRE(only.seen == 3);
  REQUIRE(rec.steps == 30);
  REQUIRE(rec.last_step == 30);
  REQUIRE(rec.first_lr == Approx(0.1f));
  REQUIRE(rec.last_lr == Approx(0.025f));  // steps 21..30 use 0.1 * 0.5^2
}

TEST_CASE("EarlyStopping ends fit() and CsvLogger writes one row per epoch", "[trainer][callbacks]") {
  const auto train = head(fashion().train, 320), test = head(fashion().test, 100);
  set_seed(2);
  // lr 0: the test loss never improves after the first epoch, so patience 2 stops after epoch 3.
  Trainer trainer{simple_model(8), optim::Adam{}.lr(0.0f), TrainingOptions{}.epochs(10).verbose(false)};
  const std::string csv = (std::filesystem::temp_directory_path() / "xtrain_test_log.csv").string();
  const History h = trainer.fit(train, test, callbacks::EarlyStopping{2}, callbacks::CsvLogger{csv});
  REQUIRE(h.epochs.size() == 3);
  std::ifstream in(csv);
  std::string line;
  std::size_t lines = 0;
  while (std::getline(in, line)) ++lines;
  REQUIRE(lines == 4);  // header + 3 epochs
}
