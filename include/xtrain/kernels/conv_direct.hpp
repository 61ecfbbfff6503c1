#pragma once
/// \file conv_direct.hpp
/// Direct convolution (stride 1, dilation 1) for layers with few channels, where im2col spends
/// more time writing and re-reading its column matrix than the GEMM spends multiplying it (LeNet's
/// 6 and 16 output channels, a first layer of one channel).
///
/// Each input plane is copied once, widened to fp32, into a zero frame of `wp = W + 2 pw` columns.
/// In that layout output position p = oh * wp + ow reads the input at p + ki * wp + kj for kernel
/// element (ki, kj), so a whole plane is one 1-D correlation over the flat frame: registers load
/// consecutive inputs, and the KW - 1 positions per row past OW are computed and dropped. The
/// input gradient is the same correlation of the zero-framed output gradient with the kernel
/// flipped and transposed (`flip_kernel`); the weight gradient correlates the framed output
/// gradient with the framed input, each (output channel, kernel element) a dot product over the
/// plane kept in registers across a block of images. Every output is summed in a fixed order, so
/// results do not depend on how images are split over threads. Scalar twin:
/// kernels/reference/conv.hpp.

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "xtrain/kernels/conv.hpp"
#include "xtrain/kernels/convert.hpp"
#include "xtrain/kernels/gemm.hpp"
#include "xtrain/kernels/simd.hpp"
#include "xtrain/kernels/transpose.hpp"

namespace xtrain::kernels::direct {

/// Whether the direct kernels compute windows of this shape (stride 1, dilation 1).
inline bool supports(const Window& g) noexcept { return g.stride == Size2{1} && g.dilation == Size2{1}; }

/// Sizes of the framed planes of a Window the direct kernels support (its input plane set).
struct Frame {
  std::size_t wp = 0;       ///< row pitch of every framed plane: W + 2 pw
  std::size_t span = 0;     ///< output positions computed per plane: OH * wp, rounded up to whole registers
  std::size_t lead = 0;     ///< (KH - 1) * wp + KW - 1: zeros before a framed output-gradient plane
  std::size_t x_ld = 0;     ///< values per framed input plane
  std::size_t dx_span = 0;  ///< input-gradient positions computed per plane: H * wp, rounded up
  std::size_t dy_ld = 0;    ///< values per framed output-gradient plane

  Frame(const Window& g, std::size_t lanes) noexcept {
    const auto up = [lanes](std::size_t v) { return (v + lanes - 1) / lanes * lanes; };
    wp = g.w + 2 * g.padding.w;
    span = up(g.oh * wp);
    lead = (g.kernel.h - 1) * wp + g.kernel.w - 1;
    x_ld = span + lead;  // >= (H + 2 ph) * wp: the whole frame, and every position span reads
    dx_span = up(g.h * wp);
    dy_ld = std::max(lead + span, g.padding.h * wp + dx_span + lead);
  }
};

namespace detail {

// out[0, n) = in[0, n) widened to fp32. Rows of a plane are short (LeNet: 10 to 28 values):
// whole registers, the last one overlapping, where a call to memcpy would cost more than the copy.
template <class T>
inline void copy_row(const T* in, float* out, std::size_t n) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    using B = simd::batch<float>;
    constexpr std::size_t L = B::size;
    if (n >= L) {
      std::size_t i = 0;
      for (; i + L <= n; i += L) B::load_unaligned(in + i).store_unaligned(out + i);
      if (i < n) B::load_unaligned(in + n - L).store_unaligned(out + n - L);
      return;
    }
#if defined(__SSE2__)
    using S = xsimd::batch<float, xsimd::sse2>;
    if (n >= S::size) {
      std::size_t i = 0;
      for (; i + S::size <= n; i += S::size) S::load_unaligned(in + i).store_unaligned(out + i);
      if (i < n) S::load_unaligned(in + n - S::size).store_unaligned(out + n - S::size);
      return;
    }
#endif
    for (std::size_t i = 0; i < n; ++i) out[i] = in[i];
  } else {
    to_float(in, out, n);
  }
}

}  // namespace detail

