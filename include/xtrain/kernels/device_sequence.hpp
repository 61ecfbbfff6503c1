#pragma once
/// \file device_sequence.hpp
/// The CUDA backend's kernel bodies over rows of tokens (kernels/device_ops.hpp says what a body
/// is): LayerNorm's forward and gradients, and causal self-attention's core with its backward.

#include <cmath>
#include <cstddef>

#include "xtrain/kernels/device_ops.hpp"

namespace xtrain::kernels::device {

/// LayerNorm over rows of n values (one thread per row), as kernels::layer_norm_forward: the
/// mean, then rstd = 1 / sqrt(biased variance + eps) from a second pass, both saved;
/// y = (x - mean) * rstd * w + b (w null: no affine).
struct LayerNormForward {
  const float* x;
  const float *w, *b;
  float* y;
  float *mean, *rstd;
  std::size_t rows, n;
  float eps;
  XTRAIN_HD std::size_t count() const { return rows; }
  XTRAIN_HD void operator()(std::size_t r) const {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    const float inv_n = 1.0f / static_cast<float>(n);
    float sum = 0.0f;
    for (std::size_t j = 0; j < n; ++j) sum += xr[j];
    const float m = sum * inv_n;
    float q = 0.0f;
    for (std::size_t j = 0; j < n; ++j) {
      const float d = xr[j] - m;
      q = std::fma(d, d, q);
    }
    const float s = 1.0f / std::sqrt(q * inv_n + eps);
    for (std::size_t j = 0; j < n; ++j) {
      const float t = (xr[j] - m) * s;
      yr[j] = w ? std::fma(t, w[j], b[j]) : t;
    }
    mean[r] = m;
    rstd[r] = s;
  }
};

/// LayerNorm's input gradient (one thread per row), as kernels::layer_norm_backward: with
/// g = dy * w (dy without affine) and xhat = (x - mean) * rstd,
/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
struct LayerNormInputGrad {
  const float *x, *dy, *w, *mean, *rstd;
  float* dx;
  std::size_t rows, n;
  XTRAIN_HD std::size_t count() const { return rows; }
  XTRAIN_HD void operator()(std::size_t r) const {
    const float *xr = x + r * n, *dr = dy + r * n;
    const float m = mean[r], s = rstd[r], inv_n = 1.0f / static_cast<float>(n);
    float sg = 0.0f, sgx = 0.0f;
    for (std::size_t j = 0; j < n; ++j) {
      const float g = w ? dr[j] * w[j] : dr[j];
      sg += g;
      sgx = std::fma(g, (xr[j] - m) * s, sgx);
    }
    const float mg = sg * inv_n, mgx = sgx * inv_n;
    for (std::size_t j = 0; j < n; ++j) {
      const float g = w ? dr[j] * w[j] : dr[j];
      dx[r * n + j] = s * (g - mg - (xr[j] - m) * s * mgx);
    }
  }
};

/// LayerNorm's weight and bias gradients (one thread per column, the rows in order, as the CPU
/// kernel adds them): dw[j] += sum over rows of dy * xhat, db[j] += sum of dy.
struct LayerNormParamGrad {
  const float *x, *dy, *mean, *rstd;
  float *dw, *db;
  std::size_t rows, n;
  XTRAIN_HD std::size_t count() const { return n; }
  XTRAIN_HD void operator()(std::size_t j) const {
    float a = dw[j], c = db[j];
    for (std::size_t r = 0; r < rows; ++r) {
      const float d = dy[r * n + j];
      a = std::fma(d, (x[r * n + j] - mean[r]) * rstd[r], a);
      c = d + c;
    }
    dw[j] = a;
    db[j] = c;
  }
};

/// Causal self-attention's core (layers::CausalSelfAttention between its two projections), one
/// thread per (sequence b, head h, query position i) in the order t = (b * heads + h) * positions
/// + i. qkv [batch * positions, 3C] holds q, k, v at columns 0, C, 2C (head h at h * d); out
/// [batch * positions, C]. With s_j = scale q_i . k_j over the keys j <= i: out_i = sum_j
/// softmax(s)_j v_j, in three passes over the keys (the maximum, then the sum of exponentials and
/// the weighted values; nothing of T x T stored), and lse[t] = max + log(sum) kept for backward.
struct CausalAttentionForward {
  const float* qkv;
  float* out;
  float* lse;
  std::size_t batch, positions, heads, d;
  float scale;
  XTRAIN_HD std::size_t count() const { return batch * heads * positions; }
  XTRAIN_HD float score(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const {
    const std::size_t c = heads * d, ld = 3 * c;
    const float *q = qkv + (b * positions + i) * ld + h * d, *k = qkv + (b * positions + j) * ld + c + h * d;
    float s = 0.0f;
    for (std::size_t e = 0; e < d; ++e) s = std::fma(q[e], k[e], s);
    return s * scale;
  }
  XTRAIN_HD void operator()(std::size_t t) const {
    const std::size_t i = t % positions, h = t / positions % heads, b = t / positions / heads;
    const std::size_t c = heads * d, ld = 3 * c;
    float m = score(b, h, i, 0);
    for (std::size_t j = 1; j <= i; ++j) m = std::fmax(m, score(b, h, i, j));
    float* o = out + (b * positions + i) * c + h * d;
    for (std::size_t e = 0; e < d; ++e) o[e] = 0.0f;
    float l = 0.0f;
    for (std::size_t j = 0; j <= i; ++j) {
      const float p = std::exp(score(b, h, i, j) - m);
      const float* v = qkv + (b * positions + j) * ld + 2 * c + h * d;
      l += p;
      for (std::size_t e = 0; e < d; ++e) o[e] = std::fma(p, v[e], o[e]);
    }
    const float inv = 1.0f / l;
    for (std::size_t e = 0; e < d; ++e) o[e] *= inv;
    lse[t] = m + std::log(l);
  }
};

/// Backward of CausalAttentionForward: `dout` [batch * positions, C] is the gradient of `out`,
/// `dqkv` [batch * positions, 3C] receives the gradients of q, k and v (written, not added).
/// Three bodies, each thread writing rows of its own (no atomics): the row sums
/// rowdot[t] = dout_i . out_i per (b, h, i); then with P_ij = exp(s_ij - lse_i) and
/// dS_ij = P_ij (dout_i . v_j - rowdot_i), per query dq_i = scale sum_{j <= i} dS_ij k_j, and per
/// key dk_j = scale sum_{i >= j} dS_ij q_i, dv_j = sum_{i >= j} P_ij dout_i.
struct AttentionRowDot {
  const float *dout, *out;
  float* rowdot;
  std::size_t batch, positions, heads, d;
  XTRAIN_HD std::size_t count() const { return batch * heads * positions; }
  XTRAIN_HD void operator()(std::size_t t) const {
    const std::size_t i = t % positions, h = t / positions % heads, b = t / positions / heads;
    const std::size_t row = (b * positions + i) * heads * d + h * d;
    float s = 0.0f;
    for (std::size_t e = 0; e < d; ++e) s = std::fma(dout[row + e], out[row + e], s);
    rowdot[t] = s;
  }
};

/// dS_ij and P_ij of the attention's backward (see AttentionRowDot), from the saved lse and
/// rowdot; and where the bodies below find their rows.
struct AttentionGradTerms {
  const float *qkv, *dout, *lse, *rowdot;
  std::size_t batch, positions, heads, d;
  float scale;
  XTRAIN_HD std::size_t count() const { return batch * heads * positions; }
  /// Thread t's sequence, head and position (t = (b * heads + h) * positions + r).
  XTRAIN_HD void split(std::size_t t, std::size_t& b, std::size_t& h, std::size_t& r) const {
    r = t % positions;
    h = t / positions % heads;
    b = t / positions / heads;
  }
  /// Where head h of position r of sequence b starts in a [*, 3C] matrix (qkv, dqkv) at block
  /// `part` (0: q, 1: k, 2: v).
  XTRAIN_HD std::size_t at(std::size_t b, std::size_t r, std::size_t part, std::size_t h) const {
    return (b * positions + r) * 3 * heads * d + part * heads * d + h * d;
  }
  // {P_ij, dS_ij} for sequence b, head h, query i, key j.
  XTRAIN_HD void terms(std::size_t b, std::size_t h, std::size_t i, std::size_t j, float& p, float& ds) const {
    const std::size_t t = (b * heads + h) * positions + i;
    const float *q = qkv + at(b, i, 0, h), *k = qkv + at(b, j, 1, h), *v = qkv + at(b, j, 2, h),
                *g = dout + (b * positions + i) * heads * d + h * d;
    float s = 0.0f, dp = 0.0f;
    for (std::size_t e = 0; e < d; ++e) {
      s = std::fma(q[e], k[e], s);
      dp = std::fma(g[e], v[e], dp);
    }
    p = std::exp(s * scale - lse[t]);
    ds = p * (dp - rowdot[t]);
  }
};

/// dq_i = scale sum_{j <= i} dS_ij k_j, one thread per (b, h, query i).
struct AttentionQueryGrad {
  AttentionGradTerms g;
  float* dqkv;
  XTRAIN_HD std::size_t count() const { return g.count(); }
  XTRAIN_HD void operator()(std::size_t t) const {
    std::size_t b, h, i;
    g.split(t, b, h, i);
    float* dq = dqkv + g.at(b, i, 0, h);
    for (std::size_t e = 0; e < g.d; ++e) dq[e] = 0.0f;
    for (std::size_t j = 0; j <= i; ++j) {
      float p, ds;
      g.terms(b, h, i, j, p, ds);
      const float* k = g.qkv + g.at(b, j, 1, h);
      for (std::size_t e = 0; e < g.d; ++e) dq[e] = std::fma(ds, k[e], dq[e]);
    }
    for (std::size_t e = 0; e < g.d; ++e) dq[e] *= g.scale;
  }
};

/// dk_j = scale sum_{i >= j} dS_ij q_i and dv_j = sum_{i >= j} P_ij dout_i, one thread per
/// (b, h, key j), the queries in order.
struct AttentionKeyValueGrad {
  AttentionGradTerms g;
  float* dqkv;
  XTRAIN_HD std::size_t count() const { return g.count(); }
  XTRAIN_HD void operator()(std::size_t t) const {
    std::size_t b, h, j;
    g.split(t, b, h, j);
    float *dk = dqkv + g.at(b, j, 1, h), *dv = dqkv + g.at(b, j, 2, h);
    for (std::size_t e = 0; e < g.d; ++e) dk[e] = dv[e] = 0.0f;
    for (std::size_t i = j; i < g.positions; ++i) {
      float p, ds;
      g.terms(b, h, i, j, p, ds);
      const float *q = g.qkv + g.at(b, i, 0, h), *go = g.dout + (b * g.positions + i) * g.heads * g.d + h * g.d;
      for (std::size_t e = 0; e < g.d; ++e) {
        dk[e] = std::fma(ds, q[e], dk[e]);
        dv[e] = std::fma(p, go[e], dv[e]);
      }
    }
    for (std::size_t e = 0; e < g.d; ++e) dk[e] *= g.scale;
  }
};

}  // namespace xtrain::kernels::device
