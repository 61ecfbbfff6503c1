#pragma once
/// \file attention.hpp
/// Causal scaled dot-product attention of one (sample, head), in fp32. Attention runs in blocks of attention_block(T)
/// query rows; only the log-sum-exp of each row is kept for backward, which recomputes the probabilities block by block
/// (as flash attention does): memory for backward grows as T per head, the scratch as T once. The softmax and every sum
/// run in fp32. A NaN or +Inf score makes its row NaN, as the definition does. Two ways to the products, chosen by
/// attention_in_tiles<S>(T, d):
/// - In tiles (head dim a multiple of a register tile's width, 32 with AVX-512; fp32 at any T;
///   bf16 at any T where bf16 products are only emulated, else with heads of 32 up to T = 192):
///   the products run in fp32 register tiles on operands read where they are (bf16 q, k, v,
///   dout widened once per head), with k and v transposed once per head and
///   the block's probabilities read along their columns for dk and dv. A tile of rows stops at
///   the keys its last row sees, and the softmax works in whole registers with the last one
///   masked. At 12 x 64 x 4 heads of 32 this ran 1.4-1.6x (fp32) and 1.2x (bf16) as fast as
///   the packed GEMMs (benchmarks/RESULTS.md, "Attention in register tiles").
/// - Otherwise through the packed GEMM: in fp32 (q, k, v, dout stored as fp32) or bf16 (stored as
///   bf16: products read them as bf16 with fp32 accumulation, and the probabilities and their
///   gradients are rounded to bf16 as they enter a product, as in bf16 flash attention).
/// Scalar twin: kernels/reference/attention.hpp.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>

#include "xtrain/kernels/elementwise.hpp"
#include "xtrain/kernels/gemm.hpp"
#include "xtrain/kernels/gemm_lowp.hpp"
#include "xtrain/kernels/simd.hpp"
#include "xtrain/kernels/transpose.hpp"

namespace xtrain::kernels {

/// Query rows per block of causal attention over T positions. A block's products run over the
/// keys up to its last row, so smaller blocks skip more of the masked triangle (at T = 64, blocks
/// of 32 compute 3/4 of the full product, one block all of it) but repack the keys once per
/// block: 32 rows up to T = 256, 64 beyond (benchmarks/RESULTS.md, "... attention blocks of 32").
constexpr std::size_t attention_block(std::size_t positions) noexcept { return positions <= 256 ? 32 : 64; }

namespace detail {
constexpr std::size_t round_up(std::size_t x, std::size_t m) noexcept { return (x + m - 1) / m * m; }

/// Row stride of the tiled path's scores and transposed keys for T positions: T rounded up to a
/// register tile's width, plus one vector where that is a multiple of 1 KiB, so that the rows a
/// tile reads do not all fall into the same sets of the L1 cache.
template <class Arch = simd::default_arch>
constexpr std::size_t attention_width(std::size_t positions) noexcept {
  const std::size_t w = round_up(positions, GemmShape<Arch>::nr);
  return w % 256 == 0 ? w + simd::lanes<Arch> : w;
}
}  // namespace detail

/// Asks the cache for `rows` rows of `cols` elements at stride `ld` from `p`, for reading: a head's
/// operands, fetched while the previous head computes (rows of 64 or 128 bytes at a stride of
/// kilobytes, which the hardware prefetchers do not follow).
template <class E>
inline void prefetch_rows(const E* p, std::size_t ld, std::size_t rows, std::size_t cols) noexcept {
  constexpr std::size_t line = 64 / sizeof(E);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; c += line) {
      // In asm: GCC deletes a loop of __builtin_prefetch as a loop without effects.
#if defined(__x86_64__) || defined(__i386__)
      asm volatile("prefetcht0 %0" : : "m"(p[r * ld + c]));
#else
      __builtin_prefetch(p + r * ld + c, 0, 3);
#endif
    }
}