/// Copies `channels` planes of x (H x W each, contiguous) into framed fp32 planes `f.x_ld` apart:
/// plane row r at (r + ph) * wp + pw, zeros around it.
template <class T>
void frame_input(const T* x, std::size_t channels, const Window& g, const Frame& f, float* out) noexcept {
  for (std::size_t c = 0; c < channels; ++c) {
    float* p = out + c * f.x_ld;
    const T* xc = x + c * g.in_plane();
    std::fill(p, p + g.padding.h * f.wp, 0.0f);
    p += g.padding.h * f.wp;
    for (std::size_t r = 0; r < g.h; ++r, p += f.wp) {
      std::fill(p, p + g.padding.w, 0.0f);
      detail::copy_row(xc + r * g.w, p + g.padding.w, g.w);
      std::fill(p + g.padding.w + g.w, p + f.wp, 0.0f);
    }
    std::fill(p, out + (c + 1) * f.x_ld, 0.0f);
  }
}

/// Copies `channels` planes of dy (OH x OW each, contiguous) into framed fp32 planes `f.dy_ld`
/// apart: row r at lead + r * wp, zeros elsewhere.
template <class T>
void frame_output_grad(const T* dy, std::size_t channels, const Window& g, const Frame& f, float* out) noexcept {
  for (std::size_t c = 0; c < channels; ++c) {
    float* p = out + c * f.dy_ld;
    const T* d = dy + c * g.out_plane();
    std::fill(p, p + f.lead, 0.0f);
    p += f.lead;
    for (std::size_t r = 0; r < g.oh; ++r, p += f.wp) {
      detail::copy_row(d + r * g.ow, p, g.ow);
      std::fill(p + g.ow, p + f.wp, 0.0f);
    }
    std::fill(p, out + (c + 1) * f.dy_ld, 0.0f);
  }
}

/// `rows` x `cols` values of a plane with row pitch `ld` to a dense plane, converted to T.
template <class T>
void crop(const float* in, std::size_t ld, std::size_t rows, std::size_t cols, T* out) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    if constexpr (std::is_same_v<T, float>)
      detail::copy_row(in + r * ld, out + r * cols, cols);
    else
      from_float(in + r * ld, out + r * cols, cols);
  }
}

/// w[out][in][KH][KW] -> flipped[in][out][KH][KW] with both kernel axes reversed: the kernel whose
/// correlation with the framed output gradient is the input gradient.
inline void flip_kernel(const float* w, std::size_t outs, std::size_t ins, Size2 kernel, float* flipped) noexcept {
  const std::size_t taps = kernel.h * kernel.w;
  for (std::size_t o = 0; o < outs; ++o)
    for (std::size_t c = 0; c < ins; ++c)
      for (std::size_t t = 0; t < taps; ++t)
        flipped[(c * outs + o) * taps + (taps - 1 - t)] = w[(o * ins + c) * taps + t];
}

