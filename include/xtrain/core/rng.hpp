#pragma once
/// \file rng.hpp
/// Counter-based random numbers (Philox4x32-10; Salmon et al., "Parallel random numbers: as easy as
/// 1, 2, 3", SC'11). A draw is a pure function of (seed, stream, index): no hidden per-rank state,
/// so a run is reproducible on any number of ranks and a checkpoint stores only counters.

#include <array>
#include <cmath>
#include <cstdint>

namespace xtrain {

/// Stream identifiers: every consumer of randomness draws from its own stream.
namespace streams {
inline constexpr std::uint64_t init = 0;                  ///< parameter initialisation
inline constexpr std::uint64_t permutation = 1ull << 56;  ///< | epoch: the data order
inline constexpr std::uint64_t dropout = 2ull << 56;      ///< | layer << 40 | step: dropout masks
inline constexpr std::uint64_t user = 3ull << 56;         ///< | anything below 2^56: free for users
inline constexpr std::uint64_t text = 4ull << 56;         ///< | batch key: random text windows (data/text.hpp)
}  // namespace streams

/// The Philox4x32-10 block function: 4 x 32 random bits from a 128-bit counter and a 64-bit key.
constexpr std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> c,
                                                  std::array<std::uint32_t, 2> k) noexcept {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u, w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(m0) * c[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(m1) * c[2];
    c = {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<std::uint32_t>(p1),
         static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<std::uint32_t>(p0)};
    k[0] += w0;
    k[1] += w1;
  }
  return c;
}

/// The 4 words of block `block` of `stream` under `seed`.
constexpr std::array<std::uint32_t, 4> random_block(std::uint64_t seed, std::uint64_t stream,
                                                    std::uint64_t block) noexcept {
  return philox4x32({static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                     static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
                    {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
}

/// Maps 32 random bits to a float uniform in [0, 1) (24 bits of precision).
constexpr float bits_to_unit_float(std::uint32_t bits) noexcept {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

/// A sequential view over one (seed, stream): its whole state is three integers.
class Generator {
 public:
  /// Requires nothing; Ensures the first draw is word 0 of block 0 of `stream`.
  constexpr explicit Generator(std::uint64_t seed = 0, std::uint64_t stream = streams::init) noexcept
      : seed_(seed), stream_(stream) {}

  /// 32 uniformly random bits.
  constexpr std::uint32_t next_u32() noexcept {
    const std::uint64_t block = position_ / 4;
    if (block != cached_block_ || !cached_) {
      cache_ = random_block(seed_, stream_, block);
      cached_block_ = block;
      cached_ = true;
    }
    return cache_[position_++ % 4];
  }

  /// Uniform in [0, 1).
  constexpr float uniform() noexcept { return bits_to_unit_float(next_u32()); }

  /// Uniform in [low, high).
  constexpr float uniform(float low, float high) noexcept { return low + (high - low) * uniform(); }

  /// Standard normal (Box-Muller; consumes two words).
  float normal() noexcept {
    const float u1 = 1.0f - uniform();  // (0, 1]
    const float u2 = uniform();
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530717958647692f * u2);
  }

  /// Uniform integer in [0, n) without modulo bias (Lemire's multiply-shift with rejection).
  constexpr std::uint64_t below(std::uint64_t n) noexcept {
    if (n <= 0xFFFFFFFFull) {
      const auto bound = static_cast<std::uint32_t>(n);
      std::uint64_t m = static_cast<std::uint64_t>(next_u32()) * bound;
      auto low = static_cast<std::uint32_t>(m);
      if (low < bound) {
        const std::uint32_t threshold = static_cast<std::uint32_t>(-bound) % bound;
        while (low < threshold) {
          m = static_cast<std::uint64_t>(next_u32()) * bound;
          low = static_cast<std::uint32_t>(m);
        }
      }
      return m >> 32;
    }
    std::uint64_t r;  // rare: n above 2^32
    const std::uint64_t limit = ~0ull - (~0ull % n);
    do r = (static_cast<std::uint64_t>(next_u32()) << 32) | next_u32();
    while (r >= limit);
    return r % n;
  }

  constexpr std::uint64_t seed() const noexcept { return seed_; }
  constexpr std::uint64_t stream() const noexcept { return stream_; }
  /// Number of 32-bit words drawn so far (the counter a checkpoint stores).
  constexpr std::uint64_t position() const noexcept { return position_; }
  constexpr void set_position(std::uint64_t position) noexcept { position_ = position; }

  template <class Archive>
  void serialize(Archive& ar, unsigned /*version*/) {
    ar& seed_;
    ar& stream_;
    ar& position_;
    cached_ = false;
  }

 private:
  std::uint64_t seed_ = 0, stream_ = 0, position_ = 0;
  std::array<std::uint32_t, 4> cache_{};
  std::uint64_t cached_block_ = 0;
  bool cached_ = false;
};

/// The generator that layer constructors draw their initial parameters from (PyTorch's default
/// generator). One per thread (ranks run as threads by ThreadAllReduce build their models
/// concurrently); `set_seed` resets the calling thread's. Ranks that call `set_seed` with the same
/// seed build identical models.
inline Generator& default_generator() noexcept {
  thread_local Generator generator{0, streams::init};
  return generator;
}

/// Seeds the calling thread's default generator: it restarts at (seed, streams::init, 0).
/// Data order and dropout take their seed from TrainingOptions::seed, which defaults to the same value.
inline void set_seed(std::uint64_t seed) noexcept { default_generator() = Generator{seed, streams::init}; }

}  // namespace xtrain