/// Whether attention over T positions with heads of d, q, k, v stored as S, runs its products in
/// fp32 register tiles on operands read in place (d a multiple of a register tile's width, 32 with
/// AVX-512) rather than through the packed GEMM. For bf16 where bf16 products are native, only
/// with heads of at most 32 and T up to 192: there the tiles ran 1.1-1.2x as fast as the bf16
/// products, which won at T = 256 (1.04x) and with heads of 64 (1.12x at T = 128).
template <class S, class Arch = simd::default_arch>
constexpr bool attention_in_tiles(std::size_t positions, std::size_t head_dim) noexcept {
  const bool fp32_wins = std::is_same_v<S, float> || !native_lowp_gemm<S> || (head_dim <= 32 && positions <= 192);
  return head_dim > 0 && head_dim % detail::GemmShape<Arch>::nr == 0 && fp32_wins;
}

/// Floats of scratch causal_attention_forward and causal_attention_backward need for T positions
/// and heads of d (the same for both; linear in T).
template <class Arch = simd::default_arch>
constexpr std::size_t attention_scratch(std::size_t positions, std::size_t head_dim) noexcept {
  const std::size_t block = std::min(positions, attention_block(positions));
  if (!attention_in_tiles<float, Arch>(positions, head_dim)) return 2 * block * positions;
  const std::size_t width = detail::attention_width<Arch>(positions);
  // k^T and v^T; a block's scores and their gradients; widened q, k, v, dout (bf16)
  return 2 * head_dim * width + 2 * block * width + 4 * positions * head_dim;
}

namespace detail {
/// The largest lane of v (a NaN lane may or may not win; callers do not depend on which).
template <class Arch>
float horizontal_max(const simd::batch<float, Arch>& v) noexcept {
#if defined(__AVX512F__)
  if constexpr (simd::batch<float, Arch>::size == 16) return _mm512_reduce_max_ps(v);
#endif
  alignas(64) float lanes[simd::batch<float, Arch>::size];
  v.store_aligned(lanes);
  return *std::max_element(lanes, lanes + simd::batch<float, Arch>::size);
}

/// max of x[i] for i < n (n >= 1); which value a NaN yields does not matter to the callers (a NaN
/// among x makes the row's exp NaN whatever the shift).
template <class Arch = simd::default_arch>
float row_max(const float* x, std::size_t n) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t w = B::size;
  float m = x[0];
  std::size_t i = 0;
  if (n >= w) {
    B acc = B::load_unaligned(x);
    for (i = w; i + w <= n; i += w) acc = xsimd::max(acc, B::load_unaligned(x + i));
    m = horizontal_max<Arch>(acc);
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

/// x[i] = exp(x[i] - shift) for i < n (the tail through one padded register: no scalar exp);
/// returns their sum when Sum (fp32 lanes, the lanes summed, then the tail in order).
template <bool Sum, class Arch = simd::default_arch>
float exp_shifted(float* x, std::size_t n, float shift) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t w = B::size;
  B acc(0.0f);
  const B s(shift);
  std::size_t i = 0;
  for (; i + w <= n; i += w) {
    const B e = ops::exp_clamped(B::load_unaligned(x + i) - s);
    e.store_unaligned(x + i);
    if constexpr (Sum) acc += e;
  }
  float sum = Sum ? simd::horizontal_sum(acc) : 0.0f;
  if (i < n) {
    alignas(64) float tail[w];
    std::fill(tail, tail + w, shift);
    std::copy(x + i, x + n, tail);
    ops::exp_clamped(B::load_aligned(tail) - s).store_aligned(tail);
    for (std::size_t j = 0; j < n - i; ++j) {
      x[i + j] = tail[j];
      if constexpr (Sum) sum += tail[j];
    }
  }
  return sum;
}

/// sum of a[i] b[i] for i < n, a and b widened from SA and SB (fp32 lanes, the lanes summed, then
/// the tail).
template <class SA, class SB, class Arch = simd::default_arch>
float row_dot(const SA* a, const SB* b, std::size_t n) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t w = B::size, chunk = 64;
  alignas(64) float wide_a[chunk], wide_b[chunk];
  B acc(0.0f);
  float tail = 0.0f;
  for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
    const std::size_t m = std::min(chunk, n - c0);
    const float* x = wide_a;
    const float* y = wide_b;
    if constexpr (std::is_same_v<SA, float>)
      x = a + c0;
    else
      to_float(a + c0, wide_a, m);
    if constexpr (std::is_same_v<SB, float>)
      y = b + c0;
    else
      to_float(b + c0, wide_b, m);
    std::size_t i = 0;
    for (; i + w <= m; i += w) acc = xsimd::fma(B::load_unaligned(x + i), B::load_unaligned(y + i), acc);
    for (; i < m; ++i) tail += x[i] * y[i];
  }
  return simd::horizontal_sum(acc) + tail;
}