namespace detail {

// MB output planes x NB registers of positions: acc = bias + the correlation.
// Only kernel rows [ki0, ki1) are summed (the others read zeros for every position of the tile).
template <std::size_t MB, std::size_t NB, class Arch>
inline void correlate_tile(const float* x, std::size_t channels, std::size_t x_ld, const float* const* w,
                           std::size_t kh, std::size_t kw, std::size_t wp, const float* bias, float* const* out,
                           std::size_t ki0, std::size_t ki1) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t L = B::size;
  B acc[MB][NB];
  for (std::size_t m = 0; m < MB; ++m)
    for (std::size_t v = 0; v < NB; ++v) acc[m][v] = B(bias ? bias[m] : 0.0f);
  const std::size_t taps = kh * kw;
  for (std::size_t c = 0; c < channels; ++c) {
    const float* xc = x + c * x_ld;
    for (std::size_t ki = ki0; ki < ki1; ++ki) {
      const float* xr = xc + ki * wp;
      const std::size_t t0 = c * taps + ki * kw;
      for (std::size_t kj = 0; kj < kw; ++kj) {
        B xv[NB];
        for (std::size_t v = 0; v < NB; ++v) xv[v] = B::load_unaligned(xr + kj + v * L);
        for (std::size_t m = 0; m < MB; ++m) {
          const B wv(w[m][t0 + kj]);
          for (std::size_t v = 0; v < NB; ++v) acc[m][v] = xsimd::fma(wv, xv[v], acc[m][v]);
        }
      }
    }
  }
  for (std::size_t m = 0; m < MB; ++m)
    for (std::size_t v = 0; v < NB; ++v) acc[m][v].store_unaligned(out[m] + v * L);
}

// Kernel rows [ki0, ki1) that meet x's nonzero values [nz_begin, nz_end) for positions [p, p + n).
inline void kernel_rows(std::size_t p, std::size_t n, std::size_t kh, std::size_t kw, std::size_t wp,
                        std::size_t nz_begin, std::size_t nz_end, std::size_t& ki0, std::size_t& ki1) noexcept {
  const std::size_t last = p + n + kw - 2;  // the last value kernel row 0 reads
  ki0 = last >= nz_begin ? 0 : std::min(kh, (nz_begin - last + wp - 1) / wp);
  ki1 = p >= nz_end ? 0 : std::min(kh, (nz_end - 1 - p) / wp + 1);
  ki1 = std::max(ki0, ki1);
}

template <std::size_t MB, class Arch>
void correlate_block(const float* x, std::size_t channels, std::size_t x_ld, const float* const* w, std::size_t kh,
                     std::size_t kw, std::size_t wp, const float* bias, float* const* out, std::size_t count,
                     std::size_t nz_begin, std::size_t nz_end) noexcept {
  constexpr std::size_t L = simd::lanes<Arch>;
  float* o[MB];
  for (std::size_t m = 0; m < MB; ++m) o[m] = out[m];
  std::size_t p = 0, ki0 = 0, ki1 = 0;
  for (; p + 2 * L <= count; p += 2 * L) {
    kernel_rows(p, 2 * L, kh, kw, wp, nz_begin, nz_end, ki0, ki1);
    correlate_tile<MB, 2, Arch>(x + p, channels, x_ld, w, kh, kw, wp, bias, o, ki0, ki1);
    for (std::size_t m = 0; m < MB; ++m) o[m] += 2 * L;
  }
  if (p < count) {
    kernel_rows(p, L, kh, kw, wp, nz_begin, nz_end, ki0, ki1);
    correlate_tile<MB, 1, Arch>(x + p, channels, x_ld, w, kh, kw, wp, bias, o, ki0, ki1);
  }
}

// MB output planes x NT kernel elements: acc[m][t] += dy[m][p] * x[p + offset[t]] over `count`
// positions of `images` images, then summed across the lanes into dw[m][t].
template <std::size_t MB, std::size_t NT, class Arch>
inline void weight_tile(const float* const* dy, std::size_t dy_image, const float* x, std::size_t x_image,
                        std::size_t images, const std::size_t* offset, std::size_t count, float* const* dw) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t L = B::size;
  B acc[MB][NT];
  for (std::size_t m = 0; m < MB; ++m)
    for (std::size_t t = 0; t < NT; ++t) acc[m][t] = B(0.0f);
  for (std::size_t n = 0; n < images; ++n) {
    const float* xn = x + n * x_image;
    for (std::size_t p = 0; p < count; p += L) {
      B dv[MB];
      for (std::size_t m = 0; m < MB; ++m) {
        dv[m] = B::load_unaligned(dy[m] + n * dy_image + p);
        simd::keep_in_register(dv[m]);
      }
      for (std::size_t t = 0; t < NT; ++t) {
        B xv = B::load_unaligned(xn + p + offset[t]);
        simd::keep_in_register(xv);  // one load for the MB FMAs, not one each
        for (std::size_t m = 0; m < MB; ++m) acc[m][t] = xsimd::fma(dv[m], xv, acc[m][t]);
      }
    }
  }
  for (std::size_t m = 0; m < MB; ++m)
    for (std::size_t t = 0; t < NT; ++t) dw[m][t] = simd::horizontal_sum(acc[m][t]);
}

