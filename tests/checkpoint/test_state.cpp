// checkpoint/state.hpp: exact resume (epoch boundary, mid-epoch, saved on 2 thread-ranks and
// resumed on 1 and the reverse), automatic naming with a total limit and "latest", and registered
// objects saved with the state.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "checkpoint/helpers.hpp"
#include "support.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;
namespace fs = std::filesystem;

namespace {
std::vector<float> moments(BnTrainer& t) {
  auto& s = t.optimizer_state();
  std::vector<float> v(s.exp_avg.begin(), s.exp_avg.end());
  v.insert(v.end(), s.exp_avg_sq.begin(), s.exp_avg_sq.end());
  return v;
}
void require_same_metrics(const EpochMetrics& a, const EpochMetrics& b) {
  REQUIRE(a.train.loss == b.train.loss);
  REQUIRE(a.train.accuracy == b.train.accuracy);
  REQUIRE(a.test.loss == b.test.loss);
  REQUIRE(a.test.accuracy == b.test.accuracy);
}

}  // namespace

TEST_CASE("Resume at an epoch boundary is bitwise exact: parameters, optimizer state, metrics", "[checkpoint]") {
  const fs::path dir = fresh_dir("epoch");
  BnTrainer straight{bn_model(), optim::Adam{}, options(4)};
  const History full = straight.fit(train1600(), test300());

  BnTrainer first{bn_model(), optim::Adam{}, options(2)};
  first.fit(train1600(), test300());
  first.save_state(dir.string());

  BnTrainer second{bn_model(99), optim::Adam{}, options(4)};  // other initial weights: the load must win
  second.load_state(dir.string());
  REQUIRE(second.epoch() == 2);
  REQUIRE(second.step() == 100);
  const History rest = second.fit(train1600(), test300());
  REQUIRE(rest.epochs.size() == 2);
  REQUIRE(values(second) == values(straight));
  REQUIRE(moments(second) == moments(straight));
  REQUIRE(second.model().get<1>().running_var()[3] == straight.model().get<1>().running_var()[3]);
  require_same_metrics(rest.epochs[1], full.epochs[3]);
}

TEST_CASE("Resume in the middle of an epoch is bitwise exact, metrics of that epoch included", "[checkpoint]") {
  const fs::path dir = fresh_dir("mid");
  BnTrainer straight{bn_model(), optim::Adam{}, options(2)};
  const History full = straight.fit(train1600(), test300());

  BnTrainer first{bn_model(), optim::Adam{}, options(2)};
  REQUIRE_THROWS_WITH(first.fit(train1600(), test300(), SaveAndStop{dir.string(), 73}),
                      "interrupted");  // epoch 2, batch 23

  BnTrainer second{bn_model(99), optim::Adam{}, options(2)};
  second.load_state(dir.string());
  REQUIRE(second.epoch() == 1);
  const History rest = second.fit(train1600(), test300());
  REQUIRE(values(second) == values(straight));
  REQUIRE(moments(second) == moments(straight));
  require_same_metrics(rest.epochs.back(), full.epochs.back());
}

TEST_CASE("A state saved on 2 ranks resumes on 1 and the reverse", "[checkpoint][parallel]") {
  auto mlp = [] {
    set_seed(11);
    return nn::Sequential{nn::Linear{784, 32}, nn::ReLU{}, nn::Linear{32, 10}};
  };
  using T = Trainer<decltype(mlp()), optim::Adam, FullPrecision, parallel::ThreadAllReduce>;
  for (const std::size_t chunk : {std::size_t{0}, std::size_t{16}}) {
    const auto opts = TrainingOptions{}.global_batch_size(64).deterministic(chunk).epochs(2).seed(4).verbose(false);
    auto run = [&](std::size_t ranks, const std::string& load, std::uint64_t stop_at, const std::string& save) {
      std::vector<float> result;
      parallel::launch_threads(ranks, [&](parallel::ThreadAllReduce& comm) {
        T t{mlp(), optim::Adam{}, opts, comm};
        if (!load.empty()) t.load_state(load);
        try {
          if (stop_at)
            t.fit(train1600(), test300(), SaveAndStop{save, stop_at});
          else
            t.fit(train1600(), test300());
        } catch (const std::runtime_error&) {
        }
        if (comm.rank() == 0) result.assign(t.params().values().begin(), t.params().values().end());
      });
      return result;
    };
    const auto straight = run(1, "", 0, "");
    const std::string a = fresh_dir("ranks_a").string(), b = fresh_dir("ranks_b").string();
    run(2, "", 30, a);                         // 2 ranks save mid-epoch 2
    const auto two_to_one = run(1, a, 0, "");  // 1 rank finishes
    run(1, "", 30, b);                         // 1 rank saves
    const auto one_to_two = run(2, b, 0, "");  // 2 ranks finish
    INFO("deterministic chunk " << chunk);
    float d1 = 0, d2 = 0;
    for (std::size_t i = 0; i < straight.size(); ++i) {
      d1 = std::max(d1, std::abs(two_to_one[i] - straight[i]));
      d2 = std::max(d2, std::abs(one_to_two[i] - straight[i]));
    }
    REQUIRE(d1 <= 1e-5f);
    REQUIRE(d2 <= 1e-5f);
    if (chunk) {
      REQUIRE(two_to_one == straight);
      REQUIRE(one_to_two == straight);
    }
  }
}

namespace {
struct Counter {
  int calls = 0;
  std::string note;
  template <class Archive>
  void serialize(Archive& ar, unsigned) {
    ar& calls;
    ar& note;
  }
};
}  // namespace

TEST_CASE("Automatic checkpoint naming, total limit, latest, and registered objects", "[checkpoint]") {
  const fs::path project = fresh_dir("project");
  BnTrainer t{bn_model(), optim::Adam{}, options(3).project_dir(project.string()).total_limit(2)};
  Counter counter{7, "hello"};
  t.register_for_checkpointing(counter);
  t.fit(train1600(), test300(), callbacks::CheckpointEvery{}.epochs(1));
  const fs::path root = project / "checkpoints";
  REQUIRE_FALSE(fs::exists(root / "checkpoint_0"));  // deleted: total_limit 2
  REQUIRE(fs::exists(root / "checkpoint_1" / "state.xtrain"));
  REQUIRE(fs::exists(root / "checkpoint_2" / "state.xtrain"));
  fs::create_directories(root / "checkpoint_3.tmp");  // a save that crashed: never "latest"

  BnTrainer again{bn_model(99), optim::Adam{}, options(3).project_dir(project.string())};
  Counter restored;
  again.register_for_checkpointing(restored);
  REQUIRE(again.resume("latest") == (root / "checkpoint_2").string());
  REQUIRE(again.epoch() == 3);
  REQUIRE(restored.calls == 7);
  REQUIRE(restored.note == "hello");
  REQUIRE(values(again) == values(t));
  REQUIRE(again.save_checkpoint() == (root / "checkpoint_3").string());  // the .tmp leftover is replaced
  BnTrainer none{bn_model(), optim::Adam{}, options(1).project_dir(fresh_dir("empty").string())};
  REQUIRE_THROWS_WITH(none.resume("latest"), Catch::Contains("no checkpoint in"));
}
