#pragma once
/// \file simd.hpp
/// The one shim through which kernels use SIMD (xsimd 8.1). The architecture is chosen at compile
/// time from `-march` (xsimd::default_arch); kernels take it as a template parameter so tests and
/// benchmarks can instantiate other widths.

#include <cstddef>

#include <xsimd/xsimd.hpp>

/// `XTRAIN_UNROLL(n)` before a loop: unroll it n times (g++'s and clang's `#pragma GCC unroll n`).
/// nvcc's front end does not know that pragma, and passes its own `#pragma unroll n` on to the
/// host compiler, which warns: in a translation unit nvcc compiles the macro is empty, and CPU
/// kernels compiled there run without the hint (train on the CPU from code g++ or clang compiles).
#define XTRAIN_PRAGMA(text) _Pragma(#text)
#if defined(__CUDACC__)
#define XTRAIN_UNROLL(n)
#else
#define XTRAIN_UNROLL(n) XTRAIN_PRAGMA(GCC unroll n)
#endif

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

/// Keeps `v` in a register: an empty asm that the compiler must assume reads and rewrites it.
/// Without it g++ folds a loaded vector that several FMAs use into each of them as a memory
/// operand, loading it once per FMA, and a kernel with more loads than the core can issue per
/// FMA runs at half speed or worse (benchmarks/RESULTS.md, "The small GEMM"). Use on vectors
/// loaded once and used by several FMAs in an inner loop.
template <class T, class Arch>
inline void keep_in_register(batch<T, Arch>& v) noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+v"(v.data));  // "v": any vector register (xmm/ymm/zmm 0-31 with AVX-512)
#endif
  (void)v;
}

/// Hides where `p` points from the optimiser: an empty asm that the compiler must assume rewrites
/// it. Loads through it in one iteration of a loop are then not recognised as the loads of the
/// previous iteration shifted by a stride, which g++'s predictive commoning (-O3) otherwise keeps
/// in registers from one iteration to the next: in a tile that already holds 25 accumulators that
/// spills them to the stack on every iteration.
template <class T>
inline void opaque(const T*& p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  asm("" : "+r"(p));
#endif
  (void)p;
}

/// Horizontal sum of a register (xsimd 8.1 spells it `hadd`; later versions `reduce_add`).
template <class Arch>
inline float horizontal_sum(const batch<float, Arch>& v) noexcept {
  return xsimd::hadd(v);
}

}  // namespace xtrain::simd