// The whole KH x KW kernel x OV registers of output channels: acc[ki][kj][v] += x[p + ki * wp +
// kj] * dyt[p][v] over the output positions of `images` images; acc stored to sums[ki][kj][OV * L].
template <std::size_t KH, std::size_t KW, std::size_t OV, class Arch>
void weight_tile_by_output(const float* dyt, std::size_t dyt_image, const float* x, std::size_t x_image,
                           std::size_t images, std::size_t oh, std::size_t ow, std::size_t wp, float* sums) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t L = B::size;
  B acc[KH][KW][OV];
  for (std::size_t i = 0; i < KH; ++i)
    for (std::size_t j = 0; j < KW; ++j)
      for (std::size_t v = 0; v < OV; ++v) acc[i][j][v] = B(0.0f);
  for (std::size_t n = 0; n < images; ++n) {
    const float* d = dyt + n * dyt_image;
    for (std::size_t r = 0; r < oh; ++r) {
      const float* xr[KH];
      for (std::size_t i = 0; i < KH; ++i) xr[i] = x + n * x_image + (r + i) * wp;
      for (std::size_t q = 0; q < ow; ++q, d += OV * L) {
        B dv[OV];
        for (std::size_t v = 0; v < OV; ++v) dv[v] = B::load_unaligned(d + v * L);
        for (std::size_t i = 0; i < KH; ++i)
          for (std::size_t j = 0; j < KW; ++j) {
            const B xs(xr[i][q + j]);
            for (std::size_t v = 0; v < OV; ++v) acc[i][j][v] = xsimd::fma(xs, dv[v], acc[i][j][v]);
          }
      }
    }
  }
  for (std::size_t i = 0; i < KH; ++i)
    for (std::size_t j = 0; j < KW; ++j)
      for (std::size_t v = 0; v < OV; ++v) acc[i][j][v].store_unaligned(sums + ((i * KW + j) * OV + v) * L);
}

}  // namespace detail

/// Output planes a correlation tile computes at once (register blocking: MB x 2 accumulators).
template <class Arch = simd::default_arch>
inline constexpr std::size_t max_block = simd::lanes<Arch> >= 16 ? 8 : 4;

