#pragma once
/// \file simd.hpp
/// The one shim through which kernels use SIMD (xsimd 8.1). The architecture is chosen at compile
/// time from `-march` (xsimd::default_arch); kernels take it as a template parameter so tests and
/// benchmarks can instantiate other widths.

#include <cstddef>

#include <xsimd/xsimd.hpp>

namespace xtrain::simd {

/// The instruction set this translation unit was compiled for.
using default_arch = xsimd::default_arch;

/// A SIMD register of `T` for architecture `Arch`.
template <class T, class Arch = default_arch>
using batch = xsimd::batch<T, Arch>;

/// Number of fp32 lanes of `Arch`.
template <class Arch = default_arch>
inline constexpr std::size_t lanes = batch<float, Arch>::size;

/// The name of the instruction set (e.g. "avx512bw", "sse2").
template <class Arch = default_arch>
constexpr const char* arch_name() noexcept {
  return Arch::name();
}

/// Horizontal sum of a register (xsimd 8.1 spells it `hadd`; later versions `reduce_add`).
template <class Arch>
inline float horizontal_sum(const batch<float, Arch>& v) noexcept {
  return xsimd::hadd(v);
}

}  // namespace xtrain::simd
