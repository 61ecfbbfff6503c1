// checkpoint/safetensors.hpp: export and import round-trip (one file and shards with an index),
// shape errors, a truncated header, and PyTorch's state_dict loaded into the same model.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "checkpoint/helpers.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;
namespace fs = std::filesystem;

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
    const Tensor<float> expected = data::load_npy_features(dir + "init." + e.name + ".npy");
    REQUIRE(std::equal(expected.begin(), expected.end(), t.params().values(e).begin()));
  }
}
