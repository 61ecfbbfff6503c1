#pragma once
/// \file attention.hpp
/// Causal scaled dot-product attention of one (sample, head), and layer normalisation of rows, in
/// fp32. Attention runs in blocks of `attention_block` query rows: a block's scores against the
/// keys up to its last row (the causal mask skips the rest) come from the packed GEMM, the softmax
/// is taken in place, and the block's output is one more GEMM. Only the log-sum-exp of each row
/// is kept for backward, which recomputes the probabilities block by block (as flash attention
/// does): memory for backward grows as T per head, the scratch as block x T once.
/// Scalar twin: kernels/reference/attention.hpp.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "xtrain/kernels/elementwise.hpp"
#include "xtrain/kernels/gemm.hpp"
#include "xtrain/kernels/simd.hpp"

namespace xtrain::kernels {

/// Query rows per block of causal attention.
inline constexpr std::size_t attention_block = 64;

/// Floats of scratch causal_attention_forward needs for T positions (backward: twice this).
constexpr std::size_t attention_scratch(std::size_t positions) noexcept {
  return std::min(positions, attention_block) * positions;
}

namespace detail {
/// x[i] = exp(x[i] - shift) for i < n; returns their sum (fp32 lanes, then the lanes in order).
template <class Arch = simd::default_arch>
float exp_shifted(float* x, std::size_t n, float shift) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t w = B::size;
  B acc(0.0f);
  const B s(shift);
  std::size_t i = 0;
  for (; i + w <= n; i += w) {
    const B e = ops::exp_clamped(B::load_unaligned(x + i) - s);
    e.store_unaligned(x + i);
    acc += e;
  }
  float sum = simd::horizontal_sum(acc);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}
/// x[i] = exp(x[i] - shift) for i < n.
template <class Arch = simd::default_arch>
void exp_shifted_only(float* x, std::size_t n, float shift) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t w = B::size;
  const B s(shift);
  std::size_t i = 0;
  for (; i + w <= n; i += w) ops::exp_clamped(B::load_unaligned(x + i) - s).store_unaligned(x + i);
  for (; i < n; ++i) x[i] = std::exp(x[i] - shift);
}
}  // namespace detail

/// out[i] = sum over j <= i of softmax_j(scale * q_i . k_j) v_j for i < T, and lse[i] the
/// log-sum-exp of row i's scaled scores (what backward needs). q, k, v: T rows of d floats at
/// stride `ld` (the fused QKV projection's row); out: T rows at stride `ldo`. `scratch`: at least
/// attention_scratch(T) floats. The GEMMs pack in the calling thread's workspace of `executor`.
inline void causal_attention_forward(std::size_t T, std::size_t d, float scale, const float* q, const float* k,
                                     const float* v, std::size_t ld, float* out, std::size_t ldo, float* lse,
                                     float* scratch, backend::Executor* executor = nullptr) {
  for (std::size_t i0 = 0; i0 < T; i0 += attention_block) {
    const std::size_t i1 = std::min(T, i0 + attention_block), rows = i1 - i0, keys = i1;
    float* s = scratch;
    gemm(Trans::no, Trans::yes, rows, keys, d, scale, q + i0 * ld, ld, k, ld, 0.0f, s, keys, executor);
    for (std::size_t r = 0; r < rows; ++r) {
      float* row = s + r * keys;
      const std::size_t n = i0 + r + 1;  // keys 0..i
      const float m = *std::max_element(row, row + n);
      const float sum = detail::exp_shifted(row, n, m);
      const float inv = 1.0f / sum;
      for (std::size_t j = 0; j < n; ++j) row[j] *= inv;
      std::fill(row + n, row + keys, 0.0f);
      lse[i0 + r] = m + std::log(sum);
    }
    gemm(Trans::no, Trans::no, rows, d, keys, 1.0f, s, keys, v, ld, 0.0f, out + i0 * ldo, ldo, executor);
  }
}

