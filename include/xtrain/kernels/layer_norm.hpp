#pragma once
/// \file layer_norm.hpp
/// Layer normalisation of rows: y = (x - mean) * rstd * w + b per row of n values, with
/// rstd = 1 / sqrt(var + eps) (biased variance), and its backward. Statistics and sums in fp32
/// registers: each row's sums run in the register's lanes and are reduced once (the rows of a
/// transformer are 64-1024 wide: a chain of scalar additions per row would cost more than the
/// row's arithmetic). Rows are stored as fp32, or as bf16/fp16 widened as they are loaded and
/// rounded (nearest even, as from_float) as they are stored, where a register holds 16 floats
/// (layer_norm_direct); the same arithmetic runs on the same widened values, so a 16-bit row
/// gives fp32's result on its values, rounded once. Elsewhere 16-bit rows are widened into a
/// buffer by the caller (layers/layer_norm.hpp).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "xtrain/core/precision.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/elementwise.hpp"
#include "xtrain/kernels/simd.hpp"

namespace xtrain::kernels {

namespace detail::ln {
/// Rows of S read and written as fp32 registers of Arch: whole registers, or the first r < lanes
/// values (the rest read as 0).
template <class Arch, class S>
struct Rows {
  using B = simd::batch<float, Arch>;
  static constexpr std::size_t w = B::size;
  static B load(const S* p) noexcept {
    if constexpr (std::is_same_v<S, float>) {
      return B::load_unaligned(p);
    } else {
#if defined(__AVX512F__)
      return load16<B>(p);
#else
      static_assert(std::is_same_v<S, float>, "16-bit rows need 16-lane registers (layer_norm_direct)");
#endif
    }
  }
  static B load(const S* p, std::size_t r) noexcept {
    alignas(64) S tmp[w] = {};
    std::copy(p, p + r, tmp);
    return load(tmp);
  }
  static void store(S* p, const B& v) noexcept {
    if constexpr (std::is_same_v<S, float>) {
      v.store_unaligned(p);
    } else {
#if defined(__AVX512F__)
      if constexpr (std::is_same_v<S, bf16>)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), round_bf16(static_cast<__m512>(v)));
      else
        store16(p, v);
#endif
    }
  }
  static void store(S* p, const B& v, std::size_t r) noexcept {
    alignas(64) S tmp[w];
    store(tmp, v);
    std::copy(tmp, tmp + r, p);
  }
  /// Lanes [0, r) true.
  static auto first(std::size_t r) noexcept {
    alignas(64) float index[w];
    for (std::size_t j = 0; j < w; ++j) index[j] = static_cast<float>(j);
    return B::load_aligned(index) < B(static_cast<float>(r));
  }
};
}  // namespace detail::ln

/// Whether rows of S are normalised where they lie (fp32 always; bf16/fp16 with 16-lane registers).
template <class S, class Arch = simd::default_arch>
inline constexpr bool layer_norm_direct = std::is_same_v<S, float> || detail::fused_lowp<Arch>;

/// Normalises `rows` rows of n values (row r at x + r * n): y = (x - mean) * rstd * w + b (w, b
/// null: no affine), saving mean and rstd per row. y may be x.
template <class S, class Arch = simd::default_arch>
requires layer_norm_direct<S, Arch>
void layer_norm_forward(const S* x, std::size_t rows, std::size_t n, float eps, const float* w, const float* b, S* y,
                        float* mean, float* rstd) noexcept {
  using R = detail::ln::Rows<Arch, S>;
  using B = typename R::B;
  constexpr std::size_t lanes = R::w;
  const std::size_t full = n / lanes * lanes, tail = n - full;
  const auto valid = R::first(tail);
  const float inv_n = 1.0f / static_cast<float>(n);
  for (std::size_t r = 0; r < rows; ++r) {
    const S* xr = x + r * n;
    S* yr = y + r * n;
    // Two chains of additions per pass; the tail's missing values read as 0.
    B s0(0.0f), s1(0.0f);
    std::size_t i = 0;
    for (; i + 2 * lanes <= full; i += 2 * lanes) {
      s0 += R::load(xr + i);
      s1 += R::load(xr + i + lanes);
    }
    if (i < full) s0 += R::load(xr + i);
    if (tail) s1 += R::load(xr + full, tail);
    const float m = simd::horizontal_sum(s0 + s1) * inv_n;
    const B vm(m);
    B q0(0.0f), q1(0.0f);
    for (i = 0; i + 2 * lanes <= full; i += 2 * lanes) {
      const B d0 = R::load(xr + i) - vm, d1 = R::load(xr + i + lanes) - vm;
      q0 = xsimd::fma(d0, d0, q0);
      q1 = xsimd::fma(d1, d1, q1);
    }
    if (i < full) {
      const B d = R::load(xr + i) - vm;
      q0 = xsimd::fma(d, d, q0);
    }
    if (tail) {
      const B d = xsimd::select(valid, R::load(xr + full, tail) - vm, B(0.0f));
      q1 = xsimd::fma(d, d, q1);
    }
    const float s = 1.0f / std::sqrt(simd::horizontal_sum(q0 + q1) * inv_n + eps);
    const B vs(s);
    auto normalised = [&](std::size_t j, const B& v) {
      const B t = (v - vm) * vs;
      return w != nullptr ? xsimd::fma(t, B::load_unaligned(w + j), B::load_unaligned(b + j)) : t;
    };
    for (i = 0; i < full; i += lanes) R::store(yr + i, normalised(i, R::load(xr + i)));
    if (tail) {
      alignas(64) float wt[lanes] = {}, bt[lanes] = {};
      const B v = R::load(xr + full, tail), t = (v - vm) * vs;
      if (w != nullptr) {
        std::copy(w + full, w + n, wt);
        std::copy(b + full, b + n, bt);
      }
      R::store(yr + full, w != nullptr ? xsimd::fma(t, B::load_aligned(wt), B::load_aligned(bt)) : t, tail);
    }
    mean[r] = m;
    rstd[r] = s;
  }
}

