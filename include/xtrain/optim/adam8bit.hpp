#pragma once
/// \file adam8bit.hpp
/// Adam8bit and AdamW8bit: Adam and AdamW whose two moments are kept in 8 bits per parameter
/// (Dettmers et al., "8-bit Optimizers via Block-wise Quantization", arXiv:2110.02861), as
/// bitsandbytes' `Adam8bit`/`AdamW8bit`. The flat parameter arena is cut into blocks of 256
/// elements; each block of each moment keeps one fp32 scale (its largest magnitude, "absmax") and
/// one 8-bit code per element. A step dequantizes a block, applies exactly Adam's fp32 update to
/// it, and quantizes it again with the block's new absmax. State: 2 bytes per parameter plus
/// 8 bytes per 256, against Adam's 8.
///
/// The code is a small floating-point format (dynamic quantization: the error is relative, about
/// 3 % at worst, across a range of 2^-17 (m) and 2^-33 (v) below the block's absmax), so that the
/// second moment of rarely-updated weights does not round to zero. It differs from bitsandbytes'
/// "dynamic tree" map (linear levels per power of ten) in the levels, not in the idea.
///
/// Tensors under `min_8bit_size()` elements (4096, bitsandbytes' default: biases, norms) and the
/// parameters named in `keep_fp32()` keep Adam's fp32 state, updated bitwise as Adam's. Blocks are
/// blocks of the arena, the same on any number of ranks: a sharded step (shard_optimizer) cuts
/// the arena at multiples of 256, so every block and its absmax live on one rank, and a
/// checkpoint's state is the same whatever the rank count.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "xtrain/core/concepts.hpp"
#include "xtrain/core/error.hpp"
#include "xtrain/core/memory.hpp"
#include "xtrain/core/param_arena.hpp"
#include "xtrain/kernels/simd.hpp"
#include "xtrain/optim/adam.hpp"
#include "xtrain/optim/param_groups.hpp"

namespace xtrain::optim {

/// The 8-bit codes of the moments: a sign (the first moment's only), an exponent of `EBits` bits
/// and 3 mantissa bits, relative to the block's absmax: code (E, M) stands for (8 + M) x
/// 2^(E - Emax - 3) for E >= 1 and for M x 2^(-Emax - 2) for E = 0, Emax = 2^EBits - 1; the
/// largest, (Emax, 0), is 1.
namespace quant {

inline constexpr std::size_t block = 256;

template <int EBits>
struct Code {
  static constexpr int emax = (1 << EBits) - 1;
  static constexpr std::int32_t largest_code = emax << 3;         // 1.0
  static constexpr std::int32_t normal_base = (127 - emax) << 3;  // r of (E, M) is normal_base + 8E + M

