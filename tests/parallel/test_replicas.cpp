// parallel/replicas.hpp: ranks that built different models are refused at start-up, naming the
// parameter and both shapes; with XTRAIN_DEBUG_COLLECTIVES, ranks whose parameters drift apart
// are stopped, naming the step.
#include <cstdlib>

#include <catch2/catch.hpp>

#include "parallel/helpers.hpp"
#include "xtrain/parallel/thread.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;
using parallel::ThreadAllReduce;

TEST_CASE("Ranks that built different models get an error naming the parameter and both shapes", "[parallel][errors]") {
  REQUIRE_THROWS_WITH(
      parallel::launch_threads(
          2,
          [](ThreadAllReduce& comm) {
            const std::size_t hidden = comm.rank() == 0 ? 32 : 64;
            auto model = nn::Sequential{nn::Linear{784, hidden}, nn::ReLU{}, nn::Linear{hidden, 10}};
            Trainer<decltype(model), optim::Adam, FullPrecision, ThreadAllReduce> t{std::move(model), optim::Adam{},
                                                                                    TrainingOptions{}, comm};
          }),
      Catch::Contains("parameter '0.weight'") && Catch::Contains("[64, 784]") && Catch::Contains("[32, 784]"));
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
          mlp(), optim::Adam{}, TrainingOptions{}.global_batch_size(64).epochs(1).verbose(false), comm};
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
