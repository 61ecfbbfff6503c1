// train/preemption.hpp: StopSignals records a signal instead of dying and restores the handlers,
// ranks agree on one rank's signal at the same step, a signal during fit() saves a checkpoint that
// resumes bitwise, and the Accelerate-style loop asks stop_signal().
#include <algorithm>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"
#include "train/helpers.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;

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
  const auto options = TrainingOptions{}.epochs(2).batch_size(32).verbose(false);
  set_seed(5);
  Trainer straight{simple_model(8), optim::Adam{}, options};
  straight.fit(train, test);

  struct sigaction before = {};
  ::sigaction(SIGTERM, nullptr, &before);  // Catch2's own handler
  set_seed(5);
  Trainer first{simple_model(8), optim::Adam{}, TrainingOptions{options}.project_dir(project.string())};
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
  Trainer second{simple_model(8), optim::Adam{}, TrainingOptions{options}.project_dir(project.string())};
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
  Trainer deaf{simple_model(8), optim::Adam{}, TrainingOptions{options}.stop_signals({})};
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