  /// The code of the magnitude y in [0, 1], rounded to the nearest (ties up, or to even below the
  /// smallest normal code); a NaN or a y above
  /// 1 gives the largest. The same operations as encode_batch's, lane by lane.
  static std::uint32_t encode(float y) noexcept {
    const auto r =
        static_cast<std::int32_t>((std::bit_cast<std::uint32_t>(y) + (1u << 19)) >> 20);  // exponent, 3 mantissa bits
    if (r >= normal_base + 8) return static_cast<std::uint32_t>(std::min(r - normal_base, largest_code));
    return static_cast<std::uint32_t>(std::min(static_cast<std::int32_t>(std::nearbyint(y * small_scale())), 8));
  }
  /// encode() of each lane of y (non-negative).
  template <class Arch>
  static xsimd::batch<std::int32_t, Arch> encode_batch(const xsimd::batch<float, Arch>& y) noexcept {
    using I = xsimd::batch<std::int32_t, Arch>;
    const I r = ((xsimd::bitwise_cast<I>(y) + I(1 << 19)) >> 20) & I(0xFFF);  // as unsigned
    const I normal = xsimd::min(r - I(normal_base), I(largest_code));
    const I small = xsimd::min(
        xsimd::batch_cast<std::int32_t>(xsimd::nearbyint(y * xsimd::batch<float, Arch>(small_scale()))), I(8));
    return xsimd::select(r >= I(normal_base + 8), normal, small);
  }
  /// decode() of each lane of `code` (its low EBits + 3 bits, any bits above them ignored).
  template <class Arch>
  static xsimd::batch<float, Arch> decode_batch(const xsimd::batch<std::int32_t, Arch>& code) noexcept {
    using I = xsimd::batch<std::int32_t, Arch>;
    using F = xsimd::batch<float, Arch>;
    const I e = (code >> 3) & I(emax), m = code & I(7);
    const F normal = xsimd::bitwise_cast<F>(((e + I(127 - emax)) << 23) | (m << 20));  // (1 + M/8) 2^(E - Emax)
    const F small = xsimd::batch_cast<float>(m) * F(1.0f / small_scale());
    return xsimd::select(xsimd::bool_cast(e == I(0)), small, normal);
  }
  /// The magnitude of `code` (its low EBits + 3 bits).
  static constexpr float decode(std::uint32_t code) noexcept {
    const std::uint32_t e = code >> 3, m = code & 7u;
    return e == 0 ? static_cast<float>(m) / small_scale()
                  : static_cast<float>(8 + m) * pow2(static_cast<int>(e) - emax - 3);
  }

 private:
  static constexpr float pow2(int k) noexcept {
    float x = 1.0f;
    for (; k > 0; --k) x *= 2.0f;
    for (; k < 0; ++k) x *= 0.5f;
    return x;
  }
  static constexpr float small_scale() noexcept { return pow2(emax + 2); }
};

using Signed = Code<4>;    // the first moment: sign, 4 exponent bits, 3 mantissa bits
using Unsigned = Code<5>;  // the second moment: 5 exponent bits, 3 mantissa bits

/// Code of x in [-absmax, absmax] given 1 / absmax.
inline std::uint8_t encode_signed(float x, float inv_absmax) noexcept {
  const std::uint32_t c = Signed::encode(std::fabs(x) * inv_absmax);
  return static_cast<std::uint8_t>(x < 0.0f && c != 0 ? c | 0x80u : c);
}
inline std::uint8_t encode_unsigned(float x, float inv_absmax) noexcept {
  return static_cast<std::uint8_t>(Unsigned::encode(x * inv_absmax));
}

/// Each code's value for an absmax of 1.
inline const std::array<float, 256>& signed_table() noexcept {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (std::uint32_t c = 0; c < 256; ++c) a[c] = (c & 0x80u ? -1.0f : 1.0f) * Signed::decode(c & 0x7Fu);
    return a;
  }();
  return t;
}
inline const std::array<float, 256>& unsigned_table() noexcept {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (std::uint32_t c = 0; c < 256; ++c) a[c] = Unsigned::decode(c);
    return a;
  }();
  return t;
}

}  // namespace quant

namespace detail {

template <class Derived, bool Decoupled>
class Adam8bitBase : public AdamBase<Derived, Decoupled> {
  using Base = AdamBase<Derived, Decoupled>;
  using Coefficients = typename Base::Coefficients;

 public:
  static constexpr std::size_t block = quant::block;
  /// Version of the state's saved form (checkpoints).
  static constexpr std::uint32_t state_format = 1;

  /// Per block of 256 arena elements: the moments' codes (one byte per element) and absmax; the
  /// parameters kept in fp32, Adam's state for their elements only, in arena order.
  struct State {
    ByteVector exp_avg_codes, exp_avg_sq_codes;
    AlignedVector exp_avg_absmax, exp_avg_sq_absmax;
    typename Base::State fp32;
    template <class Archive>
    void serialize(Archive& ar, unsigned /*version*/) {
      std::uint32_t format = state_format;
      ar& format;
      XTRAIN_CHECK(format == state_format, CheckpointError, Derived::name, ": optimizer state of format ", format,
                   ", this build reads format ", state_format);
      ar& exp_avg_codes;
      ar& exp_avg_sq_codes;
      ar& exp_avg_absmax;
      ar& exp_avg_sq_absmax;
      ar& fp32;
    }
  };

