// Trainer on the real Fashion-MNIST: learns, is reproducible, counts every sample, calls callbacks.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using xtrain::test::fashion;
using xtrain::test::head;
namespace nn = xtrain::layers;

namespace {
auto simple_model(std::size_t hidden = 32) {
  return nn::Sequential{nn::Linear{784, hidden}, nn::BatchNorm1d{hidden}, nn::ReLU{}, nn::Linear{hidden, 10}};
}

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

TEST_CASE("SimpleModel learns Fashion-MNIST: 2 epochs reach 84 percent test accuracy", "[trainer][fashion]") {
  set_seed(42);
  Trainer trainer{simple_model(), optim::Adam{}.lr(1e-3f), TrainerOptions{}.epochs(2).verbose(false)};
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
        optim::AdamW{}, TrainerOptions{}.epochs(2).seed(seed).verbose(false)};
    t.fit(train, test);
    return std::vector<float>(t.params().values().begin(), t.params().values().end());
  };
  const auto a = run(7), b = run(7), c = run(8);
  REQUIRE(a == b);
  REQUIRE(a != c);
}

TEST_CASE("Callbacks are found by detection and schedules drive the step's learning rate", "[trainer][callbacks]") {
  const auto train = head(fashion().train, 640), test = head(fashion().test, 100);
  set_seed(1);
  Trainer trainer{simple_model(8), optim::SGD{}.lr(0.1f).momentum(0.9f),
                  TrainerOptions{}.epochs(3).batch_size(64).schedule(optim::LrSchedule::step(10, 0.5f)).verbose(false)};
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
  Trainer trainer{simple_model(8), optim::Adam{}.lr(0.0f), TrainerOptions{}.epochs(10).verbose(false)};
  const std::string csv = (std::filesystem::temp_directory_path() / "xtrain_test_log.csv").string();
  const History h = trainer.fit(train, test, callbacks::EarlyStopping{2}, callbacks::CsvLogger{csv});
  REQUIRE(h.epochs.size() == 3);
  std::ifstream in(csv);
  std::string line;
  std::size_t lines = 0;
  while (std::getline(in, line)) ++lines;
  REQUIRE(lines == 4);  // header + 3 epochs
}

TEST_CASE("Data that does not fit the model is refused with the layer and shapes", "[trainer][errors]") {
  const auto train = head(fashion().train, 64);
  Trainer trainer{nn::Sequential{nn::Linear{512, 8}, nn::ReLU{}, nn::Linear{8, 10}}, optim::Adam{},
                  TrainerOptions{}.epochs(1).verbose(false)};
  REQUIRE_THROWS_WITH(trainer.fit(train, train), Catch::Contains("Linear(512, 8): input has shape [32, 784]"));
  Trainer few_classes{nn::Sequential{nn::Linear{784, 8}, nn::ReLU{}, nn::Linear{8, 5}}, optim::Adam{},
                      TrainerOptions{}.epochs(1).verbose(false)};
  REQUIRE_THROWS_WITH(few_classes.fit(train, train), Catch::Contains("outside [0, 5)"));
}

namespace {
struct RaiseAtStep {  // sends this process `sig` after optimizer step `at`, as a scheduler would
  std::uint64_t at;
  int sig;
  template <class T>
  void on_step_end(T&, const StepResult& r) const {
    if (r.step == at) std::raise(sig);
  }
};
struct SignalWhileSaving {  // registered for checkpointing: a second signal arrives during the save
  bool armed = false;
  int saves = 0;
  template <class Archive>
  void serialize(Archive& ar, unsigned) {
    ar& saves;
    if (armed) std::raise(SIGTERM);
  }
};
}  // namespace

TEST_CASE("StopSignals records a signal instead of dying and restores the handlers it replaced", "[trainer][signals]") {
  struct sigaction before = {};
  ::sigaction(SIGUSR1, nullptr, &before);
  {
    StopSignals signals;
    REQUIRE(StopSignals::received() == 0);
    parallel::SingleProcess one;
    REQUIRE(signals.poll(one) == 0);
    std::raise(SIGUSR1);  // the default action would end the test run
    REQUIRE(StopSignals::received() == SIGUSR1);
    std::raise(SIGTERM);  // the first signal is the one reported
    REQUIRE(signals.poll(one) == SIGUSR1);
  }
  struct sigaction after = {};
  ::sigaction(SIGUSR1, nullptr, &after);
  REQUIRE(after.sa_handler == before.sa_handler);
  // A signal that cannot be handled is refused, and what was installed before it is undone.
  REQUIRE_THROWS_WITH(StopSignals({SIGUSR1, 12345}), Catch::Contains("cannot handle signal 12345"));
  ::sigaction(SIGUSR1, nullptr, &after);
  REQUIRE(after.sa_handler == before.sa_handler);
  REQUIRE(signal_name(SIGUSR1) == "SIGUSR1");
  REQUIRE(exit_code_of(ValueError("x")) == exit_code::bad_input);
  REQUIRE(exit_code_of(CheckpointError("x")) == exit_code::failure);
}

