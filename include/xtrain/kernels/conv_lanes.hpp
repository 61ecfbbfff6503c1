#pragma once
/// \file conv_lanes.hpp
/// Direct convolution (stride 1, dilation 1, 3 x 3 or 5 x 5 kernels) of a group of images at
/// once, one image per SIMD lane: the planes are transposed to [channel][row][column][image], so
/// that every multiply-add of a register serves the same (output, tap) of L images (16 with
/// AVX-512) and none is idle, whatever the channel counts and plane sizes. The other direct
/// kernels (conv_direct.hpp) vectorise over an image's positions or output channels and lose
/// lanes where those are few or not a multiple of L.
///
/// Layouts (L = lanes, "framed": zeros around a plane, as wide as the padding):
///  - x: [c][H + 2 ph][W + 2 pw][L] (frame_input, Frame of the layer's window g);
///  - dy: [o][OH + 2 (KH - 1 - ph)][OW + 2 (KW - 1 - pw)][L] (frame_input, Frame of
///    input_grad_window(g)): the input gradient is then the forward correlation of dy with the
///    flipped kernel, and the weight gradient reads dy's real rows; [o][OH][OW][L]
///    (unframed_output(g)) where only the weight gradient reads it;
///  - y: [o][OH][OW][L] and dx: [c][H][W][L], unframed, transposed back by unframe.
/// Every output is one sum in a fixed order (channels, then kernel rows, then columns; lanes in
/// order for the weight gradient), the same on any number of threads. Scalar twin:
/// kernels/reference/conv.hpp. The bf16-product kernels (AVX512_BF16): conv_lanes_bf16.hpp.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "xtrain/kernels/conv.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/simd.hpp"
#include "xtrain/kernels/transpose.hpp"

namespace xtrain::kernels::lanes {

/// Whether these kernels compute windows of this shape: stride 1, dilation 1, a 3 x 3 or 5 x 5
/// kernel and padding below the kernel (the input gradient is a correlation of dy padded by
/// kernel - 1 - padding).
inline bool supports(const Window& g) noexcept {
  return g.stride == Size2{1} && g.dilation == Size2{1} && (g.kernel == Size2{3} || g.kernel == Size2{5}) &&
         g.padding.h < g.kernel.h && g.padding.w < g.kernel.w;
}

/// The window whose correlation of the output gradient (OH x OW, padded by kernel - 1 - padding)
/// with the flipped kernel is the input gradient (H x W), for a window `supports` accepts.
inline Window input_grad_window(const Window& g) noexcept {
  Window d{g.kernel, Size2{1}, Size2{g.kernel.h - 1 - g.padding.h, g.kernel.w - 1 - g.padding.w}, Size2{1}};
  d.set_input(g.oh, g.ow);
  return d;
}

/// Sizes of a window's transposed planes for L lanes.
struct Frame {
  std::size_t hf = 0, wf = 0;     ///< framed input plane: H + 2 ph rows of W + 2 pw columns
  std::size_t in_plane = 0;       ///< floats per framed input plane (hf * wf * L)
  std::size_t out_plane = 0;      ///< floats per output plane (OH * OW * L)
  std::size_t top = 0, left = 0;  ///< the padding: where the real input starts

