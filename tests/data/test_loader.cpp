// data/loader.hpp: batches in the sampler's order, gathered into a reused buffer.
#include <cstdint>
#include <filesystem>
#include <set>

#include <catch2/catch.hpp>

#include "data/helpers.hpp"
#include "xtrain/xtrain.hpp"

using namespace xtrain;
using namespace xtrain::test;
namespace fs = std::filesystem;

TEST_CASE("Loader: batches gathered into a reused buffer", "[data][loader]") {
  const fs::path dir = temp_dir("loader");
  write_idx_folder(dir, 100, false);
  const auto split = data::fashion_mnist(dir.string());
  data::Loader loader(split.train, 32, 7);
  REQUIRE(loader.batches() == 4);
  const float* buffer = loader.batch(0).x.data();
  for (std::size_t k = 1; k < 3; ++k) REQUIRE(loader.batch(k).x.data() == buffer);  // no reallocation
  const auto last = loader.batch(3);
  REQUIRE(last.y.size() == 4);
  std::set<std::int32_t> seen;
  const auto perm = loader.sampler().permutation();
  const auto b = loader.batch(1);
  for (std::size_t i = 0; i < 32; ++i) {
    REQUIRE(b.y[i] == split.train.labels()[perm[32 + i]]);
    REQUIRE(b.x(i, 0) == split.train.features()(perm[32 + i], 0));
  }
}
