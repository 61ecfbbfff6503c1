// parallel/sampler.hpp: one global permutation per (seed, epoch), split into contiguous per-rank
// shards that join to the 1-rank batch, whatever the rank count.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;

TEST_CASE("Sampler: one permutation per (seed, epoch), whatever the rank count", "[data][sampler]") {
  const std::size_t n = 1003, batch = 64;
  parallel::GlobalSampler one(n, batch, 42);
  auto perm = std::vector<std::uint32_t>(one.permutation().begin(), one.permutation().end());
  std::vector<std::uint32_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::uint32_t> iota(n);
  std::iota(iota.begin(), iota.end(), 0u);
  REQUIRE(sorted == iota);  // a permutation
  REQUIRE(perm != iota);    // shuffled
  parallel::GlobalSampler again(n, batch, 42);
  REQUIRE(std::equal(perm.begin(), perm.end(), again.permutation().begin()));
  again.set_epoch(1);
  REQUIRE_FALSE(std::equal(perm.begin(), perm.end(), again.permutation().begin()));
  REQUIRE(one.batches() == 16);  // 15 full + 1 partial of 43
  REQUIRE(parallel::GlobalSampler(n, batch, 42, true, true).batches() == 15);
  REQUIRE(parallel::GlobalSampler(n, batch, 42, false).permutation()[17] == 17);

  for (std::size_t world : {2u, 3u, 4u}) {
    for (std::size_t k = 0; k < one.batches(); ++k) {
      std::vector<std::uint32_t> joined;
      for (std::size_t r = 0; r < world; ++r) {
        parallel::GlobalSampler s(n, batch, 42, true, false, r, world);
        const auto shard = s.shard(k);
        REQUIRE(shard.global_offset == joined.size());
        REQUIRE(shard.global_count == one.shard(k).global_count);
        joined.insert(joined.end(), shard.indices.begin(), shard.indices.end());
      }
      const auto whole = one.shard(k).indices;
      REQUIRE(std::equal(joined.begin(), joined.end(), whole.begin(), whole.end()));
    }
  }
  REQUIRE_THROWS_WITH(parallel::GlobalSampler(n, 2, 1, true, false, 0, 4),
                      Catch::Contains("smaller than the number of ranks"));
}