  Frame(const Window& g, std::size_t lanes) noexcept
      : hf(g.h + 2 * g.padding.h),
        wf(g.w + 2 * g.padding.w),
        in_plane(hf * wf * lanes),
        out_plane(g.oh * g.ow * lanes),
        top(g.padding.h),
        left(g.padding.w) {}
};

/// The window of g's output plane without a frame (the output gradient as the weight gradient
/// alone reads it: its real rows), for frame_input and a Frame.
inline Window unframed_output(const Window& g) noexcept {
  Window d{g.kernel, Size2{1}, Size2{0}, Size2{1}};
  d.h = d.oh = g.oh;
  d.w = d.ow = g.ow;
  return d;
}

namespace detail {

// out[j * L + lane] = in[lane * image + j] for j < n and the first `count` lanes (images), zero in
// the others; widened to fp32. `in` holds `count` images `image` values apart.
template <class T>
inline void to_lanes(const T* in, std::size_t image, std::size_t count, std::size_t n, float* out,
                     std::size_t lanes) noexcept {
  transpose_convert(in, count, n, image, out, lanes);
  if (count < lanes)
    for (std::size_t j = 0; j < n; ++j) std::fill(out + j * lanes + count, out + (j + 1) * lanes, 0.0f);
}

}  // namespace detail

/// x's planes of `count` <= L images (`image` values apart, `channels` planes of g.h x g.w each)
/// into the framed lane layout [c][hf][wf][L] (zeros in the padding and in lanes past `count`).
template <class T>
void frame_input(const T* x, std::size_t image, std::size_t count, std::size_t channels, const Window& g,
                 const Frame& f, std::size_t lanes, float* out) noexcept {
  const std::size_t row = f.wf * lanes, right = (f.wf - f.left - g.w) * lanes;
  for (std::size_t c = 0; c < channels; ++c) {
    float* plane = out + c * f.in_plane;
    std::fill(plane, plane + f.top * row, 0.0f);  // the frame only: the rows above and below,
    std::fill(plane + (f.top + g.h) * row, plane + f.hf * row, 0.0f);
    for (std::size_t r = 0; r < g.h; ++r) {
      float* at = plane + (r + f.top) * row;
      std::fill(at, at + f.left * lanes, 0.0f);  // the columns left and right of each real row
      std::fill(at + (f.left + g.w) * lanes, at + (f.left + g.w) * lanes + right, 0.0f);
      detail::to_lanes(x + (c * g.h + r) * g.w, image, count, g.w, at + f.left * lanes, lanes);
    }
  }
}

/// The inverse for unframed planes: out[lane * image + j] = in[j * L + lane] for j < n per plane,
/// `planes` planes of n values, the first `count` lanes, rounded to T.
template <class T>
void unframe(const float* in, std::size_t planes, std::size_t n, std::size_t count, std::size_t lanes, T* out,
             std::size_t image) noexcept {
  for (std::size_t p = 0; p < planes; ++p) transpose_convert(in + p * n * lanes, n, count, lanes, out + p * n, image);
}

namespace detail {

// P consecutive outputs of one row of output plane o: acc[p] = bias + sum over c, ki, kj of
// w[o][c][ki][kj] * x[c][r + ki][q0 + p + kj] (every lane an image), x pointing at (r, q0).
// Kernel rows [ki_begin, ki_end) are those that meet real input rows; the others would add the
// frame's zeros. Each of the tile's P + KW - 1 source columns is loaded once and meets the
// outputs it reaches, in the order of kj, so every output sums c, then ki, then kj. Edge > 0: the
// tile is a whole row whose first and last Edge source columns are the frame's zeros, skipped.
template <std::size_t P, std::size_t KW, std::size_t Edge, class Arch>
inline void forward_tile(const float* x, std::size_t channels, const Frame& f, const float* w, std::size_t kh,
                         std::size_t ki_begin, std::size_t ki_end, float bias, float* out) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t L = B::size, S = P + KW - 1;
  B acc[P];
  XTRAIN_UNROLL(16)
  for (std::size_t p = 0; p < P; ++p) acc[p] = B(bias);
  for (std::size_t c = 0; c < channels; ++c)
    for (std::size_t ki = ki_begin; ki < ki_end; ++ki) {
      const float* xr = x + c * f.in_plane + ki * f.wf * L;
      const float* wr = w + (c * kh + ki) * KW;
      B wv[KW];
      XTRAIN_UNROLL(8)
      for (std::size_t kj = 0; kj < KW; ++kj) wv[kj] = B(wr[kj]);
      XTRAIN_UNROLL(32)
      for (std::size_t s = Edge; s < S - Edge; ++s) {
        B xv = B::load_aligned(xr + s * L);
        simd::keep_in_register(xv);  // one load for its KW multiply-adds, not one each
        XTRAIN_UNROLL(8)
        for (std::size_t kj = 0; kj < KW; ++kj)
          if (s >= kj && s - kj < P) acc[s - kj] = xsimd::fma(wv[kj], xv, acc[s - kj]);
      }
    }
  XTRAIN_UNROLL(16)
  for (std::size_t p = 0; p < P; ++p) acc[p].store_aligned(out + p * L);
}

// Calls tile.template operator()<P>() for tiles of P = Full, 10, 8, 7, 4, 2 or 1 consecutive
// outputs until `count` are done (10: LeNet's 10-wide planes in one tile; 7: a ResNet's last
// stage, 7 x 7, in one tile instead of 4 + 2 + 1, whose short tiles load a source column for
// fewer multiply-adds); the tile advances its own pointers.
template <std::size_t Full, class Tile>
inline void for_each_tile(std::size_t count, Tile&& tile) {
  for (std::size_t left = count; left > 0;) {
    if (left >= Full) {
      tile.template operator()<Full>();
      left -= Full;
    } else if (left == 10) {
      tile.template operator()<10>();
      left -= 10;
    } else if (left >= 8) {
      tile.template operator()<8>();
      left -= 8;
    } else if (left == 7) {
      tile.template operator()<7>();
      left -= 7;
    } else if (left >= 4) {
      tile.template operator()<4>();
      left -= 4;
    } else if (left >= 2) {
      tile.template operator()<2>();
      left -= 2;
    } else {
      tile.template operator()<1>();
      left -= 1;
    }
  }
}

// The kernel rows [begin, end) that meet real rows of framed input (not the frame's zeros) for
// output row r.
inline std::pair<std::size_t, std::size_t> real_kernel_rows(const Frame& f, std::size_t kh, std::size_t r) noexcept {
  const std::size_t real_begin = f.top, real_end = f.hf - f.top;
  return {real_begin > r ? real_begin - r : 0, std::min(kh, real_end > r ? real_end - r : 0)};
}

// One output row r of a plane: the kernel rows that meet real input rows, in tiles of the row
// (a whole row of 10 or 14 framed by KW - 1 zero columns on each side skips those: the input
// gradient of an unpadded layer).
template <std::size_t Full, std::size_t KW, class Arch>
void forward_row(const float* x, std::size_t channels, const Frame& f, const float* w, std::size_t kh, std::size_t r,
                 float bias, float* out, std::size_t count) noexcept {
  constexpr std::size_t L = simd::lanes<Arch>;
  const std::pair<std::size_t, std::size_t> rows = real_kernel_rows(f, kh, r);
  const std::size_t ki_begin = rows.first, ki_end = rows.second;  // (clang 14: no bindings in lambdas)
  x += r * f.wf * L;
  const bool framed = f.left == KW - 1;
  for_each_tile<Full>(count, [&]<std::size_t P>() {
    if constexpr (P >= 10)
      if (framed && P == count) {
        forward_tile<P, KW, KW - 1, Arch>(x, channels, f, w, kh, ki_begin, ki_end, bias, out);
        return;
      }
    forward_tile<P, KW, 0, Arch>(x, channels, f, w, kh, ki_begin, ki_end, bias, out);
    x += P * L;
    out += P * L;
  });
}

// dw[ki][kj] sums of plane o and channel c over the output positions, lanes summed at the end.
// Output columns go in pairs (q, q + 1) where the row has them: each x vector of a kernel row is
// loaded once for both and kept in a register (KW + 1 loads for 2 KW multiply-adds, not 2 KW),
// and meets dy[q] before dy[q + 1], so every sum keeps the order of the output positions.
template <std::size_t KH, std::size_t KW, class Arch>
inline void weight_tile(const float* dy, const Frame& fd, const float* x, const Frame& fx, const Window& g,
                        float* sums) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t L = B::size;
  B acc[KH][KW];
  XTRAIN_UNROLL(8)
  for (std::size_t i = 0; i < KH; ++i) XTRAIN_UNROLL(8)
  for (std::size_t j = 0; j < KW; ++j) acc[i][j] = B(0.0f);
  for (std::size_t r = 0; r < g.oh; ++r) {
    const float* d = dy + ((r + fd.top) * fd.wf + fd.left) * L;
    const float* xr = x + r * fx.wf * L;
    for (std::size_t q = 0; q < g.ow; q += 2) {
      // An odd last column pairs with zeros, which skip the column past the row.
      const bool pair = q + 1 < g.ow;
      B d0 = B::load_aligned(d + q * L), d1 = pair ? B::load_aligned(d + (q + 1) * L) : B(0.0f);
      simd::keep_in_register(d0);
      simd::keep_in_register(d1);
      const float* xq = xr + q * L;
      XTRAIN_UNROLL(8)
      for (std::size_t i = 0; i < KH; ++i) XTRAIN_UNROLL(8)
      for (std::size_t s = 0; s <= KW; ++s) {
        if (s == KW && !pair) break;
        B xv = B::load_aligned(xq + (i * fx.wf + s) * L);
        simd::keep_in_register(xv);
        if (s < KW) acc[i][s] = xsimd::fma(d0, xv, acc[i][s]);
        if (s >= 1) acc[i][s - 1] = xsimd::fma(d1, xv, acc[i][s - 1]);
      }
    }
  }
  XTRAIN_UNROLL(8)
  for (std::size_t i = 0; i < KH; ++i) XTRAIN_UNROLL(8)
  for (std::size_t j = 0; j < KW; ++j) sums[i * KW + j] = simd::horizontal_sum(acc[i][j]);
}

}  // namespace detail

