// checkpoint/archive.hpp: a specific error for every kind of bad checkpoint file (truncated,
// CRC-32, format version, byte order, not a checkpoint, another model or optimizer, missing).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>

#include <catch2/catch.hpp>

#include "checkpoint/helpers.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace nn = xtrain::layers;
namespace fs = std::filesystem;

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
