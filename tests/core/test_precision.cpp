// core/precision.hpp: bf16 and fp16 conversions, bit-exact against _Float16 and an independent
// round-to-nearest-even reference over every pattern and midpoint.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

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