namespace detail::ln {
/// One row of layer_norm_backward (w, dw, db used when Affine). dx may be dy.
template <bool Affine, class S, class Arch>
void backward_row(const S* x, const S* dy, std::size_t n, const float* w, float m, float s, S* dx, float* __restrict dw,
                  float* __restrict db) noexcept {
  using R = Rows<Arch, S>;
  using B = typename R::B;
  constexpr std::size_t lanes = R::w;
  const std::size_t full = n / lanes * lanes, tail = n - full;
  const B vm(m), vs(s);
  // g = dy * w; sums of g and g * xhat; dw += dy * xhat, db += dy. A tail's missing values read
  // as 0, so its g is 0, and its x-hat is taken as 0 (a huge mean could make it infinite).
  B sg(0.0f), sgx(0.0f);
  auto sums = [&](const B& xhat, const B& dv, const B& wv, B& dwv, B& dbv) {
    const B g = Affine ? dv * wv : dv;
    if constexpr (Affine) {
      dwv = xsimd::fma(dv, xhat, dwv);
      dbv = dv + dbv;
    }
    sg += g;
    sgx = xsimd::fma(g, xhat, sgx);
  };
  for (std::size_t i = 0; i < full; i += lanes) {
    B dwv(0.0f), dbv(0.0f);
    if constexpr (Affine) {
      dwv = B::load_unaligned(dw + i);
      dbv = B::load_unaligned(db + i);
    }
    sums((R::load(x + i) - vm) * vs, R::load(dy + i), Affine ? B::load_unaligned(w + i) : B(1.0f), dwv, dbv);
    if constexpr (Affine) {
      dwv.store_unaligned(dw + i);
      dbv.store_unaligned(db + i);
    }
  }
  alignas(64) float wt[lanes] = {}, dwt[lanes] = {}, dbt[lanes] = {};
  if (tail) {
    if constexpr (Affine) {
      std::copy(w + full, w + n, wt);
      std::copy(dw + full, dw + n, dwt);
      std::copy(db + full, db + n, dbt);
    }
    B dwv = B::load_aligned(dwt), dbv = B::load_aligned(dbt);
    const B xhat = xsimd::select(R::first(tail), (R::load(x + full, tail) - vm) * vs, B(0.0f));
    sums(xhat, R::load(dy + full, tail), B::load_aligned(wt), dwv, dbv);
    if constexpr (Affine) {
      dwv.store_aligned(dwt);
      dbv.store_aligned(dbt);
      std::copy(dwt, dwt + tail, dw + full);
      std::copy(dbt, dbt + tail, db + full);
    }
  }
  const float inv_n = 1.0f / static_cast<float>(n);
  const B mg(simd::horizontal_sum(sg) * inv_n), mgx(simd::horizontal_sum(sgx) * inv_n);
  // dx = s * (g - mean(g) - xhat * mean(g * xhat))
  auto dx_of = [&](const B& xv, const B& dv, const B& wv) {
    const B xhat = (xv - vm) * vs;
    const B g = Affine ? dv * wv : dv;
    return vs * (g - mg - xhat * mgx);
  };
  for (std::size_t i = 0; i < full; i += lanes)
    R::store(dx + i, dx_of(R::load(x + i), R::load(dy + i), Affine ? B::load_unaligned(w + i) : B(1.0f)));
  if (tail) R::store(dx + full, dx_of(R::load(x + full, tail), R::load(dy + full, tail), B::load_aligned(wt)), tail);
}
}  // namespace detail::ln

/// Backward of layer_norm_forward: dx written (dx may be dy); dw, db ADDED into, rows in order
/// (when w is not null).
template <class S, class Arch = simd::default_arch>
requires layer_norm_direct<S, Arch>
void layer_norm_backward(const S* x, const S* dy, std::size_t rows, std::size_t n, const float* w, const float* mean,
                         const float* rstd, S* dx, float* dw, float* db) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    if (w != nullptr)
      detail::ln::backward_row<true, S, Arch>(x + r * n, dy + r * n, n, w, mean[r], rstd[r], dx + r * n, dw, db);
    else
      detail::ln::backward_row<false, S, Arch>(x + r * n, dy + r * n, n, w, mean[r], rstd[r], dx + r * n, dw, db);
  }
}

}  // namespace xtrain::kernels