/// out[o][p] = bias[o] + sum over c < channels, ki < kh, kj < kw of w[o][c][ki][kj] *
/// x[c][p + ki * wp + kj], for o < outs and p < count (a multiple of the register width); x's
/// planes are x_ld apart (readable up to count + (kh - 1) * wp + kw - 1), out's out_ld apart.
/// bias may be null. Where x is zero outside [nz_begin, nz_end) of each plane (a framed plane's
/// rows of padding, a framed output gradient's frame), kernel rows that meet only zeros for a
/// whole tile of positions are skipped: the same sums for finite weights, fewer multiply-adds by
/// zero (an infinite or NaN weight no longer reaches the outputs whose window it meets only in
/// the frame).
template <class Arch = simd::default_arch>
void correlate(const float* x, std::size_t channels, std::size_t x_ld, const float* w, Size2 kernel, std::size_t wp,
               std::size_t outs, const float* bias, float* out, std::size_t out_ld, std::size_t count,
               std::size_t nz_begin = 0, std::size_t nz_end = static_cast<std::size_t>(-1)) noexcept {
  constexpr std::size_t cap = max_block<Arch>;
  const std::size_t w_ld = channels * kernel.h * kernel.w;
  const std::size_t blocks = (outs + cap - 1) / cap, mb = (outs + blocks - 1) / blocks;
  for (std::size_t o0 = 0; o0 < outs; o0 += mb) {
    // A short last block repeats its last plane (computed and stored again: the same values).
    const float* wr[cap];
    float* orow[cap];
    float bias_row[cap];
    for (std::size_t m = 0; m < mb; ++m) {
      const std::size_t o = std::min(o0 + m, outs - 1);
      wr[m] = w + o * w_ld;
      orow[m] = out + o * out_ld;
      bias_row[m] = bias ? bias[o] : 0.0f;
    }
    const float* b = bias ? bias_row : nullptr;
    const auto block = [&]<std::size_t MB>() {
      if constexpr (MB <= cap)
        detail::correlate_block<MB, Arch>(x, channels, x_ld, wr, kernel.h, kernel.w, wp, b, orow, count, nz_begin,
                                          nz_end);
    };
    switch (mb) {
      case 1:
        block.template operator()<1>();
        break;
      case 2:
        block.template operator()<2>();
        break;
      case 3:
        block.template operator()<3>();
        break;
      case 4:
        block.template operator()<4>();
        break;
      case 5:
        block.template operator()<5>();
        break;
      case 6:
        block.template operator()<6>();
        break;
      case 7:
        block.template operator()<7>();
        break;
      default:
        block.template operator()<8>();
        break;
    }
  }
}

namespace detail {

// correlate_weights with tiles of MB output planes x NT kernel elements.
template <std::size_t MB, std::size_t NT, class Arch>
void correlate_weights_tiled(const float* dy, std::size_t outs, std::size_t dy_ld, std::size_t dy_image, const float* x,
                             std::size_t channels, std::size_t x_ld, std::size_t x_image, std::size_t images,
                             Size2 kernel, std::size_t wp, std::size_t count, float* dw) noexcept {
  const std::size_t taps = kernel.h * kernel.w, w_ld = channels * taps;
  for (std::size_t o0 = 0; o0 < outs; o0 += MB)
    for (std::size_t c = 0; c < channels; ++c)
      for (std::size_t t0 = 0; t0 < taps; t0 += NT) {
        // Short blocks repeat their last plane or kernel element; only real sums are added.
        const float* d[MB];
        std::size_t offset[NT];
        float sums[MB][NT];
        float* row[MB];
        for (std::size_t m = 0; m < MB; ++m) {
          d[m] = dy + std::min(o0 + m, outs - 1) * dy_ld;
          row[m] = sums[m];
        }
        for (std::size_t t = 0; t < NT; ++t) {
          const std::size_t tap = std::min(t0 + t, taps - 1);
          offset[t] = tap / kernel.w * wp + tap % kernel.w;
        }
        weight_tile<MB, NT, Arch>(d, dy_image, x + c * x_ld, x_image, images, offset, count, row);
        for (std::size_t m = 0; m < MB && o0 + m < outs; ++m)
          for (std::size_t t = 0; t < NT && t0 + t < taps; ++t) dw[(o0 + m) * w_ld + c * taps + t0 + t] += sums[m][t];
      }
}

}  // namespace detail