/// y[o][r][q] (lanes: images) = bias[o] + the correlation, for `outs` output planes; x framed as
/// frame_input writes it; w [outs][channels][KH][KW]; bias may be null.
template <class Arch = simd::default_arch>
void forward(const float* x, std::size_t channels, const float* w, const float* bias, std::size_t outs, const Window& g,
             const Frame& f, float* y) noexcept {
  constexpr std::size_t L = simd::lanes<Arch>, full = L >= 16 ? 14 : 12;
  const std::size_t taps = g.kernel.h * g.kernel.w;
  for (std::size_t o = 0; o < outs; ++o)
    for (std::size_t r = 0; r < g.oh; ++r) {
      const float* wo = w + o * channels * taps;
      float* out = y + (o * g.oh + r) * g.ow * L;
      const float b = bias ? bias[o] : 0.0f;
      if (g.kernel.w == 5)
        detail::forward_row<full, 5, Arch>(x, channels, f, wo, g.kernel.h, r, b, out, g.ow);
      else
        detail::forward_row<full, 3, Arch>(x, channels, f, wo, g.kernel.h, r, b, out, g.ow);
    }
}

/// dw[o][c][ki][kj] = the sum over the lanes' images and the output positions of dy[o] * x[c]
/// shifted by (ki, kj), written (not added) for `outs` x `channels` kernels; x framed for g
/// (frame_input, Frame fx), dy as Frame fd says: framed for input_grad_window(g), or not at all
/// (unframed_output(g)) when no input gradient needs it.
template <class Arch = simd::default_arch>
void weight_grad(const float* dy, const Frame& fd, std::size_t outs, const float* x, const Frame& fx,
                 std::size_t channels, const Window& g, float* dw) noexcept {
  const std::size_t taps = g.kernel.h * g.kernel.w;
  for (std::size_t o = 0; o < outs; ++o)
    for (std::size_t c = 0; c < channels; ++c) {
      float* out = dw + (o * channels + c) * taps;
      if (g.kernel == Size2{5})
        detail::weight_tile<5, 5, Arch>(dy + o * fd.in_plane, fd, x + c * fx.in_plane, fx, g, out);
      else
        detail::weight_tile<3, 3, Arch>(dy + o * fd.in_plane, fd, x + c * fx.in_plane, fx, g, out);
    }
}