/// C = alpha op(A) op(B) + beta C with the products in S: the fp32 GEMM (S = float) or gemm_lowp (S = bf16).
template <class S, class TA, class TB>
void attention_gemm(Trans ta, Trans tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const TA* A,
                    std::size_t lda, const TB* B, std::size_t ldb, float beta, float* C, std::size_t ldc,
                    backend::Executor* executor) {
  static_assert(std::is_same_v<S, float> || std::is_same_v<S, bf16>, "attention products run in fp32 or bf16");
  if constexpr (std::is_same_v<S, float>)
    gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, executor);
  else
    gemm_lowp<S>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, executor);
}

/// The register tiles of a product C = alpha A B + beta C with A and B read in place (row-major,
/// strides lda and ldb; B's rows hold every column a tile reads): row tile [r0, r0 + m) runs over
/// depth k0..k1 into columns 0..n, where {k0, k1, n} = extent(r0, m) (n a multiple of the tile
/// width). Attention's operands are too small for packing to pay (a tile of q serves at most 8
/// column tiles), and the extent lets a tile skip what the causal mask makes zero. Not inlined:
/// inside attention_backward_tiles g++ spilled a B vector of the micro-kernel to the stack.
struct TileExtent {
  std::size_t k0, k1, cols;
};
template <class Arch, class Extent>
[[gnu::noinline]] void attention_tiles(std::size_t rows, const float* A, std::size_t lda, const float* B,
                                       std::size_t ldb, float alpha, float beta, float* C, std::size_t ldc,
                                       Extent extent) {
  using shape = GemmShape<Arch>;
  for (std::size_t r0 = 0; r0 < rows; r0 += shape::mr) {
    const std::size_t m = std::min(shape::mr, rows - r0);
    const TileExtent e = extent(r0, m);
    for (std::size_t j0 = 0; j0 < e.cols; j0 += shape::nr)
      micro_kernel<Arch, false, false>(e.k1 - e.k0, A + r0 * lda + e.k0, lda, B + e.k0 * ldb + j0, alpha, beta,
                                       C + r0 * ldc + j0, ldc, m, shape::nr, ldb);
  }
}

/// C[0:rows, 0:nr] = A^T B (+ C when Add) for A's element (r, k) at a[k * lda + r] (A stored transposed: the
/// probabilities or score gradients of a block, read along their columns) and B's rows at stride
/// ldb; 1 <= rows <= mr (rows past `rows` re-read the last row, never stored).
template <class Arch, bool Add>
void tile_transposed_a(std::size_t kc, const float* __restrict a, std::size_t lda, const float* __restrict b,
                       std::size_t ldb, float* __restrict c, std::size_t ldc, std::size_t rows) noexcept {
  using shape = GemmShape<Arch>;
  using B = simd::batch<float, Arch>;
  constexpr std::size_t mr = shape::mr, w = shape::lanes;
  const float* acol[mr];
  for (std::size_t r = 0; r < mr; ++r) acol[r] = a + std::min(r, rows - 1);
  B acc0[mr], acc1[mr];
  XTRAIN_UNROLL(16)
  for (std::size_t r = 0; r < mr; ++r) acc0[r] = acc1[r] = B(0.0f);
  for (std::size_t k = 0; k < kc; ++k) {
    const B b0 = B::load_unaligned(b + k * ldb), b1 = B::load_unaligned(b + k * ldb + w);
    XTRAIN_UNROLL(16)
    for (std::size_t r = 0; r < mr; ++r) {
      const B av(acol[r][k * lda]);
      acc0[r] = xsimd::fma(av, b0, acc0[r]);
      acc1[r] = xsimd::fma(av, b1, acc1[r]);
    }
  }
  for (std::size_t r = 0; r < rows; ++r) {
    if constexpr (Add) {
      acc0[r] += B::load_unaligned(c + r * ldc);
      acc1[r] += B::load_unaligned(c + r * ldc + w);
    }
    acc0[r].store_unaligned(c + r * ldc);
    acc1[r].store_unaligned(c + r * ldc + w);
  }
}

