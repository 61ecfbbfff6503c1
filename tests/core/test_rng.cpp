// core/rng.hpp: Philox4x32-10 against the Random123 known answers, draws as a pure function of
// (seed, stream, position), and set_seed making model construction reproducible.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;

TEST_CASE("RNG: Philox4x32-10 matches the Random123 known-answer vectors", "[rng]") {
  // Known-answer tests from Random123 (kat_vectors): philox4x32 10 rounds.
  auto zero = philox4x32({0, 0, 0, 0}, {0, 0});
  REQUIRE(zero == std::array<std::uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  auto ones = philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  REQUIRE(ones == std::array<std::uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  auto pi = philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u});
  REQUIRE(pi == std::array<std::uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("RNG: draws are a pure function of (seed, stream, position)", "[rng]") {
  Generator a(42, streams::user), b(42, streams::user), c(43, streams::user), d(42, streams::user | 1);
  std::vector<std::uint32_t> va, vb;
  for (int i = 0; i < 10; ++i) va.push_back(a.next_u32());
  for (int i = 0; i < 10; ++i) vb.push_back(b.next_u32());
  REQUIRE(va == vb);
  REQUIRE(c.next_u32() != va[0]);
  REQUIRE(d.next_u32() != va[0]);
  Generator e(42, streams::user);
  e.set_position(7);  // jump: resume without replaying
  REQUIRE(e.next_u32() == va[7]);

  Generator u(1);
  double sum = 0;
  for (int i = 0; i < 100000; ++i) {
    const float v = u.uniform();
    REQUIRE(v >= 0.0f);
    REQUIRE(v < 1.0f);
    sum += v;
  }
  REQUIRE(sum / 100000 == Approx(0.5).margin(0.01));
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 70000; ++i) ++counts[u.below(7)];
  for (int n : counts) REQUIRE(n == Approx(10000).margin(500));
}

TEST_CASE("set_seed makes model construction reproducible", "[rng]") {
  set_seed(5);
  layers::Linear a(20, 10);
  set_seed(5);
  layers::Linear b(20, 10);
  set_seed(6);
  layers::Linear c(20, 10);
  REQUIRE(std::equal(a.weight().values().begin(), a.weight().values().end(), b.weight().values().begin()));
  REQUIRE_FALSE(std::equal(a.weight().values().begin(), a.weight().values().end(), c.weight().values().begin()));
}
