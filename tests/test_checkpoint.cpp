// Checkpoints: exact resume (epoch boundary, mid-epoch, other rank counts), automatic naming,
// registered objects, and a specific error for every kind of bad file.
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
using xtrain::test::SaveAndStop;
namespace nn = xtrain::layers;
namespace fs = std::filesystem;

namespace {
fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("xtrain_ckpt_" + name);
  fs::remove_all(dir);
  return dir;
}
const data::TensorDataset& train1600() {
  static const auto d = head(fashion().train, 1600);
  return d;
}
const data::TensorDataset& test300() {
  static const auto d = head(fashion().test, 300);
  return d;
}
auto bn_model(std::uint64_t seed = 5) {
  set_seed(seed);
  return nn::Sequential{nn::Linear{784, 16}, nn::BatchNorm1d{16}, nn::ReLU{}, nn::Dropout{0.1f}, nn::Linear{16, 10}};
}
using BnTrainer = Trainer<decltype(bn_model()), optim::Adam>;
TrainerOptions options(std::size_t epochs) {
  return TrainerOptions{}.epochs(epochs).batch_size(32).seed(3).verbose(false);
}

std::vector<float> values(BnTrainer& t) { return {t.params().values().begin(), t.params().values().end()}; }
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
    const auto opts = TrainerOptions{}.global_batch_size(64).deterministic(chunk).epochs(2).seed(4).verbose(false);
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

TEST_CASE("Bad checkpoint files get specific errors", "[checkpoint][errors]") {
  const fs::path dir = fresh_dir("bad");
  BnTrainer t{bn_model(), optim::Adam{}, options(1)};
  t.save_state(dir.string());
  const fs::path file = dir / "state.xtrain";
  std::string good;
  {
    std::ifstream in(file, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& bytes) { std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes; };
  auto expect = [&](const std::string& problem) {
    BnTrainer u{bn_model(), optim::Adam{}, options(1)};
    INFO(problem);
    REQUIRE_THROWS_AS(u.load_state(dir.string()), CheckpointError);
    REQUIRE_THROWS_WITH(u.load_state(dir.string()), Catch::Contains(file.string()) && Catch::Contains(problem));
  };
  write(good.substr(0, good.size() / 2));
  expect("truncated");
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x10;
  write(flipped);
  expect("CRC-32");
  std::string version = good;
  version[8] = 9;
  write(version);
  expect("format version 9, this build of xtrain reads version 3");
  std::string order = good;
  std::swap(order[12], order[15]);
  write(order);
  expect("another byte order");
  write("PK\x03\x04 not a checkpoint at all");
  expect("not an xtrain checkpoint");
  write(good);
  set_seed(1);
  Trainer other{
      nn::Sequential{nn::Linear{784, 8}, nn::BatchNorm1d{8}, nn::ReLU{}, nn::Dropout{0.1f}, nn::Linear{8, 10}},
      optim::Adam{}, options(1)};
  REQUIRE_THROWS_WITH(other.load_state(dir.string()), Catch::Contains("saved for another model") &&
                                                          Catch::Contains("0.weight f32 [16, 784]") &&
                                                          Catch::Contains("0.weight f32 [8, 784]"));
  Trainer sgd{bn_model(), optim::SGD{}, options(1)};
  REQUIRE_THROWS_WITH(sgd.load_state(dir.string()), Catch::Contains("saved with optimizer Adam"));
  fs::remove(file);
  expect("cannot open");
}

TEST_CASE("safetensors: export and import round-trip, one file and shards", "[checkpoint][safetensors][errors]") {
  const fs::path dir = fresh_dir("safetensors");
  BnTrainer t{bn_model(), optim::Adam{}, options(1)};
  t.fit(train1600(), test300());
  REQUIRE(t.save_model((dir / "model.safetensors").string()) ==
          std::vector<std::string>{(dir / "model.safetensors").string()});
  const auto shards = t.save_model((dir / "sharded" / "model.safetensors").string(), 20000);
  REQUIRE(shards.size() == 3);  // 0.weight alone (50 KB > 20 KB) | everything else (1 KB) | the index
  REQUIRE(shards.back() == (dir / "sharded" / "model.safetensors.index.json").string());
  for (const std::string& source : {(dir / "model.safetensors").string(), shards.back()}) {
    BnTrainer u{bn_model(99), optim::Adam{}, options(1)};
    u.load_model(source);
    REQUIRE(values(u) == values(t));
    REQUIRE(u.model().get<1>().running_mean()[5] == t.model().get<1>().running_mean()[5]);
    REQUIRE(u.model().get<1>().num_batches_tracked() == 50);
  }
  set_seed(1);
  Trainer other{nn::Sequential{nn::Linear{784, 8}, nn::ReLU{}, nn::Linear{8, 10}}, optim::Adam{}, options(1)};
  REQUIRE_THROWS_WITH(other.load_model((dir / "model.safetensors").string()),
                      Catch::Contains("'0.weight' has shape [16, 784], the model expects [8, 784]"));
  std::ofstream((dir / "short.safetensors").string(), std::ios::binary)
      << std::string("\x10\x00\x00\x00\x00\x00\x00\x00{", 9);
  REQUIRE_THROWS_WITH(other.load_model((dir / "short.safetensors").string()), Catch::Contains("exceeds the file"));
}

TEST_CASE("safetensors written from PyTorch's state_dict load into the same model", "[checkpoint][safetensors]") {
  set_seed(1);
  auto model = nn::Sequential{nn::Linear{784, 32}, nn::BatchNorm1d{32}, nn::ReLU{}, nn::Linear{32, 10}};
  Trainer t{std::move(model), optim::Adam{}, options(1)};
  const std::string dir = std::string(XTRAIN_TEST_FIXTURES) + "/parity/";
  t.load_model(dir + "simple_model_init.safetensors");
  for (const auto& e : t.params().entries()) {
    const Matrix expected = data::load_npy_features(dir + "init." + e.name + ".npy");
    REQUIRE(std::equal(expected.begin(), expected.end(), t.params().values(e).begin()));
  }
}