/// Lane i of the result is i (0, 1, ..., lanes - 1).
template <class Arch>
simd::batch<float, Arch> lane_index() noexcept {
  using B = simd::batch<float, Arch>;
  alignas(64) float idx[B::size];
  for (std::size_t i = 0; i < B::size; ++i) idx[i] = static_cast<float>(i);
  return B::load_aligned(idx);
}

/// row[i] = 0 for i in [from, to), both multiples of the lanes.
template <class Arch>
void zero_lanes(float* row, std::size_t from, std::size_t to) noexcept {
  using B = simd::batch<float, Arch>;
  for (std::size_t i = from; i < to; i += B::size) B(0.0f).store_unaligned(row + i);
}

/// Softmax of row[0:n] in place, zeros in row[n:width] (width a multiple of the lanes, row[0:width]
/// writable and row[0:round_up(n, lanes)] readable); returns the log-sum-exp. Whole registers
/// throughout: the last one's lanes past n are masked rather than copied through a buffer.
template <class Arch>
float softmax_row(float* row, std::size_t n, std::size_t width) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t w = B::size;
  const std::size_t used = round_up(n, w);
  const auto last = lane_index<Arch>() < B(static_cast<float>(n - (used - w)));  // lanes of the last register < n
  const B neg_inf(-std::numeric_limits<float>::infinity());
  B mx = xsimd::select(last, B::load_unaligned(row + used - w), neg_inf);
  for (std::size_t i = 0; i + w < used; i += w) mx = xsimd::max(mx, B::load_unaligned(row + i));
  const float m = horizontal_max<Arch>(mx);
  const B shift(m);
  B acc(0.0f);
  for (std::size_t i = 0; i < used; i += w) {
    B e = ops::exp_clamped(B::load_unaligned(row + i) - shift);
    if (i + w == used) e = xsimd::select(last, e, B(0.0f));
    e.store_unaligned(row + i);
    acc += e;
  }
  const float sum = simd::horizontal_sum(acc);
  const B inv(1.0f / sum);
  for (std::size_t i = 0; i < used; i += w) (B::load_unaligned(row + i) * inv).store_unaligned(row + i);
  zero_lanes<Arch>(row, used, width);
  return m + std::log(sum);
}

/// Backward of softmax_row for one row: p = exp(s - lse) written over s, ds = p (dp - dsum) scale
/// over dp, both for [0, n) and zero in [n, width) (as softmax_row's bounds).
template <class Arch>
void softmax_backward_row(float* s, float* dp, std::size_t n, std::size_t width, float lse, float dsum,
                          float scale) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t w = B::size;
  const std::size_t used = round_up(n, w);
  const auto last = lane_index<Arch>() < B(static_cast<float>(n - (used - w)));
  const B vl(lse), vd(dsum), vs(scale);
  for (std::size_t i = 0; i < used; i += w) {
    B p = ops::exp_clamped(B::load_unaligned(s + i) - vl);
    B g = p * (B::load_unaligned(dp + i) - vd) * vs;
    if (i + w == used) {
      p = xsimd::select(last, p, B(0.0f));
      g = xsimd::select(last, g, B(0.0f));
    }
    p.store_unaligned(s + i);
    g.store_unaligned(dp + i);
  }
  zero_lanes<Arch>(s, used, width);
  zero_lanes<Arch>(dp, used, width);
}

/// rows x cols of S at stride ld, widened into dst (stride cols).
template <class S>
void widen_rows(const S* src, std::size_t rows, std::size_t cols, std::size_t ld, float* dst) noexcept {
  for (std::size_t r = 0; r < rows; ++r) to_float(src + r * ld, dst + r * cols, cols);
}