/// Backward of causal_attention_forward: dq = d(loss)/dq (written), dk and dv ADDED into (the
/// caller zeroes them), all T rows of d floats at stride `ldg`. `out` and `lse` are forward's,
/// `dout` the gradient of out (stride ldo). `scratch`: at least 2 * attention_scratch(T) floats.
/// The probabilities are recomputed from q, k and lse. The GEMMs pack in the calling thread's
/// workspace of `executor`.
inline void causal_attention_backward(std::size_t T, std::size_t d, float scale, const float* q, const float* k,
                                      const float* v, std::size_t ld, const float* out, const float* dout,
                                      std::size_t ldo, const float* lse, float* dq, float* dk, float* dv,
                                      std::size_t ldg, float* scratch, backend::Executor* executor = nullptr) {
  float* p = scratch;
  float* dp = scratch + attention_scratch(T);
  for (std::size_t i0 = 0; i0 < T; i0 += attention_block) {
    const std::size_t i1 = std::min(T, i0 + attention_block), rows = i1 - i0, keys = i1;
    gemm(Trans::no, Trans::yes, rows, keys, d, scale, q + i0 * ld, ld, k, ld, 0.0f, p, keys, executor);
    gemm(Trans::no, Trans::yes, rows, keys, d, 1.0f, dout + i0 * ldo, ldo, v, ld, 0.0f, dp, keys, executor);
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t i = i0 + r, n = i + 1;
      float* prow = p + r * keys;
      float* dprow = dp + r * keys;
      detail::exp_shifted_only(prow, n, lse[i]);
      std::fill(prow + n, prow + keys, 0.0f);
      // D_i = sum_j P_ij dP_ij = dout_i . out_i
      float dsum = 0.0f;
      for (std::size_t c = 0; c < d; ++c) dsum += dout[i * ldo + c] * out[i * ldo + c];
      for (std::size_t j = 0; j < n; ++j) dprow[j] = prow[j] * (dprow[j] - dsum) * scale;
      std::fill(dprow + n, dprow + keys, 0.0f);
    }
    // dv[0:i1] += P^T dout_blk; dq_blk = dS k[0:i1]; dk[0:i1] += dS^T q_blk
    gemm(Trans::yes, Trans::no, keys, d, rows, 1.0f, p, keys, dout + i0 * ldo, ldo, 1.0f, dv, ldg, executor);
    gemm(Trans::no, Trans::no, rows, d, keys, 1.0f, dp, keys, k, ld, 0.0f, dq + i0 * ldg, ldg, executor);
    gemm(Trans::yes, Trans::no, keys, d, rows, 1.0f, dp, keys, q + i0 * ld, ld, 1.0f, dk, ldg, executor);
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

/// Backward of layer_norm_forward: dx written; dw, db ADDED into (when w is not null).
/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w, xhat = (x - mean) * rstd.
inline void layer_norm_backward(const float* x, const float* dy, std::size_t rows, std::size_t n, const float* w,
                                const float* mean, const float* rstd, float* dx, float* dw, float* db) noexcept {
  const float inv_n = 1.0f / static_cast<float>(n);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    const float* dyr = dy + r * n;
    float* dxr = dx + r * n;
    const float m = mean[r], s = rstd[r];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (std::size_t j = 0; j < n; ++j) {
      const float xhat = (xr[j] - m) * s;
      const float g = w != nullptr ? dyr[j] * w[j] : dyr[j];
      sum_g += g;
      sum_gx += g * xhat;
      if (w != nullptr) {
        dw[j] += dyr[j] * xhat;
        db[j] += dyr[j];
      }
    }
    const float mg = sum_g * inv_n, mgx = sum_gx * inv_n;
    for (std::size_t j = 0; j < n; ++j) {
      const float xhat = (xr[j] - m) * s;
      const float g = w != nullptr ? dyr[j] * w[j] : dyr[j];
      dxr[j] = s * (g - mg - xhat * mgx);
    }
  }
}

}  // namespace xtrain::kernels
