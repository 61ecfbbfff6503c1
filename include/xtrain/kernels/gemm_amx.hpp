#pragma once
/// \file gemm_amx.hpp
/// The AMX part of the bf16 GEMM (kernels/gemm_lowp.hpp): Intel's tile instructions
/// (`tdpbf16ps`: a 16 x 16 fp32 tile += a 16 x 32 bf16 tile times a 32 x 16 bf16 tile, 8192
/// multiply-adds per instruction), on the Xeons that have them (Sapphire Rapids and later).
///
/// Compiled where the target has AMX-TILE and AMX-BF16 (`-march=native` on such a machine, or
/// `-march=sapphirerapids`); never imposed by the library. Used at run time only where
/// - the processor reports AMX-TILE and AMX-BF16 (CPUID leaf 7),
/// - Linux grants this process the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM,
///   XFEATURE_XTILEDATA)`, asked once; Linux 5.16 and later grant it),
/// - and the environment does not say `XTRAIN_AMX=0` (to compare the two paths in one binary).
/// Otherwise the bf16 GEMM runs on `vdpbf16ps` (AVX512_BF16, which every AMX processor has) and
/// `amx::refusal()` says why (one line on stderr says it too, unless XTRAIN_AMX=0 asked for it);
/// the examples print it on their kernel line.
///
/// Results: the sums are fp32, in an order of the hardware's choosing within each tile
/// instruction, so they match the `vdpbf16ps` path to fp32 rounding, not bitwise; the tests
/// check both against the scalar twin (kernels/reference/gemm.hpp). Within a build and machine
/// the result is the same on any number of threads (a split never changes a tile's sums).

#include <cstddef>
#include <cstdint>
#include <string>

// g++ spells the target macros __AMX_TILE__ / __AMX_BF16__, clang __AMXTILE__ / __AMXBF16__. The
// path also needs AVX512_BF16 (kernels/convert.hpp's XTRAIN_HAS_AVX512_BF16), which every AMX
// processor has: the epilogue and the packing are the vdpbf16ps path's.
#if (defined(__AMX_TILE__) || defined(__AMXTILE__)) && (defined(__AMX_BF16__) || defined(__AMXBF16__)) && \
    defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) &&  \
    defined(__x86_64__) && defined(__linux__)
#define XTRAIN_HAS_AMX_BF16 1
#else
#define XTRAIN_HAS_AMX_BF16 0
#endif

#if XTRAIN_HAS_AMX_BF16
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#endif

namespace xtrain::kernels::amx {

#if XTRAIN_HAS_AMX_BF16

/// Why the tile instructions are not used in this process ("" when they are). Decided once.
inline const std::string& refusal() {
  static const std::string why = [] {
    const char* env = std::getenv("XTRAIN_AMX");
    if (env && std::strcmp(env, "0") == 0) return std::string("XTRAIN_AMX=0 in the environment");
    unsigned a = 0, b = 0, c = 0, d = 0;
    std::string reason;
    constexpr long arch_req_xcomp_perm = 0x1023;  // linux/arch/x86/include/uapi/asm/prctl.h
    constexpr long xfeature_xtiledata = 18;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22)))
      reason = "this processor has no AMX-TILE/AMX-BF16 (the binary was built for one that has)";
    else if (syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) != 0)
      reason = std::string("Linux refused the tile data state (arch_prctl(ARCH_REQ_XCOMP_PERM): ") +
               std::strerror(errno) + "; it takes Linux 5.16 or later with AMX enabled)";
    if (!reason.empty())
      std::fprintf(stderr, "xtrain: AMX not used: %s; bf16 products run on vdpbf16ps instead\n", reason.c_str());
    return reason;
  }();
  return why;
}

/// Whether the bf16 GEMM uses the tile instructions in this process.
inline bool usable() {
  static const bool ok = refusal().empty();
  return ok;
}

/// Configures the calling thread's tiles: all eight 16 rows x 64 bytes (palette 1). Tiles 0-3
/// accumulate C (16 x 16 fp32), 4-5 hold A (16 rows x 32 bf16), 6-7 hold B (16 pairs x 16 columns).
inline void configure() noexcept {
  struct alignas(64) Config {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t colsb[16] = {};
    std::uint8_t rows[16] = {};
  } cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

/// Returns the calling thread's tiles to their initial state (a smaller state to save on a
/// context switch).
inline void release() noexcept { _tile_release(); }

/// out[0 : 16 * RowTiles, 0 : 32] = A * B over `kp` (a multiple of 16) bf16 pairs of K.
/// A: rows of words (the pair (k, k+1) of one row, k in the low half), row r at a + r * lda_words.
/// B: a panel of 32 columns, pair p at b + p * 32 (the layout of the vdpbf16ps path's B panels).
/// out: fp32, rows of 32.
template <int RowTiles>
inline void block(std::size_t kp, const std::uint32_t* a, std::size_t lda_words, const std::uint32_t* b,
                  float* out) noexcept {
  static_assert(RowTiles == 1 || RowTiles == 2);
  // g++'s _tile_loadd is an asm that takes the address alone, with no memory operand: a compiler
  // barrier keeps the packing's stores to a and b before the loads.
  asm volatile("" ::: "memory");
  const std::size_t a_stride = lda_words * sizeof(std::uint32_t);
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (RowTiles == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (std::size_t p = 0; p < kp; p += 16) {
    _tile_loadd(6, b + p * 32, 128);
    _tile_loadd(7, b + p * 32 + 16, 128);
    _tile_loadd(4, a + p, a_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (RowTiles == 2) {
      _tile_loadd(5, a + 16 * lda_words + p, a_stride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, out, 128);
  _tile_stored(1, out + 16, 128);
  if constexpr (RowTiles == 2) {
    _tile_stored(2, out + 16 * 32, 128);
    _tile_stored(3, out + 16 * 32 + 16, 128);
  }
}

#else

inline std::string refusal() { return "this build has no AMX (compile with -march=native on an AMX Xeon)"; }
inline bool usable() { return false; }

#endif

}  // namespace xtrain::kernels::amx