/// src (T rows of d at stride ld) transposed into dst (d rows of `width` >= T), zero past T.
template <class S>
void transpose_padded(const S* src, std::size_t T, std::size_t d, std::size_t ld, float* dst,
                      std::size_t width) noexcept {
  transpose_convert(src, T, d, ld, dst, width);
  if (width > T)
    for (std::size_t c = 0; c < d; ++c) std::fill(dst + c * width + T, dst + (c + 1) * width, 0.0f);
}

/// The operands of one (sequence, head) as fp32 rows: in place (S = float) or widened into `buf`.
template <class S>
const float* rows_f32(const S* src, std::size_t T, std::size_t d, std::size_t ld, float*& buf,
                      std::size_t& ld_out) noexcept {
  if constexpr (std::is_same_v<S, float>) {
    ld_out = ld;
    return src;
  } else {
    widen_rows(src, T, d, ld, buf);
    ld_out = d;
    const float* out = buf;
    buf += T * d;
    return out;
  }
}

/// causal_attention_forward when attention_in_tiles(T, d): fp32 products by register tiles on q,
/// v and k^T read in place (bf16 widened first), the softmax in whole registers.
template <class S, class Arch = simd::default_arch>
void attention_forward_tiles(std::size_t T, std::size_t d, float scale, const S* q, const S* k, const S* v,
                             std::size_t ld, float* out, std::size_t ldo, float* lse, float* scratch) {
  using shape = GemmShape<Arch>;
  const std::size_t width = attention_width<Arch>(T), block = std::min(T, attention_block(T));
  float* kt = scratch;
  float* s = kt + d * width;
  float* buf = s + block * width;
  transpose_padded(k, T, d, ld, kt, width);
  std::size_t ldq = 0, ldv = 0;
  const float* qf = rows_f32(q, T, d, ld, buf, ldq);
  const float* vf = rows_f32(v, T, d, ld, buf, ldv);
  for (std::size_t i0 = 0; i0 < T; i0 += block) {
    const std::size_t rows = std::min(T, i0 + block) - i0, cols = round_up(i0 + rows, shape::nr);
    // A row tile's keys end at its last row.
    const auto keys = [&](std::size_t r0, std::size_t m) { return i0 + r0 + m; };
    attention_tiles<Arch>(rows, qf + i0 * ldq, ldq, kt, width, scale, 0.0f, s, width,
                          [&](std::size_t r0, std::size_t m) {
                            return TileExtent{0, d, round_up(keys(r0, m), shape::nr)};
                          });
    for (std::size_t r = 0; r < rows; ++r) lse[i0 + r] = softmax_row<Arch>(s + r * width, i0 + r + 1, cols);
    attention_tiles<Arch>(rows, s, width, vf, ldv, 1.0f, 0.0f, out + i0 * ldo, ldo, [&](std::size_t r0, std::size_t m) {
      return TileExtent{0, keys(r0, m), d};
    });
  }
}