/// 2 x 2 / 2 max pooling of `planes` output planes of oh x ow (even) in the lane layout, in place:
/// y[p][r][q] (the first planes * oh * ow / 4 vectors) = the window's first maximum in PyTorch's
/// scan order (a NaN taken over, as PyTorch's CPU kernel does), of max(y, 0) when `relu` (as the
/// ReLU layer computes it: +0 for a NaN and for -0); index[p][r][q][lane] = the maximum's place in
/// its window (row-major 0-3), or 4 where the ReLU left 0 (no gradient, as the ReLU's backward
/// passes none there). Output k is written after its window is read and reads nothing before k.
template <class Arch = simd::default_arch>
void max_pool(float* y, std::size_t planes, std::size_t oh, std::size_t ow, bool relu, std::uint8_t* index) noexcept {
  using B = simd::batch<float, Arch>;
  using I = simd::batch<std::int32_t, Arch>;
  constexpr std::size_t L = B::size;
  const std::size_t ph = oh / 2, pw = ow / 2;
  float* out = y;
  for (std::size_t p = 0; p < planes; ++p)
    for (std::size_t r = 0; r < ph; ++r)
      for (std::size_t q = 0; q < pw; ++q) {
        const float* at = y + ((p * oh + 2 * r) * ow + 2 * q) * L;
        B best = B::load_aligned(at);
        if (relu) best = xsimd::max(best, B(0.0f));  // the ReLU layer's op (vmaxps)
        I where(0);
        const float* next[3] = {at + L, at + ow * L, at + (ow + 1) * L};
        for (std::int32_t k = 0; k < 3; ++k) {
          B v = B::load_aligned(next[k]);
          if (relu) v = xsimd::max(v, B(0.0f));
          const auto take = (v > best) || xsimd::isnan(v);  // PyTorch's rule: a NaN takes over
          best = xsimd::select(take, v, best);
          where = xsimd::select(xsimd::bool_cast(take), I(k + 1), where);
        }
        if (relu) where = xsimd::select(xsimd::bool_cast(best > B(0.0f)), where, I(4));
        best.store_aligned(out);
        alignas(64) std::int32_t w[L];
        where.store_aligned(w);
        for (std::size_t i = 0; i < L; ++i) index[i] = static_cast<std::uint8_t>(w[i]);
        out += L;
        index += L;
      }
}

