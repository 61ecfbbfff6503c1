// checkpoint/archive.hpp: a specific error for every kind of bad checkpoint file (truncated,
// CRC-32, format version, byte order, not a checkpoint, another model or optimizer, missing), and
// files of the previous format version still load.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
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
  expect("format version 9, this build of xtrain reads versions 3 to 4");
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

TEST_CASE("A checkpoint of format version 3 (before sharded states) still loads", "[checkpoint]") {
  const fs::path dir = fresh_dir("v3");
  BnTrainer t{bn_model(), optim::Adam{}, options(1)};
  t.fit(train1600(), test300());
  t.save_state(dir.string());
  // Version 4's payload is version 3's behind a ShardInfo (count 0 when unsharded): take it off,
  // and write the file as version 3 wrote it.
  const std::string file = (dir / "state.xtrain").string();
  std::uint32_t version = 0;
  const std::string v4 = checkpoint::read_verified(file, &version);
  REQUIRE(version == 4);
  std::ostringstream prefix(std::ios::binary);
  {
    boost::archive::binary_oarchive ar(prefix, boost::archive::no_header);
    checkpoint::ShardInfo none;
    ar << boost::serialization::make_nvp("shards", none);
  }
  REQUIRE(v4.rfind(prefix.str(), 0) == 0);
  const std::string v3 = v4.substr(prefix.str().size());
  std::string header(checkpoint::file_magic, 8);
  checkpoint::detail::put_u32(header, 3);
  checkpoint::detail::put_u32(header, checkpoint::detail::byte_order_probe());
  checkpoint::detail::put_u32(header, checkpoint::detail::type_sizes());
  checkpoint::detail::put_u64(header, v3.size());
  checkpoint::detail::put_u32(header, checkpoint::detail::crc32_of(v3));
  std::ofstream(file, std::ios::binary | std::ios::trunc) << header << v3;
  BnTrainer u{bn_model(9), optim::Adam{}, options(2)};
  u.load_state(dir.string());
  REQUIRE(values(u) == values(t));
  REQUIRE(u.optimizer_state().exp_avg == t.optimizer_state().exp_avg);
  REQUIRE(u.step() == t.step());
}
