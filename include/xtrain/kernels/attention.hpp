#pragma once
/// \file attention.hpp
/// Causal scaled dot-product attention of one (sample, head), and layer normalisation of rows, in
/// fp32. The attention's products run in fp32 (q, k, v, dout stored as fp32) or in bf16 (stored as
/// bf16: the products read them as bf16, without widened copies, with fp32 accumulation, and the
/// probabilities and their gradients are rounded to bf16 as they enter a product, as in bf16 flash
/// attention); the softmax and everything kept run in fp32 either way. A NaN or +Inf score makes
/// its row NaN, as the definition does. Attention runs in blocks of attention_block(T) query
/// rows: a block's scores against the keys up to its last row (the causal mask skips the rest)
/// come from the packed GEMM, the softmax is taken in place, and the block's output is one more
/// GEMM. Only the log-sum-exp of each row is kept for backward, which recomputes the
/// probabilities block by block (as flash attention does): memory for backward grows as T per
/// head, the scratch as block x T once.
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

namespace xtrain::kernels {

/// Query rows per block of causal attention over T positions. A block's products run over the
/// keys up to its last row, so smaller blocks skip more of the masked triangle (at T = 64, blocks
/// of 32 compute 3/4 of the full product, one block all of it) but repack the keys once per
/// block: 32 rows up to T = 256, 64 beyond (benchmarks/RESULTS.md, "... attention blocks of 32").
constexpr std::size_t attention_block(std::size_t positions) noexcept { return positions <= 256 ? 32 : 64; }

/// Floats of scratch causal_attention_forward needs for T positions (backward: twice this).
constexpr std::size_t attention_scratch(std::size_t positions) noexcept {
  return std::min(positions, attention_block(positions)) * positions;
}

namespace detail {
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
    alignas(64) float lanes[w];
    acc.store_aligned(lanes);
    m = *std::max_element(lanes, lanes + w);
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

/// sum of a[i] b[i] for i < n, a widened from S (fp32 lanes, the lanes summed, then the tail).
template <class S, class Arch = simd::default_arch>
float row_dot(const S* a, const float* b, std::size_t n) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t w = B::size, chunk = 64;
  alignas(64) float wide[chunk];
  B acc(0.0f);
  float tail = 0.0f;
  for (std::size_t c0 = 0; c0 < n; c0 += chunk) {
    const std::size_t m = std::min(chunk, n - c0);
    const float* x = wide;
    if constexpr (std::is_same_v<S, float>)
      x = a + c0;
    else
      to_float(a + c0, wide, m);
    std::size_t i = 0;
    for (; i + w <= m; i += w) acc = xsimd::fma(B::load_unaligned(x + i), B::load_unaligned(b + c0 + i), acc);
    for (; i < m; ++i) tail += x[i] * b[c0 + i];
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
}  // namespace detail

/// out[i] = sum over j <= i of softmax_j(scale * q_i . k_j) v_j for i < T, and lse[i] the
/// log-sum-exp of row i's scaled scores (what backward needs). q, k, v: T rows of d floats at
/// stride `ld` (the fused QKV projection's row); out: T rows at stride `ldo`. `scratch`: at least
/// attention_scratch(T) floats. S: float, or bf16 (products in bf16, see the file's comment). The
/// GEMMs pack in the calling thread's workspace of `executor`.
template <class S>
void causal_attention_forward(std::size_t T, std::size_t d, float scale, const S* q, const S* k, const S* v,
                              std::size_t ld, float* out, std::size_t ldo, float* lse, float* scratch,
                              backend::Executor* executor = nullptr) {
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
/// d floats at stride `ldg` each (the columns between them untouched). `out` and `lse` are forward's,
/// `dout` the gradient of out (stride ldo). `scratch`: at least 2 * attention_scratch(T) floats.
/// The probabilities are recomputed from q, k and lse. S: as forward's (dout stored as S too). The
/// GEMMs pack in the calling thread's workspace of `executor`.
template <class S>
void causal_attention_backward(std::size_t T, std::size_t d, float scale, const S* q, const S* k, const S* v,
                               std::size_t ld, const float* out, const S* dout, std::size_t ldo, const float* lse,
                               float* dq, float* dk, float* dv, std::size_t ldg, float* scratch,
                               backend::Executor* executor = nullptr) {
  float* p = scratch;
  float* dp = scratch + attention_scratch(T);
  const std::size_t block = attention_block(T);
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

/// Layer normalisation of `rows` rows of n floats: y = (x - mean) * rstd * w + b (w, b may be
/// null: no affine), saving mean and rstd = 1 / sqrt(var + eps) per row (biased variance).
inline void layer_norm_forward(const float* x, std::size_t rows, std::size_t n, float eps, const float* w,
                               const float* b, float* y, float* mean, float* rstd) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    const float m = static_cast<float>(plane_sum(xr, n) / static_cast<double>(n));
    const float var = static_cast<float>(plane_sq_dev(xr, n, m) / static_cast<double>(n));
    const float s = 1.0f / std::sqrt(var + eps);
    if (w != nullptr)
      for (std::size_t j = 0; j < n; ++j) yr[j] = (xr[j] - m) * s * w[j] + b[j];
    else
      for (std::size_t j = 0; j < n; ++j) yr[j] = (xr[j] - m) * s;
    mean[r] = m;
    rstd[r] = s;
  }
}

namespace detail {
/// One row of layer_norm_backward (w, dw, db used when Affine). The sums run in 16 fp32 lanes
/// (vectorised), added in order. dx may be dy (in place).
template <bool Affine>
void layer_norm_backward_row(const float* x, const float* dy, std::size_t n, const float* w, float m, float s,
                             float* dx, float* __restrict dw, float* __restrict db) noexcept {
  float lanes_g[16] = {}, lanes_gx[16] = {};
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (std::size_t j = 0; j < 16; ++j) {
      const float xhat = (x[i + j] - m) * s;
      const float g = Affine ? dy[i + j] * w[i + j] : dy[i + j];
      lanes_g[j] += g;
      lanes_gx[j] += g * xhat;
      if constexpr (Affine) {
        dw[i + j] += dy[i + j] * xhat;
        db[i + j] += dy[i + j];
      }
    }
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (std::size_t j = 0; j < 16; ++j) {
    sum_g += lanes_g[j];
    sum_gx += lanes_gx[j];
  }
  for (; i < n; ++i) {
    const float xhat = (x[i] - m) * s;
    const float g = Affine ? dy[i] * w[i] : dy[i];
    sum_g += g;
    sum_gx += g * xhat;
    if constexpr (Affine) {
      dw[i] += dy[i] * xhat;
      db[i] += dy[i];
    }
  }
  const float inv_n = 1.0f / static_cast<float>(n);
  const float mg = sum_g * inv_n, mgx = sum_gx * inv_n;
  for (std::size_t j = 0; j < n; ++j) {
    const float xhat = (x[j] - m) * s;
    const float g = Affine ? dy[j] * w[j] : dy[j];
    dx[j] = s * (g - mg - xhat * mgx);
  }
}
}  // namespace detail

/// Backward of layer_norm_forward: dx written; dw, db ADDED into (when w is not null).
/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w, xhat = (x - mean) * rstd.
inline void layer_norm_backward(const float* x, const float* dy, std::size_t rows, std::size_t n, const float* w,
                                const float* mean, const float* rstd, float* dx, float* dw, float* db) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    if (w != nullptr)
      detail::layer_norm_backward_row<true>(x + r * n, dy + r * n, n, w, mean[r], rstd[r], dx + r * n, dw, db);
    else
      detail::layer_norm_backward_row<false>(x + r * n, dy + r * n, n, w, mean[r], rstd[r], dx + r * n, dw, db);
  }
}

}  // namespace xtrain::kernels
