#pragma once
/// \file precision.hpp
/// 16-bit floating-point storage types `bf16` and `fp16` with round-to-nearest-even conversion
/// from fp32 (NaN stays NaN, Inf stays Inf, fp16 subnormals exact). Arithmetic is done in fp32.

#include <bit>
#include <cstdint>

namespace xtrain {

/// Converts fp32 to bfloat16 bits, rounding to nearest even; NaN is quieted, never turned into Inf.
constexpr std::uint16_t float_to_bf16_bits(float value) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  const std::uint32_t rounding_bias = 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding_bias) >> 16);
}

/// Widens bfloat16 bits to fp32 (exact).
constexpr float bf16_bits_to_float(std::uint16_t bits) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

/// Converts fp32 to IEEE binary16 bits, rounding to nearest even, with subnormals and overflow to Inf.
constexpr std::uint16_t float_to_fp16_bits(float value) noexcept {
  std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u)  // Inf or NaN (NaN keeps its top payload bits and is quieted)
    return static_cast<std::uint16_t>(sign | 0x7C00u | (x > 0x7F800000u ? 0x200u | ((x >> 13) & 0x3FFu) : 0u));
  if (x >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to Inf
  if (x < 0x38800000u) {                                                    // below 2^-14: subnormal
    const std::uint32_t exponent = x >> 23;
    if (exponent < 102) return sign;  // below 2^-25: rounds to zero
    const std::uint32_t mantissa = (x & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t shift = 126 - exponent;  // 14..24
    std::uint32_t r = mantissa >> shift;
    const std::uint32_t rem = mantissa & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = (x - 0x38000000u) >> 13;  // rebias exponent 127 -> 15
  const std::uint32_t rem = x & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

/// Widens IEEE binary16 bits to fp32 (exact, subnormals included; a signalling NaN is quieted).
constexpr float fp16_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  std::uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1Fu)  // Inf, or NaN quieted as vcvtph2ps does
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0u));
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return std::bit_cast<float>(sign);
  // Subnormal: normalise the mantissa.
  std::uint32_t e = 113;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (e << 23) | ((mantissa & 0x3FFu) << 13));
}

/// bfloat16 storage type (8-bit exponent, 7-bit mantissa). Converts explicitly to and from fp32.
struct bf16 {
  std::uint16_t bits = 0;
  constexpr bf16() = default;
  constexpr explicit bf16(float value) noexcept : bits(float_to_bf16_bits(value)) {}
  constexpr explicit operator float() const noexcept { return bf16_bits_to_float(bits); }
  static constexpr bf16 from_bits(std::uint16_t b) noexcept {
    bf16 r;
    r.bits = b;
    return r;
  }
  static constexpr const char* name = "bf16";
};

/// IEEE binary16 storage type (5-bit exponent, 10-bit mantissa). Converts explicitly to and from fp32.
struct fp16 {
  std::uint16_t bits = 0;
  constexpr fp16() = default;
  constexpr explicit fp16(float value) noexcept : bits(float_to_fp16_bits(value)) {}
  constexpr explicit operator float() const noexcept { return fp16_bits_to_float(bits); }
  static constexpr fp16 from_bits(std::uint16_t b) noexcept {
    fp16 r;
    r.bits = b;
    return r;
  }
  static constexpr const char* name = "fp16";
};

static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2);

}  // namespace xtrain