  /// Tensors with fewer elements keep fp32 state (default 4096, as bitsandbytes).
  Derived& min_8bit_size(std::size_t n) {
    min_8bit_size_ = n;
    return static_cast<Derived&>(*this);
  }
  /// These parameters (state_dict names, e.g. "wte.weight") keep fp32 state.
  Derived& keep_fp32(std::vector<std::string> names) {
    keep_ = std::move(names);
    return static_cast<Derived&>(*this);
  }
  std::size_t min_8bit_size() const noexcept { return min_8bit_size_; }
  /// Whether the parameter of arena entry `e` keeps fp32 state.
  bool keeps_fp32(const ParamEntry& e) const {
    if (e.size < min_8bit_size_) return true;
    for (const auto& name : keep_) {
      if (name == e.name) return true;
      for (const auto& alias : e.aliases)
        if (name == alias) return true;
    }
    return false;
  }

  /// "AdamW8bit(lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, min_8bit_size=4096)".
  std::string describe() const {
    std::string s = Base::describe();
    s.insert(s.size() - 1, ", min_8bit_size=" + std::to_string(min_8bit_size_));
    return s;
  }

  /// State for the arena range [begin, end) (begin a multiple of 256).
  State init(const ParamArena& arena, std::size_t begin, std::size_t end) const {
    XTRAIN_CHECK(begin % block == 0 && end >= begin, ValueError, Derived::name, ": state range [", begin, ", ", end,
                 ") does not start on a block of ", block);
    std::size_t kept = 0;
    for (const BlockRun& r : block_runs(*this, arena))
      if (r.kept)
        kept += std::min(r.end, end) > std::max(r.begin, begin) ? std::min(r.end, end) - std::max(r.begin, begin) : 0;
    return make(end - begin, kept);
  }
  /// State for a flat buffer of n elements, all in 8 bits (step() on spans).
  State init(std::size_t n) const { return make(n, 0); }

  /// Calls f on each state vector, in an order every rank shares (sharding and checkpoints).
  template <class F>
  static void visit_state(State& s, F&& f) {
    f(s.exp_avg_codes);
    f(s.exp_avg_sq_codes);
    f(s.exp_avg_absmax);
    f(s.exp_avg_sq_absmax);
    f(s.fp32.exp_avg);
    f(s.fp32.exp_avg_sq);
  }

  /// One step of a flat buffer (no arena, every element in 8 bits): `params` are elements
  /// [state_offset, state_offset + n) of the buffer the state was made for; state_offset a
  /// multiple of 256.
  void step(std::span<float> params, std::span<const float> grads, State& state, const StepInfo& info) const {
    XTRAIN_CHECK(info.state_offset % block == 0, ValueError, Derived::name, ": step at element ", info.state_offset,
                 ", not on a block of ", block);
    const Coefficients k = this->coefficients(info.lr, info.step, info.weight_decay_scale);
    for (std::size_t b = 0; b < params.size(); b += block) {
      const std::size_t n = std::min(block, params.size() - b), at = info.state_offset + b;
      std::array<float, block> m{}, v{};
      const std::size_t q = at / block;
      dequantize(state, at, q, n, m.data(), v.data());
      apply(k, params.data() + b, grads.data() + b, m.data(), v.data(), n);
      std::fill(m.begin() + static_cast<std::ptrdiff_t>(n), m.end(), 0.0f);  // beyond the buffer: no codes
      std::fill(v.begin() + static_cast<std::ptrdiff_t>(n), v.end(), 0.0f);
      quantize(state, at, q, n, m.data(), v.data());
    }
  }