TEST_CASE("Ranks agree on a signal only one of them received, at the same step", "[trainer][signals]") {
  // Ranks as threads share the process's signal flag, so each rank's own signal is given to poll:
  // rank 1 has received SIGUSR1 from its step 150 on, rank 0 never.
  std::vector<std::vector<int>> answers(2);
  parallel::launch_threads(2, [&](parallel::ThreadAllReduce& comm) {
    StopSignals signals;
    for (int step = 0; step < 300; ++step)
      answers[comm.rank()].push_back(signals.poll(comm, comm.rank() == 1 && step >= 150 ? SIGUSR1 : 0));
  });
  REQUIRE(answers[0] == answers[1]);  // the same answer at every step on both ranks
  const auto first = std::find(answers[0].begin(), answers[0].end(), SIGUSR1);
  REQUIRE(first != answers[0].end());
  REQUIRE(first - answers[0].begin() >= 150);
  REQUIRE(first - answers[0].begin() < 150 + 64);  // never more than 64 steps between checks
}

TEST_CASE("A signal during fit() saves a checkpoint at that step, and resuming ends as an uninterrupted run",
          "[trainer][signals][checkpoint]") {
  const auto train = head(fashion().train, 640), test = head(fashion().test, 200);
  const auto project = std::filesystem::temp_directory_path() / "xtrain_test_signal";
  std::filesystem::remove_all(project);
  const auto options = TrainerOptions{}.epochs(2).batch_size(32).verbose(false);
  set_seed(5);
  Trainer straight{simple_model(8), optim::Adam{}, options};
  straight.fit(train, test);

  struct sigaction before = {};
  ::sigaction(SIGTERM, nullptr, &before);  // Catch2's own handler
  set_seed(5);
  Trainer first{simple_model(8), optim::Adam{}, TrainerOptions{options}.project_dir(project.string())};
  SignalWhileSaving second_signal{true};
  first.register_for_checkpointing(second_signal);
  try {
    first.fit(train, test, RaiseAtStep{27, SIGTERM});  // inside epoch 2 (20 steps per epoch)
    FAIL("fit() returned after SIGTERM");
  } catch (const Interrupted& e) {
    REQUIRE(e.signal() == SIGTERM);
    REQUIRE(e.saved());
    REQUIRE(e.exit_code() == exit_code::interrupted);
    REQUIRE(e.checkpoint() == (project / "checkpoints" / "checkpoint_0").string());
    REQUIRE_THAT(e.what(), Catch::Contains("received SIGTERM at epoch 2 step 27: checkpoint saved to"));
  }
  REQUIRE(first.step() == 27);
  struct sigaction now = {};
  ::sigaction(SIGTERM, nullptr, &now);
  REQUIRE(now.sa_handler == &detail::on_stop_signal);  // latched: a late signal cannot kill the shutdown
  REQUIRE(before.sa_handler != &detail::on_stop_signal);

  REQUIRE(StopSignals::received() == SIGTERM);  // the signal raised during the save was recorded
  StopSignals::clear();                         // (or the next fit() would stop at once)
  set_seed(99);                                 // other initial values: the checkpoint must overwrite them
  Trainer second{simple_model(8), optim::Adam{}, TrainerOptions{options}.project_dir(project.string())};
  SignalWhileSaving loaded;
  second.register_for_checkpointing(loaded);
  second.resume("latest");  // the SIGTERM raised while it was being written did not tear it
  REQUIRE(second.step() == 27);
  second.fit(train, test);
  REQUIRE(second.params().values().size() == straight.params().values().size());
  REQUIRE(
      std::equal(second.params().values().begin(), second.params().values().end(), straight.params().values().begin()));

  Trainer nowhere{simple_model(8), optim::Adam{}, options};
  try {
    nowhere.fit(train, test, RaiseAtStep{3, SIGUSR1});
    FAIL("fit() returned after SIGUSR1");
  } catch (const Interrupted& e) {
    REQUIRE(!e.saved());
    REQUIRE(e.exit_code() == 128 + SIGUSR1);
    REQUIRE_THAT(e.what(), Catch::Contains("received SIGUSR1 at epoch 1 step 3: nothing saved (no project directory"));
  }
  Trainer deaf{simple_model(8), optim::Adam{}, TrainerOptions{options}.stop_signals({})};
  REQUIRE(deaf.options().stop_signals().empty());
  std::filesystem::remove_all(project);
}

TEST_CASE("The Accelerator-style loop asks stop_signal() at its step boundaries", "[trainer][signals]") {
  Accelerator acc;
  REQUIRE_THROWS_WITH(acc.stop_signal(), Catch::Contains("call handle_stop_signals() first"));
  acc.handle_stop_signals();
  REQUIRE(acc.stop_signal() == 0);
  std::raise(SIGUSR1);  // recorded, not fatal
  REQUIRE(acc.stop_signal() == SIGUSR1);
}
