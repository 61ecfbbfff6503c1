// optim/param_groups.hpp: AdamW without decay on biases and norms, the same under ZeRO-1 on
// thread-ranks, and the groups kept in checkpoints.
#include <filesystem>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "parallel/helpers.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;
using parallel::ThreadAllReduce;

TEST_CASE("Parameter groups: AdamW without decay on biases and norms; kept in checkpoints", "[modules]") {
  auto make = [] {
    set_seed(5);
    return nn::Sequential{nn::Linear{784, 16}, nn::BatchNorm1d{16}, nn::ReLU{}, nn::Linear{16, 10}};
  };
  auto run = [&](float wd, std::vector<optim::ParamGroup> groups) {
    Trainer t{make(), optim::AdamW{}.lr(1e-2f).weight_decay(wd), TrainingOptions{}.param_groups(groups).verbose(false)};
    data::Loader loader(train1024(), 32, 1);
    const auto b = loader.batch(0);
    t.train_step(b.x, b.y, 0, 32);  // one step: both runs start from the same gradients
    std::vector<float> weights, others;
    for (const auto& e : t.params().entries()) {
      auto v = t.params().values(e);
      (e.kind == ParamKind::weight ? weights : others)
          .insert((e.kind == ParamKind::weight ? weights : others).end(), v.begin(), v.end());
    }
    return std::pair{weights, others};
  };
  const auto grouped = run(0.1f, {optim::ParamGroup::no_weight_decay()});
  const auto decayed = run(0.1f, {}), plain = run(0.0f, {});
  REQUIRE(grouped.first == decayed.first);  // Linear weights decay as without groups
  REQUIRE(grouped.second == plain.second);  // biases and BatchNorm's affine parameters do not
  REQUIRE(grouped.second != decayed.second);

  // ZeRO-1 steps each rank's block run by run: bitwise the unsharded step (threads sum in rank order).
  const auto groups = TrainingOptions{}.global_batch_size(64).param_groups({optim::ParamGroup::no_weight_decay()});
  auto adamw_model = [&] { return make(); };
  auto train_adamw = [&](TrainingOptions o) {
    std::vector<float> params;
    parallel::launch_threads(2, [&](ThreadAllReduce& comm) {
      Trainer<decltype(make()), optim::AdamW, FullPrecision, ThreadAllReduce> t{
          adamw_model(), optim::AdamW{}.lr(1e-2f).weight_decay(0.1f), o.epochs(1).verbose(false), comm};
      t.fit(train1024(), test200());
      if (comm.rank() == 0) params.assign(t.params().values().begin(), t.params().values().end());
    });
    return params;
  };
  REQUIRE(train_adamw(TrainingOptions{groups}.shard_optimizer(true)) == train_adamw(groups));

  // Checkpoints keep the groups: the multipliers are restored, other members are refused.
  const auto dir = std::filesystem::temp_directory_path() / "xtrain_param_groups";
  std::filesystem::remove_all(dir);
  {
    Trainer t{make(), optim::AdamW{},
              TrainingOptions{}.param_groups({optim::ParamGroup::no_weight_decay().lr_scale(0.5f)}).verbose(false)};
    t.save_state(dir.string());
  }
  Trainer same{make(), optim::AdamW{},
               TrainingOptions{}.param_groups({optim::ParamGroup::no_weight_decay()}).verbose(false)};
  same.load_state(dir.string());
  REQUIRE(same.param_groups().size() == 2);
  REQUIRE(same.param_groups()[1].lr_scale == 0.5f);
  Trainer other{make(), optim::AdamW{}, TrainingOptions{}.verbose(false)};
  REQUIRE_THROWS_WITH(other.load_state(dir.string()),
                      Catch::Contains("parameter '0.bias' is in group 'no_weight_decay' in the checkpoint"));
}