  /// The arena range [info.begin, info.end), block by block (ArenaGroups calls it).
  void step_blocks(std::span<float> values, std::span<const float> grads, State& state, const BlockStep& info) const {
    std::array<Coefficients, 8> per_group{};  // the groups' coefficients (most models have 1 or 2)
    XTRAIN_CHECK(info.scales.size() <= per_group.size(), ValueError, Derived::name, ": more than ", per_group.size(),
                 " parameter groups");
    for (std::size_t g = 0; g < info.scales.size(); ++g)
      per_group[g] =
          this->coefficients(info.lr * info.scales[g].lr_scale, info.step, info.scales[g].weight_decay_scale);
    std::size_t r = 0;
    while (r < info.runs.size() && info.runs[r].end <= info.begin) ++r;
    for (std::size_t b0 = info.begin; b0 < info.end; b0 += block) {
      const std::size_t b1 = std::min(b0 + block, info.end), at = b0 - info.state_begin, q = at / block;
      std::array<float, block> m{}, v{};
      dequantize(state, at, q, b1 - b0, m.data(), v.data());
      for (std::size_t i = r; i < info.runs.size() && info.runs[i].begin < b1; ++i) {
        const BlockRun& run = info.runs[i];
        const std::size_t s = std::max(run.begin, b0), e = std::min(run.end, b1);
        if (s >= e) continue;
        const Coefficients& k = per_group[run.group];
        if (run.kept) {
          const std::size_t c = run.kept_index + (s - run.begin) - info.kept_base;
          apply(k, values.data() + s, grads.data() + s, state.fp32.exp_avg.data() + c, state.fp32.exp_avg_sq.data() + c,
                e - s);
        } else {
          apply(k, values.data() + s, grads.data() + s, m.data() + (s - b0), v.data() + (s - b0), e - s);
        }
      }
      quantize(state, at, q, b1 - b0, m.data(), v.data());
      while (r < info.runs.size() && info.runs[r].end <= b1) ++r;
    }
  }

 protected:
  Adam8bitBase() = default;
  explicit Adam8bitBase(float weight_decay) : Base(weight_decay) {}

 private:
  State make(std::size_t n, std::size_t kept) const {
    State s;
    s.exp_avg_codes.assign(n, 0);
    s.exp_avg_sq_codes.assign(n, 0);
    s.exp_avg_absmax.assign((n + block - 1) / block, 0.0f);
    s.exp_avg_sq_absmax.assign((n + block - 1) / block, 0.0f);
    s.fp32 = Base::init(kept);
    return s;
  }

  // Adam's update of n elements, SIMD batch by batch (a partial batch through a padded copy), so
  // that every element is computed as Adam computes it.
  static void apply(const Coefficients& k, float* p, const float* g, float* m, float* v, std::size_t n) {
    constexpr std::size_t w = simd::batch<float>::size;
    std::size_t i = 0;
    for (; i + w <= n; i += w) Base::update(k, p + i, g + i, m + i, v + i);
    if (i == n) return;
    std::array<float, w> pp{}, gg{}, mm{}, vv{};
    std::copy(p + i, p + n, pp.begin());
    std::copy(g + i, g + n, gg.begin());
    std::copy(m + i, m + n, mm.begin());
    std::copy(v + i, v + n, vv.begin());
    Base::update(k, pp.data(), gg.data(), mm.data(), vv.data());
    std::copy_n(pp.begin(), n - i, p + i);
    std::copy_n(mm.begin(), n - i, m + i);
    std::copy_n(vv.begin(), n - i, v + i);
  }