/// causal_attention_backward when attention_in_tiles(T, d) (see attention_forward_tiles).
template <class S, class Arch = simd::default_arch, class O>
void attention_backward_tiles(std::size_t T, std::size_t d, float scale, const S* q, const S* k, const S* v,
                              std::size_t ld, const O* out, const S* dout, std::size_t ldo, const float* lse, float* dq,
                              float* dk, float* dv, std::size_t ldg, float* scratch) {
  using shape = GemmShape<Arch>;
  const std::size_t width = attention_width<Arch>(T), block = std::min(T, attention_block(T));
  float* kt = scratch;
  float* vt = kt + d * width;
  float* p = vt + d * width;
  float* dp = p + block * width;
  float* buf = dp + block * width;
  transpose_padded(k, T, d, ld, kt, width);
  transpose_padded(v, T, d, ld, vt, width);
  std::size_t ldq = 0, ldk = 0, ldd = 0;
  const float* qf = rows_f32(q, T, d, ld, buf, ldq);
  const float* kf = rows_f32(k, T, d, ld, buf, ldk);
  const float* df = rows_f32(dout, T, d, ldo, buf, ldd);
  for (std::size_t i0 = 0; i0 < T; i0 += block) {
    const std::size_t i1 = std::min(T, i0 + block), rows = i1 - i0, cols = round_up(i1, shape::nr);
    const auto keys = [&](std::size_t r0, std::size_t m) { return i0 + r0 + m; };
    const auto scores = [&](std::size_t r0, std::size_t m) {
      return TileExtent{0, d, round_up(keys(r0, m), shape::nr)};
    };
    attention_tiles<Arch>(rows, qf + i0 * ldq, ldq, kt, width, scale, 0.0f, p, width, scores);
    attention_tiles<Arch>(rows, df + i0 * ldd, ldd, vt, width, 1.0f, 0.0f, dp, width, scores);
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t i = i0 + r;
      // D_i = sum_j P_ij dP_ij = dout_i . out_i
      const float dsum = row_dot(dout + i * ldo, out + i * ldo, d);
      softmax_backward_row<Arch>(p + r * width, dp + r * width, i + 1, cols, lse[i], dsum, scale);
    }
    // dv[0:i1] += P^T dout_blk; dk[0:i1] += dS^T q_blk: key tile [j0, j0 + mr) gets gradient
    // from the block's rows at or after j0, and keys from i0 on get their first here (written,
    // not added: the caller need not clear dk and dv).
    for (std::size_t j0 = 0; j0 < i1; j0 += shape::mr) {
      const std::size_t r0 = std::max(j0, i0) - i0, m = std::min(shape::mr, i1 - j0);
      if (j0 < i0 && j0 + m > i0)  // a tile across the block's start (tiles of 6 rows: SSE, AVX)
        for (std::size_t i = i0; i < j0 + m; ++i) {
          std::fill(dk + i * ldg, dk + i * ldg + d, 0.0f);
          std::fill(dv + i * ldg, dv + i * ldg + d, 0.0f);
        }
      const auto product = [&](auto add) {
        for (std::size_t c0 = 0; c0 < d; c0 += shape::nr) {
          tile_transposed_a<Arch, add()>(rows - r0, p + r0 * width + j0, width, df + (i0 + r0) * ldd + c0, ldd,
                                         dv + j0 * ldg + c0, ldg, m);
          tile_transposed_a<Arch, add()>(rows - r0, dp + r0 * width + j0, width, qf + (i0 + r0) * ldq + c0, ldq,
                                         dk + j0 * ldg + c0, ldg, m);
        }
      };
      if (j0 < i0)
        product(std::true_type{});
      else
        product(std::false_type{});
    }
    // dq_blk = dS k[0:i1]
    attention_tiles<Arch>(rows, dp, width, kf, ldk, 1.0f, 0.0f, dq + i0 * ldg, ldg, [&](std::size_t r0, std::size_t m) {
      return TileExtent{0, keys(r0, m), d};
    });
  }
}
}  // namespace detail

/// out[i] = sum over j <= i of softmax_j(scale * q_i . k_j) v_j for i < T, and lse[i] the
/// log-sum-exp of row i's scaled scores (what backward needs). q, k, v: T rows of d floats at
/// stride `ld` (the fused QKV projection's row); out: T rows at stride `ldo`. `scratch`: at least
/// attention_scratch(T, d) floats. S: float, or bf16 (see the file's comment for the products). The
/// GEMMs pack in the calling thread's workspace of `executor`.
template <class S>
void causal_attention_forward(std::size_t T, std::size_t d, float scale, const S* q, const S* k, const S* v,
                              std::size_t ld, float* out, std::size_t ldo, float* lse, float* scratch,
                              backend::Executor* executor = nullptr) {
  if (attention_in_tiles<S>(T, d)) {
    detail::attention_forward_tiles(T, d, scale, q, k, v, ld, out, ldo, lse, scratch);
    return;
  }
  const std::size_t block = attention_block(T);
  for (std::size_t i0 = 0; i0 < T; i0 += block) {
    const std::size_t i1 = std::min(T, i0 + block), rows = i1 - i0, keys = i1;
    float* s = scratch;
    detail::attention_gemm<S>(Trans::no, Trans::yes, rows, keys, d, scale, q + i0 * ld, ld, k, ld, 0.0f, s, keys,
                              executor);
    for (std::size_t r = 0; r < rows; ++r) {
      float* row = s + r * keys;
      const std::size_t n = i0 + r + 1;  // keys 0..i
      const float m = detail::row_max(row, n);
      const float sum = detail::exp_shifted<true>(row, n, m);
      const float inv = 1.0f / sum;
      for (std::size_t j = 0; j < n; ++j) row[j] *= inv;
      std::fill(row + n, row + keys, 0.0f);
      lse[i0 + r] = m + std::log(sum);
    }
    detail::attention_gemm<S>(Trans::no, Trans::no, rows, d, keys, 1.0f, s, keys, v, ld, 0.0f, out + i0 * ldo, ldo,
                              executor);
  }
}