/// dw[o][c][ki][kj] += sum over images n < images and positions p < count of dy[n][o][p] *
/// x[n][c][p + ki * wp + kj]: dy's planes dy_ld apart and its images dy_image apart (zero at every
/// position that is not an output), x's planes x_ld apart and its images x_image apart; count a
/// multiple of the register width. Each dw value is one sum in a fixed order. Tiles of MB output
/// planes x NT kernel elements (MB x NT accumulators, MB + 1 more registers), the shape that
/// wastes the fewest multiply-adds on padding: 4 x 6 or 6 x 4 with 32 registers (LeNet's 6
/// outputs of 25 taps: 6 x 4, 1.43x fewer than 4 x 6), 2 x 5 with 16.
template <class Arch = simd::default_arch>
void correlate_weights(const float* dy, std::size_t outs, std::size_t dy_ld, std::size_t dy_image, const float* x,
                       std::size_t channels, std::size_t x_ld, std::size_t x_image, std::size_t images, Size2 kernel,
                       std::size_t wp, std::size_t count, float* dw) noexcept {
  if constexpr (simd::lanes<Arch> >= 16) {
    const std::size_t taps = kernel.h * kernel.w;
    const auto padded = [&](std::size_t mb, std::size_t nt) {
      return (outs + mb - 1) / mb * mb * ((taps + nt - 1) / nt * nt);
    };
    if (padded(6, 4) < padded(4, 6)) {
      detail::correlate_weights_tiled<6, 4, Arch>(dy, outs, dy_ld, dy_image, x, channels, x_ld, x_image, images, kernel,
                                                  wp, count, dw);
      return;
    }
    detail::correlate_weights_tiled<4, 6, Arch>(dy, outs, dy_ld, dy_image, x, channels, x_ld, x_image, images, kernel,
                                                wp, count, dw);
  } else {
    detail::correlate_weights_tiled<2, 5, Arch>(dy, outs, dy_ld, dy_image, x, channels, x_ld, x_image, images, kernel,
                                                wp, count, dw);
  }
}

}  // namespace xtrain::kernels::direct

namespace xtrain::kernels::direct {

/// Registers of output channels per tile of correlate_weights_by_output, or 0 when it has no
/// tile for `outs` and this kernel on this architecture (3 x 3 and 5 x 5 kernels, up to 2
/// registers of output channels, at most a quarter of the lanes idle): then use
/// correlate_weights.
template <class Arch = simd::default_arch>
std::size_t output_registers(std::size_t outs, Size2 kernel) noexcept {
  constexpr std::size_t L = simd::lanes<Arch>, fit = L >= 16 ? 28 : 12;  // accumulators that fit
  const std::size_t ov = (outs + L - 1) / L, taps = kernel.h * kernel.w;
  const bool shape = kernel == Size2{3} || kernel == Size2{5};
  return shape && ov <= 2 && 4 * outs >= 3 * ov * L && taps * ov <= fit ? ov : 0;
}

/// Output-channel lanes: dyt[p][o] = dy[o][p] for the OH * OW positions of `channels` planes, each
/// row `ld` values (a multiple of the register width), zero past `channels`.
template <class T>
void transpose_output_grad(const T* dy, std::size_t channels, std::size_t plane, std::size_t ld, float* dyt) noexcept {
  transpose_convert(dy, channels, plane, plane, dyt, ld);
  for (std::size_t p = 0; p < plane; ++p) std::fill(dyt + p * ld + channels, dyt + (p + 1) * ld, 0.0f);
}

/// dw[o][c][ki][kj] += sum over images n and output positions (r, q) of dyt[n][r * OW + q][o] *
/// x[n][c][(r + ki) * wp + q + kj], vectorised over the output channels (`registers` from
/// output_registers, not 0): dyt as transpose_output_grad writes it, rows registers * lanes apart
/// and images dyt_image apart; x framed as for correlate_weights. No sums across lanes, no idle
/// positions: LeNet's and ResNet's 16-channel layers.
template <class Arch = simd::default_arch>
void correlate_weights_by_output(const float* dyt, std::size_t outs, std::size_t dyt_image, const float* x,
                                 std::size_t channels, std::size_t x_ld, std::size_t x_image, std::size_t images,
                                 const Window& g, std::size_t wp, std::size_t registers, float* dw) noexcept {
  constexpr std::size_t L = simd::lanes<Arch>, fit = L >= 16 ? 28 : 12;
  const std::size_t taps = g.kernel.h * g.kernel.w, w_ld = channels * taps;
  float sums[25 * 2 * L];
  for (std::size_t c = 0; c < channels; ++c) {
    const auto run = [&]<std::size_t K, std::size_t OV>() {
      if constexpr (K * K * OV <= fit)
        detail::weight_tile_by_output<K, K, OV, Arch>(dyt, dyt_image, x + c * x_ld, x_image, images, g.oh, g.ow, wp,
                                                      sums);
    };
    if (g.kernel == Size2{5})
      registers == 1 ? run.template operator()<5, 1>() : run.template operator()<5, 2>();
    else
      registers == 1 ? run.template operator()<3, 1>() : run.template operator()<3, 2>();
    for (std::size_t t = 0; t < taps; ++t)
      for (std::size_t o = 0; o < outs; ++o) dw[o * w_ld + c * taps + t] += sums[t * registers * L + o];
  }
}

}  // namespace xtrain::kernels::direct

