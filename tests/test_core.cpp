// Core: bf16/fp16 conversions, counter-based RNG, Param and ParamArena, error messages.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>

#include <catch2/catch.hpp>

#include "xtrain/xtrain.hpp"

using namespace xtrain;

namespace {
std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }
float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

// Independent bf16 reference: the nearer of the two bf16 neighbours in double, ties to even.
std::uint16_t bf16_reference(float f) {
  const std::uint32_t x = bits(f);
  const auto lo = static_cast<std::uint16_t>(x >> 16);
  const auto hi = static_cast<std::uint16_t>(lo + 1);
  const double v = f, a = from_bits(static_cast<std::uint32_t>(lo) << 16),
               b = std::isinf(from_bits(static_cast<std::uint32_t>(hi) << 16))
                       ? std::copysign(std::ldexp(1.0, 128), v)  // next step above the largest finite
                       : from_bits(static_cast<std::uint32_t>(hi) << 16);
  const double da = std::abs(v - a), db = std::abs(b - v);
  if (da < db) return lo;
  if (db < da) return hi;
  return (lo & 1) ? hi : lo;
}
}  // namespace

#ifdef __FLT16_MAX__  // the compiler has _Float16 on this target (g++ 12 on x86-64; clang from 15)
TEST_CASE("fp16: widening matches the compiler's _Float16 for all 65536 patterns", "[precision]") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float ours = fp16_bits_to_float(b);
    const float ref = static_cast<float>(std::bit_cast<_Float16>(b));
    if (std::isnan(ref)) {
      REQUIRE(std::isnan(ours));
    } else {
      INFO("pattern " << h);
      REQUIRE(bits(ours) == bits(ref));
      REQUIRE(float_to_fp16_bits(ours) == b);  // round trip
    }
  }
}

TEST_CASE("fp16: rounding to nearest even matches _Float16 at every midpoint and beside it", "[precision]") {
  for (std::uint32_t h = 0; h < 0x7C00; ++h) {  // every finite positive fp16 and the midpoint above it
    const double lo = fp16_bits_to_float(static_cast<std::uint16_t>(h));
    const double hi = h + 1 == 0x7C00 ? 65536.0 : fp16_bits_to_float(static_cast<std::uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid}) {
      INFO("value " << f);
      REQUIRE(float_to_fp16_bits(f) == std::bit_cast<std::uint16_t>(static_cast<_Float16>(f)));
    }
  }
  Generator gen(7);
  for (int i = 0; i < 1'000'000; ++i) {
    const float f = from_bits(gen.next_u32());
    if (std::isnan(f)) {
      REQUIRE(std::isnan(fp16_bits_to_float(float_to_fp16_bits(f))));
      continue;
    }
    REQUIRE(float_to_fp16_bits(f) == std::bit_cast<std::uint16_t>(static_cast<_Float16>(f)));
  }
}
#endif

TEST_CASE("bf16: all 65536 patterns round-trip and NaN stays NaN and Inf stays Inf", "[precision]") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float f = bf16_bits_to_float(b);
    REQUIRE(bits(f) == (h << 16));
    if (std::isnan(f))
      REQUIRE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(f))));
    else
      REQUIRE(float_to_bf16_bits(f) == b);
  }
  REQUIRE(std::isinf(static_cast<float>(bf16(std::numeric_limits<float>::infinity()))));
  REQUIRE(std::isnan(static_cast<float>(bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A signalling NaN whose payload sits in the low bits must not become Inf.
  REQUIRE(std::isnan(static_cast<float>(bf16(from_bits(0x7F800001u)))));
}

TEST_CASE("bf16: rounding to nearest even matches an independent reference at every midpoint", "[precision]") {
  for (std::uint32_t h = 0; h < 0x7F80; ++h) {
    const std::uint32_t mid = (h << 16) | 0x8000u;  // exactly halfway to the next bf16
    for (std::uint32_t x : {mid, mid - 1, mid + 1, mid | 0x80000000u, (h << 16) | 0x7FFFu}) {
      const float f = from_bits(x);
      INFO("bits " << x);
      REQUIRE(float_to_bf16_bits(f) == bf16_reference(f));
    }
  }
  REQUIRE(bf16(1.0f).bits == 0x3F80);
  REQUIRE(static_cast<float>(bf16(3.140625f)) == 3.140625f);
}

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

TEST_CASE("ParamArena: one flat buffer, aligned slices, layers view it", "[arena]") {
  set_seed(1);
  auto model = layers::Sequential{layers::Linear{5, 3}, layers::BatchNorm1d{3}, layers::ReLU{}, layers::Linear{3, 2}};
  std::vector<float> before;
  visit_parameters(model, [&](const std::string&, Param& p, ParamKind) {
    before.insert(before.end(), p.values().begin(), p.values().end());
  });
  ParamArena arena(model);
  REQUIRE(arena.entries().size() == 6);
  REQUIRE(arena.parameter_count() == 5 * 3 + 3 + 3 + 3 + 3 * 2 + 2);
  std::vector<std::string> names;
  std::vector<float> after;
  for (const auto& e : arena.entries()) {
    names.push_back(e.name);
    REQUIRE(e.offset % ParamArena::alignment == 0);
    after.insert(after.end(), arena.values(e).begin(), arena.values(e).end());
  }
  REQUIRE(names == std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"});
  REQUIRE(after == before);  // values kept
  REQUIRE(arena.entry("3.weight").shape == std::vector<std::size_t>{2, 3});
  // The layer now views the arena: a write through one is seen by the other.
  model.get<3>().weight().values()[0] = 123.0f;
  REQUIRE(arena.values()[arena.entry("3.weight").offset] == 123.0f);
  for (float g : arena.grads()) REQUIRE(g == 0.0f);
  REQUIRE_THROWS_WITH(arena.entry("9.weight"), Catch::Contains("no parameter named '9.weight'"));
  ParamArena second;
  REQUIRE_THROWS_WITH(second.adopt(model), Catch::Contains("already lives in another arena"));
}

TEST_CASE("Param copies own their storage", "[arena]") {
  layers::Linear a(4, 2);
  ParamArena arena;
  auto model = layers::Sequential{a};
  arena.adopt(model);
  Param copy = model.get<0>().weight();
  copy.values()[0] = -7.0f;
  REQUIRE(model.get<0>().weight().values()[0] != -7.0f);
  REQUIRE_FALSE(copy.in_arena());
}

TEST_CASE("XTRAIN_CHECK throws the named type with the streamed message", "[error]") {
  auto f = [](int v) { XTRAIN_CHECK(v > 0, ValueError, "value ", v, " must be positive"); };
  REQUIRE_NOTHROW(f(1));
  REQUIRE_THROWS_AS(f(-3), ValueError);
  REQUIRE_THROWS_WITH(f(-3), "value -3 must be positive");
  REQUIRE(shape_string({32, 784}) == "[32, 784]");
}