/// Backward of causal_attention_forward: dq, dk, dv = d(loss)/dq, /dk, /dv (written), T rows of
/// d floats at stride `ldg` each (the columns between them untouched). `out` and `lse` are forward's
/// (out stored as fp32 or as the layer's 16-bit output), `dout` the gradient of out (stride ldo). `scratch`: at least
/// attention_scratch(T, d) floats. The probabilities are recomputed from q, k and lse. S: as forward's (dout stored as
/// S too). The GEMMs pack in the calling thread's workspace of `executor`.
template <class S, class O>
void causal_attention_backward(std::size_t T, std::size_t d, float scale, const S* q, const S* k, const S* v,
                               std::size_t ld, const O* out, const S* dout, std::size_t ldo, const float* lse,
                               float* dq, float* dk, float* dv, std::size_t ldg, float* scratch,
                               backend::Executor* executor = nullptr) {
  if (attention_in_tiles<S>(T, d)) {
    detail::attention_backward_tiles(T, d, scale, q, k, v, ld, out, dout, ldo, lse, dq, dk, dv, ldg, scratch);
    return;
  }
  const std::size_t block = attention_block(T);
  float* p = scratch;
  float* dp = scratch + std::min(T, block) * T;
  for (std::size_t i0 = 0; i0 < T; i0 += block) {
    const std::size_t i1 = std::min(T, i0 + block), rows = i1 - i0, keys = i1;
    // Keys i0..i1 first receive gradient in this block, which adds into dk and dv: zeroed here,
    // while in cache (the caller need not clear them).
    for (std::size_t i = i0; i < i1; ++i) {
      std::fill(dk + i * ldg, dk + i * ldg + d, 0.0f);
      std::fill(dv + i * ldg, dv + i * ldg + d, 0.0f);
    }
    detail::attention_gemm<S>(Trans::no, Trans::yes, rows, keys, d, scale, q + i0 * ld, ld, k, ld, 0.0f, p, keys,
                              executor);
    detail::attention_gemm<S>(Trans::no, Trans::yes, rows, keys, d, 1.0f, dout + i0 * ldo, ldo, v, ld, 0.0f, dp, keys,
                              executor);
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t i = i0 + r, n = i + 1;
      float* prow = p + r * keys;
      float* dprow = dp + r * keys;
      detail::exp_shifted<false>(prow, n, lse[i]);
      std::fill(prow + n, prow + keys, 0.0f);
      // D_i = sum_j P_ij dP_ij = dout_i . out_i
      const float dsum = detail::row_dot(dout + i * ldo, out + i * ldo, d);
      for (std::size_t j = 0; j < n; ++j) dprow[j] = prow[j] * (dprow[j] - dsum) * scale;
      std::fill(dprow + n, dprow + keys, 0.0f);
    }
    // dv[0:i1] += P^T dout_blk; dq_blk = dS k[0:i1]; dk[0:i1] += dS^T q_blk
    detail::attention_gemm<S>(Trans::yes, Trans::no, keys, d, rows, 1.0f, p, keys, dout + i0 * ldo, ldo, 1.0f, dv, ldg,
                              executor);
    detail::attention_gemm<S>(Trans::no, Trans::no, rows, d, keys, 1.0f, dp, keys, k, ld, 0.0f, dq + i0 * ldg, ldg,
                              executor);
    detail::attention_gemm<S>(Trans::yes, Trans::no, keys, d, rows, 1.0f, dp, keys, q + i0 * ld, ld, 1.0f, dk, ldg,
                              executor);
  }
}

}  // namespace xtrain::kernels