namespace xtrain::kernels::direct {

/// Registers of output channels a tile of correlate_by_output holds (1 or 2), or 0 when that
/// forward does not pay: more than two registers, or more than a quarter of the lanes idle (with
/// AVX-512, LeNet's 6 outputs: correlate computes them by positions; with AVX2's 8 lanes they
/// fill one register).
template <class Arch = simd::default_arch>
std::size_t forward_registers(std::size_t outs) noexcept {
  constexpr std::size_t L = simd::lanes<Arch>;
  const std::size_t ov = (outs + L - 1) / L;
  return ov <= 2 && 4 * outs >= 3 * ov * L ? ov : 0;
}

/// w[o][c][t] -> wt[c][t][o] for `outs` x `ins` x `taps` weights, each (c, t) row `ld` values
/// (a multiple of the register width), zero past `outs`: the weights correlate_by_output loads.
inline void transpose_kernel(const float* w, std::size_t outs, std::size_t ins, std::size_t taps, std::size_t ld,
                             float* wt) noexcept {
  for (std::size_t c = 0; c < ins; ++c)
    for (std::size_t t = 0; t < taps; ++t) {
      float* row = wt + (c * taps + t) * ld;
      for (std::size_t o = 0; o < outs; ++o) row[o] = w[(o * ins + c) * taps + t];
      std::fill(row + outs, row + ld, 0.0f);
    }
}

/// The inverse of transpose_output_grad: y[o][p] = yt[p][o] for the `plane` positions of
/// `channels` planes (yt's rows `ld` apart), rounded to T.
template <class T>
void untranspose_output(const float* yt, std::size_t channels, std::size_t plane, std::size_t ld, T* y) noexcept {
  transpose_convert(yt, plane, channels, ld, y, plane);
}

namespace detail {

// P consecutive output positions of a row x OV registers of output channels: acc[p][v] = bias +
// sum over channels c and kernel elements (ki, kj) of wt[c][ki * kw + kj][v] * x[c][p + ki * wp +
// kj]; stored to out[p * OV * L + v * L]. One weight load per register and kernel element, one
// broadcast per position: every multiply-add computes an output (no idle lanes, no framed
// positions), where correlate's tiles compute the KW - 1 dead columns of each framed row.
template <std::size_t P, std::size_t OV, class Arch>
inline void by_output_tile(const float* x, std::size_t channels, std::size_t x_ld, const float* wt, std::size_t kh,
                           std::size_t kw, std::size_t wp, const float* bias, float* out) noexcept {
  using B = simd::batch<float, Arch>;
  constexpr std::size_t L = B::size;
  B acc[P][OV];
  XTRAIN_UNROLL(2)
  for (std::size_t v = 0; v < OV; ++v) {
    const B b0 = bias ? B::load_aligned(bias + v * L) : B(0.0f);
    XTRAIN_UNROLL(16)
    for (std::size_t p = 0; p < P; ++p) acc[p][v] = b0;
  }
  for (std::size_t c = 0; c < channels; ++c) {
    const float* xc = x + c * x_ld;
    const float* wc = wt + c * kh * kw * OV * L;
    for (std::size_t ki = 0; ki < kh; ++ki)
      for (std::size_t kj = 0; kj < kw; ++kj) {
        const float* xt = xc + ki * wp + kj;
        B wv[OV];
        XTRAIN_UNROLL(2)
        for (std::size_t v = 0; v < OV; ++v) {
          wv[v] = B::load_aligned(wc + ((ki * kw + kj) * OV + v) * L);
          simd::keep_in_register(wv[v]);
        }
        XTRAIN_UNROLL(16)
        for (std::size_t p = 0; p < P; ++p) {
          const B xs(xt[p]);
          XTRAIN_UNROLL(2)
          for (std::size_t v = 0; v < OV; ++v) acc[p][v] = xsimd::fma(xs, wv[v], acc[p][v]);
        }
      }
  }
  XTRAIN_UNROLL(16)
  for (std::size_t p = 0; p < P; ++p) XTRAIN_UNROLL(2)
  for (std::size_t v = 0; v < OV; ++v) acc[p][v].store_aligned(out + (p * OV + v) * L);
}

// Positions per tile: the accumulators and the OV weight registers fit the register file.
template <std::size_t OV, class Arch>
inline constexpr std::size_t by_output_positions = simd::lanes<Arch> >= 16 ? 14 : (OV == 1 ? 12 : 6);

// `count` positions from x (consecutive), in tiles of by_output_positions and a few shorter ones.
template <std::size_t OV, class Arch>
void by_output_run(const float* x, std::size_t channels, std::size_t x_ld, const float* wt, std::size_t kh,
                   std::size_t kw, std::size_t wp, const float* bias, float* out, std::size_t count) noexcept {
  constexpr std::size_t full = by_output_positions<OV, Arch>, L = simd::lanes<Arch>;
  while (count > 0) {
    const auto tile = [&]<std::size_t P>() {
      by_output_tile<P, OV, Arch>(x, channels, x_ld, wt, kh, kw, wp, bias, out);
      x += P;
      out += P * OV * L;
      count -= P;
    };
    // Tiles of 10 and 7 only where they are shorter than a full one (AVX2: full may be 6).
    if (count >= full) {
      tile.template operator()<full>();
      continue;
    }
    if constexpr (full > 10) {
      if (count >= 10) {
        tile.template operator()<10>();
        continue;
      }
    }
    if constexpr (full > 7) {
      if (count >= 7) {
        tile.template operator()<7>();
        continue;
      }
    }
    if (count >= 4)
      tile.template operator()<4>();
    else if (count >= 2)
      tile.template operator()<2>();
    else
      tile.template operator()<1>();
  }
}

}  // namespace detail

/// The forward of one image vectorised over the output channels: yt[r * OW + q][o] = bias[o] +
/// sum over c, ki, kj of wt[c][ki * KW + kj][o] * x[c][(r + ki) * wp + q + kj] for the OH x OW
/// output positions (rows of yt `registers` x lanes apart), x framed as frame_input writes it
/// (planes x_ld apart), wt as transpose_kernel writes it, bias padded to the same width (or
/// null). `registers` from forward_registers (not 0). Each output is one sum in a fixed order.
template <class Arch = simd::default_arch>
void correlate_by_output(const float* x, std::size_t channels, std::size_t x_ld, const float* wt, const Window& g,
                         std::size_t wp, std::size_t registers, const float* bias, float* yt) noexcept {
  const std::size_t ld = registers * simd::lanes<Arch>;
  for (std::size_t r = 0; r < g.oh; ++r) {
    const float* xr = x + r * wp;
    float* out = yt + r * g.ow * ld;
    if (registers == 1)
      detail::by_output_run<1, Arch>(xr, channels, x_ld, wt, g.kernel.h, g.kernel.w, wp, bias, out, g.ow);
    else
      detail::by_output_run<2, Arch>(xr, channels, x_ld, wt, g.kernel.h, g.kernel.w, wp, bias, out, g.ow);
  }
}

}  // namespace xtrain::kernels::direct
