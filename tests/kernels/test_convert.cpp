// kernels/convert.hpp: fp32 <-> bf16/fp16 array conversions bit-exact with their scalar twins over
// edge values and dense bit patterns. Also built with -march=x86-64-v2 and -march=x86-64-v3
// (xtrain_tests_x86-64-v2, xtrain_tests_x86-64-v3), where the fallback paths run.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/reference/convert.hpp"

using namespace xtrain;

namespace {

/// Edge values, then every float whose bits are a multiple of `stride` (both signs), then the
/// same shifted by one: rounding ties, subnormals, the overflow threshold, NaN payloads.
std::vector<float> conversion_inputs(std::uint32_t stride) {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          -65520.0f,
                          6.1035156e-5f,
                          5.9604645e-8f,
                          2.9802322e-8f,
                          2.9802326e-8f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::bit_cast<float>(0x7F800001u),   // signalling NaN
                          std::bit_cast<float>(0xFFC12345u),   // negative NaN with payload
                          std::bit_cast<float>(0x3F808000u),   // bf16 tie, rounds to even (down)
                          std::bit_cast<float>(0x3F818000u),   // bf16 tie, rounds up
                          std::bit_cast<float>(0x7F7FFFFFu),   // rounds to bf16 Inf
                          std::bit_cast<float>(0x3F801000u),   // fp16 tie
                          std::bit_cast<float>(0x3F803000u)};  // fp16 tie, rounds up
  for (std::uint64_t bits = 0; bits <= 0xFFFFFFFFu; bits += stride) {
    v.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
    v.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(bits + 1)));
  }
  return v;
}

template <class T>
std::uint16_t bits_of(T v) {
  return v.bits;
}

template <class T>
void check_conversions() {
  const auto in = conversion_inputs(4099);  // ~2.1M values, odd count: exercises the tails
  std::vector<T> out(in.size()), ref(in.size());
  kernels::from_float(in.data(), out.data(), in.size());
  kernels::reference::from_float(in.data(), ref.data(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    INFO(T::name << " narrowing of bits 0x" << std::hex << std::bit_cast<std::uint32_t>(in[i]));
    if (bits_of(out[i]) != bits_of(ref[i])) REQUIRE(bits_of(out[i]) == bits_of(ref[i]));
  }
  // Widening: all 65,536 patterns, bit-exact (NaN compared by bits).
  std::vector<T> all(65536 + 5);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = T::from_bits(static_cast<std::uint16_t>(i));
  std::vector<float> wide(all.size()), wide_ref(all.size());
  kernels::to_float(all.data(), wide.data(), all.size());
  kernels::reference::to_float(all.data(), wide_ref.data(), all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    INFO(T::name << " widening of bits 0x" << std::hex << i);
    if (std::bit_cast<std::uint32_t>(wide[i]) != std::bit_cast<std::uint32_t>(wide_ref[i]))
      REQUIRE(std::bit_cast<std::uint32_t>(wide[i]) == std::bit_cast<std::uint32_t>(wide_ref[i]));
  }
}
}  // namespace

TEST_CASE("bf16 conversions are bit-exact with the scalar twin", "[kernels][precision]") {
  INFO("conversion instructions: " << kernels::bf16_convert_isa());
  check_conversions<bf16>();
}

TEST_CASE("fp16 conversions are bit-exact with the scalar twin", "[kernels][precision]") {
  INFO("conversion instructions: " << kernels::fp16_convert_isa());
  check_conversions<fp16>();
}