  // The n moments of the block at state element `at` (block q), in fp32 (n a multiple of 16, or
  // the local arrays hold 256).
  static void dequantize(const State& s, std::size_t at, std::size_t q, std::size_t n, float* m, float* v) {
    using F = simd::batch<float>;
    using I = xsimd::batch<std::int32_t, F::arch_type>;
    constexpr std::size_t w = F::size;
    alignas(64) std::array<std::int32_t, block> cm{}, cv{};
    const std::uint8_t* om = s.exp_avg_codes.data() + at;
    const std::uint8_t* ov = s.exp_avg_sq_codes.data() + at;
    for (std::size_t i = 0; i < n; ++i) {
      cm[i] = om[i];
      cv[i] = ov[i];
    }
    const F am(s.exp_avg_absmax[q]), av(s.exp_avg_sq_absmax[q]);
    for (std::size_t i = 0; i < n; i += w) {
      const I c = I::load_aligned(cm.data() + i);
      const F mag = quant::Signed::decode_batch(c);
      const F sign = xsimd::bitwise_cast<F>((c & I(0x80)) << 24);
      (xsimd::bitwise_or(mag, sign) * am).store_unaligned(m + i);
      (quant::Unsigned::decode_batch(I::load_aligned(cv.data() + i)) * av).store_unaligned(v + i);
    }
  }

  static float largest(const simd::batch<float>& x) {
    alignas(64) std::array<float, simd::batch<float>::size> lanes{};
    x.store_aligned(lanes.data());
    return *std::max_element(lanes.begin(), lanes.end());
  }

  // Quantizes the block's n moments with its new absmax (elements the step left alone hold 0,
  // which changes neither absmax nor its code).
  static void quantize(State& s, std::size_t at, std::size_t q, std::size_t n, const float* m, const float* v) {
    using F = simd::batch<float>;
    using I = xsimd::batch<std::int32_t, F::arch_type>;
    constexpr std::size_t w = F::size;
    F am(0.0f), av(0.0f);
    for (std::size_t i = 0; i < n; i += w) {  // n: a multiple of 16 (whole units)
      am = xsimd::max(am, xsimd::abs(F::load_unaligned(m + i)));
      av = xsimd::max(av, F::load_unaligned(v + i));
    }
    const float amax = largest(am), vmax = largest(av);
    const F im(amax > 0.0f ? 1.0f / amax : 0.0f), iv(vmax > 0.0f ? 1.0f / vmax : 0.0f);
    alignas(64) std::array<std::int32_t, block> cm{}, cv{};
    for (std::size_t i = 0; i < n; i += w) {
      const F mi = F::load_unaligned(m + i);
      const I c = quant::Signed::encode_batch(xsimd::abs(mi) * im);
      xsimd::select(xsimd::bool_cast(mi < F(0.0f)) && c != I(0), c | I(0x80), c).store_aligned(cm.data() + i);
      quant::Unsigned::encode_batch(F::load_unaligned(v + i) * iv).store_aligned(cv.data() + i);
    }
    std::uint8_t* om = s.exp_avg_codes.data() + at;
    std::uint8_t* ov = s.exp_avg_sq_codes.data() + at;
    for (std::size_t i = 0; i < n; ++i) {
      om[i] = static_cast<std::uint8_t>(cm[i]);
      ov[i] = static_cast<std::uint8_t>(cv[i]);
    }
    s.exp_avg_absmax[q] = amax;
    s.exp_avg_sq_absmax[q] = vmax;
  }

  std::size_t min_8bit_size_ = 4096;
  std::vector<std::string> keep_;
};

}  // namespace detail

/// Adam with 8-bit moments: `Adam8bit{}.lr(1e-3f)`; options as Adam's, plus min_8bit_size and
/// keep_fp32.
class Adam8bit : public detail::Adam8bitBase<Adam8bit, false> {
 public:
  static constexpr const char* name = "Adam8bit";
  Adam8bit() = default;
};

/// AdamW with 8-bit moments (weight decay 0.01 by default, as AdamW).
class AdamW8bit : public detail::Adam8bitBase<AdamW8bit, true> {
 public:
  static constexpr const char* name = "AdamW8bit";
  AdamW8bit() : Adam8bitBase(0.01f) {}
};

}  // namespace xtrain::optim