/// The gradient of max_pool: the output gradient dy of `planes` planes of oh x ow (lane layout
/// with Frame f, frame zeroed here) gets each pooled gradient dp[p][r][q] at the place `index`
/// names in its window and 0 at the window's other places (and everywhere for index 4).
template <class Arch = simd::default_arch>
void max_unpool(const float* dp, const std::uint8_t* index, std::size_t planes, std::size_t oh, std::size_t ow,
                const Frame& f, float* dy) noexcept {
  using B = simd::batch<float, Arch>;
  using I = simd::batch<std::int32_t, Arch>;
  constexpr std::size_t L = B::size;
  const std::size_t ph = oh / 2, pw = ow / 2, row = f.wf * L;
  for (std::size_t p = 0; p < planes; ++p) {
    float* plane = dy + p * f.in_plane;
    std::fill(plane, plane + f.top * row, 0.0f);
    std::fill(plane + (f.top + oh) * row, plane + f.hf * row, 0.0f);
    for (std::size_t r = 0; r < oh; ++r) {
      float* at = plane + (r + f.top) * row;
      std::fill(at, at + f.left * L, 0.0f);
      std::fill(at + (f.left + ow) * L, at + row, 0.0f);
    }
    for (std::size_t r = 0; r < ph; ++r)
      for (std::size_t q = 0; q < pw; ++q) {
        const B g = B::load_aligned(dp);
        alignas(64) std::int32_t w[L];
        for (std::size_t i = 0; i < L; ++i) w[i] = index[i];
        const I where = I::load_aligned(w);
        float* at = plane + ((2 * r + f.top) * f.wf + f.left + 2 * q) * L;
        float* to[4] = {at, at + L, at + row, at + row + L};
        for (std::int32_t k = 0; k < 4; ++k)
          xsimd::select(xsimd::bool_cast(where == I(k)), g, B(0.0f)).store_aligned(to[k]);
        dp += L;
        index += L;
      }
  }
}

/// sums[o] = the sum of plane o of dy (oh x ow, lane layout with Frame f) over its positions and
/// lanes: per lane in position order, then the lanes. The bias gradient of one group of images.
template <class Arch = simd::default_arch>
void plane_sums(const float* dy, const Frame& f, std::size_t planes, std::size_t oh, std::size_t ow,
                float* sums) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t L = B::size;
  for (std::size_t p = 0; p < planes; ++p) {
    B acc(0.0f);
    for (std::size_t r = 0; r < oh; ++r) {
      const float* at = dy + p * f.in_plane + ((r + f.top) * f.wf + f.left) * L;
      for (std::size_t q = 0; q < ow; ++q) acc += B::load_aligned(at + q * L);
    }
    sums[p] = simd::horizontal_sum(acc);
  }
}

}  // namespace xtrain::kernels::lanes
